#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "model/error.h"

namespace lp {

Sampler::Sampler(SamplerParams p) : p_(p), rng_(p.seed) {
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    fail("the sampling temperature must be >= 0, got {}", p.temperature);
  if (!(p.top_p > 0 && p.top_p <= 1)) fail("top-p must be in (0, 1], got {}", p.top_p);
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (p_.temperature == 0.0f) return argmax(logits);
  const size_t V = logits.size();
  std::vector<int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  // Stable order: by logit descending, then id ascending, so results do not depend on sort details.
  std::sort(idx.begin(), idx.end(),
            [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; });
  std::vector<double> prob(V);
  const double mx = logits[idx[0]];
  double sum = 0;
  for (size_t i = 0; i < V; ++i) sum += prob[i] = std::exp((logits[idx[i]] - mx) / p_.temperature);
  size_t keep = 0;
  double cum = 0;
  while (keep < V) {
    cum += prob[keep++] / sum;
    if (cum >= p_.top_p) break;
  }
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double r = u(rng_) * std::accumulate(prob.begin(), prob.begin() + long(keep), 0.0);
  for (size_t i = 0; i < keep; ++i) {
    r -= prob[i];
    if (r <= 0) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace lp
