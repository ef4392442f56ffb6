// CUDA kernels and their launchers (declared in kernels/cuda/cuda_ops.h). The arithmetic per
// element and per row is kernels/cuda/device_math.h (tested on the CPU); this file holds the
// indexing, the reductions and the launches.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cub/cub.cuh>
#include <cuda/functional>
#include <mutex>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_math.h"
#include "model/error.h"

namespace lp::cuda {
namespace cm = lp::cuda_math;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA error in {}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}
void check_launch(const char* what) {
  check(cudaGetLastError(), what);
}
void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error in {}: {}", what, cublasGetStatusString(s));
}

unsigned blocks_for(int64_t n, int threads) {
  return unsigned((n + threads - 1) / threads);
}

constexpr int kThreads = 256;

// ---- elementwise ----------------------------------------------------------------------------

__global__ void rmsnorm_kernel(const float* x, const float* w, float* out, int64_t D, float eps) {
  const int64_t t = blockIdx.x;
  const float* row = x + t * D;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss += row[i] * row[i];
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float scale;
  const float total = Reduce(tmp).Sum(ss);
  if (threadIdx.x == 0) scale = cm::rms_scale(total, D, eps);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) out[t * D + i] = cm::rms_apply(row[i], scale, w[i]);
}

// One thread per (token, pair): the table entry is computed once per pair and applied to every head.
__global__ void rope_kernel(float* x, const int32_t* pos, int64_t T, int64_t n_heads, int64_t Dh, int64_t rope_dim,
                            float theta, const float* freq_factors) {
  const int64_t half = rope_dim / 2;
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= T * half) return;
  const int64_t t = id / half, i = id % half;
  float c, s;
  cm::rope_cos_sin(pos[t], i, rope_dim, theta, freq_factors ? freq_factors[i] : 1.0f, &c, &s);
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + (t * n_heads + h) * Dh;
    cm::rope_rotate(v[2 * i], v[2 * i + 1], c, s, &v[2 * i], &v[2 * i + 1]);
  }
}

__global__ void swiglu_kernel(const float* g, const float* u, float* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = cm::silu_mul(g[i], u[i]);
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

__global__ void gather_kernel(const float* src, const int64_t* idx, float* dst, int64_t width) {
  const int64_t r = blockIdx.x;
  const float* s = src + idx[r] * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) dst[r * width + i] = s[i];
}

__global__ void scatter_kernel(const float* src, const int64_t* idx, float* dst, int64_t width) {
  const int64_t r = blockIdx.x;
  float* d = dst + idx[r] * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) d[i] = src[r * width + i];
}

__global__ void kv_append_kernel(const float* k_new, const float* v_new, const int64_t* slot, const int32_t* pos,
                                 int64_t kv, float* k_cache, float* v_cache, uint32_t* bits) {
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < kv; i += blockDim.x) {
    k_cache[slot[t] * kv + i] = k_new[t * kv + i];
    v_cache[slot[t] * kv + i] = v_new[t * kv + i];
  }
  if (threadIdx.x == 0) atomicOr(&bits[pos[t] >> 5], 1u << (pos[t] & 31));
}

__global__ void swiglu_fused_kernel(const float* ff, float* out, int64_t T, int64_t F) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= T * F) return;
  const int64_t t = id / F, i = id % F;
  out[id] = cm::silu_mul(ff[t * 2 * F + i], ff[t * 2 * F + F + i]);
}

__global__ void gather_bf16_kernel(const uint16_t* src, const int64_t* idx, float* dst, int64_t width) {
  const int64_t r = blockIdx.x;
  const uint16_t* s = src + idx[r] * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) dst[r * width + i] = cm::bf16_to_f32(s[i]);
}

__global__ void to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = cm::f32_to_bf16(x[i]);
}

// ---- attention ------------------------------------------------------------------------------

constexpr int kTile = 128;  // keys per tile = threads per block
constexpr int kMaxDh = 256;

