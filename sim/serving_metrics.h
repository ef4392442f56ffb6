// Statistics of a serving run (sim/serving.h): latency percentiles with their confidence
// intervals, throughput, goodput against objectives, K/V utilisation.
#pragma once

#include <cstddef>
#include <vector>

#include "sim/serving.h"

namespace lp::sim {

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
  double prompt_tokens_computed_fraction_mean = 1;
};
// Metrics of requests [begin, end) of a run (all: the default).
ServingMetrics serving_metrics(const ServingRun& r, const Objectives& o, size_t begin = 0,
                               size_t end = SIZE_MAX);

}  // namespace lp::sim
