// Calibration: fit a hardware profile's per-family efficiencies (sim/cost.h) to measured runs.
//
// The measurements are `run --json` objects: every prefill op of every layer with its time,
// FLOPs, bytes, mean rows and calls (the engine's timers, counted by the same op_flops/op_bytes
// the simulator uses). Per op family the fit minimises the weighted Huber loss (weights: each
// sample's share of its run's time, so every run counts the same) of
// log(predicted / measured) over (compute, half_rows, memory, overhead) with NLopt's BOBYQA from
// the base profile's values: deterministic, and robust to a few slow outliers (a noisy machine).
// A parameter the data cannot identify keeps the base value: half_rows when the family's row
// counts span less than 4x, everything when a family has fewer than 4 samples.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "model/ops.h"
#include "sim/cost.h"

namespace lp::calib {

struct OpSample {
  Op op;
  int layer;  // -1 outside the layers
  double rows = 0, flops = 0, bytes = 0, seconds = 0;
  int64_t calls = 0;
};

struct RunMeasurement {
  std::string origin;   // file name or case label
  std::string compute;  // the dtype GEMMs ran at ("f32", "bf16")
  int64_t prompt_tokens = 0;
  int threads = 0;            // the CPU engine's threads (0: unknown or a GPU run: the whole part)
  double prefill_s = 0;       // measured wall time of the prefill
  std::vector<OpSample> ops;  // the prefill's ops, per layer
};

// Reads a run --json object. Throws lp::Error naming `origin` and the missing or bad field.
RunMeasurement measurement_from_run_json(const nlohmann::json& j, const std::string& origin);

// Predicted time of one sample on a profile (the cost model on the sample's own counts), on
// `share` of the part (hw::thread_share).
double predict_sample(const hw::Profile& hw, const OpSample& s, const std::string& compute, double share = 1);
// Predicted prefill time of a run: its samples' predictions summed, on the share of a CPU profile
// its threads had (a one-thread run on a two-core profile: half its peaks and bandwidth), so runs
// on any number of threads calibrate one profile of the whole part.
double predict_prefill(const hw::Profile& hw, const RunMeasurement& m);

struct FamilyFit {
  hw::Family family;
  int samples = 0;
  bool fitted = false;  // false: too few samples, base values kept
  bool half_rows_fitted = false;
  double median_abs_err = 0;  // |predicted / measured - 1| over the family's samples, after the fit
  double p90_abs_err = 0;
  double time_share = 0;  // share of the measured time in this family
  std::string stop;       // how the optimiser stopped when it did not converge ("" when it did)
};

struct CalibrationReport {
  std::vector<FamilyFit> families;
  std::vector<std::pair<double, double>> runs;  // (measured, predicted) prefill seconds per run
};

// The base profile with efficiencies fitted to `runs` (efficiency.default = false; the caller
// records the provenance). Throws lp::Error when there is nothing to fit.
hw::Profile calibrate(const hw::Profile& base, const std::vector<RunMeasurement>& runs,
                      CalibrationReport* report);

}  // namespace lp::calib
