// Next-token sampling: greedy (temperature 0, ties to the lowest id) or temperature + top-p
// (nucleus) with a seeded generator, so the same seed gives the same tokens.
#pragma once

#include <cstdint>
#include <random>
#include <span>

#include "kernels/argmax.h"

namespace lp {

struct SamplerParams {
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(SamplerParams p);
  int32_t sample(std::span<const float> logits);

 private:
  SamplerParams p_;
  std::mt19937_64 rng_;
};

}  // namespace lp
