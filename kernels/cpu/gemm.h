// GEMM for the CPU backend: C = A x W^T with W a GGUF-layout weight matrix in f32 or bf16, through
// oneDNN matmul primitives cached per shape, split into parts over oneTBB, and a plain streaming
// kernel for decoding's few rows. Tiles depend on the shape only, so results do not depend on the
// thread count. Scalar twin: ref::gemm (kernels/cpu/ref.h).
#pragma once

#include <cstdint>
#include <memory>

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

}  // namespace lp
