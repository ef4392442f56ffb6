// The CUDA kernels of the backend. nvcc compiles them for the GPU (kernels/cuda/ops.cu); the host
// compiler compiles the same text for tests (tests/cuda_emu/host_emulation.cpp), where
// host_threads.h runs every CUDA thread of a block as a fiber with real barriers and shared
// memory. The per-element arithmetic is device_math.h; this file is the indexing, the tiling,
// the reductions and the barriers.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_math.h"
#include "kernels/cuda/rows.h"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

#include "model/error.h"

namespace lp::cuda::kernels {
template <class T, int N>
using BlockReduce = cub::BlockReduce<T, N>;
inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    device_failed(fmt::format("CUDA error in {}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e)));
}
}  // namespace lp::cuda::kernels
// The block's dynamic shared memory as `type* name`.
#define LP_DYNAMIC_SHARED(type, name)                                \
  extern __shared__ __align__(16) unsigned char lp_dynamic_shared[]; \
  type* name = reinterpret_cast<type*>(lp_dynamic_shared)
#define LP_UNROLL _Pragma("unroll")
// kernel<<<grid, block, shared_bytes, stream>>>(args...) on the backends' stream (captured where
// graphs are on: cuda_ops.h), then the launch's error check.
#define LP_LAUNCH(kernel, grid, block, shared_bytes, ...)                                              \
  do {                                                                                                 \
    ++::lp::cuda::queued_ops_counter();                                                                \
    const auto lp_stream = static_cast<cudaStream_t>(::lp::cuda::queue_on(::lp::cuda::op_id(kernel))); \
    (kernel)<<<(grid), (block), (shared_bytes), lp_stream>>>(__VA_ARGS__);                             \
    ::lp::cuda::kernels::check_launch(#kernel);                                                        \
  } while (0)
#else
#include "tests/cuda_emu/host_stream.h"

struct alignas(16) float4 {
  float x, y, z, w;
};
namespace lp::cuda::kernels {
template <class T, int N>
using BlockReduce = ::lp::host_threads::BlockReduce<T, N>;
}  // namespace lp::cuda::kernels
#define LP_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::lp::host_threads::dynamic_shared())
#define LP_UNROLL
#define LP_LAUNCH(kernel, grid, block, shared_bytes, ...)                                            \
  (++::lp::cuda::queued_ops_counter(),                                                               \
   ::lp::cuda::emulation::launch(::lp::cuda::op_id(kernel), dim3(grid), dim3(block), (shared_bytes), \
                                 (kernel), __VA_ARGS__))
#endif

namespace lp::cuda::kernels {
namespace cm = lp::cuda_math;

constexpr int kThreads = 256;

// Four consecutive 16-bit values from an 8-byte aligned address: one load on the device.
__device__ __forceinline__ void load4_u16(const uint16_t* p, uint16_t v[4]) {
#if defined(__CUDA_ARCH__)
  const uint2 w = *reinterpret_cast<const uint2*>(p);
  v[0] = uint16_t(w.x), v[1] = uint16_t(w.x >> 16), v[2] = uint16_t(w.y), v[3] = uint16_t(w.y >> 16);
#else
  memcpy(v, p, 8);
#endif
}

// A cached K or V value: an f32 cache's float, or an f16 cache's bits (KvType::F16), as f32; and one
// stored into either.
__device__ __forceinline__ float kv_f32(float x) {
  return x;
}
__device__ __forceinline__ float kv_f32(uint16_t h) {
  return cm::f16_to_f32(h);
}
__device__ __forceinline__ void kv_put(float* d, float x) {
  *d = x;
}
__device__ __forceinline__ void kv_put(uint16_t* d, float x) {
  *d = cm::f32_to_f16(x);
}
// Four consecutive cached values as f32 (16-byte aligned f32, 8-byte aligned f16): one load.
__device__ __forceinline__ float4 kv_load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ float4 kv_load4(const uint16_t* p) {
  uint16_t h[4];
  load4_u16(p, h);
  return float4{cm::f16_to_f32(h[0]), cm::f16_to_f32(h[1]), cm::f16_to_f32(h[2]), cm::f16_to_f32(h[3])};
}

struct MaxOp {
  __host__ __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// ---- elementwise and rows --------------------------------------------------------------------

// One block of kThreads per row.
__global__ void rmsnorm_kernel(Rows<const float> x, const float* w, Rows<float> out, int64_t D, float eps) {
  const int64_t t = blockIdx.x;
  const float* row = x(t);
  float* dst = out(t);
  float ss = 0;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss += row[i] * row[i];
  using Reduce = BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float scale;
  const float total = Reduce(tmp).Sum(ss);
  if (threadIdx.x == 0) scale = cm::rms_scale(total, D, eps);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) dst[i] = cm::rms_apply(row[i], scale, w[i]);
}

// One thread per (token, pair): the table entry is computed once per pair and applied to every head.
__global__ void rope_kernel(Rows<float> x, Rows<const int32_t> pos, int64_t T, int64_t n_heads, int64_t Dh,
                            int64_t rope_dim, float theta, const float* freq_factors, float freq_scale) {
  const int64_t half = rope_dim / 2;
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= T * half) return;
  const int64_t t = id / half, i = id % half;
  float c, s;
  cm::rope_cos_sin(*pos(t), i, rope_dim, theta, (freq_factors ? freq_factors[i] : 1.0f) / freq_scale, &c, &s);
  float* row = x(t);
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = row + h * Dh;
    cm::rope_rotate(v[2 * i], v[2 * i + 1], c, s, &v[2 * i], &v[2 * i + 1]);
  }
}

__global__ void swiglu_fused_kernel(Rows<const float> ff, Rows<float> out, int64_t T, int64_t F, bool gelu) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= T * F) return;
  const int64_t t = id / F, i = id % F;
  const float* row = ff(t);
  const float g = row[i], u = row[F + i];
  out(t)[i] = gelu ? cm::gelu_tanh_mul(g, u) : cm::silu_mul(g, u);
}

