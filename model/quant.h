// GGML tensor types and their dequantization to f32.
//
// Block layouts follow the GGUF/ggml format (see docs/gguf.md for the byte-level layouts and
// where they were learned). Every dequantizer has one scalar implementation here; it is the
// reference that tests check against hand-worked blocks, and it is what model loading uses
// (loading is one pass over the weights, not a hot path).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace lp {

// Numeric ids are the on-disk `ggml_type` values; they must not change.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
  Q2_0 = 42,
};

// Where a block of type t keeps its f16 scale d (Q6_K: byte 208, after ql[128], qh[64] and its
// int8 sub-scales; the other block types: byte 0), and whether an f16 minimum (Q4_1, Q5_1) or dmin
// (Q4_K, Q5_K) follows it at byte 2.
constexpr int block_scale_offset(GgmlType t) {
  return t == GgmlType::Q6_K ? 208 : 0;
}
constexpr bool block_has_min(GgmlType t) {
  return t == GgmlType::Q4_1 || t == GgmlType::Q5_1 || t == GgmlType::Q4_K || t == GgmlType::Q5_K;
}

// The 6-bit scale and minimum of sub-block j (0..7) from a Q4_K/Q5_K super-block's 12-byte field
// p: bytes 0-3 hold scale[0..3] in their low 6 bits and bits 4-5 of scale[4..7] in their top 2;
// bytes 4-7 the same for the minima; bytes 8-11 bits 0-3 of scale[4..7] (low nibble) and of
// min[4..7] (high). Constexpr so the CUDA kernels call it too (kernels/cuda/device_math.h).
constexpr void kquant_scale_min(const uint8_t* p, int j, int& sc, int& mn) {
  if (j < 4) {
    sc = p[j] & 63;
    mn = p[j + 4] & 63;
  } else {
    sc = (p[j + 4] & 0xF) | (p[j - 4] >> 6) << 4;
    mn = (p[j + 4] >> 4) | (p[j] >> 6) << 4;
  }
}

struct TypeInfo {
  std::string_view name;  // "Q4_K"
  int64_t block_elems;    // elements per block (1 for plain types)
  int64_t block_bytes;    // bytes per block
  bool dequantizable;     // lp can turn it into f32
};

// Info for a known on-disk type id, or nullopt for an id ggml does not define (retired ids
// such as 4 and 5 included).
std::optional<TypeInfo> type_info(uint32_t type_id);

// Bytes taken by `n_elems` elements of `type` (n_elems must be a multiple of the block size;
// returns nullopt otherwise or when the size would overflow int64).
std::optional<int64_t> type_bytes(GgmlType type, int64_t n_elems);

// Dequantizes n elements (a multiple of the type's block size) from `src` to `dst`.
// Throws lp::Error for types that are not dequantizable and for a bad element count.
void dequantize(GgmlType type, const void* src, float* dst, int64_t n);

// Scalar conversions, exact per IEEE 754 (f16 subnormals, inf and nan included).
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // round to nearest even
float bf16_to_f32(uint16_t b);
uint16_t f32_to_bf16(float f);  // round to nearest even; nan stays nan

}  // namespace lp
