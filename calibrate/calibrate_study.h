// `lazyprefill calibrate` as one call, which the CLI and the Python module's calibrate both make: a
// hardware profile fitted to measurements, either per op family to `run --json` outputs (--runs:
// calibrate/calibrate.h) or to end-to-end TTFTs and decode latencies from other tools
// (--measurements: calibrate/measurement_points.h, calibrate/fit_measurements.h). Everything is read
// and checked before anything is fitted, and the fitted profile is written whole (write_file_atomic)
// only after the fit, with its provenance: the date, the inputs and, for measurements, a
// `calibration` record with every file's SHA-256, what was fitted and the errors.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "calibrate/calibrate.h"
#include "calibrate/fit_measurements.h"
#include "hwmodels/profile.h"

namespace lp::calib {

struct CalibrateRequest {
  std::string runs;                         // a folder of run --json outputs (*.json): every op family
  std::vector<std::string> measurements;    // or measurement files: what end-to-end figures identify
  std::string base;                         // the profile to start from: a built-in name or a .json file
  std::optional<hw::Profile> base_profile;  // or the profile itself (the Python module's Profile)
  std::string name;                         // the fitted profile's name ("": the base's)
  std::string out;                          // where to write it ("": nowhere)
  // --measurements only: NAME=PRESET and NAME=PROFILE for the names the files write, the parameters
  // to fit (empty: every one the data identify), precision fields imposed on every record ("": from
  // each record's dtype), the engine the fit is costed with ("": the base's).
  std::vector<std::string> model_map, hw_map, fit;
  std::string weights, compute, kv, engine;
};

// A measurement point after the fit (calibrate --measurements --json's "points").
struct CalibratedPoint {
  std::string file, model, preset;
  int record = 0;
  bool ttft = true;  // else a decode latency
  int64_t prompt_tokens = 0, context_tokens = 0;
  int batch = 1, tp = 1, repetitions = 1;
  double measured_s = 0, base_s = 0, fit_s = 0, held_out_s = 0;
};

struct CalibrateResult {
  bool from_runs = false;
  hw::Profile base;                 // as fitted from (with --engine's engine)
  hw::Profile fitted;               // the fit's own values, as the tables print them
  nlohmann::ordered_json document;  // the fitted profile's file document: what `out` holds
  hw::Profile profile;              // that document read back, as a run given the file loads it
  std::string out;                  // where it was written ("": not written)

  // --runs: per family the fit and per run measured against predicted prefill time.
  std::vector<RunMeasurement> runs;
  CalibrationReport report;

  // --measurements: the fit, its points, and what was read and left out.
  MeasurementFit fit;
  std::vector<CalibratedPoint> points;
  nlohmann::ordered_json calibration;  // the profile's `calibration` record
  size_t records = 0, files = 0;       // records read (repetitions merged), files read
  int repeated = 0;                    // records averaged into an earlier one
  int unnamed_hw = 0;                  // records without a hardware name, taken as the base's
  std::string skipped;                 // what was left out and why ("": nothing)
  std::map<std::string, int> notes;    // the importers' notes -> records

  // `calibrate --json`'s document.
  nlohmann::ordered_json to_json() const;
};

// Reads, checks, fits and (with `out`) writes. Throws lp::UsageError for a request that gives
// neither or both inputs, a --measurements option with --runs, or `out` naming an input; lp::Error
// for unreadable inputs or nothing to fit; nothing is written then.
CalibrateResult calibrate_profile(const CalibrateRequest& r);

// The per-op fit as calibrate --runs --json and validate print it: per family the fitted
// parameters and residuals, per run measured against predicted prefill time.
nlohmann::ordered_json calibration_json(const hw::Profile& fitted, const CalibrationReport& rep,
                                        const std::vector<RunMeasurement>& runs);
// The fitted profile's document: the base's fields, the fitted efficiency block, `name`, and
// sources.efficiency naming how it was made (`provenance`).
nlohmann::ordered_json fitted_profile_json(const hw::Profile& fitted, const std::string& name,
                                           const std::string& provenance);
// That document written whole to `path` (write_file_atomic), its text UTF-8 safe.
void write_fitted_profile(const std::string& path, const hw::Profile& fitted, const std::string& name,
                          const std::string& provenance);
// Today's date (UTC) as a calibration's provenance writes it: "2026-11-30".
std::string today_utc();

}  // namespace lp::calib