// One block per (query row, head). Each tile: every thread one key's logit (f32 dot product with
// the query in shared memory), the block's max, the online-softmax rescale, the weights in shared
// memory; then each thread accumulates output dims d and d + 128 over the tile's keys.
__global__ void attention_kernel(const float* q, const int32_t* q_pos, const float* k, const float* v,
                                 const int32_t* k_pos, int64_t S, int64_t H, int64_t Hkv, int64_t Dh, float* out) {
  const int64_t t = blockIdx.x / H, h = blockIdx.x % H;
  const int64_t g = h / (H / Hkv);
  __shared__ float qs[kMaxDh];
  __shared__ float w[kTile];
  __shared__ cm::OnlineSoftmax st;
  __shared__ float alpha;
  using Reduce = cub::BlockReduce<float, kTile>;
  __shared__ typename Reduce::TempStorage tmp;
  for (int64_t d = threadIdx.x; d < Dh; d += blockDim.x) qs[d] = q[(t * H + h) * Dh + d];
  if (threadIdx.x == 0) st = cm::OnlineSoftmax{};
  __syncthreads();
  const float scale = rsqrtf(float(Dh));
  const int32_t qp = q_pos[t];
  float acc0 = 0, acc1 = 0;
  for (int64_t s0 = 0; s0 < S; s0 += kTile) {
    const int64_t s = s0 + threadIdx.x;
    float logit = -INFINITY;
    if (s < S && cm::visible(k_pos[s], qp)) {
      const float* kr = k + (s * Hkv + g) * Dh;
      float dot = 0;
      for (int64_t d = 0; d < Dh; ++d) dot += qs[d] * kr[d];
      logit = dot * scale;
    }
    const float tmax = Reduce(tmp).Reduce(logit, ::cuda::maximum<float>{});
    if (threadIdx.x == 0) alpha = tmax == -INFINITY ? 1.0f : cm::online_rescale(st, tmax);
    __syncthreads();
    const bool any = st.m != -INFINITY;
    w[threadIdx.x] = any ? cm::online_weight(st, logit) : 0.0f;
    __syncthreads();
    if (threadIdx.x == 0) {
      float l = 0;
      for (int j = 0; j < kTile; ++j) l += w[j];
      st.l += l;
    }
    const int64_t n = min(int64_t(kTile), S - s0);
    acc0 *= alpha;
    acc1 *= alpha;
    for (int64_t j = 0; j < n; ++j) {
      if (w[j] == 0.0f) continue;
      const float* vr = v + ((s0 + j) * Hkv + g) * Dh;
      if (threadIdx.x < Dh) acc0 += w[j] * vr[threadIdx.x];
      if (threadIdx.x + kTile < Dh) acc1 += w[j] * vr[threadIdx.x + kTile];
    }
    __syncthreads();
  }
  if (threadIdx.x < Dh) out[(t * H + h) * Dh + threadIdx.x] = cm::online_finish(st, acc0);
  if (threadIdx.x + kTile < Dh) out[(t * H + h) * Dh + threadIdx.x + kTile] = cm::online_finish(st, acc1);
}

// ---- the last-row score ---------------------------------------------------------------------

__global__ void score_logits_kernel(const float* q, const float* k, int64_t S, int64_t H, int64_t Hkv, int64_t Dh,
                                    float* logits) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= H * S) return;
  const int64_t h = id / S, s = id % S;
  const float* kr = k + (s * Hkv + h / (H / Hkv)) * Dh;
  float dot = 0;
  for (int64_t d = 0; d < Dh; ++d) dot += q[h * Dh + d] * kr[d];
  logits[id] = dot * rsqrtf(float(Dh));
}

// One block per head: the max and the sum of exp(logit - max) over the keys.
__global__ void score_norm_kernel(const float* logits, int64_t S, float* m, float* l) {
  const int64_t h = blockIdx.x;
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float mx;
  float local = -INFINITY;
  for (int64_t s = threadIdx.x; s < S; s += blockDim.x) local = fmaxf(local, logits[h * S + s]);
  const float bmax = Reduce(tmp).Reduce(local, ::cuda::maximum<float>{});
  if (threadIdx.x == 0) mx = bmax;
  __syncthreads();
  float sum = 0;
  for (int64_t s = threadIdx.x; s < S; s += blockDim.x) sum += expf(logits[h * S + s] - mx);
  const float total = Reduce(tmp).Sum(sum);
  if (threadIdx.x == 0) {
    m[h] = mx;
    l[h] = total;
  }
}

__global__ void score_sum_kernel(const float* logits, const float* m, const float* l, int64_t S, int64_t H,
                                 float* scores) {
  const int64_t s = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s >= S) return;
  float acc = 0;
  for (int64_t h = 0; h < H; ++h) acc += cm::head_share(logits[h * S + s], m[h], l[h], H);
  scores[s] = acc;
}

// ---- selection ------------------------------------------------------------------------------

__global__ void selection_keys_kernel(const float* scores, const int32_t* pos, int64_t n, uint64_t* keys,
                                      int64_t* idx) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  keys[i] = cm::selection_key(scores[i], pos[i]);
  idx[i] = i;
}

__global__ void put_last_kernel(int64_t* keep, int64_t at, int64_t last) {
  keep[at] = last;
}

