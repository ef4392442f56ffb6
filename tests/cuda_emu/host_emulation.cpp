// The CUDA backend on the host, for tests: "device" memory is host memory, the own kernels
// (kernels.cuh) run thread by thread through the same launchers as on the GPU (launch.cuh over
// host_threads.h), and what comes from NVIDIA libraries is replaced: cuBLAS GEMMs by the scalar
// reference, CUB's radix sorts by stable sorts of the same keys, cudaMemcpy2D by row copies. Not
// part of the product: the tests link it under cuda_backend.cpp and the GPU suite's own source,
// so the ops and the session's logic are checked on machines without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/cpu/ref.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/launch.cuh"
#include "model/error.h"

namespace lp::cuda {
namespace cm = lp::cuda_math;

bool compiled() {
  return false;
}

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
void device_free(void* p) {
  std::free(p);
}
void* device_alloc_async(size_t bytes, const char* what) {
  return device_alloc(bytes, what);
}
void device_free_async(void* p) {
  device_free(p);
}
void copy_to_device(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void copy_to_host(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void copy_on_device(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void synchronize(const char*) {}
// A small GPU, so that the attention launcher takes both paths (key splits and one pass) on the
// tests' shapes.
int multiprocessors() {
  return 4;
}

void copy_columns(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t width, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * ld_dst, src + r * ld_src, size_t(width) * 4);
}

// ops.cu's select_top with CUB's radix sorts (stable) as stable sorts.
void select_top(const float* scores, const int32_t* pos, int64_t n, int64_t n_keep, int64_t* keep) {
  if (n < 1 || n_keep < 1 || n_keep > n) fail("select_top: keep {} of {} tokens", n_keep, n);
  const int64_t m = n - 1;
  std::vector<uint64_t> keys(static_cast<size_t>(std::max<int64_t>(m, 1)));
  std::vector<int64_t> idx(static_cast<size_t>(std::max<int64_t>(m, 1))), sorted(static_cast<size_t>(n));
  if (m > 0) {
    LP_LAUNCH(kernels::selection_keys_kernel, blocks_for(m, kThreads), kThreads, 0, scores, pos, m,
              keys.data(), idx.data());
    std::stable_sort(idx.begin(), idx.begin() + m,
                     [&](int64_t a, int64_t b) { return keys[size_t(a)] > keys[size_t(b)]; });
    std::copy(idx.begin(), idx.begin() + m, sorted.begin());
  }
  LP_LAUNCH(kernels::put_last_kernel, 1, 1, 0, sorted.data(), n_keep - 1, n - 1);
  std::copy(sorted.begin(), sorted.begin() + n_keep, keep);
  std::sort(keep, keep + n_keep);
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
