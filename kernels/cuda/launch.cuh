// The launchers of the backend's own kernels (cuda_ops.h), written once for both builds: ops.cu
// includes this under nvcc (LP_LAUNCH is <<<...>>>) and tests/cuda_emu/host_emulation.cpp under
// the host compiler (LP_LAUNCH runs the block's threads as fibers, tests/cuda_emu/host_threads.h). What
// differs between the two, device memory, cuBLAS, CUB sorts and copies, is in those files.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/mma.cuh"
#include "model/error.h"

namespace lp::cuda {
namespace {

unsigned blocks_for(int64_t n, int threads) {
  return unsigned((n + threads - 1) / threads);
}

// A launcher's scratch memory (scratch_alloc), given back at scope exit without synchronising the
// device.
struct Scratch {
  void* p = nullptr;
  Scratch(size_t bytes, const char* what) : p(scratch_alloc(bytes ? bytes : 1, what)) {}
  ~Scratch() { scratch_free(p); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

using kernels::kThreads;

}  // namespace

void rmsnorm_rows(Rows<const float> x, const float* w, Rows<float> out, int64_t T, int64_t D, float eps) {
  if (T <= 0) return;
  LP_LAUNCH(kernels::rmsnorm_kernel, unsigned(T), kThreads, 0, x, w, out, D, eps);
}

void rmsnorm(const float* x, const float* w, float* out, int64_t T, int64_t D, float eps) {
  rmsnorm_rows({x, D}, w, {out, D}, T, D, eps);
}

void rope_rows(Rows<float> x, Rows<const int32_t> pos, int64_t T, int64_t n_heads, int64_t Dh,
               int64_t rope_dim, float theta, const float* freq_factors, float freq_scale) {
  const int64_t n = T * (rope_dim / 2);
  if (n <= 0) return;
  LP_LAUNCH(kernels::rope_kernel, blocks_for(n, kThreads), kThreads, 0, x, pos, T, n_heads, Dh, rope_dim,
            theta, freq_factors, freq_scale);
}

void rope(float* x, const int32_t* pos, int64_t T, int64_t n_heads, int64_t Dh, int64_t rope_dim, float theta,
          const float* freq_factors, float freq_scale) {
  rope_rows({x, n_heads * Dh}, {pos, 1}, T, n_heads, Dh, rope_dim, theta, freq_factors, freq_scale);
}

void route_top_k(const float* logits, int64_t T, int64_t E, int64_t k, int32_t* ids, float* w) {
  if (T <= 0) return;
  if (E < 1 || k < 1 || k > E) fail("CUDA route_top_k: {} of {} experts", k, E);
  LP_LAUNCH(kernels::route_kernel, blocks_for(T, kThreads), kThreads, 0, logits, T, E, k, ids, w);
}

void moe_combine(const float* y, const int64_t* at, const float* w, int64_t T, int64_t k, int64_t D,
                 float* out) {
  if (T <= 0 || D <= 0) return;
  LP_LAUNCH(kernels::moe_combine_kernel, blocks_for(T * D, kThreads), kThreads, 0, y, at, w, T, k, D, out);
}

void mma_f16_tile(const float* a, const float* b, float* d, int64_t K) {
  if (K <= 0 || K % 16) fail("CUDA mma_f16_tile: K = {} is not a positive multiple of 16", K);
  LP_LAUNCH(kernels::mma_tile_kernel, 1u, 32, 0, a, b, d, K);
}

void scale_inplace(float* x, int64_t n, float s) {
  if (n <= 0) return;
  LP_LAUNCH(kernels::scale_kernel, blocks_for(n, kThreads), kThreads, 0, x, n, s);
}

void swiglu_rows(Rows<const float> ff, Rows<float> out, int64_t T, int64_t F, bool gelu) {
  if (T <= 0 || F <= 0) return;
  LP_LAUNCH(kernels::swiglu_fused_kernel, blocks_for(T * F, kThreads), kThreads, 0, ff, out, T, F, gelu);
}

void swiglu_fused(const float* ff, float* out, int64_t T, int64_t F, bool gelu) {
  swiglu_rows({ff, 2 * F}, {out, F}, T, F, gelu);
}

void add_rows(Rows<float> x, Rows<const float> y, int64_t T, int64_t D) {
  if (T <= 0 || D <= 0) return;
  LP_LAUNCH(kernels::add_kernel, blocks_for(T * D, kThreads), kThreads, 0, x, y, T, D);
}

void add_inplace(float* x, const float* y, int64_t n) {
  add_rows({x, n}, {y, n}, 1, n);
}

void copy_rows_at(Rows<const float> src, Rows<float> dst, int64_t T, int64_t width) {
  if (T <= 0 || width <= 0) return;
  LP_LAUNCH(kernels::copy_row_table_kernel, unsigned(T), kThreads, 0, src, dst, width);
}

void add_bias(float* x, const float* bias, int64_t T, int64_t n) {
  if (T <= 0 || n <= 0) return;
  LP_LAUNCH(kernels::add_bias_kernel, blocks_for(T * n, kThreads), kThreads, 0, x, bias, T * n, n);
}

void gather_rows(const float* src, const int64_t* idx, float* dst, int64_t rows, int64_t width) {
  if (rows <= 0) return;
  LP_LAUNCH(kernels::gather_kernel, unsigned(rows), kThreads, 0, src, idx, dst, width);
}

void copy_rows(const float* src, const int64_t* src_idx, float* dst, const int64_t* dst_idx, int64_t rows,
               int64_t width) {
  if (rows <= 0) return;
  LP_LAUNCH(kernels::copy_rows_kernel, unsigned(rows), kThreads, 0, src, src_idx, dst, dst_idx, width);
}

void gather_rows_bf16(const uint16_t* src, const int64_t* idx, float* dst, int64_t rows, int64_t width) {
  if (rows <= 0) return;
  LP_LAUNCH(kernels::gather_bf16_kernel, unsigned(rows), kThreads, 0, src, idx, dst, width);
}

namespace {
template <class KV>
void kv_append_rows_as(Rows<const float> k_new, Rows<const float> v_new, Rows<const int32_t> pos, int64_t T,
                       int64_t kv, Rows<KV> k_slot, Rows<KV> v_slot, Rows<int32_t> slot_pos,
                       Rows<const int32_t> slot_no, Rows<int32_t> slot_of) {
  if (T <= 0) return;
  LP_LAUNCH(kernels::kv_append_kernel<KV>, unsigned(T), kThreads, 0, k_new, v_new, pos, kv, k_slot, v_slot,
            slot_pos, slot_no, slot_of);
}
template <class KV>
void kv_append_as(const float* k_new, const float* v_new, const int32_t* pos, int64_t T, int64_t kv,
                  int64_t first_slot, KV* k_cache, KV* v_cache, int32_t* slot_pos, const int32_t* slot_no,
                  int32_t* slot_of) {
  kv_append_rows_as<KV>({k_new, kv}, {v_new, kv}, {pos, 1}, T, kv, {k_cache + first_slot * kv, kv},
                        {v_cache + first_slot * kv, kv}, {slot_pos + first_slot, 1}, {slot_no, 1},
                        {slot_of, 0});
}
}  // namespace

void kv_append_rows(Rows<const float> k_new, Rows<const float> v_new, Rows<const int32_t> pos, int64_t T,
                    int64_t kv, Rows<float> k_slot, Rows<float> v_slot, Rows<int32_t> slot_pos,
                    Rows<const int32_t> slot_no, Rows<int32_t> slot_of) {
  kv_append_rows_as(k_new, v_new, pos, T, kv, k_slot, v_slot, slot_pos, slot_no, slot_of);
}
void kv_append_rows(Rows<const float> k_new, Rows<const float> v_new, Rows<const int32_t> pos, int64_t T,
                    int64_t kv, Rows<uint16_t> k_slot, Rows<uint16_t> v_slot, Rows<int32_t> slot_pos,
                    Rows<const int32_t> slot_no, Rows<int32_t> slot_of) {
  kv_append_rows_as(k_new, v_new, pos, T, kv, k_slot, v_slot, slot_pos, slot_no, slot_of);
}

void kv_append(const float* k_new, const float* v_new, const int32_t* pos, int64_t T, int64_t kv,
               int64_t first_slot, float* k_cache, float* v_cache, int32_t* slot_pos, const int32_t* slot_no,
               int32_t* slot_of) {
  kv_append_as(k_new, v_new, pos, T, kv, first_slot, k_cache, v_cache, slot_pos, slot_no, slot_of);
}
void kv_append(const float* k_new, const float* v_new, const int32_t* pos, int64_t T, int64_t kv,
               int64_t first_slot, uint16_t* k_cache, uint16_t* v_cache, int32_t* slot_pos,
               const int32_t* slot_no, int32_t* slot_of) {
  kv_append_as(k_new, v_new, pos, T, kv, first_slot, k_cache, v_cache, slot_pos, slot_no, slot_of);
}

void argmax_rows(const float* x, int64_t rows, int64_t V, int32_t* ids) {
  if (rows <= 0) return;
  LP_LAUNCH(kernels::argmax_rows_kernel, unsigned(rows), kThreads, 0, x, V, ids);
}

void fill_i32(int32_t* x, int64_t n, int32_t v) {
  if (n <= 0) return;
  LP_LAUNCH(kernels::fill_kernel, blocks_for(n, kThreads), kThreads, 0, x, n, v);
}

void gather_positions(const int32_t* pos, const int64_t* keep, int64_t n, int32_t* out) {
  if (n <= 0) return;
  LP_LAUNCH(kernels::gather_positions_kernel, blocks_for(n, kThreads), kThreads, 0, pos, keep, n, out);
}

void slots_of(const int32_t* pos, int64_t n, const int32_t* slot_of, int32_t* out) {
  if (n <= 0) return;
  LP_LAUNCH(kernels::slots_of_kernel, blocks_for(n, kThreads), kThreads, 0, pos, n, slot_of, out);
}

// Pairs over blockIdx.x (up to 2^31 - 1), a pair's outputs over blockIdx.y (N up to 4 x 65,535).
dim3 routed_grid(int64_t P, int64_t N) {
  if (blocks_for(N, kernels::kGemvWarps) > 65535u)
    fail("CUDA routed GEMV: {} outputs a pair, past 262,140", N);
  return dim3(unsigned(P), blocks_for(N, kernels::kGemvWarps));
}

void gemv_routed_q(const uint16_t* a, int64_t a_per, const uint8_t* const* w, const int32_t* ids, int64_t E,
                   int qtype, int64_t row_bytes, float* out, int64_t P, int64_t K, int64_t N) {
  if (P <= 0 || N <= 0) return;
  LP_LAUNCH(kernels::gemv_q_routed_kernel, routed_grid(P, N), 32 * kernels::kGemvWarps, 0, a, a_per, w, ids,
            E, qtype, row_bytes, out, K, N);
}

void gemv_routed_bf16(const uint16_t* a, int64_t a_per, const uint16_t* const* w, const int32_t* ids,
                      int64_t E, float* out, int64_t P, int64_t K, int64_t N) {
  if (P <= 0 || N <= 0) return;
  LP_LAUNCH(kernels::gemv_routed_kernel<uint16_t>, routed_grid(P, N), 32 * kernels::kGemvWarps, 0, a, a_per,
            w, ids, E, out, K, N);
}

void gemv_routed_f32(const float* a, int64_t a_per, const float* const* w, const int32_t* ids, int64_t E,
                     float* out, int64_t P, int64_t K, int64_t N) {
  if (P <= 0 || N <= 0) return;
  LP_LAUNCH(kernels::gemv_routed_kernel<float>, routed_grid(P, N), 32 * kernels::kGemvWarps, 0, a, a_per, w,
            ids, E, out, K, N);
}

void to_bf16(const float* x, uint16_t* y, int64_t n) {
  if (n <= 0) return;
  LP_LAUNCH(kernels::to_bf16_kernel, blocks_for(n, kThreads), kThreads, 0, x, y, n);
}

void dequant_bf16(const uint8_t* q, int qtype, int64_t row_bytes, int64_t N, int64_t K, uint16_t* y) {
  const int64_t units = N * (K / 8);
  if (units <= 0) return;
  LP_LAUNCH(kernels::dequant_bf16_kernel, blocks_for(units, kThreads), kThreads, 0, q, qtype, row_bytes, K, y,
            units);
}

void gather_rows_q(const uint8_t* q, int qtype, int64_t row_bytes, const int64_t* idx, float* dst,
                   int64_t rows, int64_t width) {
  if (rows <= 0) return;
  LP_LAUNCH(kernels::gather_q_kernel, unsigned(rows), kThreads, 0, q, qtype, row_bytes, idx, dst, width);
}

void gemv_q(const uint16_t* a, const uint8_t* q, int qtype, int64_t row_bytes, float* out, int64_t T,
            int64_t K, int64_t N) {
  if (T <= 0 || N <= 0) return;
  LP_LAUNCH(kernels::gemv_q_kernel, blocks_for(N, kernels::kGemvWarps), 32 * kernels::kGemvWarps, 0, a, q,
            qtype, row_bytes, out, T, K, N);
}

namespace {

// Blocks of an attention kernel that fit on an SM at once, asked once per kernel instance after
// allowing it `most` bytes of shared memory (the host build: a guess).
template <class Kernel>
int attention_blocks_per_sm(Kernel* kernel, size_t most, int threads) {
  int per_sm = 2;
#if defined(__CUDACC__)
  static const int fit = [&] {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(most));
    if (e != cudaSuccess) fail("CUDA attention: cannot reserve shared memory: {}", cudaGetErrorString(e));
    int n = 0;
    const cudaError_t o = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, most);
    if (o != cudaSuccess) cudaGetLastError();  // not sticky: clear it, or the next launch check reports it
    return o == cudaSuccess && n > 0 ? n : 2;
  }();
  per_sm = fit;
#else
  (void)kernel, (void)most, (void)threads;
#endif
  return per_sm;
}

// The launch plan of one attention over `rows_per_block` query rows a block and `keys_per_tile` keys a
// tile: its keys split over blockIdx.z when its grid alone would not fill every SM with as many
// blocks as fit at once (the splits' partial results merged by attention_combine_kernel). A batch
// plans each member's job as alone, so its sums do not depend on the batch.
kernels::AttnJob plan_attention(const AttentionInput& in, int rows_per_block, int keys_per_tile, int per_sm,
                                int64_t H, int64_t Hkv) {
  kernels::AttnJob j{in.q,    in.q_pos, in.T,    in.k, in.v, in.k_pos, in.k_slot, in.S, in.out,
                     nullptr, nullptr,  nullptr, 0,    1,    0,        0,         0};
  j.row_blocks = (in.T * (H / Hkv) + rows_per_block - 1) / rows_per_block;
  const int64_t n_tiles = (in.S + keys_per_tile - 1) / keys_per_tile;
  const int64_t blocks = j.row_blocks * Hkv, want = int64_t(per_sm) * multiprocessors();
  j.tiles_per_split = std::max<int64_t>(n_tiles, 1);
  if (blocks < want && n_tiles > 1) {
    const int64_t wanted = std::min<int64_t>({n_tiles, (want + blocks - 1) / blocks, 65535});
    j.tiles_per_split = (n_tiles + wanted - 1) / wanted;
    j.splits = (n_tiles + j.tiles_per_split - 1) / j.tiles_per_split;
  }
  return j;
}

// The jobs (their row blocks one after another in x, Hkv in y, the most splits in z), then the
// merge of the split ones. With one job it goes as a kernel argument; with several, `upload` puts
// their table in device memory (queued before the launch).
template <class Kernel>
void launch_attention_jobs(Kernel* kernel, int threads, size_t shared, std::vector<kernels::AttnJob>& jobs,
                           int64_t H, int64_t Hkv, int64_t Dh, float scale, int32_t window,
                           const UploadTable& upload) {
  int64_t blocks = 0, rows = 0, splits = 1, parts = 0;
  for (kernels::AttnJob& j : jobs) {
    j.first_block = blocks, j.first_row = rows;
    blocks += j.row_blocks, rows += j.T * H, splits = std::max(splits, j.splits);
    if (j.splits > 1) parts += j.splits * j.T * H;
  }
  if (blocks == 0) return;
  // The split jobs' partial sums (none, and no allocation, where no job splits: a decoding step's
  // usual case, each layer).
  std::optional<Scratch> acc, m, l;
  if (parts > 0) {
    acc.emplace(size_t(parts * Dh) * 4, "attention splits");
    m.emplace(size_t(parts) * 4, "attention splits");
    l.emplace(size_t(parts) * 4, "attention splits");
  }
  int64_t at = 0;
  for (kernels::AttnJob& j : jobs)
    if (j.splits > 1) {
      j.part_acc = acc->as<float>() + at * Dh, j.part_m = m->as<float>() + at, j.part_l = l->as<float>() + at;
      at += j.splits * j.T * H;
    }
  const kernels::AttnJob* table = nullptr;
  if (jobs.size() > 1)
    table = static_cast<const kernels::AttnJob*>(upload(jobs.data(), jobs.size() * sizeof(kernels::AttnJob)));
  const int n = int(jobs.size());
  const dim3 grid{unsigned(blocks), unsigned(Hkv), unsigned(splits)};
  LP_LAUNCH(kernel, grid, threads, shared, jobs[0], table, n, H, Hkv, Dh, scale, window);
  if (parts > 0)
    LP_LAUNCH(kernels::attention_combine_kernel, unsigned(rows), 128, 0, jobs[0], table, n, H, Dh);
}

// The f32 kernel's jobs: the instance for Dh's columns and the caches' elements, its blocks per SM,
// its shared memory.
template <int BK, int DC, class KV>
void attention_with(const AttentionInput* in, size_t n_in, int64_t H, int64_t Hkv, int64_t Dh, float scale,
                    int32_t window, const UploadTable& upload) {
  auto* kernel = &kernels::attention_kernel<BK, DC, KV>;
  const int per_sm =
      attention_blocks_per_sm(kernel, kernels::attention_shared_bytes(64 * DC, BK), kernels::kAttnThreads);
  std::vector<kernels::AttnJob> jobs;
  for (const AttentionInput* i = in; i != in + n_in; ++i)
    if (i->T > 0) jobs.push_back(plan_attention(*i, kernels::kAttnRows, BK, per_sm, H, Hkv));
  launch_attention_jobs(kernel, kernels::kAttnThreads, kernels::attention_shared_bytes(Dh, BK), jobs, H, Hkv,
                        Dh, scale, window, upload);
}

template <int DK, class KV>
void attention_tc_with(const AttentionInput* in, size_t n_in, int64_t H, int64_t Hkv, int64_t Dh, float scale,
                       int32_t window, const UploadTable& upload) {
  auto* kernel = &kernels::attention_tc_kernel<DK, KV>;
  const size_t shared = kernels::attention_tc_shared_bytes(DK);
  const int per_sm = attention_blocks_per_sm(kernel, shared, kernels::kTcThreads);
  std::vector<kernels::AttnJob> jobs;
  for (const AttentionInput* i = in; i != in + n_in; ++i)
    if (i->T > 0) jobs.push_back(plan_attention(*i, kernels::kTcRows, kernels::kTcKeys, per_sm, H, Hkv));
  launch_attention_jobs(kernel, kernels::kTcThreads, shared, jobs, H, Hkv, Dh, scale, window, upload);
}

// The checks both attentions make of their arguments.
void check_attention(const char* what, const float* q, const void* k, const void* v, int64_t H, int64_t Hkv) {
  if (Hkv <= 0 || H % Hkv != 0) fail("CUDA {}: {} heads do not group over {} KV heads", what, H, Hkv);
  if (Hkv > 65535) fail("CUDA {}: {} KV heads", what, Hkv);
  for (const void* p :
       {static_cast<const void*>(q), static_cast<const void*>(k), static_cast<const void*>(v)})
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) fail("CUDA {}: q, k and v must be 16-byte aligned", what);
}

// The kernel instance for Dh's columns over caches of elements KV.
template <class KV>
void attention_of(const AttentionInput* in, size_t n_in, int64_t H, int64_t Hkv, int64_t Dh, float scale,
                  int32_t window, bool tensor_cores, const UploadTable& upload) {
  if (tensor_cores) {
    if (Dh <= 64)
      attention_tc_with<4, KV>(in, n_in, H, Hkv, Dh, scale, window, upload);
    else if (Dh <= 128)
      attention_tc_with<8, KV>(in, n_in, H, Hkv, Dh, scale, window, upload);
    else
      attention_tc_with<16, KV>(in, n_in, H, Hkv, Dh, scale, window, upload);
  } else if (Dh <= 64) {
    attention_with<64, 1, KV>(in, n_in, H, Hkv, Dh, scale, window, upload);
  } else if (Dh <= 128) {
    attention_with<64, 2, KV>(in, n_in, H, Hkv, Dh, scale, window, upload);
  } else if (Dh <= 192) {
    attention_with<32, 3, KV>(in, n_in, H, Hkv, Dh, scale, window, upload);
  } else {
    attention_with<32, 4, KV>(in, n_in, H, Hkv, Dh, scale, window, upload);
  }
}

}  // namespace

