// Scalar reference kernels. Kept forever: tests and benchmarks compare the fast kernels
// (kernels/cpu/gemm.h,
// elementwise.h, attention.h) against these. They are written for clarity, accumulate in double where
// a reduction is long, and never change for speed.
//
// Dimension names: T tokens, D width, H heads, Hkv kv heads, Dh head width, F ffn width.
#pragma once

#include <cstdint>
#include <vector>

namespace lp::ref {

// out[t][i] = x[t][i] / sqrt(mean(x[t]^2) + eps) * w[i]
void rmsnorm(const float* x, const float* w, float* out, int64_t T, int64_t D, float eps);

// Each head v of x [T][n_heads][Dh], in place: v[i] / sqrt(mean(v^2) + eps) * w[i] (Qwen3's q/k norms).
void head_rmsnorm(float* x, int64_t T, int64_t n_heads, int64_t Dh, const float* w, float eps);

// out[t][n] = sum_k a[t][k] * w[n][k]   (w is [N][K] row-major, as GGUF stores matrices)
void matmul(const float* a, const float* w, float* out, int64_t T, int64_t K, int64_t N);

// Rotates pairs (2i, 2i+1) of the first rope_dim dims of each head of x [T][n_heads][Dh] by
// angle pos[t] * theta^(-2i/rope_dim) / freq_factors[i] (freq_factors may be null).
void rope(float* x, const int32_t* pos, int64_t T, int64_t n_heads, int64_t Dh, int64_t rope_dim, float theta,
          const float* freq_factors, float freq_scale = 1.0f);  // angles times freq_scale

// Causal grouped-query attention.
//   q    [T][H][Dh]        queries at positions q_pos[T]
//   k, v [S][Hkv][Dh]      keys/values at positions k_pos[S]
//   out  [T][H][Dh]
// Query t attends to key s iff k_pos[s] <= q_pos[t] and, with window > 0, q_pos[t] - k_pos[s] <
// window; head h uses kv head h / (H / Hkv). Logits scaled by `scale` (0: 1/sqrt(Dh)).
void attention(const float* q, const int32_t* q_pos, int64_t T, const float* k, const float* v,
               const int32_t* k_pos, int64_t S, int64_t H, int64_t Hkv, int64_t Dh, float* out,
               float scale = 0, int32_t window = 0);

// scores[s] = mean over heads h of softmax over keys of (q[h] . k[s][h / (H/Hkv)] / sqrt(Dh)):
// the last token's attention, averaged over query heads. q [H][Dh], k [S][Hkv][Dh].
// scale as attention's; with window > 0 a key at k_pos[s] with q_pos - k_pos[s] >= window scores 0.
void last_row_scores(const float* q, const float* k, int64_t S, int64_t H, int64_t Hkv, int64_t Dh,
                     double* scores, float scale = 0, const int32_t* k_pos = nullptr, int32_t q_pos = 0,
                     int32_t window = 0);

// out[i] = gelu_tanh(gate[i]) * up[i]: GeGLU with GELU's tanh approximation (Gemma).
void geglu(const float* gate, const float* up, float* out, int64_t n);

// out[t][i] = silu(gate[t][i]) * up[t][i]
void swiglu(const float* gate, const float* up, float* out, int64_t n);

// Mixture-of-experts routing of one row's router logits [E]: the k experts of the highest softmax
// probabilities, most probable first (ties: lower id), with weights p / (sum of the k p, at least
// 2^-14). ids [k], w [k].
void route_top_k(const float* logits, int64_t E, int64_t k, int32_t* ids, float* w);

// The mixture-of-experts FFN, token by token: out[t] = sum_j w_j * down_j(act(gate_j xn[t], up_j xn[t]))
// over route_top_k of router xn[t], with act SiLU (or GELU's tanh form, `gelu`). router [E][D];
// gate_up[e] [2 Fe][D] (gate rows, then up); down[e] [D][Fe]; all f32. ids [T][k] receives the routes.
// bf16_inputs: the experts' GEMM inputs (the row, the activation) rounded to bf16 first, as a bf16
// GEMM takes them (the router's stay f32).
void moe(const float* xn, int64_t T, int64_t D, const float* router, const std::vector<const float*>& gate_up,
         const std::vector<const float*>& down, int64_t k, int64_t Fe, bool gelu, float* out, int32_t* ids,
         bool bf16_inputs = false);

// dst[r][:] = src[idx[r]][:], rows of `width` floats (row compaction, gathers by slot).
void gather_rows(const float* src, const int64_t* idx, float* dst, int64_t rows, int64_t width);

// dst[dst_idx[r]][:] = src[src_idx[r]][:] (Aux Cache stores, revival merges).
void copy_rows(const float* src, const int64_t* src_idx, float* dst, const int64_t* dst_idx, int64_t rows,
               int64_t width);

// K/V append into plain caches k, v [cap][kv] with positions k_pos [cap]: rows of k_new, v_new
// [T][kv] at positions pos[T] go to slots n .. n + T - 1 (arrival order); returns n + T.
int64_t kv_append(const float* k_new, const float* v_new, const int32_t* pos, int64_t T, int64_t kv, float* k,
                  float* v, int32_t* k_pos, int64_t n);

// x rounded to bf16 (round to nearest, ties to even) and widened back: what a bf16 GEMM input holds.
float round_bf16(float x);

}  // namespace lp::ref
