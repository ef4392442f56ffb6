// The capacity search over a serving simulation (sim/serving.h): the highest arrival rate whose
// metrics meet the objectives.
#pragma once

#include <cstdint>

#include "sim/serving_metrics.h"

namespace lp::sim {

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