// One thread per row of router logits [T][E]: its k experts and weights (cm::route_row).
__global__ void route_kernel(const float* logits, int64_t T, int64_t E, int64_t k, int32_t* ids, float* w) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < T) cm::route_row(logits + t * E, E, k, ids + t * k, w + t * k);
}

// One thread per output value: out[t][i] = sum over j < k, in routing order, of w[t][j] * y[at[t][j]][i]
// (each row's experts' outputs, grouped by expert in y, weighted back into the row).
__global__ void moe_combine_kernel(const float* y, const int64_t* at, const float* w, int64_t T, int64_t k,
                                   int64_t D, float* out) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= T * D) return;
  const int64_t t = id / D, i = id % D;
  float acc = 0;
  for (int64_t j = 0; j < k; ++j) acc += w[t * k + j] * y[(at ? at[t * k + j] : t * k + j) * D + i];
  out[id] = acc;
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}

// x(t)[i] += y(t)[i] over T rows of D: one thread per value.
__global__ void add_kernel(Rows<float> x, Rows<const float> y, int64_t T, int64_t D) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= T * D) return;
  const int64_t t = id / D, i = id % D;
  x(t)[i] += y(t)[i];
}

// One block per row: dst(r)[0:width] = src(r)[0:width] (a batch's rows gathered into one buffer for
// a GEMM, and its outputs back into each member's).
__global__ void copy_row_table_kernel(Rows<const float> src, Rows<float> dst, int64_t width) {
  const int64_t r = blockIdx.x;
  const float* s = src(r);
  float* d = dst(r);
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) d[i] = s[i];
}

// x[t][i] += bias[i] for rows of n values: one thread per value.
__global__ void add_bias_kernel(float* x, const float* bias, int64_t total, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < total) x[i] += bias[i % n];
}

// One block per row.
__global__ void gather_kernel(const float* src, const int64_t* idx, float* dst, int64_t width) {
  const int64_t r = blockIdx.x;
  const float* s = src + idx[r] * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) dst[r * width + i] = s[i];
}

// One block per row: dst[dst_idx[r]] = src[src_idx[r]] (Aux Cache stores and revivals).
__global__ void copy_rows_kernel(const float* src, const int64_t* src_idx, float* dst, const int64_t* dst_idx,
                                 int64_t width) {
  const int64_t r = blockIdx.x;
  const float* s = src + src_idx[r] * width;
  float* d = dst + dst_idx[r] * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) d[i] = s[i];
}

__global__ void gather_bf16_kernel(const uint16_t* src, const int64_t* idx, float* dst, int64_t width) {
  const int64_t r = blockIdx.x;
  const uint16_t* s = src + idx[r] * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) dst[r * width + i] = cm::bf16_to_f32(s[i]);
}

