// calibrate --measurements before the fit: the files read and checked (each file's SHA-256 for
// the provenance, the same bytes twice refused, repetitions of a point averaged), then the
// records that can calibrate `base` turned into points, with what was left out and why.
//
//   read_measurement_set  every file imported (calibrate/measurements.h), hashed, merged
//   select_points         per record: its hardware mapped to a profile, its model to a preset,
//                         its precision from its dtype (or the caller's); records under load,
//                         decode latencies of pruned runs, prompts after a cached context and
//                         records of other hardware are counted and left out
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "calibrate/fit_measurements.h"
#include "calibrate/measurements.h"
#include "hwmodels/profile.h"

namespace lp::calib {

struct MeasurementFile {
  std::string path, sha256;
  size_t records = 0;
  std::vector<std::pair<std::string, std::string>> side_files;  // (path, sha256): vLLM's .pytorch.json
};
struct MeasurementSet {
  std::vector<MeasurementFile> files;
  std::vector<Measurement> records;  // repetitions merged
  int repeated = 0;                  // records averaged into an earlier one
};
// Throws lp::Error naming the file that cannot be imported, or lp::UsageError naming two files
// that hold the same bytes.
MeasurementSet read_measurement_set(const std::vector<std::string>& paths);

struct PointMapping {
  std::map<std::string, std::string> models;    // a file's model name -> preset
  std::map<std::string, std::string> hardware;  // a file's hardware name -> profile
  // Precision fields to impose on every record ("" keeps what the record's dtype gives).
  std::string weights, compute, kv;
};
struct PointSelection {
  std::vector<Point> points;  // pointing into the set's records: the set must outlive them
  int under_load = 0, pruned_decode = 0, cached_context = 0;
  int unnamed_hw = 0;                   // records without a hardware name, taken as the base's
  std::map<std::string, int> other_hw;  // profile -> records left out
  std::map<std::string, int> notes;     // the importers' notes -> records
  // "3 measured under load (TTFT includes queueing); 2 on h100-sxm (--base is l4)", or "".
  std::string skipped(const std::string& base) const;
};
// Throws lp::UsageError naming the record for an unknown hardware or model name (and how to map
// it), a dtype with no precision, or a tensor-parallel degree the model or profile cannot take;
// lp::Error when no record is left to fit.
PointSelection select_points(const MeasurementSet& set, const hw::Profile& base, const PointMapping& map);

}  // namespace lp::calib
