// Row-wise CPU kernels of a layer: RMSNorm (of rows and of heads), RoPE, SwiGLU, the residual and bias
// adds and a vectorised exp,
// rows in parallel over oneTBB. Each row is computed inside one task, so results do not depend on
// the thread count. Changes against the scalar twins (kernels/cpu/ref.h): float accumulation in
// SIMD lanes, a polynomial exp (relative error ~1e-7), RoPE angles from a per-forward table.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/context.h"

namespace lp {

// out[t] = x[t] * rsqrt(mean(x[t]^2) + eps) * w, rows in parallel.
void rmsnorm(CpuContext& ctx, const float* x, const float* w, float* out, int64_t T, int64_t D, float eps);

// Each of the n_heads heads of Dh values at the start of every row of x [T] (row stride ld) replaced
// by its RMSNorm times w [Dh] (Qwen3's q and k norms), in place.
void head_rmsnorm(CpuContext& ctx, float* x, int64_t T, int64_t ld, int64_t n_heads, int64_t Dh,
                  const float* w, float eps);

// x[t][i] += bias[i] for the first N values of each row (row stride ld).
void add_bias(CpuContext& ctx, float* x, int64_t T, int64_t ld, const float* bias, int64_t N);

// cos/sin table for RoPE: [T][rope_dim/2] each, for the given positions.
struct RopeTable {
  int64_t T = 0, half = 0;
  std::vector<float> cos, sin;
};
// freq_scale multiplies every frequency (linear RoPE scaling: 1 / factor).
RopeTable rope_table(const int32_t* pos, int64_t T, int64_t rope_dim, float theta, const float* freq_factors,
                     float freq_scale = 1.0f);
// Rotates x [T][n_heads][Dh] (row stride ld floats) using table rows rows[t] (or t if null).
void rope(CpuContext& ctx, float* x, int64_t T, int64_t ld, int64_t n_heads, int64_t Dh,
          const RopeTable& tab);

// out[i] = silu(gate[i]) * up[i]; gate/up/out are [T][F] with row strides.
void swiglu(CpuContext& ctx, const float* gate, int64_t ld_gate, const float* up, int64_t ld_up, float* out,
            int64_t ld_out, int64_t T, int64_t F);

// out[i] = gelu_tanh(gate[i]) * up[i] (GeGLU, Gemma), laid out as swiglu's.
void geglu(CpuContext& ctx, const float* gate, int64_t ld_gate, const float* up, int64_t ld_up, float* out,
           int64_t ld_out, int64_t T, int64_t F);

// x[i] += y[i]
void add_inplace(CpuContext& ctx, float* x, const float* y, int64_t n);

// Vectorised exp used by the kernels (exposed for tests).
void exp_inplace(float* x, int64_t n);

}  // namespace lp