// One block per row: its k and v into its cache slot's rows (as the cache's element type KV: float,
// or f16 bits rounded to nearest even), its position into the slot's, and the slot's number
// *slot_no(t) into slot_of(t) at that position (the row's cache's position-to-slot map).
template <class KV>
__global__ void kv_append_kernel(Rows<const float> k_new, Rows<const float> v_new, Rows<const int32_t> pos,
                                 int64_t kv, Rows<KV> k_slot, Rows<KV> v_slot, Rows<int32_t> slot_pos,
                                 Rows<const int32_t> slot_no, Rows<int32_t> slot_of) {
  const int64_t t = blockIdx.x;
  const float *ks = k_new(t), *vs = v_new(t);
  KV *kd = k_slot(t), *vd = v_slot(t);
  for (int64_t i = threadIdx.x; i < kv; i += blockDim.x) {
    kv_put(kd + i, ks[i]);
    kv_put(vd + i, vs[i]);
  }
  if (threadIdx.x == 0) {
    const int32_t p = *pos(t);
    *slot_pos(t) = p;
    slot_of(t)[p] = *slot_no(t);
  }
}

// Each row's greedy token (lp::argmax, kernels/argmax.h): the first index of its largest value, NaNs
// never chosen, a NaN at 0 giving 0. One block a row: each thread's best of its stride (value, then
// the lower index), then a tree over the block's.
__global__ void argmax_rows_kernel(const float* x, int64_t V, int32_t* ids) {
  const float* row = x + int64_t(blockIdx.x) * V;
  __shared__ float bv[kThreads];
  __shared__ int64_t bi[kThreads];
  const int tid = int(threadIdx.x);
  float best = cm::neg_inf();
  int64_t at = V;  // past every index: loses every tie
  for (int64_t i = tid; i < V; i += blockDim.x) {
    const float v = row[i];
    if (v > best || (v == best && i < at)) best = v, at = i;  // a NaN is neither
  }
  bv[tid] = best;
  bi[tid] = at;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (tid < half) {
      const float v = bv[tid + half];
      const int64_t i = bi[tid + half];
      if (v > bv[tid] || (v == bv[tid] && i < bi[tid])) bv[tid] = v, bi[tid] = i;
    }
    __syncthreads();
  }
  if (tid == 0) ids[blockIdx.x] = (row[0] != row[0] || bi[0] >= V) ? 0 : int32_t(bi[0]);
}

__global__ void fill_kernel(int32_t* x, int64_t n, int32_t v) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = v;
}

// out[i] = pos[keep[i]]: the positions a selection kept (a deferred step's next active set).
__global__ void gather_positions_kernel(const int32_t* pos, const int64_t* keep, int64_t n, int32_t* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = pos[keep[i]];
}

// out[i] = the cache slot of position pos[i] at a layer (slot_of: its position-to-slot map, -1 where the
// layer holds no K/V), for attention and scores to read the keys where they are. A position without
// K/V there reads slot 0 instead: the step missed a revival and the host computes it again.
__global__ void slots_of_kernel(const int32_t* pos, int64_t n, const int32_t* slot_of, int32_t* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const int32_t s = slot_of[pos[i]];
    out[i] = s < 0 ? 0 : s;
  }
}

__global__ void to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = cm::f32_to_bf16(x[i]);
}

// ---- GGUF blocks (--dtype int8): rows of `row_bytes` bytes, K elements each ---------------------

// y[n][k] = bf16(element k of row n), for the tensor-core GEMM of a prefill: one thread per unit
// of 8 elements (cuda_math::q_unit), units = N * K / 8.
__global__ void dequant_bf16_kernel(const uint8_t* q, int qt, int64_t row_bytes, int64_t K, uint16_t* y,
                                    int64_t units) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= units) return;
  const int64_t per_row = K / 8, n = i / per_row;
  int64_t k[2];
  float w[8];
  cm::q_unit(q + n * row_bytes, qt, i - n * per_row, k, w);
  uint16_t* out = y + n * K;
  for (int h = 0; h < 2; ++h)
    for (int e = 0; e < 4; ++e) out[k[h] + e] = cm::f32_to_bf16(w[4 * h + e]);
}

// dst[r][:] = row idx[r] of the blocks, in f32 (the embedding lookup, exact as on the CPU).
__global__ void gather_q_kernel(const uint8_t* q, int qt, int64_t row_bytes, const int64_t* idx, float* dst,
                                int64_t width) {
  const int64_t r = blockIdx.x;
  const uint8_t* row = q + idx[r] * row_bytes;
  for (int64_t u = threadIdx.x; u < width / 8; u += blockDim.x) {
    int64_t k[2];
    float w[8];
    cm::q_unit(row, qt, u, k, w);
    for (int e = 0; e < 8; ++e) dst[r * width + k[e >> 2] + (e & 3)] = w[e];
  }
}

