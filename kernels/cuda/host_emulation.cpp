// The launchers of cuda_ops.h executed on the host: "device" memory is host memory and every op is
// the CPU reference (kernels/cpu/ref.h) or device_math.h in a plain loop. Not part of the product:
// the test `lp_cuda_emu_tests` links it under cuda_session.cpp, so the CUDA session's own logic
// (row bookkeeping, slots, gathers, pruning, revival, the Aux Cache) is checked against the CPU
// backend on machines without a GPU. Semantics are those the header documents.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/ref.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_math.h"
#include "kernels/pruning.h"
#include "model/error.h"

namespace lp::cuda {
namespace cm = lp::cuda_math;

bool compiled() { return false; }

Device open_device() {
  Device d;
  d.count = 1;
  d.name = "host emulation";
  d.total_bytes = d.free_bytes = int64_t(1) << 40;
  return d;
}

void* device_alloc(size_t bytes, const char* what) {
  void* p = std::calloc(bytes ? bytes : 1, 1);
  if (!p) fail("cannot allocate {} bytes for {}", bytes, what);
  return p;
}
void device_free(void* p) { std::free(p); }
void copy_to_device(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void copy_to_host(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void synchronize(const char*) {}

void rmsnorm(const float* x, const float* w, float* out, int64_t T, int64_t D, float eps) {
  ref::rmsnorm(x, w, out, T, D, eps);
}

void rope(float* x, const int32_t* pos, int64_t T, int64_t n_heads, int64_t Dh, int64_t rope_dim, float theta,
          const float* freq_factors) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < rope_dim / 2; ++i) {
      float c, s;
      cm::rope_cos_sin(pos[t], i, rope_dim, theta, freq_factors ? freq_factors[i] : 1.0f, &c, &s);
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = x + (t * n_heads + h) * Dh;
        cm::rope_rotate(v[2 * i], v[2 * i + 1], c, s, &v[2 * i], &v[2 * i + 1]);
      }
    }
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = cm::silu_mul(gate[i], up[i]);
}

void swiglu_fused(const float* ff, float* out, int64_t T, int64_t F) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < F; ++i) out[t * F + i] = cm::silu_mul(ff[t * 2 * F + i], ff[t * 2 * F + F + i]);
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void gather_rows(const float* src, const int64_t* idx, float* dst, int64_t rows, int64_t width) {
  // Through a copy: the session may gather from a buffer into itself (it does not, but the GPU
  // kernel reads and writes different buffers, and so does this).
  std::vector<float> tmp(size_t(rows * width));
  for (int64_t r = 0; r < rows; ++r) std::memcpy(tmp.data() + r * width, src + idx[r] * width, size_t(width) * 4);
  std::memcpy(dst, tmp.data(), tmp.size() * 4);
}

void gather_rows_bf16(const uint16_t* src, const int64_t* idx, float* dst, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < width; ++i) dst[r * width + i] = cm::bf16_to_f32(src[idx[r] * width + i]);
}

void scatter_rows(const float* src, const int64_t* idx, float* dst, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + idx[r] * width, src + r * width, size_t(width) * 4);
}

void copy_columns(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t width, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * ld_dst, src + r * ld_src, size_t(width) * 4);
}

void attention(const float* q, const int32_t* q_pos, int64_t T, const float* k, const float* v, const int32_t* k_pos,
               int64_t S, int64_t H, int64_t Hkv, int64_t Dh, float* out) {
  ref::attention(q, q_pos, T, k, v, k_pos, S, H, Hkv, Dh, out);
}

void last_row_scores(const float* q, const float* k, int64_t S, int64_t H, int64_t Hkv, int64_t Dh, float* scores) {
  std::vector<double> d(static_cast<size_t>(S));
  ref::last_row_scores(q, k, S, H, Hkv, Dh, d.data());
  for (int64_t s = 0; s < S; ++s) scores[s] = float(d[size_t(s)]);
}

void select_top(const float* scores, const int32_t* pos, int64_t n, int64_t n_keep, int64_t* keep) {
  const auto k = lp::select_top({pos, size_t(n)}, {scores, size_t(n)}, n_keep);
  std::copy(k.begin(), k.end(), keep);
}

void kv_append(const float* k_new, const float* v_new, const int64_t* slot, const int32_t* pos, int64_t T, int64_t kv,
               float* k_cache, float* v_cache, uint32_t* bits) {
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(k_cache + slot[t] * kv, k_new + t * kv, size_t(kv) * 4);
    std::memcpy(v_cache + slot[t] * kv, v_new + t * kv, size_t(kv) * 4);
    cm::set_has_kv(bits, pos[t]);
  }
}

void to_bf16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = cm::f32_to_bf16(x[i]);
}

void gemm_f32(const float* a, const float* w, float* out, int64_t T, int64_t K, int64_t N) {
  ref::matmul(a, w, out, T, K, N);
}

void gemm_bf16(const uint16_t* a, const uint16_t* w, float* out, int64_t T, int64_t K, int64_t N) {
  std::vector<float> af(size_t(T * K)), wf(size_t(N * K));
  for (size_t i = 0; i < af.size(); ++i) af[i] = cm::bf16_to_f32(a[i]);
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = cm::bf16_to_f32(w[i]);
  ref::matmul(af.data(), wf.data(), out, T, K, N);
}

}  // namespace lp::cuda
