// `lazyprefill calibrate-serving` as one call, which the CLI and the Python module's calibrate_serving
// both make: an engine's scheduler parameters (kernel time scale, host time per iteration and per
// request) fitted to the user's own serving benchmarks (calibrate/serving_benchmarks.h), with each
// figure's error before the fit, after it and held out; with `out`, the profile carrying the fitted
// engine written whole. The request carries the CLI's options with its defaults; their ranges are
// checked here, so both front ends refuse a value in the same words.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "calibrate/serving_benchmarks.h"
#include "hwmodels/profile.h"
#include "model/config.h"
#include "sim/cost.h"
#include "sim/serving_study.h"

namespace lp::calib {

struct CalibrateServingRequest {
  std::vector<std::string> benchmarks;    // vllm bench serve, guidellm, AIPerf or genai-perf files
  std::string model, model_config;        // a GGUF file's shape, or a preset or configuration file
  std::optional<ModelConfig> config;      // or the model itself (the Python module's Model)
  std::string hw;                         // the server's profile: a built-in name or a .json file
  std::optional<hw::Profile> hw_profile;  // or the profile itself
  std::string engine;                     // the server's engine preset ("": the profile's)
  sim::Precision precision;
  sim::SchedulerOverrides sched;
  std::optional<double> kv_budget_mib;  // unset: kv_fraction of the memory less the weights
  double kv_fraction = 0.9;             // vLLM's gpu_memory_utilization
  double kv_element_bytes = 0;          // 0: the kv precision's
  int tp = 1;
  std::string fit = "scale,iteration";  // of scale, iteration, request
  uint64_t seed = 0;                    // of the simulated arrivals
  std::string out;                      // write the profile with the fitted engine here ("": nowhere)
};

struct CalibrateServingResult {
  std::string model, fit_spec;
  hw::Profile hw;             // as simulated (with the request's engine)
  sim::ServingConfig config;  // the scheduler and K/V budget the benchmarks were simulated under
  ServingFit fit;
  size_t benchmarks = 0;               // runs read from the files
  nlohmann::ordered_json document;     // with `out`: the profile with the fitted engine
  std::optional<hw::Profile> profile;  // that document read back, as a run given the file loads it
  std::string out;                     // where it was written ("": not written)
  // `calibrate-serving --json`'s document.
  nlohmann::ordered_json to_json() const;
};

// Reads, checks, fits and (with `out`) writes. Throws lp::UsageError for a value out of its range, an
// unknown --fit part, `out` naming an input; lp::Error for unreadable benchmarks or no memory left for
// K/V; nothing is written then.
CalibrateServingResult calibrate_serving(const CalibrateServingRequest& r);

// ms for times, tokens/s for throughput, as the tools print them (the document's units).
double shown(Figure f, double v);

}  // namespace lp::calib
