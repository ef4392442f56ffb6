// The serving simulation (sim/serving.h) against a measured load test (bench/serve_load.py's
// summary and the server's request logs, tests/fixtures/serving/), as a pipeline of named steps
// with typed results; `lazyprefill validate --serving DIR` renders them.
//
//   read_load_test      the summary (rates, requests per rate, the server's budgets) and the logs
//   calibrate_serving   a profile fitted to the lowest rate's requests that ran alone (prefills and
//                       unpruned decoding as single-request points; decoding attention's share of
//                       peak, and with DIR/lone the op-by-op fit's level, by Brent's method on the
//                       lone decodes through the serving simulation); the revival model or share
//   machine_drift       how much faster or slower the machine ran at each rate than at the first
//   compare_rates       every request replayed at its logged arrival; each rate's TTFT p50/p90, ITL
//                       p50 and throughput against the log's, with the measured figure's interval
//                       and the prediction's band over the drift
//
// Targets (issue 22): within 10% at every rate below saturation, saturation within 15%.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "calibrate/fit_measurements.h"
#include "calibrate/lone_decode.h"
#include "hwmodels/profile.h"
#include "model/config.h"
#include "pruning/schedule.h"
#include "sim/revival.h"
#include "sim/serving_metrics.h"

namespace lp::calib {

// A load test: its rates, and per method (none, lazyllm) the requests that did not end in an
// error, in arrival order, per_rate of them per rate.
struct LoadTest {
  std::string dir;
  std::vector<double> rates;
  int64_t per_rate = 0;
  int64_t kv_budget_mib = 1024, max_batch_tokens = 2048;  // the server's, from the summary's argv
  struct Method {
    std::string name;
    std::vector<sim::LoggedRequest> log;
  };
  std::vector<Method> methods;
};
// Throws lp::Error naming the file and the problem: no summary, no rates or fewer than 3 requests
// per rate, a log whose times are missing or out of order, or whose count is not rates x per_rate.
LoadTest read_load_test(const std::string& dir);

struct ServingValidationOptions {
  std::string preset = "smollm2-135m";  // the model's configuration
  std::string base;                     // the profile the fit starts from
  std::string dtype;                    // the server's compute dtype (precision_for_dtype)
  std::string revival_model;            // a revival model file; "" for DIR/revivals.json or the log's share
  bool revival_share_from_log = false;  // the share of active tokens revived, from the log's counts
};

struct ServingCalibration {
  ModelConfig model;
  sim::Precision precision;
  Schedule schedule;  // LazyLLM's (the default)
  hw::Profile hw;     // fitted
  size_t points = 0;  // single-request points
  MeasurementFit fit;
  double revival_share = 0;  // per stage and decoding step, from the log
  std::optional<sim::RevivalModel> revival_model;
  double decode_compute = 0;  // decoding attention's share of peak, fitted
  size_t lone_decodes = 0;    // lone requests with decoding steps it was fitted on
  std::optional<LoneDecodeFit> lone_fit;
  std::map<std::string, double> decode_rms_before, decode_rms_after;  // per method, log error
  std::map<std::string, sim::ServingMethod> methods;                  // none, lazyllm
  sim::ServingConfig config;                                          // the server's budgets
};
ServingCalibration calibrate_serving(const LoadTest& t, const ServingValidationOptions& o);

struct DriftPoint {
  double rate = 0;
  std::string method;
  size_t lone_prefills = 0;
  double drift = 0;  // the median measured / predicted lone prefill against the first rate's, - 1
};
struct MachineDrift {
  double largest = 0;
  std::vector<DriftPoint> by_rate;
};
MachineDrift machine_drift(const LoadTest& t, const ServingCalibration& cal);

// One figure of one rate: measured, predicted, relative error; the prediction's band over the
// machine's drift and the measured figure's 95% interval (percentiles only), in the figure's unit
// (ms, or requests/s), and whether they meet.
struct FigureCheck {
  double measured = 0, predicted = 0, error = 0;
  double band_lo = 0, band_hi = 0;
  std::optional<sim::QuantileInterval> interval;
  bool consistent = false;
};
enum class Figure { TtftP50, TtftP90, ItlP50, Throughput };  // in this order (indexes)
inline constexpr Figure kFigures[] = {Figure::TtftP50, Figure::TtftP90, Figure::ItlP50, Figure::Throughput};
const char* figure_key(Figure f);    // "ttft_p50", ..., "requests_per_s"
const char* figure_field(Figure f);  // "ttft_p50_ms", ..., "requests_per_s"

struct RateComparison {
  double rate = 0;
  std::string method;
  bool calibrated_on = false;     // the first rate
  bool below_saturation = false;  // the rate is under the measured saturation throughput
  std::map<Figure, FigureCheck> figures;
};
// How well a rate's n requests pin a percentile, by the simulation's own long run at that rate.
struct SamplingSpread {
  int64_t requests = 0;
  int draws = 0;
  size_t sample_size = 0;
  bool stable = false;  // false where the simulation saturates at this rate
  double long_run = 0, share_within_10pct = 0, lo = 0, hi = 0;
};
struct OutsideTarget {
  size_t row = 0;  // in RateComparisons::rows
  double rate = 0;
  std::string method;
  Figure figure = Figure::TtftP50;
  double error = 0;
  bool consistent = false;
  std::optional<SamplingSpread> sampling;  // percentiles only
};
struct Saturation {
  std::string method;
  double measured = 0, predicted = 0, error = 0;
};
struct RateComparisons {
  std::vector<RateComparison> rows;  // per method, per rate
  std::vector<Saturation> saturation;
  double worst_below_saturation = 0;
  bool within_targets = true;
  std::vector<OutsideTarget> outside;
  bool outside_within_uncertainty = false;
};
RateComparisons compare_rates(const LoadTest& t, const ServingCalibration& cal, const MachineDrift& drift);

}  // namespace lp::calib