// out[t][n] = sum_k a[t][k] * w[n][k] for few rows of bf16 activations a (a decoding step, the LM
// head), w the blocks' elements in f32: one warp per output n (kGemvWarps per block), each lane
// over units of 8 elements (cuda_math::q_unit_parts: a warp reads 256 or 144 contiguous bytes per
// step) with the scale and minimum taken out of each run of 4, rows in groups of 4 held in
// registers, the lanes' partial sums added by shuffles. Unlike the prefill's GEMM the weights are
// not rounded to bf16: that would cost more instructions per weight than the product. K % 32 == 0,
// a 8-byte aligned (4 activations per load).
// One row's share of a unit of 8 weights (cm::q_unit_parts: their values qv, the two runs of 4 at
// k[0] and k[1] with their scales s and minima m): acc += s (x . qv) (+ m sum(x)) run by run.
__device__ __forceinline__ void q_unit_accumulate(const uint16_t* x, const int64_t k[2], const float qv[8],
                                                  const float s[2], const float m[2], bool minima,
                                                  float& acc) {
  LP_UNROLL
  for (int h = 0; h < 2; ++h) {
    uint16_t v[4];
    load4_u16(x + k[h], v);
    float dot = 0, sum = 0;
    LP_UNROLL
    for (int e = 0; e < 4; ++e) {
      const float xe = cm::bf16_to_f32(v[e]);
      dot += xe * qv[4 * h + e];
      sum += xe;
    }
    acc += s[h] * dot;
    if (minima) acc += m[h] * sum;
  }
}

constexpr int kGemvWarps = 4;
__global__ void gemv_q_kernel(const uint16_t* a, const uint8_t* q, int qt, int64_t row_bytes, float* out,
                              int64_t T, int64_t K, int64_t N) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t n = int64_t(blockIdx.x) * kGemvWarps + (int(threadIdx.x) >> 5);
  const uint8_t* row = q + (n < N ? n : 0) * row_bytes;
  const int64_t units = K / 8;
  const bool minima = cm::has_minima(qt);
  for (int64_t t0 = 0; t0 < T; t0 += 4) {
    const int rows = int(T - t0 < 4 ? T - t0 : 4);
    float acc[4] = {0, 0, 0, 0};
    if (n < N) {
      for (int64_t u = lane; u < units; u += 32) {
        int64_t k[2];
        float qv[8], s[2], m[2];
        cm::q_unit_parts(row, qt, u, k, qv, s, m);
        for (int t = 0; t < rows; ++t) q_unit_accumulate(a + (t0 + t) * K, k, qv, s, m, minima, acc[t]);
      }
    }
    for (int t = 0; t < 4; ++t)
      for (int off = 16; off > 0; off /= 2) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off, 32);
    if (lane == 0 && n < N)
      for (int t = 0; t < rows; ++t) out[(t0 + t) * N + n] = acc[t];
  }
}

// The experts of a decoding step's (row, expert) pairs in one launch: blockIdx.x is pair p, whose
// input row is a[p / a_per] (a_per = k: a row's k pairs share the layer's input; 1: each pair its own
// row) and whose matrix is expert ids[p]'s, w[ids[p]] (of E). Blocks: each warp one output of the
// pair, by gemv_q_kernel's arithmetic for a single row (so a pair's sums are the ones gemv_q gives its
// row). A route outside [0, E) (a router that saw a NaN) gives NaN, not a read outside the table.
__global__ void gemv_q_routed_kernel(const uint16_t* a, int64_t a_per, const uint8_t* const* w,
                                     const int32_t* ids, int64_t E, int qt, int64_t row_bytes, float* out,
                                     int64_t K, int64_t N) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t n = int64_t(blockIdx.y) * kGemvWarps + (int(threadIdx.x) >> 5), p = blockIdx.x;
  if (n >= N) return;  // the warp's: n is the same on every lane
  if (ids[p] < 0 || ids[p] >= E) {
    if (lane == 0) out[p * N + n] = cm::quiet_nan();
    return;
  }
  const uint8_t* row = w[ids[p]] + n * row_bytes;
  const uint16_t* x = a + (p / a_per) * K;
  const int64_t units = K / 8;
  const bool minima = cm::has_minima(qt);
  float acc = 0;
  for (int64_t u = lane; u < units; u += 32) {
    int64_t k[2];
    float qv[8], s[2], m[2];
    cm::q_unit_parts(row, qt, u, k, qv, s, m);
    q_unit_accumulate(x, k, qv, s, m, minima, acc);
  }
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off, 32);
  if (lane == 0) out[p * N + n] = acc;
}

LP_HD float as_f32(float v) {
  return v;
}
LP_HD float as_f32(uint16_t v) {
  return cm::bf16_to_f32(v);
}

