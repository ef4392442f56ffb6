// Greedy decoding's choice, shared by the host's sampler (engine/sampler.h) and a backend that picks
// greedy tokens where its logits are (Backend::lm_head_greedy, the CUDA backend's argmax kernel).
#pragma once

#include <cstdint>
#include <span>

namespace lp {

// The first index of the largest value; NaNs are never chosen, but a NaN at 0, which nothing beats,
// gives 0 (as the one-pass scan `if (x[i] > x[best]) best = i` does); -0 and +0 are equal.
int32_t argmax(std::span<const float> logits);

}  // namespace lp
