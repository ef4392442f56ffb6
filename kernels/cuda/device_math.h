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

#include "model/quant.h"  // kquant_scale_min (constexpr: the device calls it too)

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

// The causal mask on original positions: query at q_pos sees key at k_pos iff k_pos <= q_pos, and,
// in a sliding-window layer (window > 0: Gemma 3's local layers), q_pos - k_pos < window.
LP_HD bool visible(int32_t k_pos, int32_t q_pos, int32_t window = 0) {
  return k_pos <= q_pos && (window <= 0 || int64_t(q_pos) - int64_t(k_pos) < int64_t(window));
}

// SiLU-gated (SwiGLU) or tanh-GELU-gated (GeGLU, Gemma) product of a gate and an up value.
LP_HD float gelu_tanh_mul(float g, float u) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * g * (1.0f + tanhf(c * (g + 0.044715f * g * g * g))) * u;
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

// The router's choice for one row of logits z[E] (kernels/cpu/moe.h route_top_k): the k most probable
// experts, most probable first, ties to the lower id, into ids[k]; w[k] their softmax probabilities
// over the k's sum, the sum clamped below at 2^-14 (llama.cpp's build_moe_ffn). No scratch: the j-th
// pick is the most probable expert ranked after the (j-1)-th in (probability down, id up) order, so
// a row costs k + 2 passes over E and one thread can route it whatever E is.
LP_HD void route_row(const float* z, int64_t E, int64_t k, int32_t* ids, float* w) {
  float mx = z[0];
  for (int64_t e = 1; e < E; ++e) mx = fmaxf(mx, z[e]);
  double sum = 0;  // in double, as the CPU's route_top_k sums
  for (int64_t e = 0; e < E; ++e) sum += expf(z[e] - mx);
  const float inv = float(1.0 / sum);
  float prev_p = 0;
  double chosen = 0;
  int64_t prev = -1;
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    float best_p = 0;
    for (int64_t e = 0; e < E; ++e) {
      const float p = expf(z[e] - mx) * inv;
      if (prev >= 0 && !(p < prev_p || (p == prev_p && e > prev))) continue;  // ranked before the last pick
      if (best < 0 || p > best_p) best = e, best_p = p;                       // ties: the lower id stays
    }
    ids[j] = int32_t(best);
    w[j] = best_p;
    chosen += best_p;
    prev = best, prev_p = best_p;
  }
  const float denom = fmaxf(float(chosen), 6.103515625e-5f);
  for (int64_t j = 0; j < k; ++j) w[j] /= denom;
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

