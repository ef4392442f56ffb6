// GEMM for the CPU backend: C = A x W^T with W a GGUF-layout weight matrix in f32 or bf16, through
// oneDNN matmul primitives cached per shape, split into parts over oneTBB, and a plain streaming
// kernel for decoding's few rows. Tiles depend on the shape only, so results do not depend on the
// thread count. Scalar twin: ref::gemm (kernels/cpu/ref.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/context.h"
#include "kernels/cpu/buffer.h"
#include "kernels/cpu/qgemm.h"
#include "model/quant.h"

namespace lp {

// F32: exact; BF16: bf16 GEMM inputs, f32 accumulation; Int8: weights in GGUF blocks multiplied by
// 8-bit activations with integer dot products (kernels/cpu/qgemm.h).
enum class DType { F32, BF16, Int8 };
const char* dtype_name(DType d);
// True when the CPU multiplies bf16 natively (AVX-512 BF16 or AMX), so bf16 GEMMs run at about
// twice the f32 rate; without it oneDNN emulates bf16 and f32 is the faster mode.
bool cpu_has_native_bf16();
// The `--dtype auto` choice: bf16 where it is native, else f32.
DType fastest_dtype();

// A weight matrix [N][K] (N outputs, K inputs), row-major as GGUF stores it: f32 or bf16
// elements, or (Int8) runs of rows in GGUF blocks (QPart: one per tensor the matrix stacks, each in
// its own type), K / 32 blocks a row.
struct Matrix {
  int64_t rows = 0;  // N
  int64_t cols = 0;  // K
  DType dtype = DType::F32;
  Buffer<float> f32;      // [N][K] when dtype == F32
  Buffer<uint16_t> bf16;  // [N][K] when dtype == BF16
  // Int8: the rows in order. A part of a type the integer GEMM multiplies reads the model file's own
  // blocks (q_owner keeps the mapping); the others point into q, requantized to Q8_0.
  std::vector<QPart> parts;
  Buffer<uint8_t> q;
  std::shared_ptr<const void> q_owner;
  std::vector<std::shared_ptr<const QPacked>> packs;  // each part's QPart::packed (qpack)
  bool mixed() const;                                 // Int8 parts of more than one type
  // Int8: the parts' type when they share one, else the first's (Q8_0 before there are parts).
  GgmlType qtype() const { return parts.empty() ? GgmlType::Q8_0 : parts.front().type; }
  const void* data() const {
    return dtype == DType::F32    ? (const void*)f32.data()
           : dtype == DType::BF16 ? (const void*)bf16.data()
                                  : nullptr;
  }
  int64_t row_bytes() const;  // bytes of one row in its storage (Int8: on average, when mixed)
  int64_t bytes() const;
  // Int8: every row's blocks contiguous in one type (what the CUDA backend uploads): the parts'
  // bytes when they share a type, else every row requantized to Q8_0 (*type says which).
  std::vector<uint8_t> contiguous_blocks(GgmlType* type) const;
  // Row r as f32 (the embedding lookup).
  void row_f32(int64_t r, float* out) const;
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

}  // namespace lp
