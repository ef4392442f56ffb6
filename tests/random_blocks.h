// Random rows of GGUF blocks for the quantized kernels' tests (CPU qgemm, CUDA int8) and for the
// benches' random models (lp_make_gguf, lp_gpu_bench --int8).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "model/quant.h"

namespace lp::testing {

// The block types the quantized kernels read as stored.
constexpr GgmlType kQuantTypes[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                                    GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

// `rows` rows of K elements of type t: every byte of the quants, the high bits and the K-quants'
// sub-scales random (Q8_0's -128 and Q6_K's -128 sub-scale included); scales f16 in [0.001, 0.1),
// minima (Q4_1, Q5_1) and dmin (Q4_K, Q5_K) in [-0.1, 0.1).
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
    blk[block_scale_offset(t)] = uint8_t(d & 255);
    blk[block_scale_offset(t) + 1] = uint8_t(d >> 8);
    if (block_has_min(t)) {
      const uint16_t m = f32_to_f16(minimum(rng));
      blk[2] = uint8_t(m & 255);
      blk[3] = uint8_t(m >> 8);
    }
  }
  return w;
}

// n_blocks blocks of type t at p, fast enough for a model of billions of weights (xorshift, 8
// bytes at a time): every byte random, then the f16 scale fields set to d (and Q4_1/Q5_1's
// minimum, Q4_K/Q5_K's dmin to -8d), so every scale is finite. For timing and memory, not numerics.
inline void fill_random_blocks(GgmlType t, uint8_t* p, int64_t n_blocks, uint64_t seed, float d) {
  const TypeInfo info = *type_info(uint32_t(t));
  const bool two = block_has_min(t);
  const int d_at = block_scale_offset(t);
  const uint16_t hd = f32_to_f16(d), hm = f32_to_f16(-8 * d);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t b = 0; b < n_blocks; ++b, p += info.block_bytes) {
    for (int64_t j = 0; j < info.block_bytes; j += 8) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      std::memcpy(p + j, &s, size_t(std::min<int64_t>(8, info.block_bytes - j)));
    }
    p[d_at] = uint8_t(hd & 255), p[d_at + 1] = uint8_t(hd >> 8);
    if (two) p[2] = uint8_t(hm & 255), p[3] = uint8_t(hm >> 8);
  }
}

}  // namespace lp::testing
