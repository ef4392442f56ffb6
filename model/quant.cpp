// GGML tensor types: size table, f16/bf16 conversions and scalar dequantizers.
//
// Byte layouts are described in docs/gguf.md. Blocks are read byte by byte (multi-byte fields are
// little-endian on disk and are assembled explicitly), so no block struct, packing pragma or
// alignment assumption is involved: a GGUF tensor may start at any byte offset a caller hands us.
#include "model/quant.h"

#include <array>
#include <bit>
#include <cstring>
#include <limits>

#include "model/error.h"

namespace lp {

// ---- Scalar conversions ------------------------------------------------------------------------
// f16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. f32: 1, 8 (bias 127), 23.
// bf16: the top 16 bits of an f32.

float f16_to_f32(uint16_t h) {
  // The three cases (normal, inf/nan, zero/subnormal) are each computed, then one is selected.
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = h & 0x7C00;
  const uint32_t shifted = uint32_t(h & 0x7FFF) << 13;  // exponent and mantissa in f32 position
  // Normal: rebias the exponent from 15 to 127.
  const uint32_t normal = shifted + ((127 - 15) << 23);
  // Inf / nan: all-ones exponent, mantissa (nan payload) kept.
  const uint32_t inf_nan = shifted | 0x7F800000u;
  // Zero / subnormal: mantissa * 2^-24, exact in f32 (mantissa < 2^10, power-of-two scaling).
  const uint32_t subnormal = std::bit_cast<uint32_t>(float(h & 0x3FF) * 0x1p-24f);
  const uint32_t mag = exp == 0x7C00 ? inf_nan : exp == 0 ? subnormal : normal;
  return std::bit_cast<float>(sign | mag);
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) {
    // nan: keep the top payload bits and force the quiet bit so it cannot turn into inf.
    return uint16_t(sign | 0x7E00 | ((abs >> 13) & 0x3FF));
  }
  // 65520 = 0x477FF000 lies halfway between 65504 (largest f16, odd mantissa) and 65536; ties to
  // even round it, and everything above, to inf.
  if (abs >= 0x477FF000u) return uint16_t(sign | 0x7C00);
  const uint32_t exp = abs >> 23;  // biased f32 exponent
  if (exp < 113) {
    // Below 2^-14: the result is subnormal (or zero), an integer count of 2^-24.
    // |f| = m * 2^(exp-150) with m the 24-bit significand, so count = m * 2^(exp-126).
    const uint32_t shift = 126 - exp;  // >= 14
    if (shift > 24) return sign;       // |f| < 2^-25: rounds to zero (m < 2^24, no tie possible)
    const uint32_t m = (abs & 0x7FFFFFu) | 0x800000u;
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;  // may carry into the smallest normal: fine
    return uint16_t(sign | q);
  }
  // Normal: rebias the exponent, keep the top 10 mantissa bits, round on the 13 dropped bits.
  // A carry out of the mantissa correctly bumps the exponent.
  uint32_t h = (exp - 112) << 10 | ((abs >> 13) & 0x3FF);
  const uint32_t rem = abs & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return uint16_t(sign | h);
}

float bf16_to_f32(uint16_t b) {
  return std::bit_cast<float>(uint32_t(b) << 16);
}

uint16_t f32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    // nan: truncating could clear every mantissa bit (e.g. 0x7F800001 -> inf); set the quiet bit.
    return uint16_t((u >> 16) | 0x0040);
  }
  // Round to nearest even on the 16 dropped bits; overflow past the largest bf16 gives inf.
  const uint32_t lsb = (u >> 16) & 1;
  return uint16_t((u + 0x7FFFu + lsb) >> 16);
}

