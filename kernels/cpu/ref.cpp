#include "kernels/cpu/ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace lp::ref {

void rmsnorm(const float* x, const float* w, float* out, int64_t T, int64_t D, float eps) {
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += double(x[t * D + i]) * x[t * D + i];
    const double scale = 1.0 / std::sqrt(ss / double(D) + eps);
    for (int64_t i = 0; i < D; ++i) out[t * D + i] = float(x[t * D + i] * scale * w[i]);
  }
}

void head_rmsnorm(float* x, int64_t T, int64_t n_heads, int64_t Dh, const float* w, float eps) {
  rmsnorm(x, w, x, T * n_heads, Dh, eps);  // each head is a row of Dh; read before written
}

void matmul(const float* a, const float* w, float* out, int64_t T, int64_t K, int64_t N) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += double(a[t * K + k]) * w[n * K + k];
      out[t * N + n] = float(acc);
    }
}

void rope(float* x, const int32_t* pos, int64_t T, int64_t n_heads, int64_t Dh, int64_t rope_dim, float theta,
          const float* freq_factors, float freq_scale) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * Dh;
      for (int64_t i = 0; i < rope_dim / 2; ++i) {
        double freq = std::pow(double(theta), -2.0 * double(i) / double(rope_dim));
        if (freq_factors) freq /= freq_factors[i];
        freq *= freq_scale;
        const double a = double(pos[t]) * freq;
        const double c = std::cos(a), s = std::sin(a);
        const double x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = float(x0 * c - x1 * s);
        v[2 * i + 1] = float(x0 * s + x1 * c);
      }
    }
}

void attention(const float* q, const int32_t* q_pos, int64_t T, const float* k, const float* v,
               const int32_t* k_pos, int64_t S, int64_t H, int64_t Hkv, int64_t Dh, float* out, float scale_f,
               int32_t window) {
  const int64_t group = H / Hkv;
  const double scale = scale_f > 0 ? double(scale_f) : 1.0 / std::sqrt(double(Dh));
  std::vector<double> p(S);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / group;
      const float* qv = q + (t * H + h) * Dh;
      double mx = -INFINITY;
      for (int64_t s = 0; s < S; ++s) {
        if (k_pos[s] > q_pos[t] || (window > 0 && int64_t(q_pos[t]) - k_pos[s] >= window)) {
          p[s] = -INFINITY;
          continue;
        }
        double dot = 0;
        const float* kv = k + (s * Hkv + g) * Dh;
        for (int64_t d = 0; d < Dh; ++d) dot += double(qv[d]) * kv[d];
        p[s] = dot * scale;
        mx = std::max(mx, p[s]);
      }
      double sum = 0;
      for (int64_t s = 0; s < S; ++s) {
        p[s] = std::isinf(p[s]) ? 0.0 : std::exp(p[s] - mx);
        sum += p[s];
      }
      float* o = out + (t * H + h) * Dh;
      for (int64_t d = 0; d < Dh; ++d) {
        double acc = 0;
        for (int64_t s = 0; s < S; ++s) acc += p[s] * v[(s * Hkv + g) * Dh + d];
        o[d] = sum > 0 ? float(acc / sum) : 0.0f;
      }
    }
}