// The same over dense experts: bf16 weights with bf16 inputs, or f32 with f32, summed in f32 (each
// lane a stride of K, then the warp's shuffles).
template <class V>
__global__ void gemv_routed_kernel(const V* a, int64_t a_per, const V* const* w, const int32_t* ids,
                                   int64_t E, float* out, int64_t K, int64_t N) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t n = int64_t(blockIdx.y) * kGemvWarps + (int(threadIdx.x) >> 5), p = blockIdx.x;
  if (n >= N) return;
  if (ids[p] < 0 || ids[p] >= E) {
    if (lane == 0) out[p * N + n] = cm::quiet_nan();
    return;
  }
  const V* row = w[ids[p]] + n * K;
  const V* x = a + (p / a_per) * K;
  float acc = 0;
  for (int64_t i = lane; i < K; i += 32) acc += as_f32(x[i]) * as_f32(row[i]);
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off, 32);
  if (lane == 0) out[p * N + n] = acc;
}

// ---- attention ------------------------------------------------------------------------------
//
// FlashAttention's scheme on CUDA cores, in f32. A block takes 32 query rows of one KV head: row
// i of KV head g is token i / G and query head g * G + i % G (G = H / Hkv), so the rows of a GQA
// group share every K/V tile. Blocks run latest rows first (the longest causal rows). Per tile of
// BK keys: the positions, then (unless every key of the tile comes after every query of the
// block) the K rows into shared memory, S = Q K^T with each of the 128 threads computing 4 rows x
// BK/16 keys from float4 reads, the causal mask on original positions and the online softmax in
// registers (a row's keys sit in the 16 lanes of one half-warp: max and sum by shuffles), the V
// rows into the same shared memory, and O = alpha O + P V with each thread holding 4 rows x 4
// dims per 64 of the head width. Keys may be split over blockIdx.z (flash-decoding) when the
// grid would leave SMs idle; each split then writes its unnormalised O with its max and sum, and
// attention_combine_kernel merges them. q, k and v must be 16-byte aligned, Dh % 4 == 0.

constexpr int kAttnThreads = 128;
constexpr int kAttnRows = 32;

// The shared memory of attention_kernel<BK, ...> for head width Dh, in bytes.
inline size_t attention_shared_bytes(int64_t Dh, int BK) {
  const int64_t ld = Dh + 4;
  const int64_t floats = kAttnRows * ld + BK * ld + kAttnRows * (BK + 4);
  return size_t(floats + kAttnRows + BK) * 4;
}

// One attention of a launch: a member's query rows and key set (attention()'s arguments), its key
// splits (planned as it would be alone, so that its sums are the same in any batch), its partial
// results when split, and where its blocks and output rows start in the launch's grid.
struct AttnJob {
  const float* q;
  const int32_t* q_pos;
  int64_t T;
  const void *k, *v;  // the cache's K and V: float, or f16 bits (the kernel's KV)
  const int32_t *k_pos, *k_slot;
  int64_t S;
  float* out;
  float *part_acc, *part_m, *part_l;  // null when the job is not split
  int64_t tiles_per_split, splits, row_blocks, first_block, first_row;
};

// This block's job: `one`, or the job of jobs[n] whose blocks (first_block, by x) or output rows
// (first_row, by_rows) hold index i.
__device__ __forceinline__ AttnJob job_of(const AttnJob& one, const AttnJob* jobs, int n, int64_t i,
                                          bool by_rows) {
  if (!jobs) return one;
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if ((by_rows ? jobs[mid].first_row : jobs[mid].first_block) <= i)
      lo = mid;
    else
      hi = mid - 1;
  }
  return jobs[lo];
}

// The job a block of an attention kernel runs and its row block (counted from the job's last: the
// last rows see the most keys, so they start first); `none` when blockIdx.z is past the job's splits
// (the whole block has nothing to do).
struct BlockJob {
  AttnJob job;
  int64_t row_block;
  bool none;
};
__device__ __forceinline__ BlockJob block_job(const AttnJob& one, const AttnJob* jobs, int n_jobs) {
  const AttnJob j = job_of(one, jobs, n_jobs, blockIdx.x, false);
  return {j, j.first_block + j.row_blocks - 1 - int64_t(blockIdx.x), int64_t(blockIdx.z) >= j.splits};
}

// The cache row of key s: k_slot[s] for a listed key set, else s.
__device__ __forceinline__ int64_t key_row(const int32_t* k_slot, int64_t s) {
  return k_slot ? k_slot[s] : s;
}