namespace {

// Block size of the legacy quants; super-block size of the K-quants.
constexpr int64_t kQK = 32;
constexpr int64_t kQK_K = 256;

// Highest on-disk id we describe, plus one. ggml defines ids up to 42 (Q2_0); 4, 5, 31-33 and
// 36-38 were retired by ggml and are treated as undefined.
constexpr uint32_t kTypeIdCount = 43;

struct TypeRow {
  bool defined = false;
  TypeInfo info{};
};

// Sizes match ggml's block structs and type_traits (ggml/src/ggml-common.h, ggml.c) and, except
// for Q8_1, gguf-py's GGML_QUANT_SIZES.
// Ids 39-42 are not in GgmlType yet; they are listed so that a file using them gets a clear
// "unsupported tensor type MXFP4" rather than "unknown type id 39".
constexpr std::array<TypeRow, kTypeIdCount> make_type_table() {
  std::array<TypeRow, kTypeIdCount> t{};
  auto set = [&](uint32_t id, std::string_view name, int64_t elems, int64_t bytes, bool deq) {
    t[id] = TypeRow{true, TypeInfo{name, elems, bytes, deq}};
  };
  set(0, "F32", 1, 4, true);
  set(1, "F16", 1, 2, true);
  set(2, "Q4_0", kQK, 18, true);
  set(3, "Q4_1", kQK, 20, true);
  set(6, "Q5_0", kQK, 22, true);
  set(7, "Q5_1", kQK, 24, true);
  set(8, "Q8_0", kQK, 34, true);
  // Q8_1: d, s (f16) + 32 int8 = 36. gguf-py still says 40, from when d and s were f32.
  set(9, "Q8_1", kQK, 36, false);
  set(10, "Q2_K", kQK_K, 84, false);
  set(11, "Q3_K", kQK_K, 110, false);
  set(12, "Q4_K", kQK_K, 144, true);
  set(13, "Q5_K", kQK_K, 176, true);
  set(14, "Q6_K", kQK_K, 210, true);
  set(15, "Q8_K", kQK_K, 292, false);  // f32 d + 256 int8 + 16 int16 sums; activation format
  set(16, "IQ2_XXS", kQK_K, 66, false);
  set(17, "IQ2_XS", kQK_K, 74, false);
  set(18, "IQ3_XXS", kQK_K, 98, false);
  set(19, "IQ1_S", kQK_K, 50, false);
  set(20, "IQ4_NL", kQK, 18, false);
  set(21, "IQ3_S", kQK_K, 110, false);
  set(22, "IQ2_S", kQK_K, 82, false);
  set(23, "IQ4_XS", kQK_K, 136, false);
  // Integer and f64 tensors are not weights; converting them to f32 would silently round.
  set(24, "I8", 1, 1, false);
  set(25, "I16", 1, 2, false);
  set(26, "I32", 1, 4, false);
  set(27, "I64", 1, 8, false);
  set(28, "F64", 1, 8, false);
  set(29, "IQ1_M", kQK_K, 56, false);
  set(30, "BF16", 1, 2, true);
  set(34, "TQ1_0", kQK_K, 54, false);
  set(35, "TQ2_0", kQK_K, 66, false);
  set(39, "MXFP4", 32, 17, false);
  set(40, "NVFP4", 64, 36, false);
  set(41, "Q1_0", 128, 18, false);
  set(42, "Q2_0", 64, 18, false);
  return t;
}

constexpr std::array<TypeRow, kTypeIdCount> kTypes = make_type_table();

// Little-endian 16-bit field at p (any alignment).
inline uint16_t load_u16(const uint8_t* p) {
  return uint16_t(p[0] | (p[1] << 8));
}
inline float load_f16(const uint8_t* p) {
  return f16_to_f32(load_u16(p));
}

void convert_f16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(src + 2 * i));
}

void convert_bf16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
}

// ---- Legacy 32-element blocks ------------------------------------------------------------------
// In the 4-bit blocks byte j (0..15) holds element j in its low nibble and element j+16 in its
// high nibble. In the 5-bit blocks the fifth bit of element j is bit j of a 32-bit little-endian
// word qh.

