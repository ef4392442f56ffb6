#include "sim/serving_metrics.h"

#include <algorithm>
#include <boost/math/distributions/binomial.hpp>
#include <boost/random/mersenne_twister.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <cmath>

#include "model/error.h"

namespace lp::sim {

double quantile_sorted(const std::vector<double>& v, double q) {
  const double x = std::clamp(q, 0.0, 1.0) * double(v.size() - 1);
  const size_t i = size_t(x);
  const double f = x - double(i);
  return i + 1 < v.size() ? v[i] + f * (v[i + 1] - v[i]) : v[i];
}

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  p.p50 = quantile_sorted(v, 0.5), p.p90 = quantile_sorted(v, 0.9), p.p99 = quantile_sorted(v, 0.99);
  double s = 0;
  for (double x : v) s += x;
  p.mean = s / double(v.size());
  return p;
}

QuantileInterval quantile_interval(std::vector<double> v, double q, double level) {
  QuantileInterval r;
  if (v.empty()) return r;
  std::sort(v.begin(), v.end());
  const int64_t n = int64_t(v.size());
  const boost::math::binomial_distribution<double> B(double(n), std::clamp(q, 0.0, 1.0));
  const double tail = (1 - level) / 2;
  // l: the largest rank with P(B <= l - 1) <= tail; u: the smallest with P(B >= u) <= tail.
  int64_t l = 0, u = n + 1;
  while (l + 1 <= n && boost::math::cdf(B, double(l)) <= tail) ++l;
  while (u - 1 >= 1 && boost::math::cdf(boost::math::complement(B, double(u - 2))) <= tail) --u;
  r.lo_open = l < 1;
  r.hi_open = u > n;
  r.lo = v[size_t(std::clamp<int64_t>(l, 1, n) - 1)];
  r.hi = v[size_t(std::clamp<int64_t>(u, 1, n) - 1)];
  return r;
}

SampleSpread sample_quantile_spread(std::vector<double> values, double q, size_t n, double tolerance,
                                    int draws, uint64_t seed) {
  if (n < 1 || n > values.size()) fail("a sample of {} cannot be drawn from {} values", n, values.size());
  if (draws < 1) fail("the number of draws must be positive, got {}", draws);
  SampleSpread r;
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  r.population = quantile_sorted(sorted, q);
  boost::random::mt19937_64 rng(seed);
  std::vector<double> sample(n), got;
  got.reserve(size_t(draws));
  int within = 0;
  for (int d = 0; d < draws; ++d) {
    for (size_t i = 0; i < n; ++i) {  // the first n of a partial Fisher-Yates shuffle
      const size_t j = boost::random::uniform_int_distribution<size_t>(i, values.size() - 1)(rng);
      std::swap(values[i], values[j]);
      sample[i] = values[i];
    }
    std::sort(sample.begin(), sample.end());
    const double x = quantile_sorted(sample, q);
    within += std::fabs(x - r.population) <= tolerance * std::fabs(r.population) ? 1 : 0;
    got.push_back(x);
  }
  std::sort(got.begin(), got.end());
  r.share_within = double(within) / double(draws);
  r.lo = quantile_sorted(got, 0.05), r.hi = quantile_sorted(got, 0.95);
  return r;
}

ServingMetrics serving_metrics(const ServingRun& r, const Objectives& o, size_t begin, size_t end) {
  end = std::min(end, r.requests.size());
  ServingMetrics m;
  if (begin >= end) return m;
  std::vector<double> ttft, itl, e2e, queue;
  double first = r.requests[begin].arrival_s, last = 0, out = 0, in = 0, share = 0;
  int64_t good = 0;
  for (size_t i = begin; i < end; ++i) {
    const RequestOutcome& q = r.requests[i];
    ttft.push_back(q.ttft_s());
    if (q.output_tokens > 1) itl.push_back(q.itl_s());
    e2e.push_back(q.e2e_s());
    queue.push_back(q.queue_s());
    first = std::min(first, q.arrival_s);
    last = std::max(last, q.finished_s);
    out += double(q.output_tokens), in += double(q.prompt_tokens), share += q.prompt_tokens_computed_fraction;
    if ((o.ttft_p90_s <= 0 || q.ttft_s() <= o.ttft_p90_s) && (o.itl_p90_s <= 0 || q.itl_s() <= o.itl_p90_s))
      ++good;
  }
  m.requests = int64_t(end - begin);
  m.duration_s = last - first;
  m.ttft = percentiles(std::move(ttft));
  m.itl = percentiles(std::move(itl));
  m.e2e = percentiles(std::move(e2e));
  m.queue = percentiles(std::move(queue));
  if (m.duration_s > 0) {  // the deployment's: every group's alike (ServingRun::replicas)
    const double scale = double(std::max(r.replicas, 1)) / m.duration_s;
    m.requests_per_s = double(m.requests) * scale;
    m.output_tokens_per_s = out * scale;
    m.prompt_tokens_per_s = in * scale;
    m.goodput_per_s = double(good) * scale;
  }
  m.prompt_tokens_computed_fraction_mean = share / double(m.requests);
  if (r.kv_capacity > 0) {
    m.kv_utilisation_mean = r.kv_reserved_mean / r.kv_capacity;
    m.kv_utilisation_peak = r.kv_reserved_peak / r.kv_capacity;
  }
  return m;
}

}  // namespace lp::sim
