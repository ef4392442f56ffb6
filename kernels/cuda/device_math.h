// The per-element and per-row arithmetic of the CUDA kernels (kernels/cuda/*.cu), as
// `__host__ __device__` functions: the GPU runs exactly these, and the CPU test suite runs them
// too (tests/kernels/test_cuda_math.cpp) against the scalar references (kernels/cpu/ref.h), so the
// arithmetic is tested on machines without a GPU. The launchers stay thin: indexing and
// reductions around these calls.
//
// Plain C++ (no CUDA headers) so the host compiler can include it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define LP_HD __host__ __device__ __forceinline__
#else
#define LP_HD inline
#endif

namespace lp::cuda_math {

// 1 / sqrt(x): the GPU's rsqrtf (about 2 ulp) on the device, the exact quotient on the host.
LP_HD float inv_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return rsqrtf(x);
#else
  return 1.0f / sqrtf(x);
#endif
}

// RMSNorm: the scale 1 / sqrt(mean(x^2) + eps) from a row's sum of squares (accumulated in f32 by
// the kernel's block reduction), and one output element.
LP_HD float rms_scale(float sum_sq, int64_t D, float eps) {
  return 1.0f / sqrtf(sum_sq / float(D) + eps);
}
LP_HD float rms_apply(float x, float scale, float w) {
  return x * scale * w;
}

// RoPE: cos and sin of pair i (dims 2i, 2i+1) at original position `pos`, with
// freq = theta^(-2i / rope_dim) / freq_factor (1 when the model has no factors). In double: at
// 100k positions an f32 angle is off by ~1e-2 rad. rope_kernel has one thread per (token, pair):
// it computes this once, in double, and rotates that pair of every head in f32.
LP_HD void rope_cos_sin(int32_t pos, int64_t i, int64_t rope_dim, float theta, float freq_factor, float* c,
                        float* s) {
  const double freq = pow(double(theta), -2.0 * double(i) / double(rope_dim)) / double(freq_factor);
  const double a = double(pos) * freq;
  *c = float(cos(a));
  *s = float(sin(a));
}
LP_HD void rope_rotate(float x0, float x1, float c, float s, float* y0, float* y1) {
  *y0 = x0 * c - x1 * s;
  *y1 = x0 * s + x1 * c;
}

// SwiGLU: silu(g) * u.
LP_HD float silu_mul(float g, float u) {
  return g / (1.0f + expf(-g)) * u;
}

// The causal mask on original positions: query at q_pos sees key at k_pos iff k_pos <= q_pos.
LP_HD bool visible(int32_t k_pos, int32_t q_pos) {
  return k_pos <= q_pos;
}

// Online softmax (FlashAttention's recurrence), per query row and head: running max m, running
// sum l of exp(x - m), and an output accumulator rescaled whenever m grows. f32 throughout.
struct OnlineSoftmax {
  float m = -INFINITY;
  float l = 0;
};
// Folds one tile's max `tile_max` into the state; returns the factor by which the accumulator
// and l must be multiplied (exp(old m - new m); 1 when the max did not grow, 0 from -inf).
LP_HD float online_rescale(OnlineSoftmax& s, float tile_max) {
  const float m_new = fmaxf(s.m, tile_max);
  const float alpha = s.m == -INFINITY ? 0.0f : expf(s.m - m_new);
  s.m = m_new;
  s.l *= alpha;
  return alpha;
}
// The weight of one logit under the current max (0 for a masked key: -inf).
LP_HD float online_weight(const OnlineSoftmax& s, float logit) {
  return logit == -INFINITY ? 0.0f : expf(logit - s.m);
}
// The output element after all tiles: acc / l (0 for a row that saw no key).
LP_HD float online_finish(const OnlineSoftmax& s, float acc) {
  return s.l > 0 ? acc / s.l : 0.0f;
}

// Merging key splits of one row (flash-decoding): a split with running max m_split contributes
// its sum and accumulator times exp(m_split - m_all), m_all the max over splits; a split that saw
// no key (m_split = -inf) contributes nothing.
LP_HD float split_weight(float m_split, float m_all) {
  return m_split == -INFINITY ? 0.0f : expf(m_split - m_all);
}

// The last-row importance score of key s: mean over the H query heads of softmax probabilities;
// head h contributes exp(logit - m_h) / l_h / H.
LP_HD float head_share(float logit, float m_h, float l_h, int64_t H) {
  return expf(logit - m_h) / l_h / float(H);
}

// Selection keys: a key that sorts (descending, as unsigned 64-bit) in the order LazyLLM keeps
// tokens: higher score first, equal scores by later position first (pruning/select.cpp
// select_top). The float's bits are mapped to an order-preserving unsigned value.
LP_HD uint64_t selection_key(float score, int32_t pos) {
  if (score == 0.0f) score = 0.0f;  // -0 and +0 are equal scores: the position decides
  uint32_t u;
  memcpy(&u, &score, sizeof u);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // negative floats reversed, positives above them
  return (uint64_t(u) << 32) | uint64_t(uint32_t(pos));
}

// Tokens kept at a pruning layer: as pruning/schedule.h tokens_kept (the host computes it; this
// copy lets a device-side loop check its bound). share in [0, 1), n_active >= 1.
LP_HD int64_t tokens_kept(int64_t n_active, double share) {
  const double x = share * double(n_active);
  const int64_t pruned = int64_t(floor(x + x * 1e-12));  // the same slack as the host
  const int64_t kept = n_active - pruned;
  return kept < 1 ? 1 : kept;
}

// Per-token "has KV" bits, one per original position, in 32-bit words.
LP_HD bool has_kv(const uint32_t* bits, int32_t pos) {
  return (bits[pos >> 5] >> (pos & 31)) & 1u;
}
LP_HD void set_has_kv(uint32_t* bits, int32_t pos) {
  bits[pos >> 5] |= 1u << (pos & 31);
}

// bf16 <-> f32, round to nearest even (as the CPU's bf16 path and cuBLAS inputs).
LP_HD uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
LP_HD float bf16_to_f32(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace lp::cuda_math