// A device scratch buffer freed at scope exit.
struct Scratch {
  void* p = nullptr;
  explicit Scratch(size_t bytes, const char* what) { p = device_alloc(bytes ? bytes : 1, what); }
  ~Scratch() { device_free(p); }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

cublasHandle_t blas() {
  static std::once_flag once;
  static cublasHandle_t h = nullptr;
  static cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  std::call_once(once, [] { status = cublasCreate(&h); });
  check_blas(status, "cublasCreate");
  return h;
}

}  // namespace

bool compiled() {
  return true;
}

Device open_device() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess)
    fail("no usable CUDA device: {} ({}); is an NVIDIA driver installed and a GPU visible?", cudaGetErrorString(e),
         cudaGetErrorName(e));
  if (count == 0) fail("no CUDA device found (cudaGetDeviceCount returned 0)");
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  Device d;
  d.index = 0;
  d.count = count;
  d.name = prop.name;
  d.cc_major = prop.major;
  d.cc_minor = prop.minor;
  d.total_bytes = int64_t(total_b);
  d.free_bytes = int64_t(free_b);
  return d;
}

void* device_alloc(size_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_b, &total_b);
    fail("cannot allocate {:.2f} GiB on the GPU for {} ({:.2f} GiB free of {:.2f}): {}", double(bytes) / 1073741824.0,
         what, double(free_b) / 1073741824.0, double(total_b) / 1073741824.0, cudaGetErrorString(e));
  }
  return p;
}

void device_free(void* p) {
  if (p) cudaFree(p);
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "copy to device");
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "copy to host");
}

void synchronize(const char* what) {
  check(cudaDeviceSynchronize(), what);
}

void rmsnorm(const float* x, const float* w, float* out, int64_t T, int64_t D, float eps) {
  if (T <= 0) return;
  rmsnorm_kernel<<<unsigned(T), kThreads>>>(x, w, out, D, eps);
  check_launch("rmsnorm");
}

void rope(float* x, const int32_t* pos, int64_t T, int64_t n_heads, int64_t Dh, int64_t rope_dim, float theta,
          const float* freq_factors) {
  const int64_t n = T * (rope_dim / 2);
  if (n <= 0) return;
  rope_kernel<<<blocks_for(n, kThreads), kThreads>>>(x, pos, T, n_heads, Dh, rope_dim, theta, freq_factors);
  check_launch("rope");
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  if (n <= 0) return;
  swiglu_kernel<<<blocks_for(n, kThreads), kThreads>>>(gate, up, out, n);
  check_launch("swiglu");
}

void add_inplace(float* x, const float* y, int64_t n) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n, kThreads), kThreads>>>(x, y, n);
  check_launch("add");
}

void gather_rows(const float* src, const int64_t* idx, float* dst, int64_t rows, int64_t width) {
  if (rows <= 0) return;
  gather_kernel<<<unsigned(rows), kThreads>>>(src, idx, dst, width);
  check_launch("gather_rows");
}

void scatter_rows(const float* src, const int64_t* idx, float* dst, int64_t rows, int64_t width) {
  if (rows <= 0) return;
  scatter_kernel<<<unsigned(rows), kThreads>>>(src, idx, dst, width);
  check_launch("scatter_rows");
}

void attention(const float* q, const int32_t* q_pos, int64_t T, const float* k, const float* v, const int32_t* k_pos,
               int64_t S, int64_t H, int64_t Hkv, int64_t Dh, float* out) {
  if (Dh > kMaxDh) fail("CUDA attention supports head widths up to {}, got {}", kMaxDh, Dh);
  if (H % Hkv != 0) fail("CUDA attention: {} heads do not group over {} KV heads", H, Hkv);
  if (T <= 0) return;
  attention_kernel<<<unsigned(T * H), kTile>>>(q, q_pos, k, v, k_pos, S, H, Hkv, Dh, out);
  check_launch("attention");
}

void last_row_scores(const float* q, const float* k, int64_t S, int64_t H, int64_t Hkv, int64_t Dh, float* scores) {
  if (S <= 0) return;
  Scratch logits(size_t(H * S) * sizeof(float), "score logits"), m(size_t(H) * sizeof(float), "score max"),
      l(size_t(H) * sizeof(float), "score sum");
  score_logits_kernel<<<blocks_for(H * S, kThreads), kThreads>>>(q, k, S, H, Hkv, Dh, logits.as<float>());
  check_launch("score logits");
  score_norm_kernel<<<unsigned(H), kThreads>>>(logits.as<float>(), S, m.as<float>(), l.as<float>());
  check_launch("score norm");
  score_sum_kernel<<<blocks_for(S, kThreads), kThreads>>>(logits.as<float>(), m.as<float>(), l.as<float>(), S, H,
                                                          scores);
  check_launch("score sum");
  synchronize("last_row_scores");  // the scratch is freed at return
}

