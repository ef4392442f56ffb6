// The GGUF block formats as the integer GEMM's kernels read them (qgemm.h): where a block's
// values, scales and minima lie, each block decoded to int8 (the scalar twin's reading), and the
// one switch from a type to a kernel's template. Internal to the qgemm*.cpp files.
//
// Everything here is in an anonymous namespace on purpose: each file that includes it compiles a
// copy of its own (the instruction-set files include it before their target region, so for the
// build's own target, and inline it into their kernels), and the linker never merges one file's
// copy with another's.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/qgemm.h"
#include "model/quant.h"

namespace lp::qk {
namespace {

inline uint16_t load_u16(const uint8_t* p) {
  return uint16_t(p[0] | (p[1] << 8));  // little-endian, as GGUF stores it
}

// Every type here is read as blocks of 32 weights (docs/gguf.md has the layouts): Q8_0, Q4_0,
// Q4_1, Q5_0 and Q5_1 are such blocks; a K-quant super-block of 256 is 8 of them. Q4_K and Q5_K
// sub-block j has scale d * sc[j] and minimum -dmin * mn[j] (6-bit multipliers), its low four
// bits the low (j even) or high (j odd) nibbles of 32 bytes shared with its pair, Q5_K's fifth
// bit bit j of qh[l]. Q6_K's 32-block j (half h = j / 4, k = j % 4) takes nibbles of ql[64h +
// 32(k % 2) + l] (low for k < 2), bits 2k..2k+1 of qh[32h + l] as bits 4-5, less 32, and has two
// scales, d * sc[2j] for its first 16 elements and d * sc[2j + 1] for the rest: lanes 0-3 of a
// block's 8 lanes of 4 products use the first, lanes 4-7 the second. Weights multiply as signed
// int8 (Q8_0; Q4_0, Q5_0 and Q6_K less their offset) or as unsigned values with a per-block
// minimum (Q4_1, Q5_1, Q4_K, Q5_K).
constexpr bool is_signed(GgmlType t) {
  return t == GgmlType::Q8_0 || t == GgmlType::Q4_0 || t == GgmlType::Q5_0 || t == GgmlType::Q6_K;
}
constexpr int n_scales(GgmlType t) {  // per block of 32: Q6_K's sub-blocks are 16 elements
  return t == GgmlType::Q6_K ? 2 : 1;
}
// Whether the decoding tiles read a type's scales in their loop (at each block's start, as the
// simple types keep them) or convert them once per tile (the K-quants', in their super-blocks).
constexpr bool scales_in_loop(GgmlType t) {
  return t != GgmlType::Q4_K && t != GgmlType::Q5_K && t != GgmlType::Q6_K;
}
constexpr int64_t block_bytes(GgmlType t) {  // of the type's own block (256 weights for the K-quants)
  switch (t) {
    case GgmlType::Q8_0:
      return 34;
    case GgmlType::Q4_0:
      return 18;
    case GgmlType::Q4_1:
      return 20;
    case GgmlType::Q5_0:
      return 22;
    case GgmlType::Q5_1:
      return 24;
    case GgmlType::Q4_K:
      return 144;
    case GgmlType::Q5_K:
      return 176;
    default:
      return 210;  // Q6_K
  }
}
// What a signed type's stored values are offset by (their unsigned form: Q8_0's int8 + 128 and the
// nibbles of Q4_0/Q5_0/Q6_K before their -8/-16/-32); 0 for the unsigned types.
constexpr int unsigned_offset(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0:
      return 128;
    case GgmlType::Q4_0:
      return 8;
    case GgmlType::Q5_0:
      return 16;
    case GgmlType::Q6_K:
      return 32;
    default:
      return 0;
  }
}
inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// Calls f with std::integral_constant<GgmlType, t>: one switch for every kernel's per-type template.
template <class F>
void with_type(GgmlType t, F&& f) {
  switch (t) {
    case GgmlType::Q8_0:
      return f(std::integral_constant<GgmlType, GgmlType::Q8_0>{});
    case GgmlType::Q4_0:
      return f(std::integral_constant<GgmlType, GgmlType::Q4_0>{});
    case GgmlType::Q4_1:
      return f(std::integral_constant<GgmlType, GgmlType::Q4_1>{});
    case GgmlType::Q5_0:
      return f(std::integral_constant<GgmlType, GgmlType::Q5_0>{});
    case GgmlType::Q5_1:
      return f(std::integral_constant<GgmlType, GgmlType::Q5_1>{});
    case GgmlType::Q4_K:
      return f(std::integral_constant<GgmlType, GgmlType::Q4_K>{});
    case GgmlType::Q5_K:
      return f(std::integral_constant<GgmlType, GgmlType::Q5_K>{});
    case GgmlType::Q6_K:
      return f(std::integral_constant<GgmlType, GgmlType::Q6_K>{});
    default:
      break;
  }
}
// The types qpack keeps packed from load (for the AVX2 and 512-bit kernels): every type but Q5_0 and
// Q5_1.
constexpr bool packs(GgmlType t) {
  return t == GgmlType::Q8_0 || t == GgmlType::Q4_0 || t == GgmlType::Q4_1 || t == GgmlType::Q4_K ||
         t == GgmlType::Q5_K || t == GgmlType::Q6_K;
}
constexpr bool is_kquant(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K;
}
// The bits a packed type keeps above its nibbles, in planes of 64 bytes a block and vector (Q5_K's
// fifth bit: one plane; Q6_K's two: two).
constexpr int high_planes(GgmlType t) {
  return t == GgmlType::Q5_K ? 1 : t == GgmlType::Q6_K ? 2 : 0;
}
// Four bytes as one little-endian word (a Q5_0/Q5_1 block's qh: element e's fifth bit is bit e).
inline uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
inline int q5_high_offset(GgmlType t) {  // where a Q5_0/Q5_1 block's qh[4] starts
  return t == GgmlType::Q5_0 ? 2 : 4;
}

// Block b's scales as f32 (lanes 0-3 take d[0], lanes 4-7 d[1]; equal but for Q6_K) and its
// minimum (0 for the signed types), from the f16 values `h` converts: a K-quant's d * sc and
// -(dmin * mn) are each one rounding.
struct BlockScale {
  float d[2];
  float m;
};
template <class Half>
inline BlockScale block_scale(GgmlType t, const uint8_t* row, int64_t b, Half h) {
  switch (t) {
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q5_0: {
      const float d = h(load_u16(row + b * block_bytes(t)));
      return {{d, d}, 0.f};
    }
    case GgmlType::Q4_1:
    case GgmlType::Q5_1: {
      const uint8_t* blk = row + b * block_bytes(t);
      const float d = h(load_u16(blk));
      return {{d, d}, h(load_u16(blk + 2))};
    }
    case GgmlType::Q6_K: {
      const uint8_t* sb = row + (b >> 3) * 210;
      const float d = h(load_u16(sb + 208));
      const auto* sc = reinterpret_cast<const int8_t*>(sb + 192) + 2 * (b & 7);
      return {{d * float(sc[0]), d * float(sc[1])}, 0.f};
    }
    default:
      break;
  }
  // Q4_K, Q5_K: the 6-bit scale and minimum of sub-block b % 8 in the 12-byte field at byte 4.
  const uint8_t* sb = row + (b >> 3) * block_bytes(t);
  const uint8_t* p = sb + 4;
  int sc = 0, mn = 0;
  kquant_scale_min(p, int(b & 7), sc, mn);
  const float d = h(load_u16(sb)) * float(sc);
  return {{d, d}, -(h(load_u16(sb + 2)) * float(mn))};
}

// The K-quants' arithmetic (qgemm.h) per super-block of 8 blocks: block b's integer multipliers,
// sc[h] for its halves (equal but for Q6_K, whose are signed) and mn its minimum's (0 for Q6_K), and
// the super-block's f32 d and dmin (0 for Q6_K) from the f16 values `h` converts.
struct KScale {
  int32_t sc[2];
  int32_t mn;
};
inline KScale kblock_scale(GgmlType t, const uint8_t* row, int64_t b) {
  const uint8_t* sb = row + (b >> 3) * block_bytes(t);
  if (t == GgmlType::Q6_K) {
    const auto* sc = reinterpret_cast<const int8_t*>(sb + 192) + 2 * (b & 7);
    return {{sc[0], sc[1]}, 0};
  }
  int sc = 0, mn = 0;
  kquant_scale_min(sb + 4, int(b & 7), sc, mn);
  return {{sc, sc}, mn};
}
struct SuperScale {
  float d, dmin;
};
template <class Half>
inline SuperScale super_scale(GgmlType t, const uint8_t* row, int64_t sb, Half h) {
  const uint8_t* p = row + sb * block_bytes(t);
  if (t == GgmlType::Q6_K) return {h(load_u16(p + 208)), 0.f};
  return {h(load_u16(p)), h(load_u16(p + 2))};
}

// One weight block as 32 int8 values in element order.
inline void decode_scalar(GgmlType t, const uint8_t* row, int64_t b, int8_t* w) {
  switch (t) {
    case GgmlType::Q8_0:
      std::memcpy(w, row + b * 34 + 2, kQBlock);
      return;
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const uint8_t* sb = row + (b >> 3) * block_bytes(t);
      const int j = int(b & 7), shift = (j & 1) ? 4 : 0;
      const uint8_t* q = sb + (t == GgmlType::Q4_K ? 16 : 48) + 32 * (j >> 1);
      for (int l = 0; l < kQBlock; ++l) {
        const int high = t == GgmlType::Q5_K ? ((sb[16 + l] >> j) & 1) << 4 : 0;
        w[l] = int8_t(((q[l] >> shift) & 15) | high);
      }
      return;
    }
    case GgmlType::Q6_K: {
      const uint8_t* sb = row + (b >> 3) * 210;
      const int h = int(b & 7) >> 2, k = int(b & 3), shift = k >= 2 ? 4 : 0;
      const uint8_t* ql = sb + 64 * h + 32 * (k & 1);
      const uint8_t* qh = sb + 128 + 32 * h;
      for (int l = 0; l < kQBlock; ++l)
        w[l] = int8_t((((ql[l] >> shift) & 15) | ((qh[l] >> (2 * k)) & 3) << 4) - 32);
      return;
    }
    default:
      break;
  }
  // Q4_0, Q4_1, Q5_0, Q5_1: element j < 16 is the low nibble of qs[j], element j >= 16 the high
  // nibble of qs[j - 16]; Q5's fifth bit of element j is bit j of qh.
  const int64_t bb = block_bytes(t);
  const uint8_t* blk = row + b * bb;
  const uint8_t* q = blk + bb - 16;
  const bool five = t == GgmlType::Q5_0 || t == GgmlType::Q5_1;
  const uint32_t qh = five ? load_u32(blk + q5_high_offset(t)) : 0;
  const int off = t == GgmlType::Q4_0 ? 8 : t == GgmlType::Q5_0 ? 16 : 0;
  for (int j = 0; j < 16; ++j) {
    w[j] = int8_t(((q[j] & 15) | ((qh >> j) & 1) << 4) - off);
    w[j + 16] = int8_t(((q[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - off);
  }
}

}  // namespace
}  // namespace lp::qk