void attention_batched(const AttentionInput* in, size_t n_in, int64_t H, int64_t Hkv, int64_t Dh, float scale,
                       int32_t window, bool tensor_cores, const UploadTable& upload) {
  const char* what = tensor_cores ? "tensor-core attention" : "attention";
  if (tensor_cores && (Dh <= 0 || Dh > 256 || Dh % 2 != 0))
    fail("CUDA tensor-core attention supports even head widths up to 256, got {}", Dh);
  if (!tensor_cores && (Dh <= 0 || Dh > 256 || Dh % 4 != 0))
    fail("CUDA attention supports head widths that are multiples of 4 up to 256, got {}", Dh);
  for (const AttentionInput* i = in; i != in + n_in; ++i) {
    check_attention(what, i->q, i->k, i->v, H, Hkv);
    if (i->kv != in->kv) fail("CUDA {}: caches of f32 and f16 in one launch", what);
  }
  if (n_in == 0) return;
  if (in->kv == KvType::F16)
    attention_of<uint16_t>(in, n_in, H, Hkv, Dh, scale, window, tensor_cores, upload);
  else
    attention_of<float>(in, n_in, H, Hkv, Dh, scale, window, tensor_cores, upload);
}

void attention(const float* q, const int32_t* q_pos, int64_t T, const void* k, const void* v,
               const int32_t* k_pos, int64_t S, int64_t H, int64_t Hkv, int64_t Dh, float scale,
               int32_t window, float* out, const int32_t* k_slot, KvType kv) {
  const AttentionInput one{q, q_pos, T, k, v, k_pos, k_slot, S, out, kv};
  attention_batched(&one, 1, H, Hkv, Dh, scale, window, false, {});
}

