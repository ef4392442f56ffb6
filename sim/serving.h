// Serving under load, discrete-event (docs/simulator.md, "Serving"): the scheduler `lazyprefill
// serve` runs (engine/scheduler.cpp), replayed on iterations the per-op cost model prices. Each
// iteration takes the FIFO queue's head while its K/V reservation fits the budget and its prompt
// the iteration's token budget (the first prefill of an iteration always fits the token budget),
// then runs one decoding row for every request that was running and the prefill of each admitted
// one together; its time is the ops of the summed work (sim/layer_cost.h: GEMMs over all rows,
// attention over each request's own keys) plus a fixed per-iteration overhead. A request's rows,
// keys and revivals per layer are those of its synthetic trace (traces/synthetic.h) under its
// method, so LazyLLM's pruned prefills and its revivals' extra decoding rows price each iteration.
// Chunked prefill (vLLM's): a prompt longer than the chunk runs in chunks of the token budget
// over several iterations, the decoding rows riding along; under LazyLLM only the last chunk can
// prune (scoring needs the last token), so every chunk before it is computed at every layer.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "admission/admission.h"
#include "hwmodels/profile.h"
#include "model/config.h"
#include "pruning/method.h"
#include "pruning/schedule.h"
#include "sim/cost.h"
#include "traces/synthetic.h"

namespace lp::sim {

// One request as it arrives.
struct ServingRequest {
  double arrival_s = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
};

// ---- workloads ----

// A length distribution: fixed N, uniform over [lo, hi], or drawn from a list (a file's lengths).
struct LengthDist {
  enum class Kind { Fixed, Uniform, Samples } kind = Kind::Fixed;
  int64_t lo = 1, hi = 1;
  std::vector<int64_t> samples;
  // "N", "LO:HI", or "file:PATH" (one positive whole number a line, or the prompt_tokens /
  // output_tokens column named by `column` of a CSV or a serve --log-requests file). Throws
  // lp::Error naming `what` and the problem.
  static LengthDist parse(const std::string& s, const std::string& what, const std::string& column);
  // Lengths drawn uniformly from `samples` (not empty, each in [1, 2^24]; unchecked here).
  static LengthDist from_samples(std::vector<int64_t> samples);
  std::string describe() const;
  int64_t max() const;
};

// Arrivals: Poisson at `rate` requests/s, or gamma-distributed gaps of mean 1 / rate and
// coefficient of variation `cv` (1 is Poisson; above 1, burstier).
struct Arrivals {
  double rate = 1;
  double cv = 1;
};

// n requests, seeded: the gaps are drawn once as unit-mean variates and divided by the rate, so
// the same seed at a higher rate gives the same requests, each arriving earlier in proportion
// (common random numbers: a capacity search compares rates on the same draws). Boost.Random's
// generators and distributions, so the draws are the same on every platform.
std::vector<ServingRequest> make_workload(int64_t n, const Arrivals& a, const LengthDist& prompt,
                                          const LengthDist& output, uint64_t seed);
// The same requests at `rate` (scaling a workload made at rate 1).
std::vector<ServingRequest> at_rate(std::span<const ServingRequest> unit, double rate);

// One line of a `serve --log-requests` file: its times (seconds since the server started; NaN where
// the line has none), counts, and whether it ended in an error.
struct LoggedRequest {
  double arrival_s = 0, admitted_s = 0, first_token_s = 0, finished_s = 0;
  int64_t prompt_tokens = 0, output_tokens = 0, revivals = 0;
  bool error = false;
  int64_t line = 0;  // in the file, for messages
};
// Every line of a request log, sorted by arrival (the server writes them as requests finish).
// Throws lp::Error naming the file, line and problem: not a JSON object, no number arrival_s,
// prompt_tokens or output_tokens, a negative or non-finite arrival, counts that are not whole.
std::vector<LoggedRequest> read_request_log(const std::string& path);

// Requests from a file: a CSV with a header naming arrival_s, prompt_tokens and output_tokens (any
// order, other columns ignored) whose arrival times are sorted and non-negative; or a `serve
// --log-requests` file (JSON lines, written as requests finish, so sorted here by arrival_s; its
// requests that ended in an error are left out). Throws lp::Error naming the file, line and
// problem.
std::vector<ServingRequest> read_requests(const std::string& path);

// ---- the simulation ----

struct ServingMethod {
  std::string name = "none";
  Method method;                 // the policy and the schedule it prunes by
  std::vector<PruneStep> steps;  // the schedule resolved for the model
  double drop_share = 0;         // random-drop: the share of each prompt dropped before the model
  trace::Revivals revivals;      // synthetic decoding's revivals (empty: none)
};
// `method` as the serving simulation runs it on an n_layer model: its schedule resolved
// (resolve_method: a lp::UsageError when it does not fit the policy) and random-drop's share,
// with the revivals given; named `name`, or the policy's name when that is "".
ServingMethod serving_method(const Method& method, int n_layer, trace::Revivals revivals = {},
                             std::string name = "");

struct ServingConfig {
  int64_t max_batch_tokens = 8192;  // rows per iteration (serve --max-batch-tokens)
  double kv_budget_bytes = 0;       // K/V reservations admitted at once (serve --kv-budget-mib)
  double kv_element_bytes = 2;      // bytes of one K or V element in the cache (2: the CPU's f16)
  int64_t kv_block = 64;            // cache capacity rounded up to this many tokens (the CPU layout)
  int64_t chunk_tokens = 0;         // > 0: chunked prefill, chunks of at most this many prompt tokens
  double iteration_overhead_s = 0;  // the scheduler's time per iteration beyond the batch
  // Every iteration's time multiplied by this: a machine that runs this much slower (> 1) or
  // faster than its profile says (validate --serving's sensitivity to the machine's drift).
  double time_scale = 1;
  int tp = 1;
  int64_t kv_samples = 512;  // points of the K/V utilisation series kept (evenly over the run)
};

// What one request saw.
struct RequestOutcome {
  double arrival_s = 0, admitted_s = 0, first_token_s = 0, finished_s = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  double prompt_share = 1;  // of its prompt's (token, layer) pairs, the prefill computed
  double ttft_s() const { return first_token_s - arrival_s; }
  double queue_s() const { return admitted_s - arrival_s; }
  double e2e_s() const { return finished_s - arrival_s; }
  // Mean gap between its tokens after the first (0 for one token), as guidellm reports it.
  double itl_s() const;
};

struct KvPoint {
  double t_s = 0, reserved = 0, used = 0;  // bytes
};

struct ServingRun {
  std::vector<RequestOutcome> requests;  // in arrival order
  int64_t iterations = 0;
  double end_s = 0;             // the last request's finish
  double kv_capacity = 0;       // the budget, bytes
  std::vector<KvPoint> kv;      // utilisation over time (sampled)
  double kv_reserved_mean = 0;  // time-weighted over the run, bytes
  double kv_reserved_peak = 0;
};

// The K/V layout a configuration's reservations count in (lp::reservation_bytes, the policy the
// engine's scheduler runs: admission/admission.h).
inline KvLayout kv_layout(const ServingConfig& cfg) {
  return KvLayout{cfg.kv_element_bytes, cfg.kv_block};
}

// Runs the requests (sorted by arrival) through the scheduler. Throws lp::Error for a request
// whose reservation exceeds the K/V budget (it could never run), a budget of zero, or a bad
// configuration.
ServingRun simulate_serving(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                            const ServingMethod& m, const ServingConfig& cfg,
                            std::span<const ServingRequest> reqs);

// ---- metrics ----

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
};
// Of `v` (empty: zeros), by linear interpolation between order statistics (numpy's default).
Percentiles percentiles(std::vector<double> v);