// -infinity.
LP_HD float neg_inf() {
  const uint32_t u = 0xff800000u;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

// A quiet NaN (what a kernel writes for an input it cannot use).
LP_HD float quiet_nan() {
  const uint32_t u = 0x7fc00000u;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
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

// ---- GGUF quantized blocks (--dtype int8 on the GPU) --------------------------------------------
// The weights stay in their blocks on the device; the kernels read a row 8 elements at a time (below).
// model/quant.cpp's dequantizers are the reference (tests/kernels/test_cuda_math.cpp).

// ggml type ids of the block types the GPU reads.
enum QType : int {
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14
};

// Whether the kernels below read blocks of ggml type qt.
LP_HD bool readable(int qt) {
  return qt == kQ4_0 || qt == kQ4_1 || qt == kQ5_0 || qt == kQ5_1 || qt == kQ8_0 || qt == kQ4_K ||
         qt == kQ5_K || qt == kQ6_K;
}
// Whether element values carry a per-run minimum (Q4_1, Q5_1, Q4_K, Q5_K).
LP_HD bool has_minima(int qt) {
  return qt == kQ4_1 || qt == kQ5_1 || qt == kQ4_K || qt == kQ5_K;
}

// IEEE half -> f32, exact (subnormals, infinities and NaN included): the instruction on the device.
LP_HD float f16_to_f32(uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while (!(man & 0x400u)) {
      man <<= 1;
      --exp;
    }
    u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// f32 -> IEEE half, round to nearest even, as the CPU's f16 K/V cache rounds (F16C's vcvtps2ph,
// model/quant's f32_to_f16): past 65,504 (from 65,520 up) an infinity, below 2^-14 a subnormal, a NaN
// a quiet NaN. The instruction on the device; on the host the same rounding by hand, checked against
// both (tests/kernels/test_cuda_math.cpp).
LP_HD uint16_t f32_to_f16(float f) {
#if defined(__CUDA_ARCH__)
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  const uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  const int e = int(mag >> 23) - 127;  // the unbiased exponent
  if (e > 15) return uint16_t(sign | 0x7c00u);
  const uint32_t m = (mag & 0x7fffffu) | 0x800000u;  // the 24-bit significand (normal f32 here)
  // The half's bits before rounding, and the dropped bits against half a unit of the last kept one.
  int drop;
  uint32_t h;
  if (e >= -14) {
    drop = 13;
    h = (uint32_t(e + 15) << 10) | ((m >> 13) & 0x3ffu);
  } else {
    drop = -e - 1;  // a subnormal counts units of 2^-24: m 2^(e - 23) = (m >> drop) 2^-24
    if (drop > 24) return uint16_t(sign);  // below 2^-25, f32 subnormals and zero included
    h = m >> drop;
  }
  const uint32_t rest = m & ((1u << drop) - 1), half = 1u << (drop - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;  // a carry moves into the exponent: still exact
  return uint16_t(sign | h);
#endif
}

LP_HD uint16_t load_u16(const uint8_t* p) {
  return uint16_t(p[0] | (p[1] << 8));
}

// Four (two-byte aligned) bytes p[0..3] as one little-endian word: two 16-bit loads on the device
// (a block's quants are only two-byte aligned: Q8_0 and Q4_0 blocks are 34 and 18 bytes).
LP_HD uint32_t load_4_bytes(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return uint32_t(h[0]) | uint32_t(h[1]) << 16;
#else
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
#endif
}

// The unit of work of the GPU's block kernels: 8 elements of a row, two runs of 4 consecutive
// elements starting at k[0] and k[1], read from 8 (Q8_0) or 4 (the others) consecutive quant
// bytes of one block. Unit u of a row:
// - Q8_0: block u/4, elements 8(u%4)..+7 (k[1] = k[0] + 4);
// - Q4_0, Q4_1, Q5_0, Q5_1: block u/4, quant bytes 4(u%4)..+3, whose low nibbles are elements
//   4(u%4)..+3 and high nibbles 16 + 4(u%4)..+3 (Q5's fifth bit of element e: bit e of qh);
// - Q4_K, Q5_K: super-block u/32, quant bytes 4(u%32)..+3 of its 128, low nibbles in sub-block 2g,
//   high in 2g+1 (g = (u%32)/8; Q5_K's fifth bits from the same 4 bytes of qh[32]);
// - Q6_K: super-block u/32, ql bytes 4(u%32)..+3 of its 128: half h = (u%32)/16, position
//   p = 4(u%16) % 32 in 32-block c = 4(u%16) / 32, low nibbles in 32-block c, high in c + 2, bits
//   4-5 from qh[32h + p..] (bits 2c.. and 2(c+2)..), scale sc[8h + 2c + p/16] and sc[8h + 2c + 4 + p/16].
// So a warp's 32 lanes read 32 consecutive units: 256 contiguous bytes of Q8_0, 128 of quants in
// the others. A row has K / 8 units. Block layouts: docs/gguf.md.
//
// q_unit_parts gives element 4h + i as qv[4h + i] * s[h] + m[h]: the quants as exact small
// integers in f32 (less Q4_0's 8, Q5_0's 16, Q6_K's 32), a scale and a minimum per run (m = 0 for
// the signed types), so a dot product can take the scale out of each run's sum. q_unit gives the
// elements.

// f32 of a small integer v (< 2^23) less `bias - 2^23`, from the bits of 2^23 + v: one add, where
// a conversion instruction would run at a quarter of the rate. Exact.
LP_HD float small_int_to_f32(uint32_t v, float bias) {
  const uint32_t u = 0x4B000000u | v;
  float f;
  memcpy(&f, &u, sizeof f);
  return f - bias;
}

LP_HD void q_unit_parts(const uint8_t* row, int qt, int64_t u, int64_t k[2], float qv[8], float s[2],
                        float m[2]) {
  constexpr float k2p23 = 8388608.0f;
  if (qt == kQ8_0) {
    const uint8_t* b = row + (u >> 2) * 34;
    const int part = int(u & 3);
    s[0] = s[1] = f16_to_f32(load_u16(b));
    m[0] = m[1] = 0.0f;
    const uint8_t* qs = b + 2 + 8 * part;
    const uint32_t lo = load_4_bytes(qs) ^ 0x80808080u, hi = load_4_bytes(qs + 4) ^ 0x80808080u;  // q + 128
    for (int i = 0; i < 4; ++i) {
      qv[i] = small_int_to_f32(lo >> 8 * i & 0xFF, k2p23 + 128);
      qv[4 + i] = small_int_to_f32(hi >> 8 * i & 0xFF, k2p23 + 128);
    }
    k[0] = (u >> 2) * 32 + 8 * part;
    k[1] = k[0] + 4;
    return;
  }
  if (qt == kQ4_0 || qt == kQ4_1 || qt == kQ5_0 || qt == kQ5_1) {
    const bool five = qt == kQ5_0 || qt == kQ5_1, minimum = qt == kQ4_1 || qt == kQ5_1;
    const int size = qt == kQ4_0 ? 18 : qt == kQ4_1 ? 20 : qt == kQ5_0 ? 22 : 24;
    const uint8_t* b = row + (u >> 2) * size;
    const int part = int(u & 3);
    s[0] = s[1] = f16_to_f32(load_u16(b));
    m[0] = m[1] = minimum ? f16_to_f32(load_u16(b + 2)) : 0.0f;
    const float bias = k2p23 + (qt == kQ4_0 ? 8 : qt == kQ5_0 ? 16 : 0);
    const uint32_t qs = load_4_bytes(b + size - 16 + 4 * part);
    // Q5: bits 4part..+3 (low nibbles' elements) and 16 + 4part..+3 (high) of qh, as bit 4.
    const uint32_t qh = five ? load_4_bytes(b + (minimum ? 4 : 2)) >> 4 * part : 0;
    for (int i = 0; i < 4; ++i) {
      qv[i] = small_int_to_f32((qs >> 8 * i & 0xF) | (qh >> i & 1) << 4, bias);
      qv[4 + i] = small_int_to_f32((qs >> (8 * i + 4) & 0xF) | (qh >> (16 + i) & 1) << 4, bias);
    }
    k[0] = (u >> 2) * 32 + 4 * part;
    k[1] = k[0] + 16;
    return;
  }
  const int l = int(u & 31);
  if (qt == kQ6_K) {
    const uint8_t* b = row + (u >> 5) * 210;
    const int h = l >> 4, c = (l & 15) >> 3, p = 4 * (l & 7);
    const float d = f16_to_f32(load_u16(b + 208));
    const uint32_t ql = load_4_bytes(b + 4 * l), qh = load_4_bytes(b + 128 + 32 * h + p);
    for (int half = 0; half < 2; ++half) {
      const int blk = c + 2 * half;  // the 32-block of the half this run is in
      s[half] = d * float(int8_t(b[192 + 8 * h + 2 * blk + p / 16]));
      m[half] = 0.0f;
      for (int i = 0; i < 4; ++i)
        qv[4 * half + i] = small_int_to_f32(
            (ql >> (8 * i + 4 * half) & 0xF) | (qh >> (8 * i + 2 * blk) & 3) << 4, k2p23 + 32);
    }
    k[0] = (u >> 5) * 256 + 128 * h + 32 * c + p;
    k[1] = k[0] + 64;
    return;
  }
  // Q4_K, Q5_K
  const bool five = qt == kQ5_K;
  const uint8_t* b = row + (u >> 5) * (five ? 176 : 144);
  const int g = l >> 3, off = 4 * (l & 7);
  const float d = f16_to_f32(load_u16(b)), dmin = f16_to_f32(load_u16(b + 2));
  const uint32_t qs = load_4_bytes(b + (five ? 48 : 16) + 4 * l), qh = five ? load_4_bytes(b + 16 + off) : 0;
  for (int half = 0; half < 2; ++half) {
    int sc, mn;
    kquant_scale_min(b + 4, 2 * g + half, sc, mn);
    s[half] = d * float(sc);
    m[half] = -(dmin * float(mn));
    for (int i = 0; i < 4; ++i)
      qv[4 * half + i] =
          small_int_to_f32((qs >> (8 * i + 4 * half) & 0xF) | (qh >> (8 * i + 2 * g + half) & 1) << 4, k2p23);
  }
  k[0] = (u >> 5) * 256 + 64 * g + off;
  k[1] = k[0] + 32;
}

LP_HD void q_unit(const uint8_t* row, int qt, int64_t u, int64_t k[2], float w[8]) {
  float qv[8], s[2], m[2];
  q_unit_parts(row, qt, u, k, qv, s, m);
  for (int e = 0; e < 8; ++e) w[e] = qv[e] * s[e >> 2] + m[e >> 2];
}

}  // namespace lp::cuda_math