void attention_tc(const float* q, const int32_t* q_pos, int64_t T, const void* k, const void* v,
                  const int32_t* k_pos, int64_t S, int64_t H, int64_t Hkv, int64_t Dh, float scale,
                  int32_t window, float* out, const int32_t* k_slot, KvType kv) {
  const AttentionInput one{q, q_pos, T, k, v, k_pos, k_slot, S, out, kv};
  attention_batched(&one, 1, H, Hkv, Dh, scale, window, true, {});
}

void last_row_scores(const float* q, const void* k, int64_t S, int64_t H, int64_t Hkv, int64_t Dh,
                     float scale, const int32_t* k_pos, int32_t q_pos, int32_t window, float* scores,
                     const int32_t* k_slot, KvType kv) {
  if (S <= 0) return;
  Scratch logits(size_t(H * S) * sizeof(float), "score logits"), m(size_t(H) * sizeof(float), "score max"),
      l(size_t(H) * sizeof(float), "score sum");
  if (kv == KvType::F16)
    LP_LAUNCH(kernels::score_logits_kernel<uint16_t>, blocks_for(H * S, kThreads), kThreads, 0, q,
              static_cast<const uint16_t*>(k), S, H, Hkv, Dh, scale, k_pos, k_slot, q_pos, window,
              logits.as<float>());
  else
    LP_LAUNCH(kernels::score_logits_kernel<float>, blocks_for(H * S, kThreads), kThreads, 0, q,
              static_cast<const float*>(k), S, H, Hkv, Dh, scale, k_pos, k_slot, q_pos, window,
              logits.as<float>());
  LP_LAUNCH(kernels::score_norm_kernel, unsigned(H), kThreads, 0, logits.as<float>(), S, m.as<float>(),
            l.as<float>());
  LP_LAUNCH(kernels::score_sum_kernel, blocks_for(S, kThreads), kThreads, 0, logits.as<float>(),
            m.as<float>(), l.as<float>(), S, H, scores);
}

}  // namespace lp::cuda
