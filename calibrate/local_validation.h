// The simulator against the engine on this machine (`lazyprefill validate`), as steps with typed
// results; the command measures the cases with the engine and renders the result.
//
//   local_cases     the grid: prompt lengths x four schedules (none, two LazyLLM, frozen), cases
//                   calibrated on and held out alternating like a chessboard's squares
//   validate_local  a profile calibrated on the calibration cases' runs; every held-out case's TTFT
//                   predicted from its own trace, with the fitted profile and with the base one, op
//                   by op; every pruned case's speedup over the unpruned run at its length, measured
//                   as the median of the rounds' paired ratios, against the predicted one
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "calibrate/calibrate.h"
#include "hwmodels/profile.h"
#include "model/config.h"
#include "model/ops.h"
#include "sim/cost.h"
#include "traces/trace.h"

namespace lp::calib {

struct LocalCase {
  int64_t tokens = 0;
  std::string policy, schedule;
  bool train = false;  // calibrated on; false: held out
  // "<tokens>-<policy>-<schedule>", a file name (':' -> '_', ',' -> '+').
  std::string label() const;
};
// The grid's prompt lengths: 256, 1024, 4096 and 8192 tokens (quick: 256, 512, 1024, 2048).
std::vector<int64_t> local_lengths(bool quick);
// Four schedules at each length (none, two LazyLLM ones, frozen), a checkerboard of them calibrated
// on and the rest held out: 16 cases over local_lengths.
std::vector<LocalCase> local_cases(const std::vector<int64_t>& lengths);
inline std::vector<LocalCase> local_cases(bool quick) {
  return local_cases(local_lengths(quick));
}

// One case as the engine ran it: its fastest round, and every round's prefill time in round
// order (all cases have the same number of rounds, run alternated, so round r of two cases ran a
// few seconds apart).
struct MeasuredCase {
  LocalCase c;
  RunMeasurement run;  // the fastest round
  trace::Trace trace;  // the fastest round's trace
  std::vector<double> rounds_prefill_s;
};

struct OpCheck {
  Op op;
  double measured_ms = 0, predicted_ms = 0, error_pct = 0;
};
struct HeldOutCase {
  LocalCase c;
  double measured_ms = 0, predicted_ms = 0, error_pct = 0;
  double base_predicted_ms = 0;  // with the profile before the fit
  std::vector<OpCheck> ops;      // the ops the run timed, in Op order
  // The op with the largest |error| among those over 5% of the measured TTFT; null if none.
  const OpCheck* worst_op() const;
};
struct SpeedupCheck {
  LocalCase c;
  bool held_out = false;  // the case or its unpruned run was held out
  double measured = 0;    // median over the rounds of the paired ratio (unpruned / pruned prefill)
  double measured_min = 0, measured_max = 0;
  double fastest_runs = 0;  // the ratio of the two fastest runs
  double predicted = 0;     // with the fitted profile, from the two runs' traces
  bool within_range = false;
  double error_points = 0;  // 100 x (predicted - measured): 1.50x vs 1.47x is 3 points
};
struct LocalValidation {
  hw::Profile fitted;
  CalibrationReport report;
  std::vector<RunMeasurement> train;  // the runs calibrated on
  std::vector<HeldOutCase> held;
  double mape_pct = 0, base_mape_pct = 0;
  std::vector<SpeedupCheck> speedups;  // pruned cases with an unpruned run at their length
  double worst_points = 0, worst_points_held_out = 0;
  int within_range = 0;
};

// Throws lp::Error when no case is calibrated on or none is held out, or when the cases' rounds
// differ in number.
LocalValidation validate_local(const hw::Profile& base, const ModelConfig& c, const sim::Precision& precision,
                               const std::vector<MeasuredCase>& cases);

}  // namespace lp::calib
