// The KV-Runahead timeline (sim/runahead.h) against measured runs (`lazyprefill validate
// --runahead DIR`; tests/fixtures/runahead/, bench/runahead_ttft.sh KEEP=DIR), as steps with typed
// results; the command renders them.
//
//   read_runahead_fixtures  a folder's `mpirun -n P run --runahead --json` outputs and its
//                           single-process `run --json` outputs
//   validate_runahead       the profile calibrated on the single processes (per-op timings, any
//                           thread count: each run priced on the share of the part its threads
//                           had); every KV-Runahead run predicted from its own partition, ranks
//                           and threads per rank; medians per (prompt, partition, threads) compared
//
// Issue 23's target: TTFT within 10%.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "calibrate/calibrate.h"
#include "hwmodels/profile.h"
#include "model/config.h"
#include "sim/cost.h"

namespace lp::calib {

// One measured `run --runahead --json` output.
struct RunaheadRun {
  std::string origin;
  ModelConfig config;
  sim::Precision precision;
  std::vector<int64_t> partition;
  std::string rule;  // --partition as given: auto, even or sizes
  int threads = 1;   // per rank
  double ttft_s = 0;
  std::vector<double> wait_s;  // per rank, where the output has them
  int64_t prompt_tokens() const;
};
// Throws lp::Error naming `origin` and the field: a missing or mistyped field, a dtype or K/V
// dtype the engine has not, a partition that is not one chunk of at least a token per rank (two
// ranks or more) summing to the prompt, threads below 1, a TTFT that is not a positive number.
RunaheadRun read_runahead_run(const nlohmann::json& j, const std::string& origin);

struct RunaheadFixtures {
  std::string dir;
  std::vector<RunMeasurement> singles;  // the single-process runs, named by file
  std::vector<RunaheadRun> runs;
};
// Every *.json file of `dir` in name order. Throws lp::Error naming the file, or the folder when it
// has no single-process run or no KV-Runahead run.
RunaheadFixtures read_runahead_fixtures(const std::string& dir);

// Single-process runs with the same prompt and threads, their medians.
struct SingleProcessCheck {
  int64_t prompt_tokens = 0;
  int threads = 0;
  size_t runs = 0;
  double measured_s = 0, predicted_s = 0, error = 0;  // error: predicted / measured - 1
};
struct RankCheck {
  int64_t tokens = 0;
  std::optional<double> measured_wait_s;  // median over the runs that reported it
  double predicted_wait_s = 0, predicted_done_s = 0;
};
// KV-Runahead runs with the same prompt, partition and threads per rank, their medians.
struct RunaheadCheck {
  int64_t prompt_tokens = 0;
  std::vector<int64_t> partition;
  std::string rule;
  int threads_per_rank = 0;
  size_t runs = 0;
  double measured_s = 0, predicted_s = 0, error = 0;
  std::vector<RankCheck> ranks;
  // What the calibrated profile would have balanced instead (run --runahead --runahead-hw FILE).
  std::vector<int64_t> calibrated_partition;
  double calibrated_predicted_s = 0;
};
// At a prompt measured both balanced ("auto") and "even": the ratio of their TTFTs.
struct AutoOverEven {
  int64_t prompt_tokens = 0;
  double measured = 0, predicted = 0;
};
struct RunaheadValidation {
  hw::Profile fitted;
  CalibrationReport report;
  std::vector<SingleProcessCheck> single;  // by (prompt, threads)
  std::vector<RunaheadCheck> runahead;     // by (prompt, partition, threads)
  std::vector<AutoOverEven> auto_over_even;
  double worst_abs_error = 0;
  static constexpr double kTarget = 0.10;
  bool within_target() const { return worst_abs_error <= kTarget; }
};
RunaheadValidation validate_runahead(const hw::Profile& base, const RunaheadFixtures& f);

}  // namespace lp::calib