// n rows of per_row groups of four values each, the rows of keys s0 .. s0 + n - 1 (key_row) of src
// (the cache's elements, KV), rows `stride` elements apart, as f32 into dst rows `ld` floats apart:
// four loads in flight per thread before their stores.
template <class KV>
__device__ __forceinline__ void load_rows(float* dst, int ld, const KV* src, int64_t stride, int n,
                                          int per_row, const int32_t* k_slot, int64_t s0) {
  const int total = n * per_row;
  for (int base = int(threadIdx.x); base < total; base += 4 * kAttnThreads) {
    float4 buf[4];
    LP_UNROLL
    for (int u = 0; u < 4; ++u) {
      const int e = base + u * kAttnThreads;
      if (e < total) {
        const int c = e / per_row, d4 = e - c * per_row;
        buf[u] = kv_load4(src + key_row(k_slot, s0 + c) * stride + 4 * d4);
      }
    }
    LP_UNROLL
    for (int u = 0; u < 4; ++u) {
      const int e = base + u * kAttnThreads;
      if (e < total) {
        const int c = e / per_row, d4 = e - c * per_row;
        *reinterpret_cast<float4*>(dst + c * ld + 4 * d4) = buf[u];
      }
    }
  }
}

// A key tile's positions into kp[KEYS] (INT32_MAX past its n keys), loaded by the block's first KEYS
// threads; true when every key comes after every query of the block (q_last: their latest position),
// so the whole tile is masked (uniform over the block). A barrier inside: all threads call it.
template <int KEYS>
__device__ __forceinline__ bool tile_all_masked(int32_t* kp, const int32_t* k_pos, const int32_t* k_slot,
                                                int64_t s0, int n, int32_t q_last) {
  const int tid = int(threadIdx.x);
  if (tid < KEYS) kp[tid] = tid < n ? k_pos[key_row(k_slot, s0 + tid)] : INT32_MAX;
  __syncthreads();
  int32_t k_first = INT32_MAX;
  for (int c = 0; c < KEYS; ++c) k_first = kp[c] < k_first ? kp[c] : k_first;
  return k_first > q_last;
}

