#include "kernels/cpu/elementwise.h"

#include <immintrin.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cmath>

#include "kernels/cpu/simd.h"

namespace lp {

using namespace simd;

void exp_inplace(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, exp512(_mm512_loadu_ps(x + i)));
#elif defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp256(_mm256_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = exp1(x[i]);
}

// Elementwise ops of at most this many values run on the calling thread: entering the thread arena
// costs more than they do.
constexpr int64_t kInlineValues = 16384;

// Rows t = 0..T-1 of an elementwise op, each `per_row` values: across the threads, or on the
// calling thread when the whole op is at most kInlineValues. A batch of
// decoding requests runs each member's one-row norms, RoPE, SwiGLU and residual in turn (engine/
// batch.cpp), about five ops per member and layer: 1,200 arena entries a step for 8 members, which
// cost more than the ops. Each row's arithmetic is the same either way.
template <class F>
void for_rows(CpuContext& ctx, int64_t T, int64_t per_row, F&& f) {
  if (T * per_row <= kInlineValues) {
    for (int64_t t = 0; t < T; ++t) f(t);
    return;
  }
  ctx.run([&] { tbb::parallel_for(int64_t(0), T, f); });
}

void rmsnorm(CpuContext& ctx, const float* x, const float* w, float* out, int64_t T, int64_t D, float eps) {
  for_rows(ctx, T, D, [&](int64_t t) {
    const float* xr = x + t * D;
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
    const float scale = 1.0f / std::sqrt(ss / float(D) + eps);
    float* o = out + t * D;
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) o[i] = xr[i] * scale * w[i];
  });
}

void head_rmsnorm(CpuContext& ctx, float* x, int64_t T, int64_t ld, int64_t n_heads, int64_t Dh,
                  const float* w, float eps) {
  for_rows(ctx, T, n_heads * Dh, [&](int64_t t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + t * ld + h * Dh;
      float ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < Dh; ++i) ss += v[i] * v[i];
      const float scale = 1.0f / std::sqrt(ss / float(Dh) + eps);
#pragma omp simd
      for (int64_t i = 0; i < Dh; ++i) v[i] = v[i] * scale * w[i];
    }
  });
}

void add_bias(CpuContext& ctx, float* x, int64_t T, int64_t ld, const float* bias, int64_t N) {
  for_rows(ctx, T, N, [&](int64_t t) {
    float* r = x + t * ld;
#pragma omp simd
    for (int64_t i = 0; i < N; ++i) r[i] += bias[i];
  });
}

RopeTable rope_table(const int32_t* pos, int64_t T, int64_t rope_dim, float theta, const float* ff,
                     float freq_scale) {
  RopeTable tab;
  tab.T = T;
  tab.half = rope_dim / 2;
  tab.cos.resize(size_t(T * tab.half));
  tab.sin.resize(size_t(T * tab.half));
  std::vector<double> freq(size_t(tab.half));
  for (int64_t i = 0; i < tab.half; ++i) {
    freq[i] = std::pow(double(theta), -2.0 * double(i) / double(rope_dim));
    if (ff) freq[i] /= ff[i];
    freq[i] *= freq_scale;
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < tab.half; ++i) {
      const double a = double(pos[t]) * freq[i];
      tab.cos[t * tab.half + i] = float(std::cos(a));
      tab.sin[t * tab.half + i] = float(std::sin(a));
    }
  return tab;
}

void rope(CpuContext& ctx, float* x, int64_t T, int64_t ld, int64_t n_heads, int64_t Dh,
          const RopeTable& tab) {
  for_rows(ctx, T, n_heads * Dh, [&](int64_t t) {
    const float* c = tab.cos.data() + t * tab.half;
    const float* s = tab.sin.data() + t * tab.half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + t * ld + h * Dh;
      for (int64_t i = 0; i < tab.half; ++i) {
        const float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c[i] - x1 * s[i];
        v[2 * i + 1] = x0 * s[i] + x1 * c[i];
      }
    }
  });
}

namespace {

// out = g / (1 + exp(a(g))) * u over rows: SwiGLU with a(g) = -g (silu(g) = g / (1 + exp(-g))), GeGLU
// with a(g) = -2z, z = sqrt(2/pi) (g + 0.044715 g^3), since GELU's tanh form 0.5 g (1 + tanh(z)) is
// g / (1 + exp(-2z)). Act supplies a(g) for 512-bit, 256-bit and scalar lanes.
template <class Act>
void gated(CpuContext& ctx, const float* gate, int64_t ld_gate, const float* up, int64_t ld_up, float* out,
           int64_t ld_out, int64_t T, int64_t F) {
  for_rows(ctx, T, F, [&](int64_t t) {
    const float* g = gate + t * ld_gate;
    const float* u = up + t * ld_up;
    float* o = out + t * ld_out;
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= F; i += 16) {
      const __m512 gv = _mm512_loadu_ps(g + i);
      const __m512 a = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(Act::arg(gv))));
      _mm512_storeu_ps(o + i, _mm512_mul_ps(a, _mm512_loadu_ps(u + i)));
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (; i + 8 <= F; i += 8) {
      const __m256 gv = _mm256_loadu_ps(g + i);
      const __m256 a = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), exp256(Act::arg(gv))));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(a, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < F; ++i) o[i] = g[i] / (1.0f + exp1(Act::arg(g[i]))) * u[i];
  });
}

struct Silu {
  static float arg(float g) { return -g; }
#if defined(__AVX512F__)
  static __m512 arg(__m512 g) {
    return _mm512_sub_ps(_mm512_setzero_ps(), g);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  static __m256 arg(__m256 g) {
    return _mm256_sub_ps(_mm256_setzero_ps(), g);
  }
#endif
};

struct GeluTanh {
  static constexpr float k2c = 2 * 0.7978845608028654f, k3 = 0.044715f;  // 2 sqrt(2/pi), GELU's cubic
  static float arg(float g) { return -k2c * (g + k3 * g * g * g); }
#if defined(__AVX512F__)
  static __m512 arg(__m512 g) {
    const __m512 inner = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(k3), g), _mm512_mul_ps(g, g), g);
    return _mm512_mul_ps(_mm512_set1_ps(-k2c), inner);
  }
#elif defined(__AVX2__) && defined(__FMA__)
  static __m256 arg(__m256 g) {
    const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(k3), g), _mm256_mul_ps(g, g), g);
    return _mm256_mul_ps(_mm256_set1_ps(-k2c), inner);
  }
#endif
};

}  // namespace

void swiglu(CpuContext& ctx, const float* gate, int64_t ld_gate, const float* up, int64_t ld_up, float* out,
            int64_t ld_out, int64_t T, int64_t F) {
  gated<Silu>(ctx, gate, ld_gate, up, ld_up, out, ld_out, T, F);
}

void geglu(CpuContext& ctx, const float* gate, int64_t ld_gate, const float* up, int64_t ld_up, float* out,
           int64_t ld_out, int64_t T, int64_t F) {
  gated<GeluTanh>(ctx, gate, ld_gate, up, ld_up, out, ld_out, T, F);
}

void add_inplace(CpuContext& ctx, float* x, const float* y, int64_t n) {
  if (n <= kInlineValues) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
    return;
  }
  ctx.run([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 4096), [&](const tbb::blocked_range<int64_t>& r) {
#pragma omp simd
      for (int64_t i = r.begin(); i < r.end(); ++i) x[i] += y[i];
    });
  });
}

}  // namespace lp
