// The CUDA backend's device, memory and op launchers, as plain C++ declarations so that
// code without CUDA headers (the CLI, the tests) can call them. Built from kernels/cuda/*.cu when
// CMake finds nvcc (LP_CUDA); otherwise kernels/cuda/no_cuda.cpp provides the same functions,
// and open_device() says that this build has no CUDA backend.
//
// Every launcher takes device pointers, runs on the backends' one stream, and throws lp::Error with one
// line naming the op and the CUDA error when a launch or an allocation fails. Layouts and
// semantics are those of the scalar references (kernels/cpu/ref.h); the per-element arithmetic
// is kernels/cuda/device_math.h, tested on the CPU.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "kernels/cuda/rows.h"
#include "kernels/kv_type.h"

namespace lp::cuda {

// True when this build has the CUDA backend.
bool compiled();

// Operations queued on the stream by this process: kernel launches, cuBLAS GEMMs and copies (CUB's
// sorts count by their own launches of ours around them). The host's work per decoding step is
// measured by it (issue 58, item 3: a batch's launches must not grow with its members).
inline std::atomic<int64_t>& queued_ops_counter() {
  static std::atomic<int64_t> n{0};
  return n;
}
inline int64_t queued_ops() {
  return queued_ops_counter().load();
}

// CUDA graphs (issue 58, item 2). Every operation is queued on one stream (a blocking stream, so the
// legacy default stream's calls stay ordered with it). While graphs are on (set_graphs, by the thread
// that drives the device), the operations queued are not launched one by one but captured, and a
// segment of them goes to the device as one graph launch at the next call that waits for the device
// or allocates or frees device or pinned memory (a copy back, a synchronisation: what ends it is what
// would have made the host wait, or what a capture cannot hold), or when graphs are turned off. A
// segment's executable graph is kept by the sequence of operations it holds (the kernels, copies and
// GEMM shapes in order) and updated in place with the next segment of that sequence
// (cudaGraphExecUpdate: new pointers, counts and grid sizes), so a decoding step after the first is
// captured, updated and launched, not instantiated. The host then pays a capture per operation,
// not a launch. Off by default: a thread that did not turn them on queues as without them (its
// operations end a capture first).
void set_graphs(bool on);
struct GraphCounts {
  int64_t launched = 0;      // segments launched as graphs
  int64_t instantiated = 0;  // of them, instantiated (a sequence not kept, or whose update failed)
  int64_t ops = 0;           // operations captured into them
};
GraphCounts graph_counts();  // since the process started
// The identity of an operation in a segment's sequence (graphs): a kernel by its function, a copy or
// GEMM by a tag and its sizes.
template <class F>
uint64_t op_id(F* kernel) {
  return uint64_t(reinterpret_cast<uintptr_t>(kernel));
}
// The stream an operation `op` (op_id) is queued on: it begins a capture where graphs are on and
// none is open, and adds op to the open one's sequence. Every operation calls it once.
void* queue_on(uint64_t op);
// A launcher's scratch memory, freed when the launcher returns (Scratch in launch.cuh): stream-
// ordered memory, or, in a capture, a region of an arena (graph_cache.h ScratchArena) that outlives
// the graphs using it (an allocation ends the capture, which a launcher's scratch would do at every
// attention with key splits and every selection). Where the arena is full, stream-ordered memory,
// and a larger arena at the next capture that begins with no scratch live.
void* scratch_alloc(size_t bytes, const char* what);
void scratch_free(void* p);

// Throws lp::DeviceError(what): a CUDA or cuBLAS call failed. It is lost() when the device cannot
// be used again by this process (the error is sticky: a synchronisation after it fails too).
[[noreturn]] void device_failed(const std::string& what);

struct Device {
  int index = 0, count = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int64_t total_bytes = 0, free_bytes = 0;
};

// The first GPU, made current. Throws lp::Error with one line saying why there is none (a build
// without CUDA, no driver, no device, a driver older than the runtime).
Device open_device();

// Device memory: allocation that throws on failure (naming the bytes asked and free), copies.
void* device_alloc(size_t bytes, const char* what);
void device_free(void* p);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
// Device to device, queued on the stream: the host does not wait.
void copy_on_device(void* dst, const void* src, size_t bytes);
// Pinned (page-locked) host memory, which a queued copy reads or writes while the host goes on.
void* host_alloc_pinned(size_t bytes, const char* what);
void host_free_pinned(void* p);
// Copies queued on the stream, between device memory and pinned host memory, that the host does not
// wait for (a copy from pageable memory waits for the work queued before it: CUDA's "API
// synchronization behavior"). The pinned bytes must stay as they are (to the device) or unread (to
// the host) until the stream has run the copy, which a copy_to_host or synchronize afterwards says.
void copy_to_device_async(void* dst, const void* pinned_src, size_t bytes);
void copy_to_host_async(void* pinned_dst, const void* src, size_t bytes);
void synchronize(const char* what);
// Stream-ordered memory (cudaMallocAsync / cudaFreeAsync on the stream): freeing does not
// wait for the device, and the launches queued before the free still see the memory.
void* device_alloc_async(size_t bytes, const char* what);
void device_free_async(void* p);
// The current GPU's streaming multiprocessors (the attention launcher splits keys over blocks
// when the grid would leave them idle).
int multiprocessors();

// out[t][i] = x[t][i] / sqrt(mean(x[t]^2) + eps) * w[i]
void rmsnorm(const float* x, const float* w, float* out, int64_t T, int64_t D, float eps);
// In place on x [T][n_heads][Dh], at original positions pos[T]; freq_factors may be null.
void rope(float* x, const int32_t* pos, int64_t T, int64_t n_heads, int64_t Dh, int64_t rope_dim, float theta,
          const float* freq_factors, float freq_scale = 1.0f);  // angles times freq_scale (linear scaling)
// x[i] += y[i]
void add_inplace(float* x, const float* y, int64_t n);
// The same row ops over Rows (kernels/cuda/rows.h): contiguous rows, or a table of row addresses
// that lets one launch cover a batch's members. rmsnorm_rows may run in place (x and out the same
// rows); rope_rows reads row t's position at *pos(t).
void rmsnorm_rows(Rows<const float> x, const float* w, Rows<float> out, int64_t T, int64_t D, float eps);
void rope_rows(Rows<float> x, Rows<const int32_t> pos, int64_t T, int64_t n_heads, int64_t Dh,
               int64_t rope_dim, float theta, const float* freq_factors, float freq_scale);
void swiglu_rows(Rows<const float> ff, Rows<float> out, int64_t T, int64_t F, bool gelu);
void add_rows(Rows<float> x, Rows<const float> y, int64_t T, int64_t D);  // x(t)[i] += y(t)[i]
void copy_rows_at(Rows<const float> src, Rows<float> dst, int64_t T, int64_t width);
// x[t][i] += bias[i], x [T][n]
void add_bias(float* x, const float* bias, int64_t T, int64_t n);
// dst[r][:] = src[idx[r]][:]   (compacting kept rows, Aux Cache loads)
void gather_rows(const float* src, const int64_t* idx, float* dst, int64_t rows, int64_t width);
// Causal GQA over the active keys, mask on original positions (ref::attention), tiled with an
// online softmax and f32 accumulation (kernels.cuh). Head widths: multiples of 4 up to 256.
// Logits are scaled by `scale` (1/sqrt(Dh) for most models); window > 0 masks keys window or more
// positions before the query (a sliding-window layer).
// With k_slot, the keys are a list of cache rows: key s is row k_slot[s] of k and v and its position
// k_pos[k_slot[s]] (a LazyLLM step's active keys, read where they are instead of gathered first).
// k and v hold the cache's elements, of type kv: floats, or f16 bits widened as they are loaded
// (the same sums as f32 keys and values that hold those halves).
void attention(const float* q, const int32_t* q_pos, int64_t T, const void* k, const void* v,
               const int32_t* k_pos, int64_t S, int64_t H, int64_t Hkv, int64_t Dh, float scale,
               int32_t window, float* out, const int32_t* k_slot = nullptr, KvType kv = KvType::F32);
// The same attention on the tensor cores (kernels/cuda/attention_tc.cuh): q times the scale, k and v
// rounded to f16 as they are loaded (an f16 cache's k and v exactly), the products accumulated in f32,
// the weights rounded to f16 for P V. Even head widths up to 256.
void attention_tc(const float* q, const int32_t* q_pos, int64_t T, const void* k, const void* v,
                  const int32_t* k_pos, int64_t S, int64_t H, int64_t Hkv, int64_t Dh, float scale,
                  int32_t window, float* out, const int32_t* k_slot = nullptr, KvType kv = KvType::F32);
// Several attentions of one layer's shape in one launch (a batch's members: each its own rows, cache
// and key set, as attention() takes them), each with the key splits and sums it has alone. With more
// than one, `upload` copies the launch's table of jobs (bytes from host memory) into device memory
// the caller owns and returns its address, queued before the launch; the table stays untouched until
// the stream has run it.
struct AttentionInput {
  const float* q;
  const int32_t* q_pos;
  int64_t T;
  const void *k, *v;  // the cache's elements, of type kv
  const int32_t* k_pos;
  const int32_t* k_slot;  // null: keys 0 .. S - 1
  int64_t S;
  float* out;
  KvType kv = KvType::F32;  // one type for every input of a launch
};
using UploadTable = std::function<const void*(const void* host, size_t bytes)>;
void attention_batched(const AttentionInput* in, size_t n_in, int64_t H, int64_t Hkv, int64_t Dh, float scale,
                       int32_t window, bool tensor_cores, const UploadTable& upload);
// The last token's attention (at position q_pos) over S keys, averaged over heads
// (ref::last_row_scores), into scores[S]; with window > 0 the keys at k_pos[S] outside the window
// score 0. k holds the cache's elements, of type kv.
void last_row_scores(const float* q, const void* k, int64_t S, int64_t H, int64_t Hkv, int64_t Dh,
                     float scale, const int32_t* k_pos, int32_t q_pos, int32_t window, float* scores,
                     const int32_t* k_slot = nullptr, KvType kv = KvType::F32);
// LazyLLM's selection (pruning/select.h select_top) with CUB radix sorts: keep[n_keep] the kept
// indices in increasing order; the last token always kept. n_keep in [1, n].
void select_top(const float* scores, const int32_t* pos, int64_t n, int64_t n_keep, int64_t* keep);
// K/V append: rows of k_new/v_new [T][kv] into cache slots first_slot .. first_slot + T - 1 of
// k_cache/v_cache [cap][kv], each row's original position pos[t] into slot_pos at its slot, and its
// slot's number slot_no[t] into slot_of at its position (the cache's position-to-slot map). An f16
// cache (uint16_t) gets each value rounded to nearest even.
void kv_append(const float* k_new, const float* v_new, const int32_t* pos, int64_t T, int64_t kv,
               int64_t first_slot, float* k_cache, float* v_cache, int32_t* slot_pos, const int32_t* slot_no,
               int32_t* slot_of);
void kv_append(const float* k_new, const float* v_new, const int32_t* pos, int64_t T, int64_t kv,
               int64_t first_slot, uint16_t* k_cache, uint16_t* v_cache, int32_t* slot_pos,
               const int32_t* slot_no, int32_t* slot_of);
// The same through Rows: row t's k and v from k_new(t), v_new(t) into k_slot(t), v_slot(t), its
// position *pos(t) into *slot_pos(t), its slot's number *slot_no(t) into the map slot_of(t) at that
// position (a batch's members' rows, each into its own cache, in one launch).
void kv_append_rows(Rows<const float> k_new, Rows<const float> v_new, Rows<const int32_t> pos, int64_t T,
                    int64_t kv, Rows<float> k_slot, Rows<float> v_slot, Rows<int32_t> slot_pos,
                    Rows<const int32_t> slot_no, Rows<int32_t> slot_of);
void kv_append_rows(Rows<const float> k_new, Rows<const float> v_new, Rows<const int32_t> pos, int64_t T,
                    int64_t kv, Rows<uint16_t> k_slot, Rows<uint16_t> v_slot, Rows<int32_t> slot_pos,
                    Rows<const int32_t> slot_no, Rows<int32_t> slot_of);
// x[0:n] = v
void fill_i32(int32_t* x, int64_t n, int32_t v);
// ids[r] = lp::argmax of row r of x [rows][V] (kernels/argmax.h): a greedy token without its logits.
void argmax_rows(const float* x, int64_t rows, int64_t V, int32_t* ids);
// out[i] = pos[keep[i]], i < n: the positions a selection kept.
void gather_positions(const int32_t* pos, const int64_t* keep, int64_t n, int32_t* out);
// out[i] = slot_of[pos[i]], i < n, or 0 where that is -1 (no K/V at the layer: the step missed a
// revival, and the host computes it again).
void slots_of(const int32_t* pos, int64_t n, const int32_t* slot_of, int32_t* out);
// dst[r][0:width] = src[r][0:width] with row strides ld_src, ld_dst (splitting fused q|k|v rows).
void copy_columns(const float* src, int64_t ld_src, float* dst, int64_t ld_dst, int64_t width, int64_t rows);
// out[t][i] = act(ff[t][i]) * ff[t][F + i] for fused gate|up rows ff [T][2F]: act silu, or with
// gelu the tanh-approximated GELU (GeGLU).
void swiglu_fused(const float* ff, float* out, int64_t T, int64_t F, bool gelu = false);
// The mixture-of-experts FFN (kernels/cpu/moe.h): for each row of router logits [T][E], ids[T][k] its k
// most probable experts (ties to the lower id) and w[T][k] their renormalized probabilities
// (cuda_math::route_row; kernels/cpu/moe.h route_top_k).
void route_top_k(const float* logits, int64_t T, int64_t E, int64_t k, int32_t* ids, float* w);
// out[t][:] = sum over j < k, in order, of w[t][j] * y[at[t][j]][:]: the rows' expert outputs, which
// y [.][D] holds grouped by expert (or, at null, pair by pair: y[t k + j]), weighted and summed back
// into each row.
void moe_combine(const float* y, const int64_t* at, const float* w, int64_t T, int64_t k, int64_t D,
                 float* out);
// x[i] *= s
void scale_inplace(float* x, int64_t n, float s);
// d[16][8] = a[16][K] b[K][8] (row-major f32, rounded to f16) on the tensor cores, one warp through
// kernels/cuda/mma.cuh's fragments: the layout the tensor-core kernels rely on, checked on the device.
void mma_f16_tile(const float* a, const float* b, float* d, int64_t K);
// dst[dst_idx[r]][:] = src[src_idx[r]][:]   (Aux Cache stores and loads, revived rows back into
// place: the scatter of active rows, and a gather at the same time). src and dst must not overlap.
void copy_rows(const float* src, const int64_t* src_idx, float* dst, const int64_t* dst_idx, int64_t rows,
               int64_t width);
// dst[r][:] = src[idx[r]][:] widened from bf16 (embedding rows of a bf16 table).
void gather_rows_bf16(const uint16_t* src, const int64_t* idx, float* dst, int64_t rows, int64_t width);
// GGUF blocks (--dtype int8): N rows of `row_bytes` bytes holding K elements each of block type
// `qtype` (device_math.h QType: Q8_0, Q4_0, Q4_1, Q4_K).
// y[N][K] = bf16 of each element (the prefill's GEMMs then run gemm_bf16 on it).
void dequant_bf16(const uint8_t* q, int qtype, int64_t row_bytes, int64_t N, int64_t K, uint16_t* y);
// dst[r][:] = row idx[r] in f32 (embedding rows).
void gather_rows_q(const uint8_t* q, int qtype, int64_t row_bytes, const int64_t* idx, float* dst,
                   int64_t rows, int64_t width);
// out[T][N] = a[T][K] . w[N][K]^T with f32 sums, a in bf16 (to_bf16), reading the blocks
// directly: for few rows (decoding steps, the LM head), where dequantizing the whole matrix would
// cost more than the products. a 8-byte aligned, K % 32 == 0.
void gemv_q(const uint16_t* a, const uint8_t* q, int qtype, int64_t row_bytes, float* out, int64_t T,
            int64_t K, int64_t N);
// A decoding step's experts in one launch (one per active expert before): for each (row, expert) pair
// p < P, out[p][N] = a[p / a_per][K] . W[N][K]^T with W expert ids[p]'s matrix, whose device address
// is w[ids[p]] (w: a device table of the layer's E experts; a route outside [0, E), which a router
// that saw a NaN gives, makes its outputs NaN). a_per = k: the pairs of a row share the layer's input
// row; 1: each pair has its own (the down projection of its activation). Blocks of type qtype
// (row_bytes a row; a in bf16, gemv_q's arithmetic for each pair, bit for bit), bf16 weights with
// bf16 a, or f32 with f32 a; f32 sums. N at most 262,140.
void gemv_routed_q(const uint16_t* a, int64_t a_per, const uint8_t* const* w, const int32_t* ids, int64_t E,
                   int qtype, int64_t row_bytes, float* out, int64_t P, int64_t K, int64_t N);
void gemv_routed_bf16(const uint16_t* a, int64_t a_per, const uint16_t* const* w, const int32_t* ids,
                      int64_t E, float* out, int64_t P, int64_t K, int64_t N);
void gemv_routed_f32(const float* a, int64_t a_per, const float* const* w, const int32_t* ids, int64_t E,
                     float* out, int64_t P, int64_t K, int64_t N);
// f32 -> bf16 (round to nearest even).
void to_bf16(const float* x, uint16_t* y, int64_t n);
// out[T][N] = a[T][K] . w[N][K]^T with cuBLAS: f32 inputs (exact path), or bf16 inputs with f32
// accumulation and output (cublasGemmEx, CUBLAS_COMPUTE_32F).
void gemm_f32(const float* a, const float* w, float* out, int64_t T, int64_t K, int64_t N);
void gemm_bf16(const uint16_t* a, const uint16_t* w, float* out, int64_t T, int64_t K, int64_t N);

}  // namespace lp::cuda