// One job (`one`) or a launch's jobs (jobs[n_jobs], a batch's members: blockIdx.x runs over their
// row blocks one job after another, blockIdx.z up to the most splits of any). KV: the caches' element.
template <int BK, int DC, class KV>
__global__ void __launch_bounds__(kAttnThreads)
    attention_kernel(AttnJob one, const AttnJob* jobs, int n_jobs, int64_t H, int64_t Hkv, int64_t Dh,
                     float scale, int32_t window) {
  static_assert(BK % 16 == 0 && BK <= kAttnThreads, "a tile is loaded one position per thread");
  constexpr int KJ = BK / 16;
  constexpr int ldp = BK + 4;
  const BlockJob B = block_job(one, jobs, n_jobs);
  if (B.none) return;
  const auto& [q, q_pos, T, k_any, v_any, k_pos, k_slot, S, out, part_acc, part_m, part_l, tiles_per_split,
               n_splits, n_row_blocks, first_block, first_row] = B.job;
  const KV *k = static_cast<const KV*>(k_any), *v = static_cast<const KV*>(v_any);
  const int64_t G = H / Hkv, g = blockIdx.y, split = blockIdx.z, rows = T * G, row0 = B.row_block * kAttnRows;
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int ld = int(Dh) + 4, per_row = int(Dh) / 4;  // padded rows stay float4-aligned
  LP_DYNAMIC_SHARED(float, smem);
  float* qs = smem;                  // [kAttnRows][ld]
  float* kvs = qs + kAttnRows * ld;  // [BK][ld]: the tile's K rows, then its V rows
  float* ps = kvs + BK * ld;         // [kAttnRows][ldp]: the tile's weights
  int32_t* qp = reinterpret_cast<int32_t*>(ps + kAttnRows * ldp);  // [kAttnRows]
  int32_t* kp = qp + kAttnRows;                                    // [BK]

  for (int e = tid; e < kAttnRows * per_row; e += kAttnThreads) {
    const int r = e / per_row, d4 = e - r * per_row;
    const int64_t i = row0 + r;
    float4 x = {0.0f, 0.0f, 0.0f, 0.0f};
    if (i < rows) x = *reinterpret_cast<const float4*>(q + ((i / G) * H + g * G + i % G) * Dh + 4 * d4);
    *reinterpret_cast<float4*>(qs + r * ld + 4 * d4) = x;
  }
  if (tid < kAttnRows) {
    const int64_t i = row0 + tid;
    qp[tid] = i < rows ? q_pos[i / G] : -1;  // a padding row sees no key
  }
  __syncthreads();
  int32_t q_last = -1;
  for (int r = 0; r < kAttnRows; ++r) q_last = qp[r] > q_last ? qp[r] : q_last;

  cm::OnlineSoftmax st[4];  // rows ty * 4 + i; the same in the 16 lanes of a half-warp
  float acc[4][DC][4] = {};
  const int64_t n_tiles = (S + BK - 1) / BK;
  const int64_t tile_end = (split + 1) * tiles_per_split < n_tiles ? (split + 1) * tiles_per_split : n_tiles;
  for (int64_t tile = split * tiles_per_split; tile < tile_end; ++tile) {
    const int64_t s0 = tile * BK;
    const int n = S - s0 < BK ? int(S - s0) : BK;
    if (tile_all_masked<BK>(kp, k_pos, k_slot, s0, n, q_last)) {
      __syncthreads();  // before the next tile's positions overwrite these
      continue;
    }
    load_rows(kvs, ld, k + g * Dh, Hkv * Dh, n, per_row, k_slot, s0);
    __syncthreads();
    float sc[4][KJ] = {};
    for (int d = 0; d < int(Dh); d += 4) {
      float4 qv[4], kv[KJ];
      LP_UNROLL
      for (int i = 0; i < 4; ++i) qv[i] = *reinterpret_cast<const float4*>(qs + (ty * 4 + i) * ld + d);
      LP_UNROLL
      for (int j = 0; j < KJ; ++j) kv[j] = *reinterpret_cast<const float4*>(kvs + (tx + 16 * j) * ld + d);
      LP_UNROLL
      for (int i = 0; i < 4; ++i) LP_UNROLL
      for (int j = 0; j < KJ; ++j)
        sc[i][j] = fmaf(qv[i].w, kv[j].w,
                        fmaf(qv[i].z, kv[j].z, fmaf(qv[i].y, kv[j].y, fmaf(qv[i].x, kv[j].x, sc[i][j]))));
    }
    // The online softmax of each row over this tile, across the 16 lanes holding its keys.
    LP_UNROLL
    for (int i = 0; i < 4; ++i) {
      const int r = ty * 4 + i;
      float mx = -INFINITY;
      LP_UNROLL
      for (int j = 0; j < KJ; ++j) {
        const int c = tx + 16 * j;
        sc[i][j] = c < n && cm::visible(kp[c], qp[r], window) ? sc[i][j] * scale : -INFINITY;
        mx = fmaxf(mx, sc[i][j]);
      }
      LP_UNROLL
      for (int off = 8; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off, 16));
      const float alpha = cm::online_rescale(st[i], mx);
      float sum = 0;
      LP_UNROLL
      for (int j = 0; j < KJ; ++j) {
        const float w = cm::online_weight(st[i], sc[i][j]);
        ps[r * ldp + tx + 16 * j] = w;
        sum += w;
      }
      LP_UNROLL
      for (int off = 8; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off, 16);
      st[i].l += sum;
      LP_UNROLL
      for (int cc = 0; cc < DC; ++cc) LP_UNROLL
      for (int e = 0; e < 4; ++e) acc[i][cc][e] *= alpha;
    }
    __syncthreads();  // every thread is done with the K rows and has written its weights
    load_rows(kvs, ld, v + g * Dh, Hkv * Dh, n, per_row, k_slot, s0);
    const int n4 = (n + 3) & ~3;  // P V reads keys four at a time: rows n .. n4 - 1 are zeros
    for (int e = tid; e < (n4 - n) * per_row; e += kAttnThreads)
      *reinterpret_cast<float4*>(kvs + (n + e / per_row) * ld + 4 * (e % per_row)) =
          float4{0.0f, 0.0f, 0.0f, 0.0f};
    __syncthreads();
    for (int c = 0; c < n4; c += 4) {
      float4 p[4];
      LP_UNROLL
      for (int i = 0; i < 4; ++i) p[i] = *reinterpret_cast<const float4*>(ps + (ty * 4 + i) * ldp + c);
      LP_UNROLL
      for (int cc = 0; cc < DC; ++cc) {
        const int d = 4 * tx + 64 * cc;
        if (d < int(Dh)) {
          const float4 v0 = *reinterpret_cast<const float4*>(kvs + (c + 0) * ld + d);
          const float4 v1 = *reinterpret_cast<const float4*>(kvs + (c + 1) * ld + d);
          const float4 v2 = *reinterpret_cast<const float4*>(kvs + (c + 2) * ld + d);
          const float4 v3 = *reinterpret_cast<const float4*>(kvs + (c + 3) * ld + d);
          LP_UNROLL
          for (int i = 0; i < 4; ++i) {
            acc[i][cc][0] =
                fmaf(p[i].w, v3.x, fmaf(p[i].z, v2.x, fmaf(p[i].y, v1.x, fmaf(p[i].x, v0.x, acc[i][cc][0]))));
            acc[i][cc][1] =
                fmaf(p[i].w, v3.y, fmaf(p[i].z, v2.y, fmaf(p[i].y, v1.y, fmaf(p[i].x, v0.y, acc[i][cc][1]))));
            acc[i][cc][2] =
                fmaf(p[i].w, v3.z, fmaf(p[i].z, v2.z, fmaf(p[i].y, v1.z, fmaf(p[i].x, v0.z, acc[i][cc][2]))));
            acc[i][cc][3] =
                fmaf(p[i].w, v3.w, fmaf(p[i].z, v2.w, fmaf(p[i].y, v1.w, fmaf(p[i].x, v0.w, acc[i][cc][3]))));
          }
        }
      }
    }
    __syncthreads();
  }

  LP_UNROLL
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + ty * 4 + i;
    if (row >= rows) break;
    const int64_t o = (row / G) * H + g * G + row % G;  // output row (token, head)
    LP_UNROLL
    for (int cc = 0; cc < DC; ++cc) LP_UNROLL
    for (int e = 0; e < 4; ++e) {
      const int64_t d = 4 * tx + 64 * cc + e;
      if (d >= Dh) continue;
      if (part_acc)
        part_acc[(split * T * H + o) * Dh + d] = acc[i][cc][e];
      else
        out[o * Dh + d] = cm::online_finish(st[i], acc[i][cc][e]);
    }
    if (part_acc && tx == 0) {
      part_m[split * T * H + o] = st[i].m;
      part_l[split * T * H + o] = st[i].l;
    }
  }
}

