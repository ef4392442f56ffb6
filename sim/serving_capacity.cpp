#include "sim/serving_capacity.h"

#include <algorithm>
#include <cmath>

#include "model/error.h"

namespace lp::sim {

namespace {
bool meets(const ServingMetrics& m, const Objectives& o) {
  return (o.ttft_p90_s <= 0 || m.ttft.p90 <= o.ttft_p90_s) && (o.itl_p90_s <= 0 || m.itl.p90 <= o.itl_p90_s);
}
}  // namespace

CapacityResult find_capacity(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                             const ServingMethod& m, const ServingConfig& cfg, const Arrivals& shape,
                             const LengthDist& prompt, const LengthDist& output, const CapacityOptions& o) {
  if (!o.objectives.any()) fail("a capacity search needs an objective (a p90 TTFT or a p90 ITL)");
  if (o.seeds < 1) fail("a capacity search needs at least one seed, got {}", o.seeds);
  if (!(o.tolerance > 0 && o.tolerance < 1))
    fail("the search's tolerance must be in (0, 1), got {}", o.tolerance);
  if (!(o.rate_lo > 0)) fail("the lowest rate must be positive, got {}", o.rate_lo);
  CapacityResult res;
  std::vector<double> rates;
  for (int k = 0; k < o.seeds; ++k) {
    const auto unit = make_workload(o.requests, {1.0, shape.cv}, prompt, output, o.seed + uint64_t(k));
    const auto metrics_at = [&](double rate) {
      ++res.simulations;
      return serving_metrics(simulate_serving(c, hw, p, m, cfg, at_rate(unit, rate)), o.objectives);
    };
    double lo = o.rate_lo;
    const ServingMetrics at_lo = metrics_at(lo);
    if (!meets(at_lo, o.objectives)) {
      if (k == 0) res.best = at_lo;
      rates.push_back(0);
      continue;
    }
    double hi = o.rate_hi > lo ? o.rate_hi : lo * 2;
    ServingMetrics at_best = at_lo;
    for (int i = 0; i < 40; ++i) {  // double until it fails
      const ServingMetrics mm = metrics_at(hi);
      if (!meets(mm, o.objectives)) break;
      lo = hi, at_best = mm, hi *= 2;
    }
    while ((hi - lo) / lo > o.tolerance) {
      const double mid = std::sqrt(lo * hi);
      const ServingMetrics mm = metrics_at(mid);
      if (meets(mm, o.objectives))
        lo = mid, at_best = mm;
      else
        hi = mid;
    }
    rates.push_back(lo);
    if (k == 0) res.at_rate = at_best;
  }
  std::vector<double> sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  res.rate = sorted[sorted.size() / 2];
  if (sorted.size() % 2 == 0) res.rate = 0.5 * (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]);
  res.rate_min = sorted.front(), res.rate_max = sorted.back();
  res.met = res.rate > 0;
  res.bracket = o.tolerance;
  return res;
}

}  // namespace lp::sim