void dequant_q4_0(const uint8_t* src, float* dst, int64_t nb) {  // 18 bytes: d, qs[16]
  for (int64_t b = 0; b < nb; ++b, src += 18, dst += kQK) {
    const float d = load_f16(src);
    const uint8_t* qs = src + 2;
    for (int j = 0; j < 16; ++j) {
      dst[j] = float((qs[j] & 0xF) - 8) * d;
      dst[j + 16] = float((qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const uint8_t* src, float* dst, int64_t nb) {  // 20 bytes: d, m, qs[16]
  for (int64_t b = 0; b < nb; ++b, src += 20, dst += kQK) {
    const float d = load_f16(src);
    const float m = load_f16(src + 2);
    const uint8_t* qs = src + 4;
    for (int j = 0; j < 16; ++j) {
      dst[j] = float(qs[j] & 0xF) * d + m;
      dst[j + 16] = float(qs[j] >> 4) * d + m;
    }
  }
}

// Shared by Q5_0 (offset -16, no min) and Q5_1 (offset 0, min m): value = (q5 + offset) * d + m.
void dequant_q5(const uint8_t* qh_bytes, const uint8_t* qs, float d, float m, int offset, float* dst) {
  const uint32_t qh = uint32_t(qh_bytes[0]) | uint32_t(qh_bytes[1]) << 8 | uint32_t(qh_bytes[2]) << 16 |
                      uint32_t(qh_bytes[3]) << 24;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0xF) | int((qh >> j) & 1) << 4;
    const int hi = (qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
    dst[j] = float(lo + offset) * d + m;
    dst[j + 16] = float(hi + offset) * d + m;
  }
}

void dequant_q5_0(const uint8_t* src, float* dst, int64_t nb) {  // 22 bytes: d, qh[4], qs[16]
  for (int64_t b = 0; b < nb; ++b, src += 22, dst += kQK) {
    dequant_q5(src + 2, src + 6, load_f16(src), 0.0f, -16, dst);
  }
}

void dequant_q5_1(const uint8_t* src, float* dst, int64_t nb) {  // 24 bytes: d, m, qh[4], qs[16]
  for (int64_t b = 0; b < nb; ++b, src += 24, dst += kQK) {
    dequant_q5(src + 4, src + 8, load_f16(src), load_f16(src + 2), 0, dst);
  }
}

void dequant_q8_0(const uint8_t* src, float* dst, int64_t nb) {  // 34 bytes: d, int8 qs[32]
  for (int64_t b = 0; b < nb; ++b, src += 34, dst += kQK) {
    const float d = load_f16(src);
    for (int j = 0; j < 32; ++j) dst[j] = float(int8_t(src[2 + j])) * d;
  }
}

// ---- K-quants: 256-element super-blocks ---------------------------------------------------------

// Unpacks the eight 6-bit scales and mins of a Q4_K/Q5_K super-block (kquant_scale_min).
void unpack_scales_mins(const uint8_t* p, uint8_t scale[8], uint8_t min[8]) {
  for (int j = 0; j < 8; ++j) {
    int sc = 0, mn = 0;
    kquant_scale_min(p, j, sc, mn);
    scale[j] = uint8_t(sc);
    min[j] = uint8_t(mn);
  }
}

// 144 bytes: d, dmin (f16), scales[12], qs[128]. Sub-blocks of 32 come in pairs: the 32 bytes
// qs[32g..32g+31] hold sub-block 2g in their low nibbles and sub-block 2g+1 in their high ones.
// value = d*scale[s]*q - dmin*min[s] (the min is subtracted, unlike Q4_1's added m).
void dequant_q4_k(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 144, dst += kQK_K) {
    const float d = load_f16(src);
    const float dmin = load_f16(src + 2);
    uint8_t sc[8], mn[8];
    unpack_scales_mins(src + 4, sc, mn);
    const uint8_t* qs = src + 16;
    for (int g = 0; g < 4; ++g) {
      const float d_lo = d * sc[2 * g], m_lo = dmin * mn[2 * g];
      const float d_hi = d * sc[2 * g + 1], m_hi = dmin * mn[2 * g + 1];
      float* y = dst + 64 * g;
      for (int l = 0; l < 32; ++l) {
        const uint8_t q = qs[32 * g + l];
        y[l] = d_lo * float(q & 0xF) - m_lo;
        y[l + 32] = d_hi * float(q >> 4) - m_hi;
      }
    }
  }
}

// 176 bytes: d, dmin, scales[12], qh[32], qs[128]. Low nibbles as in Q4_K; the fifth bit of
// element 64g+l (l < 32) is bit 2g of qh[l], and of element 64g+32+l it is bit 2g+1 of qh[l].
void dequant_q5_k(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 176, dst += kQK_K) {
    const float d = load_f16(src);
    const float dmin = load_f16(src + 2);
    uint8_t sc[8], mn[8];
    unpack_scales_mins(src + 4, sc, mn);
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + 48;
    for (int g = 0; g < 4; ++g) {
      const float d_lo = d * sc[2 * g], m_lo = dmin * mn[2 * g];
      const float d_hi = d * sc[2 * g + 1], m_hi = dmin * mn[2 * g + 1];
      float* y = dst + 64 * g;
      for (int l = 0; l < 32; ++l) {
        const uint8_t q = qs[32 * g + l];
        const int lo = (q & 0xF) | ((qh[l] >> (2 * g)) & 1) << 4;
        const int hi = (q >> 4) | ((qh[l] >> (2 * g + 1)) & 1) << 4;
        y[l] = d_lo * float(lo) - m_lo;
        y[l + 32] = d_hi * float(hi) - m_hi;
      }
    }
  }
}

// 210 bytes: ql[128], qh[64], int8 scales[16], d (f16 last). Each 128-element half h uses
// ql[64h..64h+63] and qh[32h..32h+31]. For l < 32 within the half:
//   element l     : low nibble of ql[l],    qh[l] bits 0-1
//   element l+32  : low nibble of ql[l+32], qh[l] bits 2-3
//   element l+64  : high nibble of ql[l],   qh[l] bits 4-5
//   element l+96  : high nibble of ql[l+32], qh[l] bits 6-7
// Element e of the super-block has scale scales[e/16]; value = d*scale*(q6-32).
void dequant_q6_k(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 210, dst += kQK_K) {
    const float d = load_f16(src + 208);
    const int8_t* scales = reinterpret_cast<const int8_t*>(src + 192);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = src + 64 * h;
      const uint8_t* qh = src + 128 + 32 * h;
      float* y = dst + 128 * h;
      const int8_t* sc = scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int q0 = ((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32;
        const int q1 = ((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32;
        const int q2 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
        const int q3 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
        const int s = l / 16;
        y[l] = d * float(sc[s]) * float(q0);
        y[l + 32] = d * float(sc[s + 2]) * float(q1);
        y[l + 64] = d * float(sc[s + 4]) * float(q2);
        y[l + 96] = d * float(sc[s + 6]) * float(q3);
      }
    }
  }
}

}  // namespace

std::optional<TypeInfo> type_info(uint32_t type_id) {
  if (type_id >= kTypeIdCount || !kTypes[type_id].defined) return std::nullopt;
  return kTypes[type_id].info;
}

std::optional<int64_t> type_bytes(GgmlType type, int64_t n_elems) {
  const std::optional<TypeInfo> info = type_info(uint32_t(type));
  if (!info || n_elems < 0 || n_elems % info->block_elems != 0) return std::nullopt;
  const int64_t blocks = n_elems / info->block_elems;
  if (blocks > std::numeric_limits<int64_t>::max() / info->block_bytes) return std::nullopt;
  return blocks * info->block_bytes;
}

void dequantize(GgmlType type, const void* src, float* dst, int64_t n) {
  const uint32_t id = uint32_t(type);
  const std::optional<TypeInfo> info = type_info(id);
  if (!info) fail("unknown tensor type id {}", id);
  if (!info->dequantizable) fail("unsupported tensor type {}", info->name);
  if (n < 0 || n % info->block_elems != 0) {
    fail("cannot dequantize {} elements of {}: not a multiple of its block size {}", n, info->name,
         info->block_elems);
  }
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / info->block_elems;
  switch (type) {
    case GgmlType::F32:
      static_assert(std::endian::native == std::endian::little, "GGUF data is little-endian");
      if (n > 0) std::memcpy(dst, p, size_t(n) * sizeof(float));
      return;
    case GgmlType::F16:
      return convert_f16(p, dst, n);
    case GgmlType::BF16:
      return convert_bf16(p, dst, n);
    case GgmlType::Q4_0:
      return dequant_q4_0(p, dst, nb);
    case GgmlType::Q4_1:
      return dequant_q4_1(p, dst, nb);
    case GgmlType::Q5_0:
      return dequant_q5_0(p, dst, nb);
    case GgmlType::Q5_1:
      return dequant_q5_1(p, dst, nb);
    case GgmlType::Q8_0:
      return dequant_q8_0(p, dst, nb);
    case GgmlType::Q4_K:
      return dequant_q4_k(p, dst, nb);
    case GgmlType::Q5_K:
      return dequant_q5_k(p, dst, nb);
    case GgmlType::Q6_K:
      return dequant_q6_k(p, dst, nb);
    default:
      break;
  }
  // Only reachable if the table marks a type dequantizable that the switch lacks.
  fail("internal: no dequantizer for tensor type {}", info->name);
}

}  // namespace lp