// Merges the key splits of the attention kernels: one block per output row (token, head) of a job, or
// of a launch's jobs (those not split have nothing to merge).
__global__ void attention_combine_kernel(AttnJob one, const AttnJob* jobs, int n_jobs, int64_t H,
                                         int64_t Dh) {
  const AttnJob J = job_of(one, jobs, n_jobs, blockIdx.x, true);
  if (J.splits < 2) return;
  const float *part_acc = J.part_acc, *part_m = J.part_m, *part_l = J.part_l;
  const int64_t n_rows = J.T * H, splits = J.splits, o = int64_t(blockIdx.x) - J.first_row;
  float* out = J.out;
  float m = -INFINITY;
  for (int64_t s = 0; s < splits; ++s) m = fmaxf(m, part_m[s * n_rows + o]);
  float l = 0;
  for (int64_t s = 0; s < splits; ++s)
    l += part_l[s * n_rows + o] * cm::split_weight(part_m[s * n_rows + o], m);
  const cm::OnlineSoftmax st{m, l};
  for (int64_t d = threadIdx.x; d < Dh; d += blockDim.x) {
    float a = 0;
    for (int64_t s = 0; s < splits; ++s)
      a += part_acc[(s * n_rows + o) * Dh + d] * cm::split_weight(part_m[s * n_rows + o], m);
    out[o * Dh + d] = cm::online_finish(st, a);
  }
}

// ---- the last-row score ---------------------------------------------------------------------

// One thread per (head, key): the scaled logit of the last query row, at q_pos; -inf for a key
// outside a sliding window (k_pos: the keys' positions, read only with a window; key s is cache row
// key_row(k_slot, s) of k, whose elements are KV).
template <class KV>
__global__ void score_logits_kernel(const float* q, const KV* k, int64_t S, int64_t H, int64_t Hkv,
                                    int64_t Dh, float scale, const int32_t* k_pos, const int32_t* k_slot,
                                    int32_t q_pos, int32_t window, float* logits) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= H * S) return;
  const int64_t h = id / S, s = id % S, row = key_row(k_slot, s);
  if (window > 0 && !cm::visible(k_pos[row], q_pos, window)) {
    logits[id] = -INFINITY;
    return;
  }
  const KV* kr = k + (row * Hkv + h / (H / Hkv)) * Dh;
  float dot = 0;
  for (int64_t d = 0; d < Dh; ++d) dot += q[h * Dh + d] * kv_f32(kr[d]);
  logits[id] = dot * scale;
}

// One block per head: the max and the sum of exp(logit - max) over the keys.
__global__ void score_norm_kernel(const float* logits, int64_t S, float* m, float* l) {
  const int64_t h = blockIdx.x;
  using Reduce = BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ float mx;
  float local = -INFINITY;
  for (int64_t s = threadIdx.x; s < S; s += blockDim.x) local = fmaxf(local, logits[h * S + s]);
  const float bmax = Reduce(tmp).Reduce(local, MaxOp{});
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

// One thread per key: the mean over heads of its probability.
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

}  // namespace lp::cuda::kernels
