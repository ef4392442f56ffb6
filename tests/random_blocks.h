// Random rows of GGUF blocks for the quantized kernels' tests (CPU qgemm, CUDA int8).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "model/quant.h"

namespace lp::testing {

// The block types the quantized kernels read as stored.
constexpr GgmlType kQuantTypes[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4_K};

// `rows` rows of K elements of type t: every byte of the quants (and Q4_K's 6-bit sub-scales)
// random, Q8_0's -128 included; scales f16 in [0.001, 0.1), Q4_1's minimum and Q4_K's dmin in
// [-0.1, 0.1).
inline std::vector<uint8_t> random_q_rows(GgmlType t, int64_t rows, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(0.001f, 0.1f), minimum(-0.1f, 0.1f);
  const auto info = *type_info(uint32_t(t));
  const int64_t nb = K / info.block_elems, bytes = info.block_bytes;
  std::vector<uint8_t> w(size_t(rows * nb * bytes));
  for (int64_t i = 0; i < rows * nb; ++i) {
    uint8_t* blk = w.data() + i * bytes;
    for (int64_t j = 0; j < bytes; ++j) blk[j] = uint8_t(rng());
    const uint16_t d = f32_to_f16(scale(rng));
    blk[0] = uint8_t(d & 255);
    blk[1] = uint8_t(d >> 8);
    if (t == GgmlType::Q4_1 || t == GgmlType::Q4_K) {
      const uint16_t m = f32_to_f16(minimum(rng));
      blk[2] = uint8_t(m & 255);
      blk[3] = uint8_t(m >> 8);
    }
  }
  return w;
}

}  // namespace lp::testing
