// LazyLLM's selection on the host: the n_keep - 1 highest-scoring of the n = pos.size() tokens
// other than the last, plus the last, as indices into pos in increasing order; ties go to the later
// position. Used by the policies (pruning/policy.h) and the CPU backend; the CUDA backend's
// select_top (kernels/cuda/cuda_ops.h) is its device twin and is tested against it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace lp {

std::vector<int64_t> select_top(std::span<const int32_t> pos, std::span<const float> scores, int64_t n_keep);

}  // namespace lp