// A distribution-free confidence interval for the q-quantile of the population `v` was drawn from:
// the order statistics x(l) <= x(u) with P(l <= B <= u - 1) >= level for B ~ Binomial(n, q), each
// end as far in as that allows. An end the sample cannot bound (too few samples beyond it) is the
// sample's extreme, marked open.
struct QuantileInterval {
  double lo = 0, hi = 0;
  bool lo_open = false, hi_open = false;
};
QuantileInterval quantile_interval(std::vector<double> v, double q, double level = 0.95);

// The q-quantile of sorted `v` (not empty), interpolated as percentiles() does.
double quantile_sorted(const std::vector<double>& v, double q);

// How well a sample of n pins the q-quantile of the population `values`: `draws` samples of n
// without replacement (Boost.Random, seeded), each one's q-quantile; the share of them within
// `tolerance` (relative) of the population's, and their 5th and 95th percentiles. What a load
// test of n requests a rate can hold a percentile to, given the distribution the simulation
// predicts. Throws lp::Error for n outside [1, values.size()] or draws < 1.
struct SampleSpread {
  double population = 0;    // the q-quantile of all of `values`
  double share_within = 0;  // of the draws
  double lo = 0, hi = 0;    // the draws' 5th and 95th percentiles
};
SampleSpread sample_quantile_spread(std::vector<double> values, double q, size_t n, double tolerance,
                                    int draws = 4000, uint64_t seed = 1);

struct Objectives {
  double ttft_p90_s = 0;  // 0: none
  double itl_p90_s = 0;
  bool any() const { return ttft_p90_s > 0 || itl_p90_s > 0; }
};

struct ServingMetrics {
  int64_t requests = 0;
  double duration_s = 0;  // first arrival to last finish
  Percentiles ttft, itl, e2e, queue;
  double requests_per_s = 0, output_tokens_per_s = 0, prompt_tokens_per_s = 0;
  double goodput_per_s = 0;  // requests/s whose TTFT and ITL each meet the objectives
  double kv_utilisation_mean = 0, kv_utilisation_peak = 0;  // reserved / budget
  double prompt_share_mean = 1;
};
// Metrics of requests [begin, end) of a run (all: the default).
ServingMetrics serving_metrics(const ServingRun& r, const Objectives& o, size_t begin = 0,
                               size_t end = SIZE_MAX);

// ---- capacity ----

struct CapacityOptions {
  Objectives objectives;
  double rate_lo = 0.01, rate_hi = 0;  // requests/s; rate_hi 0: from the batch-1 service time
  double tolerance = 0.01;             // relative width at which the search stops
  int seeds = 3;            // workloads (seeds seed..seed + seeds - 1); the capacity is their median
  int64_t requests = 2000;  // per workload
  uint64_t seed = 0;
};

struct CapacityResult {
  bool met = false;                   // some rate meets the objectives
  double rate = 0;                    // the median over seeds of the highest rate that meets them
  double rate_min = 0, rate_max = 0;  // over the seeds
  double bracket = 0;                 // the search's own resolution (relative)
  ServingMetrics at_rate;             // the first seed's metrics at `rate`
  ServingMetrics best;                // unmet: at the lowest rate tried, the best p90s reachable
  int64_t simulations = 0;
};

// The highest arrival rate whose p90 TTFT and p90 ITL meet the objectives, per seed by bisection
// on the rate (common random numbers: each seed's workload is scaled, not redrawn), with the
// seeds' spread as its uncertainty. Throws lp::Error when the objectives are missing.
CapacityResult find_capacity(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                             const ServingMethod& m, const ServingConfig& cfg, const Arrivals& shape,
                             const LengthDist& prompt, const LengthDist& output, const CapacityOptions& o);

}  // namespace lp::sim