void last_row_scores(const float* q, const float* k, int64_t S, int64_t H, int64_t Hkv, int64_t Dh,
                     double* scores, float scale_f, const int32_t* k_pos, int32_t q_pos, int32_t window) {
  const double scale = scale_f > 0 ? double(scale_f) : 1.0 / std::sqrt(double(Dh));
  const int64_t group = H / Hkv;
  std::vector<double> p(static_cast<size_t>(S));
  for (int64_t s = 0; s < S; ++s) scores[s] = 0;
  for (int64_t h = 0; h < H; ++h) {
    double mx = -INFINITY;
    for (int64_t s = 0; s < S; ++s) {
      double dot = 0;
      for (int64_t d = 0; d < Dh; ++d) dot += double(q[h * Dh + d]) * k[(s * Hkv + h / group) * Dh + d];
      p[s] = window > 0 && int64_t(q_pos) - k_pos[s] >= window ? -INFINITY : dot * scale;
      mx = std::max(mx, p[s]);
    }
    double sum = 0;
    for (int64_t s = 0; s < S; ++s) sum += p[s] = std::exp(p[s] - mx);
    for (int64_t s = 0; s < S; ++s) scores[s] += p[s] / sum / double(H);
  }
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = float(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void geglu(const float* gate, const float* up, float* out, int64_t n) {
  const double c = std::sqrt(2.0 / M_PI);
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = float(0.5 * g * (1.0 + std::tanh(c * (g + 0.044715 * g * g * g))) * up[i]);
  }
}

void route_top_k(const float* logits, int64_t E, int64_t k, int32_t* ids, float* w) {
  double mx = logits[0], sum = 0;
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, double(logits[e]));
  std::vector<double> p(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(double(logits[e]) - mx);
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) order[size_t(e)] = int32_t(e);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
  double chosen = 0;
  for (int64_t j = 0; j < k; ++j) chosen += p[size_t(order[size_t(j)])] / sum;
  for (int64_t j = 0; j < k; ++j) {
    ids[j] = order[size_t(j)];
    w[j] = float(p[size_t(ids[j])] / sum / std::max(chosen, 6.103515625e-5));
  }
}

void moe(const float* xn, int64_t T, int64_t D, const float* router, const std::vector<const float*>& gate_up,
         const std::vector<const float*>& down, int64_t k, int64_t Fe, bool gelu, float* out, int32_t* ids,
         bool bf16_inputs) {
  const int64_t E = int64_t(gate_up.size());
  std::vector<float> logits(static_cast<size_t>(E)), w(static_cast<size_t>(k)), ff(size_t(2 * Fe)),
      act(static_cast<size_t>(Fe)), y(static_cast<size_t>(D)), xr(static_cast<size_t>(D));
  for (int64_t t = 0; t < T; ++t) {
    const float* x = xn + t * D;
    matmul(x, router, logits.data(), 1, D, E);
    route_top_k(logits.data(), E, k, ids + t * k, w.data());
    for (int64_t i = 0; i < D; ++i) xr[size_t(i)] = bf16_inputs ? round_bf16(x[i]) : x[i];
    std::vector<double> acc(static_cast<size_t>(D), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      matmul(xr.data(), gate_up[size_t(e)], ff.data(), 1, D, 2 * Fe);
      (gelu ? geglu : swiglu)(ff.data(), ff.data() + Fe, act.data(), Fe);
      if (bf16_inputs)
        for (auto& a : act) a = round_bf16(a);
      matmul(act.data(), down[size_t(e)], y.data(), 1, Fe, D);
      for (int64_t i = 0; i < D; ++i) acc[size_t(i)] += double(w[size_t(j)]) * y[size_t(i)];
    }
    for (int64_t i = 0; i < D; ++i) out[t * D + i] = float(acc[size_t(i)]);
  }
}

void gather_rows(const float* src, const int64_t* idx, float* dst, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < width; ++i) dst[r * width + i] = src[idx[r] * width + i];
}

void copy_rows(const float* src, const int64_t* src_idx, float* dst, const int64_t* dst_idx, int64_t rows,
               int64_t width) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < width; ++i) dst[dst_idx[r] * width + i] = src[src_idx[r] * width + i];
}

int64_t kv_append(const float* k_new, const float* v_new, const int32_t* pos, int64_t T, int64_t kv, float* k,
                  float* v, int32_t* k_pos, int64_t n) {
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < kv; ++i) {
      k[(n + t) * kv + i] = k_new[t * kv + i];
      v[(n + t) * kv + i] = v_new[t * kv + i];
    }
    k_pos[n + t] = pos[t];
  }
  return n + T;
}

float round_bf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if ((b & 0x7f800000u) == 0x7f800000u) return x;  // inf and nan unchanged
  b += 0x7fffu + ((b >> 16) & 1u);                 // round to nearest, ties to even
  b &= 0xffff0000u;
  float y;
  std::memcpy(&y, &b, 4);
  return y;
}

}  // namespace lp::ref
