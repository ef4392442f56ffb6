// Fast CPU kernels (oneTBB for parallelism, oneDNN for GEMM, AVX-512 where available).
// Each has a scalar reference in kernels/cpu/ref.h; tests/test_ops.cpp compares them.
//
// Changes against the references: float accumulation in SIMD lanes (order differs), a
// polynomial exp (relative error ~1e-7), RoPE angles from a per-forward table, and attention
// that processes keys in position order so the causal mask becomes a prefix length.
// Row reductions stay inside one task, so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <tuple>
#include <vector>

#include "kernels/context.h"
#include "kernels/cpu/buffer.h"

namespace lp {

enum class DType { F32, BF16 };
const char* dtype_name(DType d);
// True when the CPU multiplies bf16 natively (AVX-512 BF16 or AMX), so bf16 GEMMs run at about
// twice the f32 rate; without it oneDNN emulates bf16 and f32 is the faster mode.
bool cpu_has_native_bf16();
// The `--dtype auto` choice: bf16 where it is native, else f32.
DType fastest_dtype();

// A weight matrix [N][K] (N outputs, K inputs), row-major as GGUF stores it, in f32 or bf16.
struct Matrix {
  int64_t rows = 0;  // N
  int64_t cols = 0;  // K
  DType dtype = DType::F32;
  Buffer<float> f32;      // [N][K] when dtype == F32
  Buffer<uint16_t> bf16;  // [N][K] when dtype == BF16
  const void* data() const {
    return dtype == DType::F32 ? (const void*)f32.data() : (const void*)bf16.data();
  }
  int64_t bytes() const { return rows * cols * (dtype == DType::F32 ? 4 : 2); }
};

// C[M][N] (row stride ldc) = A[M][K] (row stride lda, f32) x W^T.
// In bf16 mode A is rounded to bf16 first; accumulation is f32 either way.
// Splits N across the context's threads; each part is a single-threaded oneDNN matmul.
class Gemm {
 public:
  Gemm();
  ~Gemm();
  void run(CpuContext& ctx, const float* A, int64_t M, int64_t lda, const Matrix& W, float* C, int64_t ldc);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// out[t] = x[t] * rsqrt(mean(x[t]^2) + eps) * w, rows in parallel.
void rmsnorm(CpuContext& ctx, const float* x, const float* w, float* out, int64_t T, int64_t D, float eps);

// cos/sin table for RoPE: [T][rope_dim/2] each, for the given positions.
struct RopeTable {
  int64_t T = 0, half = 0;
  std::vector<float> cos, sin;
};
RopeTable rope_table(const int32_t* pos, int64_t T, int64_t rope_dim, float theta, const float* freq_factors);
// Rotates x [T][n_heads][Dh] (row stride ld floats) using table rows rows[t] (or t if null).
void rope(CpuContext& ctx, float* x, int64_t T, int64_t ld, int64_t n_heads, int64_t Dh,
          const RopeTable& tab);

// out[i] = silu(gate[i]) * up[i]; gate/up/out are [T][F] with row strides.
void swiglu(CpuContext& ctx, const float* gate, int64_t ld_gate, const float* up, int64_t ld_up, float* out,
            int64_t ld_out, int64_t T, int64_t F);

// x[i] += y[i]
void add_inplace(CpuContext& ctx, float* x, const float* y, int64_t n);

// One layer's KV cache. Slots are filled in arrival order; slot_of maps a position to its slot
// (-1: no K/V at this layer, the "has K/V" bit). Prefill and plain decoding append in position
// order, so the slots stay sorted and attention reads them as one causal prefix; revived tokens
// are appended at their old positions wherever they fall, and from then on attention and scores
// take an explicit list of slots in position order (`KeySet`).
//   kt  [Hkv][Dh][kt_ld]   keys, transposed so a key tile is contiguous per dimension; the row
//                        stride kt_ld = cap + 16 is never a multiple of 4 KiB, so the Dh rows a
//                        tile reads do not all fall into the same L1 set
//   v   [Hkv][cap][Dh]
//   pos [cap]            position of each slot
struct LayerKV {
  int64_t cap = 0, kt_ld = 0, n = 0, Hkv = 0, Dh = 0;
  Buffer<float> kt, v;
  std::vector<int32_t> pos;
  std::vector<int32_t> slot_of;  // [max position + 1], grown on demand
  bool sorted = true;            // slot positions ascending
  void init(int64_t capacity, int64_t n_kv_heads, int64_t head_dim);
  void clear();
  // Appends T rows of k, v [T][Hkv*Dh] (row strides ldk/ldv) at positions pos[T] (ascending,
  // none held yet). Positions before held ones are allowed (revival) and clear `sorted`.
  void append(const float* k, int64_t ldk, const float* v, int64_t ldv, const int32_t* pos, int64_t T);
  // Slot holding position p, or -1.
  int64_t find(int32_t p) const { return p >= 0 && size_t(p) < slot_of.size() ? slot_of[size_t(p)] : -1; }
  // Every held slot in position order.
  std::vector<int32_t> slots_in_order() const;
};

// The keys a query block may see: slots of a LayerKV in ascending position order. An empty
// `slots` means every held slot, which must then be sorted (the common, gather-free case).
struct KeySet {
  const LayerKV& kv;
  std::span<const int32_t> slots = {};
  int64_t size() const { return slots.empty() ? kv.n : int64_t(slots.size()); }
  int32_t slot(int64_t i) const { return slots.empty() ? int32_t(i) : slots[size_t(i)]; }
};

// Causal GQA attention of T queries q [T][H*Dh] (row stride ldq) at positions q_pos over the
// keys of `keys` with position <= the query's; writes out [T][H*Dh] (row stride ldo).
void attention(CpuContext& ctx, const float* q, int64_t ldq, const int32_t* q_pos, int64_t T,
               const KeySet& keys, int64_t H, float* out, int64_t ldo);

// LazyLLM importance scores: scores[i] = mean over the H query heads of softmax_i(q . K^T /
// sqrt(Dh)) for one query row q [H*Dh] (the last token) over the keys of `keys` (all of them:
// the scoring row is the newest token). One extra query row: H * n * Dh multiply-adds; the full
// probability matrix is never formed.
void last_row_scores(const float* q, const KeySet& keys, int64_t H, float* scores);

// Vectorised exp used by the kernels (exposed for tests).
void exp_inplace(float* x, int64_t n);

}  // namespace lp
