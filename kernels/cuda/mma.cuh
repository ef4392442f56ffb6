// Tensor-core products for the kernels (issue 58): a warp's 16x8x16 f16 multiply-accumulate with f32
// accumulators, PTX's `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` (sm_80 and later), and the
// fragments it takes, in the layout the PTX ISA documents ("Matrix Fragments for mma.m16n8k16 with
// floating point type"). f16 rather than bf16 (the same rate): the K/V cache the kernels read is f16
// (kernels/kv_type.h), so K and V enter exactly, and Q and the softmax weights lose 2^-11 where bf16
// loses 2^-8. With g = lane / 4 and t = lane % 4:
//   A (16 x 16, row-major), four 32-bit registers of two f16 each (the lower index in the low half):
//     a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]
//     a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   B (16 x 8, "col": each column's k contiguous), two registers:
//     b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]
//   C and D (16 x 8, f32): d[0], d[1] = D[g][2t, 2t+1]   d[2], d[3] = D[g+8][2t, 2t+1]
// Under nvcc the product is the instruction. On the host (tests/cuda_emu, LP_HOST_THREADS) every lane
// receives all 32 lanes' fragments (host_threads::warp_all) and computes its four outputs from them by
// that layout: each product of two f16 is exact in f32, the 16 of an output are summed in double and
// added to the accumulator once (the hardware's order and internal width are its own: results agree to
// the f32 rounding of a 16-term sum). A kernel that fills fragments by this layout computes the same
// product on both, which the GPU suite checks on the device (tests/gpu/test_gpu_ops.cpp,
// GpuOps.F16TensorCoreTile...).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cuda/device_math.h"

#if !defined(__CUDACC__)
#include "tests/cuda_emu/host_threads.h"
#endif

namespace lp::cuda::kernels {

// Two floats as a register of two f16 (round to nearest even): `lo` in the low half.
LP_HD uint32_t pack_f16x2(float lo, float hi) {
  return uint32_t(::lp::cuda_math::f32_to_f16(lo)) | (uint32_t(::lp::cuda_math::f32_to_f16(hi)) << 16);
}

#if defined(__CUDACC__)

// d += A B for the warp's fragments (all 32 lanes, converged).
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#else

namespace mma_host {
// Element (row, k) of A from the warp's A fragments, by the layout above.
inline float a_at(const uint32_t (*a)[4], int row, int k) {
  const int lane = (row % 8) * 4 + (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
  return ::lp::cuda_math::f16_to_f32(uint16_t(a[lane][reg] >> (16 * (k % 2))));
}
// Element (k, col) of B from the warp's B fragments.
inline float b_at(const uint32_t (*b)[2], int k, int col) {
  const int lane = col * 4 + (k % 8) / 2, reg = k >= 8 ? 1 : 0;
  return ::lp::cuda_math::f16_to_f32(uint16_t(b[lane][reg] >> (16 * (k % 2))));
}
}  // namespace mma_host

inline void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  uint32_t all_a[32][4], all_b[32][2];
  ::lp::host_threads::warp_all(a, sizeof a, all_a);
  ::lp::host_threads::warp_all(b, sizeof b, all_b);
  const int lane = ::lp::host_threads::linear_thread() % 32, g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + i % 2;
    double sum = 0;
    for (int k = 0; k < 16; ++k) sum += double(mma_host::a_at(all_a, row, k)) * mma_host::b_at(all_b, k, col);
    d[i] = float(double(d[i]) + sum);
  }
}

#endif

// One warp: d[16][8] = a[16][K] b[K][8] (both row-major f32, rounded to f16 as they are loaded into
// fragments), K a multiple of 16, one mma per 16 of K: the layout above, checked where it runs.
__global__ void mma_tile_kernel(const float* a, const float* b, float* d, int64_t K) {
  const int lane = int(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  float acc[4] = {0, 0, 0, 0};
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    const float* ar = a + k0 + 2 * t;
    const uint32_t fa[4] = {
        pack_f16x2(ar[g * K], ar[g * K + 1]), pack_f16x2(ar[(g + 8) * K], ar[(g + 8) * K + 1]),
        pack_f16x2(ar[g * K + 8], ar[g * K + 9]), pack_f16x2(ar[(g + 8) * K + 8], ar[(g + 8) * K + 9])};
    const float* bc = b + (k0 + 2 * t) * 8 + g;
    const uint32_t fb[2] = {pack_f16x2(bc[0], bc[8]), pack_f16x2(bc[64], bc[72])};
    mma_f16_16816(acc, fa, fb);
  }
  d[g * 8 + 2 * t] = acc[0];
  d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2];
  d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

}  // namespace lp::cuda::kernels
