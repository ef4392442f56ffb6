// Serving benchmarks a user ran against their own server, with tools nobody here wrote: importers
// into one typed record, the workload each one ran as the serving simulation draws it, and the
// fit of an engine's scheduler parameters to them with held-out errors per metric
// (docs/simulator.md, "Calibrating from serving benchmarks").
//
// Metric definitions, the same in every importer: TTFT from the request's send to its first token;
// ITL each request's mean gap between its tokens after the first, (latency - TTFT) / (output - 1):
// vLLM's TPOT, guidellm's inter_token_latency_ms, AIPerf's and genai-perf's inter_token_latency
// (not vLLM's "itl", which pools every gap between streamed chunks); latency from send to last
// token; throughput completed requests and output tokens over the benchmark's duration.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "sim/serving.h"
#include "sim/serving_metrics.h"

namespace lp::calib {

inline constexpr double kNotGiven = std::numeric_limits<double>::quiet_NaN();

// A latency's summary as the file gives it, seconds; NaN where the file has none.
struct LatencySummary {
  double mean = kNotGiven, p50 = kNotGiven, p90 = kNotGiven, p99 = kNotGiven;
};

// One load point of a serving benchmark.
struct ServingBenchmark {
  std::string tool;     // "vllm bench serve", "guidellm", "aiperf", "genai-perf"
  std::string version;  // the tool's version where the file records it ("" where not)
  std::string where;    // the file, and the record or benchmark in it, for messages
  // The load: requests released at `rate` a second (infinity: all at once), gamma gaps of
  // coefficient of variation `cv` (1 Poisson, near 0 a constant rate), at most `concurrency`
  // in flight (0: no limit).
  double rate = std::numeric_limits<double>::infinity();
  double cv = 1;
  int64_t concurrency = 0;
  int64_t completed = 0;
  double duration_s = 0;
  // Per request where the file keeps them (vLLM's --save-detailed, guidellm's request records),
  // in the order sent; else empty, and the means stand for every request.
  std::vector<int64_t> prompt_tokens, output_tokens;
  double prompt_tokens_mean = 0, output_tokens_mean = 0;
  LatencySummary ttft, itl, e2e;
  double requests_per_s = 0, output_tokens_per_s = 0;
};

// Every load point in a file: a `vllm bench serve --save-result` JSON (one object, or one a line
// with --append-result), a guidellm report (0.3's and 0.4-0.8's layouts: each of its benchmarks),
// an AIPerf `profile_export_aiperf.json` or a genai-perf `*_genai_perf.json`; told apart by their
// fields. Throws lp::Error naming the file, the tool and version seen and the field: a missing
// field, a unit it cannot convert, percentiles that decrease, a concurrency of 0, counts that are
// not whole, no completed request.
std::vector<ServingBenchmark> read_serving_benchmarks(const std::string& path);

// The requests a benchmark ran, as the serving simulation takes them: `completed` requests of the
// file's lengths (each request's, else the means rounded), released at its rate (seeded gamma
// gaps; all at 0 at an infinite rate), with `clients` set to its concurrency in `cfg`.
std::vector<sim::ServingRequest> benchmark_workload(const ServingBenchmark& b, uint64_t seed);

// The figures compared, in peers' terms: p50 and p90 TTFT and ITL, throughput in output tokens/s.
enum class Figure { TtftP50, TtftP90, ItlP50, ItlP90, Throughput, kCount };
inline constexpr int kFigures = int(Figure::kCount);
const char* figure_name(Figure f);
// A benchmark's measured figure (NaN where the file has none) and a simulated run's.
double measured(const ServingBenchmark& b, Figure f);
double simulated(const sim::ServingMetrics& m, Figure f);

// What the fit may move: the engine's host time per iteration, a scale on every iteration's
// modelled device time (the engine's kernels against the profile's efficiencies), and the host time
// per request an iteration schedules (sampling, detokenising, streaming).
struct ServingFitOptions {
  bool fit_iteration = true;  // iteration_s, from 0 to 1 s
  bool fit_scale = true;      // kernel time scale, from 0.1 to 10
  bool fit_request = false;   // request_s, host time per request an iteration schedules, 0 to 100 ms
  uint64_t seed = 0;          // of the simulated workloads
};

struct PointResult {
  std::string where;
  double rate = 0;
  int64_t concurrency = 0;
  double measured[kFigures];
  double uncalibrated[kFigures];
  double calibrated[kFigures];  // with every point's fit
  double held_out[kFigures];    // with the fit of the other points (NaN with one point)
};

struct ServingFit {
  double iteration_s = 0, scale = 1, request_s = 0;  // fitted (or the base's where not fitted)
  std::vector<PointResult> points;
  // Mean absolute percentage error per figure over the points that give it: uncalibrated,
  // calibrated on all (in-sample), and held out (leave one out; NaN with one point).
  double mape_uncalibrated[kFigures], mape_calibrated[kFigures], mape_held_out[kFigures];
  int64_t simulations = 0;
};

// Fits the options' parameters to the benchmarks (the sum of squared log ratios of every figure
// each one gives, NLopt's BOBYQA), each benchmark simulated on its own workload under `cfg` (the
// engine's scheduler and K/V budget), unpruned. With two or more benchmarks, each one's figures
// are also predicted by the fit of the others (held out). Throws lp::Error for no benchmark, or
// nothing to fit.
ServingFit fit_serving_benchmarks(const ModelConfig& c, const hw::Profile& hw, const sim::Precision& p,
                                  const sim::ServingConfig& cfg, std::span<const ServingBenchmark> bs,
                                  const ServingFitOptions& o);

}  // namespace lp::calib
