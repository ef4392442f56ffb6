// The mixture-of-experts FFN on the CPU (Qwen3-MoE, Mixtral: ModelConfig::moe), in the engine's one
// pass over a layer's rows:
//   1. router logits [T][E] = xn Wr^T (f32), softmax per row, the k most probable experts (ties to the
//      lower expert id), their probabilities renormalized to sum to 1 (route_top_k);
//   2. the (row, expert) pairs grouped by expert (a counting sort), so each active expert's gate|up
//      and down are one GEMM each over its rows: an expert's weights are read once per pass, in
//      prefill and in a decoding step alike, in the matrices' dtype (int8 blocks as the dense GEMMs);
//   3. out[t] = sum over t's experts j, in routing order, of w[t][j] * down_j(act(gate_j, up_j)).
// Scalar twins: ref::route_top_k and ref::moe (kernels/cpu/ref.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/context.h"
#include "kernels/cpu/buffer.h"
#include "kernels/cpu/gemm.h"

namespace lp {

struct LayerWeights;

// For each row t of logits [T][E]: ids[t][0..k) the experts of the k highest softmax probabilities,
// most probable first (ties: the lower id), and w[t][j] their probabilities over the k's sum
// (clamped below at 2^-14, as llama.cpp does).
void route_top_k(const float* logits, int64_t T, int64_t E, int64_t k, int32_t* ids, float* w);

// The routes of a pass's rows: ids [T][k] the experts, most probable first, w [T][k] their weights.
struct MoeRoutes {
  int64_t k = 0;
  std::vector<int32_t> ids;
  std::vector<float> w;
  int64_t rows() const { return k ? int64_t(ids.size()) / k : 0; }
};

// Routes the rows xn [T][D] by the router [E][D] (f32): its logits, then route_top_k.
void moe_route(CpuContext& ctx, Gemm& gemm, const Matrix& router, int64_t k, const float* xn, int64_t T,
               int64_t D, MoeRoutes& r, Buffer<float>& logits);

// A counting sort of keys[P] in [0, n_keys): first [n_keys + 1] each key's first slot, at [P] each
// item's slot, the items of one key in their order. The grouping of (row, expert) pairs by expert
// here and in the CUDA backend (its keys also split each expert's rows by GEMM path).
void group_by_key(std::span<const int32_t> keys, int64_t n_keys, std::vector<int64_t>& first,
                  std::vector<int64_t>& at);

// The scratch of the experts' pass, kept between passes (sized for the largest).
struct MoeScratch {
  Buffer<float> x, ff, act, y;
  std::vector<int64_t> at;     // [T][k] where pair (t, j) sits in the grouped order
  std::vector<int64_t> first;  // [E + 1] each expert's first grouped row
};

// out [T][D] = sum over each row's routed experts j of w_j * down_j(act(gate_j xn, up_j xn)), the pairs
// grouped by expert (one gate|up and one down GEMM per active expert). `gelu`: GeGLU, else SwiGLU.
void moe_experts(CpuContext& ctx, Gemm& gemm, const LayerWeights& L, const MoeRoutes& r, int64_t Fe,
                 bool gelu, const float* xn, int64_t T, int64_t D, float* out, MoeScratch& s);

}  // namespace lp