void select_top(const float* scores, const int32_t* pos, int64_t n, int64_t n_keep, int64_t* keep) {
  if (n < 1 || n_keep < 1 || n_keep > n) fail("select_top: keep {} of {} tokens", n_keep, n);
  const int64_t m = n - 1;  // candidates: every token but the last, which is always kept
  Scratch keys(size_t(m) * 8, "selection keys"), keys_sorted(size_t(m) * 8, "selection keys"),
      idx(size_t(m) * 8, "selection order"), idx_sorted(size_t(n) * 8, "selection order");
  if (m > 0) {
    selection_keys_kernel<<<blocks_for(m, kThreads), kThreads>>>(scores, pos, m, keys.as<uint64_t>(), idx.as<int64_t>());
    check_launch("selection keys");
    size_t bytes = 0;
    check(cub::DeviceRadixSort::SortPairsDescending(nullptr, bytes, keys.as<uint64_t>(), keys_sorted.as<uint64_t>(),
                                                    idx.as<int64_t>(), idx_sorted.as<int64_t>(), int(m)),
          "selection sort (size)");
    Scratch tmp(bytes, "selection sort");
    check(cub::DeviceRadixSort::SortPairsDescending(tmp.p, bytes, keys.as<uint64_t>(), keys_sorted.as<uint64_t>(),
                                                    idx.as<int64_t>(), idx_sorted.as<int64_t>(), int(m)),
          "selection sort");
  }
  // The best n_keep - 1 candidates and the last token, in increasing order.
  put_last_kernel<<<1, 1>>>(idx_sorted.as<int64_t>(), n_keep - 1, n - 1);
  check_launch("selection last");
  size_t bytes = 0;
  check(cub::DeviceRadixSort::SortKeys(nullptr, bytes, idx_sorted.as<int64_t>(), keep, int(n_keep)),
        "selection order (size)");
  Scratch tmp(bytes, "selection order");
  check(cub::DeviceRadixSort::SortKeys(tmp.p, bytes, idx_sorted.as<int64_t>(), keep, int(n_keep)), "selection order");
  synchronize("select_top");
}

void kv_append(const float* k_new, const float* v_new, const int64_t* slot, const int32_t* pos, int64_t T, int64_t kv,
               float* k_cache, float* v_cache, uint32_t* bits) {
  if (T <= 0) return;
  kv_append_kernel<<<unsigned(T), kThreads>>>(k_new, v_new, slot, pos, kv, k_cache, v_cache, bits);
  check_launch("kv_append");
}

void copy_columns(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t width, int64_t rows) {
  if (rows <= 0 || width <= 0) return;
  check(cudaMemcpy2D(dst, size_t(ld_dst) * 4, src, size_t(ld_src) * 4, size_t(width) * 4, size_t(rows),
                     cudaMemcpyDeviceToDevice),
        "copy_columns");
}

void swiglu_fused(const float* ff, float* out, int64_t T, int64_t F) {
  if (T * F <= 0) return;
  swiglu_fused_kernel<<<blocks_for(T * F, kThreads), kThreads>>>(ff, out, T, F);
  check_launch("swiglu_fused");
}

void gather_rows_bf16(const uint16_t* src, const int64_t* idx, float* dst, int64_t rows, int64_t width) {
  if (rows <= 0) return;
  gather_bf16_kernel<<<unsigned(rows), kThreads>>>(src, idx, dst, width);
  check_launch("gather_rows_bf16");
}

void to_bf16(const float* x, uint16_t* y, int64_t n) {
  if (n <= 0) return;
  to_bf16_kernel<<<blocks_for(n, kThreads), kThreads>>>(x, y, n);
  check_launch("to_bf16");
}

// Row-major out[T][N] = a[T][K] . w[N][K]^T is, column-major, out^T[N][T] = w[N][K]-as-[K][N]^T . a^T:
// cuBLAS with op(A) = T on w (lda K), op(B) = N on a (ldb K), C ldc N.
void gemm_f32(const float* a, const float* w, float* out, int64_t T, int64_t K, int64_t N) {
  if (T <= 0 || N <= 0) return;
  const float one = 1.0f, zero = 0.0f;
  check_blas(cublasSgemm(blas(), CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(T), int(K), &one, w, int(K), a, int(K), &zero,
                         out, int(N)),
             "gemm_f32");
}

void gemm_bf16(const uint16_t* a, const uint16_t* w, float* out, int64_t T, int64_t K, int64_t N) {
  if (T <= 0 || N <= 0) return;
  const float one = 1.0f, zero = 0.0f;
  check_blas(cublasGemmEx(blas(), CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(T), int(K), &one, w, CUDA_R_16BF, int(K), a,
                          CUDA_R_16BF, int(K), &zero, out, CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT),
             "gemm_bf16");
}

}  // namespace lp::cuda
