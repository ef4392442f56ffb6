#include "kernels/cpu/qgemm.h"

#include <cpuid.h>
#include <immintrin.h>
#include <tbb/blocked_range2d.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/cpu/buffer.h"
#include "kernels/cpu/simd.h"
#include "model/error.h"

namespace lp {

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
// Row m's starting values for the panels: -offset x the integer sum of each activation block (each
// half for Q6_K), [nb][S].
void activation_bias(GgmlType t, int off, const QActBlock* a, int64_t nb, int32_t* out) {
  const int S = n_scales(t), len = kQBlock / S;
  for (int64_t b = 0; b < nb; ++b)
    for (int h = 0; h < S; ++h) {
      int32_t sum = 0;
      for (int j = h * len; j < (h + 1) * len; ++j) sum += a[b].q[j];
      out[b * S + h] = -off * sum;
    }
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
// A panel's storage (the 512-bit and AVX2 kernels each describe their layout): weight bytes, f32
// scales and minima.
struct Panel {
  std::vector<uint8_t> bytes;
  std::vector<float> d, mins;
  uint8_t* w() {  // 64-byte aligned: a group of 16 lanes (two of 8) is one cache line
    return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(bytes.data()) + 63) & ~uintptr_t(63));
  }
};
}  // namespace

// Panels of 32 outputs, each [nb][2 vectors][groups][64 bytes] of weights (groups: 4 of nibbles
// for Q4_0 and Q4_1, 8 of bytes for Q8_0; vnni512::PackedPanel reads them) and [nb][32] f16
// scales and minima as the file stores them. Lanes past N are zero.
struct QPacked {
  GgmlType type = GgmlType::Q8_0;
  int64_t N = 0, nb = 0, panel_bytes = 0;
  Buffer<uint8_t> w;
  Buffer<uint16_t> d, m;
};

namespace {
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

// One weight block as 32 int8 values in element order.
void decode_scalar(GgmlType t, const uint8_t* row, int64_t b, int8_t* w) {
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

// The reference arithmetic of every kernel (qgemm.h): per block, and per 16-element half for Q6_K,
// the exact integer dot product and one fused multiply-add with the scale d_w * d_a (rounded once),
// then for the types with a minimum one fused multiply-add of m_w with s_a, all into a single
// accumulator in block order.
float dot_scalar(GgmlType t, const uint8_t* w_row, const QActBlock* a, int64_t nb) {
  const int S = n_scales(t), len = kQBlock / S;
  float acc = 0;
  int8_t w[kQBlock];
  for (int64_t b = 0; b < nb; ++b) {
    decode_scalar(t, w_row, b, w);
    const BlockScale bs = block_scale(t, w_row, b, f16_to_f32);
    for (int h = 0; h < S; ++h) {
      int32_t s = 0;
      for (int j = h * len; j < (h + 1) * len; ++j) s += int32_t(w[j]) * int32_t(a[b].q[j]);
      acc = std::fma(float(s), bs.d[h] * a[b].d, acc);
    }
    if (block_has_min(t)) acc = std::fma(bs.m, a[b].s, acc);
  }
  return acc;
}

}  // namespace

// Each instruction set's functions carry its target attribute (GCC and clang alike), so the
// build's own -march never decides what the kernels may use.
#define LP_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define LP_TARGET_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

// ---- AVX2: vpmaddubsw (u8 x s8 -> pairs of s16) + vpmaddwd (-> 8 x s32 lanes) ----
namespace avx2 {
namespace {
#define LP_QTARGET LP_TARGET_AVX2
// Byte e of the result: 16 where bit e of qh is set, else 0 (each byte takes qh's byte e / 8 and
// tests its bit e % 8).
LP_QTARGET inline __m256i fifth_bits(uint32_t qh) {
  const __m256i bytes =
      _mm256_shuffle_epi8(_mm256_set1_epi32(int(qh)),
                          _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(16));
}
// Block b's 32 weights as bytes in element order (decode_scalar's values).
template <GgmlType T>
LP_QTARGET inline __m256i load_w(const uint8_t* row, int64_t b) {
  const __m256i nib = _mm256_set1_epi8(15);
  if constexpr (T == GgmlType::Q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * 34 + 2));
  } else if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    const uint8_t* sb = row + (b >> 3) * block_bytes(T);
    const int j = int(b & 7);
    const __m256i v = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(sb + (T == GgmlType::Q4_K ? 16 : 48) + 32 * (j >> 1)));
    const __m256i w = _mm256_and_si256((j & 1) ? _mm256_srli_epi16(v, 4) : v, nib);
    if constexpr (T == GgmlType::Q4_K) return w;
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 16));
    const __m256i m = _mm256_set1_epi8(char(1 << j));
    return _mm256_or_si256(
        w, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m), m), _mm256_set1_epi8(16)));
  } else if constexpr (T == GgmlType::Q6_K) {
    const uint8_t* sb = row + (b >> 3) * 210;
    const int h = int(b & 7) >> 2, k = int(b & 3);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 64 * h + 32 * (k & 1)));
    const __m256i lo = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(v, 4) : v, nib);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sb + 128 + 32 * h));
    // Bits 2k..2k+1 of each byte to bits 4-5: a 16-bit shift right by 2k < 8 leaves each byte's
    // own bits at 0-1, the mask drops what crossed from its neighbour.
    const __m256i hi = _mm256_slli_epi16(
        _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3)), 4);
    return _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32));
  } else {  // Q4_0, Q4_1, Q5_0, Q5_1
    const uint8_t* blk = row + b * block_bytes(T);
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + block_bytes(T) - 16));
    const __m128i lo = _mm_and_si128(x, _mm_set1_epi8(15));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), _mm_set1_epi8(15));
    __m256i w = _mm256_set_m128i(hi, lo);
    if constexpr (T == GgmlType::Q5_0 || T == GgmlType::Q5_1)
      w = _mm256_or_si256(w, fifth_bits(load_u32(blk + q5_high_offset(T))));
    if constexpr (T == GgmlType::Q4_0) return _mm256_sub_epi8(w, _mm256_set1_epi8(8));
    if constexpr (T == GgmlType::Q5_0) return _mm256_sub_epi8(w, _mm256_set1_epi8(16));
    return w;
  }
}
// Block b as unsigned bytes for the panels: the decoded values plus Offset (the type's
// unsigned_offset, or 0 where a kernel keeps them signed).
template <GgmlType T, int Offset>
LP_QTARGET inline __m256i load_u(const uint8_t* row, int64_t b) {
  const __m256i w = load_w<T>(row, b);
  if constexpr (Offset != 0) return _mm256_add_epi8(w, _mm256_set1_epi8(char(Offset)));
  return w;
}
struct WPrep {
  __m256i w, absw;
};
template <bool Signed>
LP_QTARGET inline WPrep prep_w(__m256i w) {
  return {w, Signed ? _mm256_abs_epi8(w) : w};
}
struct APrep {
  __m256i a;
};
template <bool Signed>
LP_QTARGET inline APrep prep_a(const QActBlock& a) {
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q))};
}
// Lane l: the sum of w_j a_j over bytes 4l..4l+3 (|w| <= 128, |a| <= 127: no pair saturates).
template <bool Signed>
LP_QTARGET inline __m256i isum(const WPrep& w, const APrep& a) {
  const __m256i p =
      Signed ? _mm256_maddubs_epi16(w.absw, _mm256_sign_epi8(a.a, w.w)) : _mm256_maddubs_epi16(w.w, a.a);
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
// Block b's scales and minimum, f16 converted by F16C (exact, as model/quant's f16_to_f32).
template <GgmlType T>
LP_QTARGET inline BlockScale scales(const uint8_t* row, int64_t b) {
  return block_scale(T, row, b, [](uint16_t h) LP_QTARGET { return _cvtsh_ss(h); });
}
// 16 ymm registers: 4 x 2 tiles (8 accumulators) keep the weights' vectors in registers too
// (2 x 4 and 4 x 4 ran 1.4-2.4x slower, 2 x 2 1.4x; BM_QGemm Q8_0 512 x 576 x 3072, 2026-11-24).
constexpr int kMR = 4, kNR = 2, kMR1 = 4, kNR1 = 2;
#include "kernels/cpu/qgemm_tile.inc"
// The rows over the tile above (after it: not sorted with it).
#include "kernels/cpu/qgemm_rows.inc"
#undef LP_QTARGET
}  // namespace
}  // namespace avx2

// ---- AVX-512 VNNI: vpdpbusd (u8 x s8, 4 products summed into each s32 lane), 256-bit ----
namespace vnni {
namespace {
#define LP_QTARGET LP_TARGET_VNNI
template <GgmlType T>
LP_QTARGET inline __m256i load_w(const uint8_t* row, int64_t b) {
  return avx2::load_w<T>(row, b);  // AVX2's subset of this target: inlined
}
// Signed weights: vpdpbusd multiplies unsigned by signed, so the activations go in as q + 128
// and the lanes start at -128 * (sum of their 4 weights), computed once per weight block.
struct WPrep {
  __m256i w, start;
};
template <bool Signed>
LP_QTARGET inline WPrep prep_w(__m256i w) {
  if (!Signed) return {w, _mm256_setzero_si256()};
  const __m256i comp = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(char(0x80)), w);
  return {w, _mm256_sub_epi32(_mm256_setzero_si256(), comp)};
}
struct APrep {
  __m256i a;  // q + 128 as u8 for signed weights, q (s8) for Q4_1's unsigned nibbles
};
template <bool Signed>
LP_QTARGET inline APrep prep_a(const QActBlock& a) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q));
  return {Signed ? _mm256_xor_si256(q, _mm256_set1_epi8(char(0x80))) : q};
}
template <bool Signed>
LP_QTARGET inline __m256i isum(const WPrep& w, const APrep& a) {
  return Signed ? _mm256_dpbusd_epi32(w.start, a.a, w.w) : _mm256_dpbusd_epi32(w.start, w.w, a.a);
}
template <GgmlType T>
LP_QTARGET inline BlockScale scales(const uint8_t* row, int64_t b) {
  return block_scale(T, row, b, [](uint16_t h) LP_QTARGET { return _cvtsh_ss(h); });
}
// 32 ymm registers with AVX-512VL. Tall tiles share each weight block's preparation over more
// rows: Q8_0 512 x 576 x 3072 took 11.1 ms in 8 x 2, 12.7 in 6 x 2, 14.0 in 4 x 2, 16.4 in 4 x 4,
// 24.8 in 2 x 4; Q4_1 (a scalar minimum term per pair) 19.9 in 6 x 2, 21.9 in 4 x 4, 29.7 in 8 x 2
// (BM_QGemm, medians of 3, 2026-11-24, AMD EPYC).
constexpr int kMR = 8, kNR = 2, kMR1 = 8, kNR1 = 2;
#include "kernels/cpu/qgemm_tile.inc"
// The rows over the tile above (after it: not sorted with it).
#include "kernels/cpu/qgemm_rows.inc"
#undef LP_QTARGET
}  // namespace
}  // namespace vnni

// ---- AVX-512 VNNI, 512-bit: outputs across the lanes, weights packed per panel ----
// The 256-bit kernels above hold one output's block in a vector and reduce its lanes per block.
// This one holds 16 outputs in the 16 lanes of a zmm: each vpdpbusd adds 4 products to each of 16
// outputs (the activations' 4 bytes broadcast from memory), and after 8 of them a block's exact
// sums are in the lanes, ready for one conversion, one multiply and one fused multiply-add per 16
// outputs. The weights of a panel of 32 outputs are copied once per GEMM into that order, as the
// unsigned bytes vpdpbusd needs (a signed type's offset, 128 for Q8_0 and 8, 16, 32 for Q4_0,
// Q5_0, Q6_K, is added to each weight and taken back as -offset x the activation block's sum, the
// lanes' starting value), and every row of the GEMM passes over the panel. Per output it is the
// scalar twin's arithmetic. Weights packed once at load (qpack, PackedPanel) run every M here;
// otherwise small M (decoding) runs the 256-bit tiles (kPanelMinRows).
namespace vnni512 {
namespace {
#define LP_QTARGET LP_TARGET_VNNI
constexpr int kLanes = 16, kNV = 2, kPanel = kLanes * kNV;
// 6 rows x 2 vectors: 12 f32 accumulators, 12 integer block sums and the 2 weight vectors in the 32
// zmm registers.
constexpr int kMR = 6;
constexpr int offset(GgmlType t) {
  return unsigned_offset(t);
}
// A Panel of up to 32 outputs: weights [nb][kNV][8 groups of 4 elements][16 lanes][4 bytes], scales
// [nb][S][kNV][16], minima [nb][kNV][16]. Lanes past the outputs are zero.
template <GgmlType T>
LP_QTARGET void pack(const uint8_t* W, int64_t row_bytes, int64_t n0, int cnt, int64_t nb, Panel& p) {
  constexpr int S = n_scales(T);
  p.bytes.assign(size_t(nb * kNV * 8 * 64 + 64), 0);
  p.d.assign(size_t(nb * S * kPanel), 0.f);
  if constexpr (block_has_min(T)) p.mins.assign(size_t(nb * kPanel), 0.f);
  uint8_t* pw = p.w();
  const __m256i groups = _mm256_setr_epi32(0, 64, 128, 192, 256, 320, 384, 448);
  for (int n = 0; n < cnt; ++n) {
    const int j = n / kLanes, lane = n % kLanes;
    const uint8_t* row = W + (n0 + n) * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      // The template call in parentheses: clang's intrinsic is a macro, and its comma would split it.
      _mm256_i32scatter_epi32(pw + (b * kNV + j) * 8 * 64 + lane * 4, groups,
                              (avx2::load_u<T, offset(T)>(row, b)), 1);
      const BlockScale bs = vnni::scales<T>(row, b);
      for (int h = 0; h < S; ++h) p.d[size_t(((b * S + h) * kNV + j) * kLanes + lane)] = bs.d[h];
      if constexpr (block_has_min(T)) p.mins[size_t((b * kNV + j) * kLanes + lane)] = bs.m;
    }
  }
}
// A panel as the GEMM packs it per call: the weights' unsigned bytes, f32 scales and minima.
struct BytePanel {
  const uint8_t* pw;
  const float *pd, *pm;
  LP_QTARGET __m512i w(int64_t b, int j, int g) const {
    return _mm512_load_si512(pw + ((b * kNV + j) * 8 + g) * 64);
  }
  LP_QTARGET __m512 d(int64_t b, int S, int h, int j) const {
    return _mm512_loadu_ps(pd + ((b * S + h) * kNV + j) * kLanes);
  }
  LP_QTARGET __m512 m(int64_t b, int j) const { return _mm512_loadu_ps(pm + (b * kNV + j) * kLanes); }
  void prefetch(int64_t) const {}  // packed per call: in cache
};
// A panel as qpack keeps it (QPacked below): Q4_0 and Q4_1 as nibbles, groups 2q and 2q + 1 in
// the low and high halves of 64 bytes [nb][kNV][4][64]; Q8_0 as BytePanel's bytes; the f16 scales
// and minima of the file, [nb][kNV][16] each, widened in registers (exactly).
template <GgmlType T>
struct PackedPanel {
  static constexpr bool kNibbles = T != GgmlType::Q8_0;
  const uint8_t* pw;
  const uint16_t *pd, *pm;
  LP_QTARGET __m512i w(int64_t b, int j, int g) const {
    if constexpr (!kNibbles) return _mm512_load_si512(pw + ((b * kNV + j) * 8 + g) * 64);
    const __m512i x = _mm512_load_si512(pw + ((b * kNV + j) * 4 + g / 2) * 64);
    return _mm512_and_si512(g % 2 ? _mm512_srli_epi16(x, 4) : x, _mm512_set1_epi8(15));
  }
  LP_QTARGET __m512 d(int64_t b, int, int, int j) const {
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(pd + (b * kNV + j) * kLanes)));
  }
  LP_QTARGET __m512 m(int64_t b, int j) const {
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(pm + (b * kNV + j) * kLanes)));
  }
  // Block b + kAhead's lines, read from memory while block b multiplies.
  static constexpr int64_t kAhead = 4, kLines = kNV * (kNibbles ? 4 : 8);
  void prefetch(int64_t b) const {
    const uint8_t* p = pw + (b + kAhead) * kLines * 64;
    for (int64_t l = 0; l < kLines; ++l) _mm_prefetch(reinterpret_cast<const char*>(p + l * 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(pd + (b + kAhead) * kPanel), _MM_HINT_T0);
  }
};
// Rows m0..m0+MR of a panel's outputs (C points at its first output; k[j] masks the lanes that are
// outputs). bias: -offset x the sum of each activation block (half for Q6_K), [M][nb][S].
template <GgmlType T, int MR, class Src>
LP_QTARGET inline void tile(const Src& src, const QActBlock* qa, const int32_t* bias, int64_t nb, int64_t m0,
                            float* C, int64_t ldc, const __mmask16 (&k)[kNV]) {
  constexpr int S = n_scales(T), G = 8 / S;
  __m512 acc[MR][kNV];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < kNV; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    src.prefetch(b);
    for (int h = 0; h < S; ++h) {
      __m512i s[MR][kNV];
      for (int m = 0; m < MR; ++m) {
        const __m512i start =
            offset(T) != 0 ? _mm512_set1_epi32(bias[((m0 + m) * nb + b) * S + h]) : _mm512_setzero_si512();
        for (int j = 0; j < kNV; ++j) s[m][j] = start;
      }
      for (int g = h * G; g < (h + 1) * G; ++g) {
        __m512i w[kNV];
        for (int j = 0; j < kNV; ++j) w[j] = src.w(b, j, g);
        for (int m = 0; m < MR; ++m) {
          const __m512i a = _mm512_set1_epi32(load_i32(qa[(m0 + m) * nb + b].q + 4 * g));
          for (int j = 0; j < kNV; ++j) s[m][j] = _mm512_dpbusd_epi32(s[m][j], w[j], a);
        }
      }
      for (int m = 0; m < MR; ++m) {
        const __m512 da = _mm512_set1_ps(qa[(m0 + m) * nb + b].d);
        for (int j = 0; j < kNV; ++j)
          acc[m][j] =
              _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[m][j]), _mm512_mul_ps(src.d(b, S, h, j), da), acc[m][j]);
      }
    }
    if constexpr (block_has_min(T))
      for (int m = 0; m < MR; ++m) {
        const __m512 sa = _mm512_set1_ps(qa[(m0 + m) * nb + b].s);
        for (int j = 0; j < kNV; ++j) acc[m][j] = _mm512_fmadd_ps(src.m(b, j), sa, acc[m][j]);
      }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < kNV; ++j) _mm512_mask_storeu_ps(C + (m0 + m) * ldc + j * kLanes, k[j], acc[m][j]);
}
// Every row over one panel of cnt outputs (<= kPanel) at C.
template <GgmlType T, class Src>
LP_QTARGET void rows(const Src& src, const QActBlock* qa, const int32_t* bias, int64_t nb, int64_t M, int cnt,
                     float* C, int64_t ldc) {
  __mmask16 k[kNV];
  for (int j = 0; j < kNV; ++j) {
    const int lanes = std::clamp(cnt - j * kLanes, 0, kLanes);
    k[j] = __mmask16((1u << lanes) - 1);
  }
  for (int64_t m = 0; m < M; m += kMR)
    simd::with_rows<kMR>(int(M - m),
                         [&](auto mr) { tile<T, decltype(mr)::value>(src, qa, bias, nb, m, C, ldc, k); });
}
// Every row of outputs n0..n0 + cnt (cnt <= kPanel).
template <GgmlType T>
LP_QTARGET void panel(const uint8_t* W, int64_t row_bytes, const QActBlock* qa, const int32_t* bias,
                      int64_t nb, int64_t M, int64_t n0, int cnt, float* C, int64_t ldc) {
  thread_local Panel p;
  pack<T>(W, row_bytes, n0, cnt, nb, p);
  const BytePanel src{p.w(), p.d.data(), block_has_min(T) ? p.mins.data() : nullptr};
  rows<T>(src, qa, bias, nb, M, cnt, C + n0, ldc);
}
LP_QTARGET void run_panel(GgmlType t, const uint8_t* W, int64_t row_bytes, const QActBlock* qa,
                          const int32_t* bias, int64_t nb, int64_t M, int64_t n0, int cnt, float* C,
                          int64_t ldc) {
  with_type(t,
            [&](auto type) { panel<decltype(type)::value>(W, row_bytes, qa, bias, nb, M, n0, cnt, C, ldc); });
}
constexpr bool packs(GgmlType t) {
  return t == GgmlType::Q8_0 || t == GgmlType::Q4_0 || t == GgmlType::Q4_1;
}
// A packed panel widened into BytePanel's storage: nibbles to bytes, f16 to f32.
template <GgmlType T>
LP_QTARGET void widen(const PackedPanel<T>& src, int64_t nb, Panel& p) {
  p.bytes.resize(size_t(nb * kNV * 8 * 64 + 64));
  p.d.resize(size_t(nb * kPanel));
  if constexpr (block_has_min(T)) p.mins.resize(size_t(nb * kPanel));
  uint8_t* pw = p.w();
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < kNV; ++j) {
      for (int g = 0; g < 8; ++g) _mm512_store_si512(pw + ((b * kNV + j) * 8 + g) * 64, src.w(b, j, g));
      _mm512_storeu_ps(p.d.data() + (b * kNV + j) * kLanes, src.d(b, 1, 0, j));
      if constexpr (block_has_min(T)) _mm512_storeu_ps(p.mins.data() + (b * kNV + j) * kLanes, src.m(b, j));
    }
}
// Every row over panel p of a packed matrix. Many rows (wide) multiply it widened once to bytes:
// each tile of 6 rows passes over the panel again, and as bytes vpdpbusd reads its weights from
// memory, where nibbles take a shift and a mask per tile (Q4_1 512 x 576 x 3072: 4.9 ms from the
// nibbles, 3.7 ms packing per call, BM_QGemmPacked, 2026-11-26).
LP_QTARGET void run_packed(const QPacked& P, int64_t p, const QActBlock* qa, const int32_t* bias, int64_t M,
                           bool wide, float* C, int64_t ldc) {
  const int64_t n0 = p * kPanel, scales = p * P.nb * kPanel;
  const int cnt = int(std::min<int64_t>(kPanel, P.N - n0));
  with_type(P.type, [&](auto type) {
    constexpr GgmlType T = decltype(type)::value;
    if constexpr (packs(T)) {
      const PackedPanel<T> src{P.w.data() + p * P.panel_bytes, P.d.data() + scales,
                               block_has_min(T) ? P.m.data() + scales : nullptr};
      if (!wide || !src.kNibbles) return rows<T>(src, qa, bias, P.nb, M, cnt, C + n0, ldc);
      thread_local Panel w;
      widen<T>(src, P.nb, w);
      rows<T>(BytePanel{w.w(), w.d.data(), block_has_min(T) ? w.mins.data() : nullptr}, qa, bias, P.nb, M,
              cnt, C + n0, ldc);
    }
  });
}
#undef LP_QTARGET
}  // namespace
}  // namespace vnni512

// ---- AVX2 panels: 8 outputs across a ymm's lanes ----
// The 512-bit kernel's panel order on AVX2 (no vpdpbusd): vpmaddubsw (u8 x s8 -> pairs of s16)
// then vpmaddwd with ones give each lane the sum of its 4 products, as one vpdpbusd does, and a
// block's exact sums are again in the lanes with no reduction. Q4_0, Q5_0 and Q6_K carry their
// offset as there (pair sums at most 2 x 63 x 127); Q8_0 cannot (2 x 255 x 127 would saturate), so
// its panel holds the signed weights and their absolute values and multiplies |w| by the
// activations with w's sign, as the 256-bit tiles do.
namespace avx2p {
namespace {
#define LP_QTARGET LP_TARGET_AVX2
constexpr int kLanes = 8, kNV = 2, kPanel = kLanes * kNV;
// 2 rows x 2 vectors: 4 f32 accumulators, 4 integer block sums, 2 weight vectors (4 for Q8_0) and
// the broadcast activations in the 16 ymm registers.
constexpr int kMR = 2;
constexpr int offset(GgmlType t) {
  return t == GgmlType::Q8_0 ? 0 : unsigned_offset(t);
}
// A Panel: weights [nb][kNV][8 groups][8 lanes][4 bytes] (Q8_0: then the same again as absolute
// values), scales [nb][S][kNV][8], minima [nb][kNV][8]; lanes past the outputs are zero.
template <GgmlType T>
LP_QTARGET void pack(const uint8_t* W, int64_t row_bytes, int64_t n0, int cnt, int64_t nb, Panel& p) {
  constexpr int S = n_scales(T);
  const int64_t plane = nb * kNV * 8 * 32;
  p.bytes.assign(size_t((T == GgmlType::Q8_0 ? 2 : 1) * plane + 64), 0);
  p.d.assign(size_t(nb * S * kPanel), 0.f);
  if constexpr (block_has_min(T)) p.mins.assign(size_t(nb * kPanel), 0.f);
  uint8_t* pw = p.w();
  alignas(32) uint8_t u[32], a[32];
  for (int n = 0; n < cnt; ++n) {
    const int j = n / kLanes, lane = n % kLanes;
    const uint8_t* row = W + (n0 + n) * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i v = avx2::load_u<T, offset(T)>(row, b);
      _mm256_store_si256(reinterpret_cast<__m256i*>(u), v);
      if constexpr (T == GgmlType::Q8_0)
        _mm256_store_si256(reinterpret_cast<__m256i*>(a), _mm256_abs_epi8(v));
      for (int g = 0; g < 8; ++g) {
        uint8_t* dst = pw + ((b * kNV + j) * 8 + g) * 32 + lane * 4;
        std::memcpy(dst, u + 4 * g, 4);
        if constexpr (T == GgmlType::Q8_0) std::memcpy(dst + plane, a + 4 * g, 4);
      }
      const BlockScale bs = avx2::scales<T>(row, b);
      for (int h = 0; h < S; ++h) p.d[size_t(((b * S + h) * kNV + j) * kLanes + lane)] = bs.d[h];
      if constexpr (block_has_min(T)) p.mins[size_t((b * kNV + j) * kLanes + lane)] = bs.m;
    }
  }
}
template <GgmlType T, int MR>
LP_QTARGET inline void tile(const uint8_t* pw, int64_t plane, const float* pd, const float* pm,
                            const QActBlock* qa, const int32_t* bias, int64_t nb, int64_t m0, float* C,
                            int64_t ldc, const __m256i (&k)[kNV]) {
  constexpr int S = n_scales(T), G = 8 / S;
  constexpr bool kQ8 = T == GgmlType::Q8_0;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR][kNV];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < kNV; ++j) acc[m][j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int h = 0; h < S; ++h) {
      __m256i s[MR][kNV];
      for (int m = 0; m < MR; ++m) {
        const __m256i start =
            offset(T) != 0 ? _mm256_set1_epi32(bias[((m0 + m) * nb + b) * S + h]) : _mm256_setzero_si256();
        for (int j = 0; j < kNV; ++j) s[m][j] = start;
      }
      for (int g = h * G; g < (h + 1) * G; ++g) {
        __m256i w[kNV];
        for (int j = 0; j < kNV; ++j)
          w[j] = _mm256_load_si256(reinterpret_cast<const __m256i*>(pw + ((b * kNV + j) * 8 + g) * 32));
        for (int m = 0; m < MR; ++m) {
          const __m256i a = _mm256_set1_epi32(load_i32(qa[(m0 + m) * nb + b].q + 4 * g));
          for (int j = 0; j < kNV; ++j) {
            __m256i pairs;
            if constexpr (kQ8)
              pairs = _mm256_maddubs_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(
                                               pw + plane + ((b * kNV + j) * 8 + g) * 32)),
                                           _mm256_sign_epi8(a, w[j]));
            else
              pairs = _mm256_maddubs_epi16(w[j], a);
            s[m][j] = _mm256_add_epi32(s[m][j], _mm256_madd_epi16(pairs, ones));
          }
        }
      }
      for (int m = 0; m < MR; ++m) {
        const __m256 da = _mm256_set1_ps(qa[(m0 + m) * nb + b].d);
        for (int j = 0; j < kNV; ++j) {
          const __m256 dw = _mm256_loadu_ps(pd + ((b * S + h) * kNV + j) * kLanes);
          acc[m][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[m][j]), _mm256_mul_ps(dw, da), acc[m][j]);
        }
      }
    }
    if constexpr (block_has_min(T))
      for (int m = 0; m < MR; ++m) {
        const __m256 sa = _mm256_set1_ps(qa[(m0 + m) * nb + b].s);
        for (int j = 0; j < kNV; ++j)
          acc[m][j] = _mm256_fmadd_ps(_mm256_loadu_ps(pm + (b * kNV + j) * kLanes), sa, acc[m][j]);
      }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < kNV; ++j) _mm256_maskstore_ps(C + (m0 + m) * ldc + j * kLanes, k[j], acc[m][j]);
}
template <GgmlType T>
LP_QTARGET void panel(const uint8_t* W, int64_t row_bytes, const QActBlock* qa, const int32_t* bias,
                      int64_t nb, int64_t M, int64_t n0, int cnt, float* C, int64_t ldc) {
  thread_local Panel p;
  pack<T>(W, row_bytes, n0, cnt, nb, p);
  __m256i k[kNV];
  for (int j = 0; j < kNV; ++j)
    k[j] = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt - j * kLanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const uint8_t* pw = p.w();
  const int64_t plane = nb * kNV * 8 * 32;
  const float* pd = p.d.data();
  const float* pm = block_has_min(T) ? p.mins.data() : nullptr;
  float* c = C + n0;
  for (int64_t m = 0; m < M; m += kMR)
    simd::with_rows<kMR>(int(M - m), [&](auto mr) {
      tile<T, decltype(mr)::value>(pw, plane, pd, pm, qa, bias, nb, m, c, ldc, k);
    });
}
LP_QTARGET void run_panel(GgmlType t, const uint8_t* W, int64_t row_bytes, const QActBlock* qa,
                          const int32_t* bias, int64_t nb, int64_t M, int64_t n0, int cnt, float* C,
                          int64_t ldc) {
  with_type(t,
            [&](auto type) { panel<decltype(type)::value>(W, row_bytes, qa, bias, nb, M, n0, cnt, C, ldc); });
}
#undef LP_QTARGET
}  // namespace
}  // namespace avx2p

// ---- Decoding: fewer rows than a panel pays for, weights read where they lie ----
// A decoding step multiplies one activation row by every weight once, so copying weights into
// panels would double its memory traffic. These kernels read each output's blocks in place, as the
// 256-bit tiles do, but 8 outputs at a time: each output's block gives a vector of 8 lanes of 4
// products (lanes 0-3 its first 16 elements, 4-7 the rest), and the 8 outputs' lanes are summed
// together by one transpose-and-add (reduce4: 9 instructions per 4 vectors), leaving each
// output's two half-block sums in the lanes of two vectors of 8. Then per block one conversion, one
// multiply and one fused multiply-add per 8 outputs (two for Q6_K's halves, one more for a
// minimum): per output the scalar twin's arithmetic. The weights go in as the panels hold them (a
// signed type's offset added, taken back as -offset x the activation block's sum); the simple
// types' scales are read in the loop, the K-quants' converted once per tile into [nb][S][8]; the
// activations' bytes, one load per block, serve all 8 outputs.
namespace gemv {
constexpr int kOut = 8;
// Stores the 8 x 8 matrix whose rows are r[0..7] column by column: out[8j + i] = r[i][j].
LP_TARGET_AVX2 inline void transpose8(const __m256 (&r)[8], float* out) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int j = 0; j < 4; ++j) {
    _mm256_storeu_ps(out + 8 * j, _mm256_permute2f128_ps(u[j], u[j + 4], 0x20));
    _mm256_storeu_ps(out + 8 * (j + 4), _mm256_permute2f128_ps(u[j], u[j + 4], 0x31));
  }
}
// The simple types' scales sit at the start of each block (Q4_1 and Q5_1: d, then m), read in the
// tile's loop; the K-quants' are converted here once per tile, per super-block of 8 blocks (d and
// dmin once, the 6-bit multipliers of all 8 at once), into [nb][S][8] and minima [nb][8]: the same
// values as block_scale's, one rounding each. Lanes past cnt repeat the last output (their results
// are never stored).
constexpr bool scales_in_loop(GgmlType t) {
  return t != GgmlType::Q4_K && t != GgmlType::Q5_K && t != GgmlType::Q6_K;
}
template <GgmlType T>
LP_TARGET_AVX2 void tile_scales(const uint8_t* W, int64_t row_bytes, int64_t n0, int cnt, int64_t nb,
                                float* d, float* mins) {
  const uint8_t* row[kOut];
  for (int i = 0; i < kOut; ++i) row[i] = W + (n0 + std::min(i, cnt - 1)) * row_bytes;
  // Each output's 8 (Q6_K: 16) values of a super-block as vectors, then transposed to [block][8].
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    __m256 v[2][kOut], m[kOut];
    for (int i = 0; i < kOut; ++i) {
      const uint8_t* p = row[i] + sb * block_bytes(T);
      if constexpr (T == GgmlType::Q6_K) {  // its 16 int8 scales, [8 blocks][2 halves] in order
        const __m256 dd = _mm256_set1_ps(_cvtsh_ss(load_u16(p + 208)));
        const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
        v[0][i] = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
        v[1][i] = _mm256_mul_ps(dd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
      } else {
        // kquant_scale_min for all 8 sub-blocks at once, four bytes a word: sub-blocks 0-3 the low
        // 6 bits of bytes 0-3 (scales) and 4-7 (minima); 4-7 a nibble of bytes 8-11 below the top
        // 2 bits of bytes 0-3 (scales) and 4-7 (minima).
        const uint32_t u0 = load_u32(p + 4), u1 = load_u32(p + 8), u2 = load_u32(p + 12);
        const uint32_t sc_lo = u0 & 0x3f3f3f3f, mn_lo = u1 & 0x3f3f3f3f;
        const uint32_t sc_hi = (u2 & 0x0f0f0f0f) | ((u0 >> 6) & 0x03030303) << 4;
        const uint32_t mn_hi = ((u2 >> 4) & 0x0f0f0f0f) | ((u1 >> 6) & 0x03030303) << 4;
        const __m128i sc = _mm_setr_epi32(int(sc_lo), int(sc_hi), 0, 0),
                      mn = _mm_setr_epi32(int(mn_lo), int(mn_hi), 0, 0);
        v[0][i] = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(load_u16(p))),
                                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)));
        m[i] =
            _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(load_u16(p + 2))),
                                                             _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn))));
      }
    }
    if constexpr (T == GgmlType::Q6_K) {
      transpose8(v[0], d + sb * 16 * kOut);
      transpose8(v[1], d + (sb * 16 + 8) * kOut);
    } else {
      transpose8(v[0], d + sb * 8 * kOut);
      transpose8(m, mins + sb * 8 * kOut);
    }
  }
}
// A simple type's 8 outputs' scales of block b (f16 at the block's start) and, for Q4_1 and Q5_1,
// minima (the f16 after it).
template <GgmlType T>
LP_TARGET_AVX2 inline void loop_scales(const uint8_t* const (&row)[kOut], int64_t b, __m256& d, __m256& m) {
  const int64_t off = b * block_bytes(T);
  const __m256i h = _mm256_setr_epi32(load_i32(reinterpret_cast<const int8_t*>(row[0] + off)),
                                      load_i32(reinterpret_cast<const int8_t*>(row[1] + off)),
                                      load_i32(reinterpret_cast<const int8_t*>(row[2] + off)),
                                      load_i32(reinterpret_cast<const int8_t*>(row[3] + off)),
                                      load_i32(reinterpret_cast<const int8_t*>(row[4] + off)),
                                      load_i32(reinterpret_cast<const int8_t*>(row[5] + off)),
                                      load_i32(reinterpret_cast<const int8_t*>(row[6] + off)),
                                      load_i32(reinterpret_cast<const int8_t*>(row[7] + off)));
  // Each 128-bit lane's four low (then high) halves to its low 8 bytes, then the two lanes' together.
  const __m256i sh = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9,
                                      12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  const __m256i v = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(h, sh), _MM_SHUFFLE(3, 1, 2, 0));
  d = _mm256_cvtph_ps(_mm256_castsi256_si128(v));
  if constexpr (block_has_min(T)) m = _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1));
}
// A tile's 8 rows (outputs past cnt repeat the last; their results are never stored). It reads
// them block by block, 8 short interleaved streams the hardware prefetcher hardly follows (a row
// of SmolLM2's Q4_1 576 is 6 cache lines), so each tile asks for the tile after next, spread over
// its blocks, and only for rows the matrix has.
struct Tile {
  const uint8_t* row[kOut];
  const char* next = nullptr;
  int64_t lines = 0, per_block = 0;
  static constexpr int kAhead = 2;
  Tile(const uint8_t* W, int64_t row_bytes, int64_t N, int64_t n0, int cnt, int64_t nb) {
    for (int i = 0; i < kOut; ++i) row[i] = W + (n0 + std::min(i, cnt - 1)) * row_bytes;
    const int64_t ahead = std::clamp<int64_t>(N - n0 - kAhead * kOut, 0, kOut);
    if (ahead > 0) {
      next = reinterpret_cast<const char*>(W + (n0 + kAhead * kOut) * row_bytes);
      lines = (ahead * row_bytes + 63) / 64;
      per_block = (lines + nb - 1) / nb;
    }
  }
  void prefetch(int64_t b) const {
    for (int64_t l = b * per_block; l < std::min(lines, (b + 1) * per_block); ++l)
      __builtin_prefetch(next + l * 64);
  }
};
// Block b's scales for the tile's 8 outputs: d0 (d1: Q6_K's second half) and the minima m.
struct BlockScales {
  __m256 d0, d1, m;
};
template <GgmlType T>
LP_TARGET_AVX2 inline BlockScales block_scales(const Tile& t, int64_t b, const float* pd, const float* pm) {
  BlockScales s{_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  if constexpr (scales_in_loop(T)) {
    loop_scales<T>(t.row, b, s.d0, s.m);
  } else {
    s.d0 = _mm256_loadu_ps(pd + b * n_scales(T) * kOut);
    if constexpr (n_scales(T) == 2) s.d1 = _mm256_loadu_ps(pd + b * 2 * kOut + kOut);
    if constexpr (block_has_min(T)) s.m = _mm256_loadu_ps(pm + b * kOut);
  }
  return s;
}
// One row's block into its 8 accumulators, from the 8 outputs' half-block sums h0 and h1: the
// offset taken back (-Offset x the activation half's sum, bi), then the scalar twin's sequence.
template <GgmlType T, int Offset>
LP_TARGET_AVX2 inline __m256 accumulate(__m256i h0, __m256i h1, const BlockScales& sc, const QActBlock& a,
                                        const int32_t* bi, __m256 acc) {
  const __m256 da = _mm256_set1_ps(a.d);
  if constexpr (n_scales(T) == 1) {
    __m256i sum = _mm256_add_epi32(h0, h1);
    if constexpr (Offset != 0) sum = _mm256_add_epi32(sum, _mm256_set1_epi32(bi[0]));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(sc.d0, da), acc);
  } else {
    h0 = _mm256_add_epi32(h0, _mm256_set1_epi32(bi[0]));
    h1 = _mm256_add_epi32(h1, _mm256_set1_epi32(bi[1]));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h0), _mm256_mul_ps(sc.d0, da), acc);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h1), _mm256_mul_ps(sc.d1, da), acc);
  }
  if constexpr (block_has_min(T)) acc = _mm256_fmadd_ps(sc.m, _mm256_set1_ps(a.s), acc);
  return acc;
}
// The first cnt of a row's 8 outputs.
LP_TARGET_AVX2 inline void store(float* c, int cnt, __m256 acc) {
  _mm256_maskstore_ps(
      c, _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), acc);
}
// Per 128-bit chunk c: lane k = the sum of the 4 lanes of v_k's chunk c.
template <class V, class Lo32, class Hi32, class Lo64, class Hi64, class Add>
inline V reduce4(V v0, V v1, V v2, V v3, Lo32 lo32, Hi32 hi32, Lo64 lo64, Hi64 hi64, Add add) {
  const V t0 = add(lo32(v0, v1), hi32(v0, v1)), t1 = add(lo32(v2, v3), hi32(v2, v3));
  return add(lo64(t0, t1), hi64(t0, t1));
}
}  // namespace gemv

namespace vnni512 {
namespace {
#define LP_QTARGET LP_TARGET_VNNI
LP_QTARGET inline __m512i reduce4(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
  return gemv::reduce4(
      v0, v1, v2, v3, [](__m512i a, __m512i b) LP_QTARGET { return _mm512_unpacklo_epi32(a, b); },
      [](__m512i a, __m512i b) LP_QTARGET { return _mm512_unpackhi_epi32(a, b); },
      [](__m512i a, __m512i b) LP_QTARGET { return _mm512_unpacklo_epi64(a, b); },
      [](__m512i a, __m512i b) LP_QTARGET { return _mm512_unpackhi_epi64(a, b); },
      [](__m512i a, __m512i b) LP_QTARGET { return _mm512_add_epi32(a, b); });
}
// Block b of two rows as one zmm of unsigned bytes (load_u's values, row r0 in the low half). The
// simple types decode both at once: Q4_0 and Q4_1's 16 bytes broadcast to both 128-bit lanes of a
// half, the second lane shifted right by 4 (its high nibbles), Q5's fifth bits as a 64-bit mask.
template <GgmlType T>
LP_QTARGET inline __m512i load_u2(const uint8_t* r0, const uint8_t* r1, int64_t b) {
  if constexpr (T == GgmlType::Q8_0) {
    const __m512i w = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0 + b * 34 + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1 + b * 34 + 2)), 1);
    return _mm512_xor_si512(w, _mm512_set1_epi8(char(0x80)));  // + 128
  } else if constexpr (T == GgmlType::Q4_0 || T == GgmlType::Q4_1 || T == GgmlType::Q5_0 ||
                       T == GgmlType::Q5_1) {
    constexpr int64_t bb = block_bytes(T);
    const uint8_t* b0 = r0 + b * bb;
    const uint8_t* b1 = r1 + b * bb;
    const __m512i x = _mm512_inserti64x4(
        _mm512_castsi256_si512(
            _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + bb - 16)))),
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + bb - 16))), 1);
    __m512i w = _mm512_and_si512(
        _mm512_srlv_epi16(x, _mm512_setr_epi64(0, 0, 0x0004000400040004, 0x0004000400040004, 0, 0,
                                               0x0004000400040004, 0x0004000400040004)),
        _mm512_set1_epi8(15));
    if constexpr (T == GgmlType::Q5_0 || T == GgmlType::Q5_1) {
      const __mmask64 hi =
          __mmask64(load_u32(b0 + q5_high_offset(T))) | __mmask64(load_u32(b1 + q5_high_offset(T))) << 32;
      w = _mm512_mask_add_epi8(w, hi, w, _mm512_set1_epi8(16));
    }
    return w;  // Q4_0 and Q5_0's offsets (8, 16) are the nibbles' own: nothing to add
  } else {
    return _mm512_inserti64x4(_mm512_castsi256_si512(avx2::load_u<T, offset(T)>(r0, b)),
                              (avx2::load_u<T, offset(T)>(r1, b)), 1);  // in parentheses: a macro in clang
  }
}
// Rows m0..m0+MR x outputs n0..n0+cnt (cnt <= 8). Output k and k + 4 share a zmm (one vpdpbusd for
// both, the activation block broadcast to both halves), so after reduce4 chunk c lane k holds output
// k + 4 (c / 2)'s half c % 2.
template <GgmlType T, int MR>
LP_QTARGET inline void gemv_tile(const uint8_t* W, int64_t row_bytes, int64_t N, int64_t n0, int cnt,
                                 const float* pd, const float* pm, const QActBlock* qa, const int32_t* bias,
                                 int64_t nb, int64_t m0, float* C, int64_t ldc) {
  const gemv::Tile t(W, row_bytes, N, n0, cnt, nb);
  __m256 acc[MR];
  for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    t.prefetch(b);
    const auto sc = gemv::block_scales<T>(t, b, pd, pm);
    __m512i w[4];
    for (int k = 0; k < 4; ++k) w[k] = load_u2<T>(t.row[k], t.row[k + 4], b);
    for (int m = 0; m < MR; ++m) {
      const QActBlock& a = qa[(m0 + m) * nb + b];
      const __m512i av = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q)));
      __m512i s[4];
      for (int k = 0; k < 4; ++k) s[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[k], av);
      const __m512i r = reduce4(s[0], s[1], s[2], s[3]);
      const __m512i hh = _mm512_shuffle_i32x4(r, r, _MM_SHUFFLE(3, 1, 2, 0));  // [half 0 | half 1]
      acc[m] = gemv::accumulate<T, offset(T)>(_mm512_castsi512_si256(hh), _mm512_extracti64x4_epi64(hh, 1),
                                              sc, a, bias + ((m0 + m) * nb + b) * n_scales(T), acc[m]);
    }
  }
  for (int m = 0; m < MR; ++m) gemv::store(C + (m0 + m) * ldc + n0, cnt, acc[m]);
}
#undef LP_QTARGET
}  // namespace
}  // namespace vnni512

namespace avx2p {
namespace {
#define LP_QTARGET LP_TARGET_AVX2
LP_QTARGET inline __m256i reduce4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
  return gemv::reduce4(
      v0, v1, v2, v3, [](__m256i a, __m256i b) LP_QTARGET { return _mm256_unpacklo_epi32(a, b); },
      [](__m256i a, __m256i b) LP_QTARGET { return _mm256_unpackhi_epi32(a, b); },
      [](__m256i a, __m256i b) LP_QTARGET { return _mm256_unpacklo_epi64(a, b); },
      [](__m256i a, __m256i b) LP_QTARGET { return _mm256_unpackhi_epi64(a, b); },
      [](__m256i a, __m256i b) LP_QTARGET { return _mm256_add_epi32(a, b); });
}
// The 512-bit decoding tile on AVX2: one ymm per output, the panels' arithmetic per block (Q8_0
// signed, |w| x sign(a, w); the others unsigned with their offset).
template <GgmlType T, int MR>
LP_QTARGET inline void gemv_tile(const uint8_t* W, int64_t row_bytes, int64_t N, int64_t n0, int cnt,
                                 const float* pd, const float* pm, const QActBlock* qa, const int32_t* bias,
                                 int64_t nb, int64_t m0, float* C, int64_t ldc) {
  constexpr bool kQ8 = T == GgmlType::Q8_0;
  const __m256i ones = _mm256_set1_epi16(1);
  const gemv::Tile t(W, row_bytes, N, n0, cnt, nb);
  __m256 acc[MR];
  for (int m = 0; m < MR; ++m) acc[m] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    t.prefetch(b);
    const auto sc = gemv::block_scales<T>(t, b, pd, pm);
    __m256i w[gemv::kOut];
    for (int k = 0; k < gemv::kOut; ++k) w[k] = avx2::load_u<T, offset(T)>(t.row[k], b);
    for (int m = 0; m < MR; ++m) {
      const QActBlock& a = qa[(m0 + m) * nb + b];
      const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q));
      __m256i s[gemv::kOut];
      for (int k = 0; k < gemv::kOut; ++k) {
        const __m256i pairs = kQ8 ? _mm256_maddubs_epi16(_mm256_abs_epi8(w[k]), _mm256_sign_epi8(av, w[k]))
                                  : _mm256_maddubs_epi16(w[k], av);
        s[k] = _mm256_madd_epi16(pairs, ones);
      }
      const __m256i ra = reduce4(s[0], s[1], s[2], s[3]), rb = reduce4(s[4], s[5], s[6], s[7]);
      acc[m] = gemv::accumulate<T, offset(T)>(_mm256_permute2x128_si256(ra, rb, 0x20),
                                              _mm256_permute2x128_si256(ra, rb, 0x31), sc, a,
                                              bias + ((m0 + m) * nb + b) * n_scales(T), acc[m]);
    }
  }
  for (int m = 0; m < MR; ++m) gemv::store(C + (m0 + m) * ldc + n0, cnt, acc[m]);
}
#undef LP_QTARGET
}  // namespace
}  // namespace avx2p

namespace gemv {
// Every row (M < kPanelMinRows) of the outputs n0..n0+cnt, in row groups of up to kMR: 8 on
// AVX-512 (32 registers: 8 accumulators beside the 4 weight vectors), 4 on AVX2 (16). A group
// decodes each weight block once for all its rows, so 8 rows (8 requests decoding together) take
// one pass over the weights instead of two.
template <bool V512>
constexpr int kMR = V512 ? 8 : 4;
// No target attribute: it calls each instruction set's tile, which is not inlined into it.
template <bool V512, GgmlType T>
void run_tile(const uint8_t* W, int64_t row_bytes, const QActBlock* qa, const int32_t* bias, int64_t nb,
              int64_t M, int64_t N, int64_t n0, int cnt, float* C, int64_t ldc) {
  constexpr int S = n_scales(T);
  thread_local std::vector<float> d, mins;
  if constexpr (!scales_in_loop(T)) {
    d.resize(size_t(nb * S * kOut));
    if constexpr (block_has_min(T)) mins.resize(size_t(nb * kOut));
    tile_scales<T>(W, row_bytes, n0, cnt, nb, d.data(), mins.data());
  }
  for (int64_t m = 0; m < M; m += kMR<V512>)
    simd::with_rows<kMR<V512>>(int(M - m), [&](auto mr) {
      constexpr int MR = decltype(mr)::value;
      if constexpr (V512)
        vnni512::gemv_tile<T, MR>(W, row_bytes, N, n0, cnt, d.data(), mins.data(), qa, bias, nb, m, C, ldc);
      else
        avx2p::gemv_tile<T, MR>(W, row_bytes, N, n0, cnt, d.data(), mins.data(), qa, bias, nb, m, C, ldc);
    });
}
// Outputs n0..n0+cnt of N.
void run(bool v512, GgmlType t, const uint8_t* W, int64_t row_bytes, const QActBlock* qa, const int32_t* bias,
         int64_t nb, int64_t M, int64_t N, int64_t n0, int cnt, float* C, int64_t ldc) {
  with_type(t, [&](auto type) {
    constexpr GgmlType T = decltype(type)::value;
    if (v512)
      run_tile<true, T>(W, row_bytes, qa, bias, nb, M, N, n0, cnt, C, ldc);
    else
      run_tile<false, T>(W, row_bytes, qa, bias, nb, M, N, n0, cnt, C, ldc);
  });
}
}  // namespace gemv

namespace {
// 127 / amax, the factor that maps a block's largest magnitude to 127: 0 for an all-zero block and
// for one whose largest magnitude is below 127 / FLT_MAX (about 3.7e-37), where it overflows. Such
// a block quantizes to zeros, a contribution far below the float precision of any sum it joins;
// with the infinite factor a zero became NaN, an undefined conversion to int (found by clang's
// UBSan, issue 49) that gave -127.
inline float inverse_scale(float amax) {
  const float id = 127.f / amax;
  return id <= std::numeric_limits<float>::max() ? id : 0.f;
}

// One block: d = max|v| / 127, q = round-half-even(v * 127 / max|v|) clamped to +-127, s = d * sum q;
// a block with a NaN or an infinity gets NaN scales and zero bytes (as the f32 product would be
// NaN, never a cast of NaN to int).
void quantize_block_scalar(const float* v, QActBlock& o) {
  float amax = 0;
  bool finite = true;
  for (int j = 0; j < kQBlock; ++j) {
    amax = std::max(amax, std::fabs(v[j]));
    finite = finite && std::isfinite(v[j]);
  }
  if (!finite) {
    o.d = o.s = std::numeric_limits<float>::quiet_NaN();
    std::fill(o.q, o.q + kQBlock, int8_t(0));
    return;
  }
  o.d = amax / 127.f;
  const float id = inverse_scale(amax);
  int32_t sum = 0;
  for (int j = 0; j < kQBlock; ++j) {
    const int32_t q = int32_t(std::nearbyint(v[j] * id));
    o.q[j] = int8_t(std::clamp(q, -127, 127));
    sum += o.q[j];
  }
  o.s = o.d * float(sum);
}
}  // namespace

// The same arithmetic in vectors (each value's product and rounding are the scalar ones, the max
// and the integer sum exact in any order): the same bits. In scalar code it took 3.6-5.8% of the
// samples of `perf record` over BatchedDecode/8 (prefill included), 2026-11-26.
void quantize_activations(const float* x, int64_t K, QActBlock* out) {
  if (K % kQBlock != 0) fail("quantize_activations: {} values are not a multiple of {}", K, kQBlock);
  for (int64_t b = 0; b < K / kQBlock; ++b) {
    const float* v = x + b * kQBlock;
    QActBlock& o = out[b];
#if defined(__AVX512F__) && defined(__AVX512BW__)
    static_assert(kQBlock == 32);
    const __m512 a0 = _mm512_loadu_ps(v), a1 = _mm512_loadu_ps(v + 16);
    // x - x is 0 exactly when x is finite.
    const __mmask16 f0 = _mm512_cmp_ps_mask(_mm512_sub_ps(a0, a0), _mm512_setzero_ps(), _CMP_EQ_OQ);
    const __mmask16 f1 = _mm512_cmp_ps_mask(_mm512_sub_ps(a1, a1), _mm512_setzero_ps(), _CMP_EQ_OQ);
    if ((f0 & f1) != 0xffff) {
      quantize_block_scalar(v, o);
      continue;
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a0), _mm512_abs_ps(a1)));
    o.d = amax / 127.f;
    const __m512 id = _mm512_set1_ps(inverse_scale(amax));
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    const auto q = [&](__m512 a) {
      const __m512 r =
          _mm512_roundscale_ps(_mm512_mul_ps(a, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      return _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(r), lo), hi);
    };
    const __m512i q0 = q(a0), q1 = q(a1);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o.q), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o.q + 16), _mm512_cvtepi32_epi8(q1));
    o.s = o.d * float(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
#else
    quantize_block_scalar(v, o);
#endif
  }
}

void quantize_q8_0(const float* x, int64_t K, uint8_t* out) {
  if (K % kQBlock != 0) fail("quantize_q8_0: {} values are not a multiple of {}", K, kQBlock);
  for (int64_t b = 0; b < K / kQBlock; ++b) {
    const float* v = x + b * kQBlock;
    uint8_t* blk = out + b * 34;
    float amax = 0;
    bool finite = true;
    for (int j = 0; j < kQBlock; ++j) {
      amax = std::max(amax, std::fabs(v[j]));
      finite = finite && std::isfinite(v[j]);
    }
    const float d = finite ? amax / 127.f : std::numeric_limits<float>::quiet_NaN();
    const float id = finite ? inverse_scale(amax) : 0.f;
    const uint16_t h = f32_to_f16(d);  // NaN or, past f16's range, infinite: the loader refuses it
    blk[0] = uint8_t(h & 255);
    blk[1] = uint8_t(h >> 8);
    for (int j = 0; j < kQBlock; ++j)
      blk[2 + j] = uint8_t(int8_t(std::clamp(int32_t(std::nearbyint(v[j] * id)), -127, 127)));
  }
}

void requantize_q8_0(GgmlType t, const uint8_t* row, int64_t K, uint8_t* out) {
  thread_local std::vector<float> tmp;
  tmp.resize(size_t(K));
  dequantize(t, row, tmp.data(), K);
  quantize_q8_0(tmp.data(), K, out);
}

const char* qkernel_name(QKernel k) {
  switch (k) {
    case QKernel::Scalar:
      return "scalar";
    case QKernel::Avx2:
      return "avx2";
    case QKernel::Avx512Vnni:
      return "avx512-vnni";
    case QKernel::Avx512Vnni512:
      return "avx512-vnni-512";
  }
  return "?";
}

namespace {
// cpuid leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports does not know "f16c").
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
bool detect(QKernel k) {
  __builtin_cpu_init();
  switch (k) {
    case QKernel::Scalar:
      return true;
    case QKernel::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case QKernel::Avx512Vnni:
    case QKernel::Avx512Vnni512:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c() &&
             __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }
  return false;
}
}  // namespace

// Asked on every GEMM (check), so detected once: cpuid traps to the hypervisor in a virtual machine,
// and asking each time cost 14 us a call here, more than a decoding step's 576 x 576 GEMM itself.
bool qkernel_supported(QKernel k) {
  static const bool supported[] = {detect(QKernel::Scalar), detect(QKernel::Avx2),
                                   detect(QKernel::Avx512Vnni), detect(QKernel::Avx512Vnni512)};
  return supported[int(k)];
}

QKernel best_qkernel() {
  static const QKernel k = qkernel_supported(QKernel::Avx512Vnni512) ? QKernel::Avx512Vnni512
                           : qkernel_supported(QKernel::Avx2)        ? QKernel::Avx2
                                                                     : QKernel::Scalar;
  return k;
}

std::vector<QKernel> supported_qkernels() {
  std::vector<QKernel> v;
  for (QKernel k : {QKernel::Scalar, QKernel::Avx2, QKernel::Avx512Vnni, QKernel::Avx512Vnni512})
    if (qkernel_supported(k)) v.push_back(k);
  return v;
}

bool qgemm_supports(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0:
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

namespace {
// Fewer rows than this run the 256-bit tiles under the 512-bit (where the part is not packed at
// load) and AVX2 kernels. Packing per call does not pay at 8 rows: BM_QGemm Q4_1 8 x 576 x 3072
// took 0.19 ms packing per call, 0.14-0.22 ms in the tiles (2026-11-26, AMD EPYC); packed at load,
// 0.06-0.08 ms (BM_QGemmPacked).
constexpr int64_t kPanelMinRows = 16;
void check(QKernel k, GgmlType t) {
  if (!qgemm_supports(t)) fail("the integer GEMM does not multiply {} weights", type_info(uint32_t(t))->name);
  if (!qkernel_supported(k)) fail("this CPU cannot run the {} integer kernel", qkernel_name(k));
}
}  // namespace

float qdot(QKernel k, GgmlType t, const void* w_row, const QActBlock* a, int64_t nblocks) {
  check(k, t);
  const auto* w = static_cast<const uint8_t*>(w_row);
  switch (k) {
    case QKernel::Avx2:
      return avx2::dot(t, w, a, nblocks);
    case QKernel::Avx512Vnni:
    case QKernel::Avx512Vnni512:  // one row: the 256-bit tiles (see qgemm)
      return vnni::dot(t, w, a, nblocks);
    case QKernel::Scalar:
      break;
  }
  return dot_scalar(t, w, a, nblocks);
}

namespace {
// One part's outputs from the quantized rows q [M][nb] (C already offset to its first column).
void run_part(CpuContext& ctx, QKernel k, const QPart& part, const QActBlock* q, int64_t M, int64_t nb,
              float* C, int64_t ldc) {
  const GgmlType t = part.type;
  const uint8_t* w = part.data;
  const int64_t N = part.rows, row_bytes = *type_bytes(t, nb * kQBlock);
  const bool v512 = k == QKernel::Avx512Vnni512;
  if (k == QKernel::Avx512Vnni512 || k == QKernel::Avx2) {
    // -offset x each activation block's sum, for the types these kernels multiply unsigned.
    const int64_t S = n_scales(t);
    const int off = v512 ? vnni512::offset(t) : avx2p::offset(t);
    thread_local std::vector<int32_t> bias;
    bias.resize(size_t(M * nb * S));
    int32_t* bs = bias.data();
    if (v512 && part.packed) {
      const QPacked& P = *part.packed;
      if (P.type != t || P.N != N || P.nb != nb) fail("qgemm: a packed part does not match its blocks");
      if (off != 0)
        for (int64_t m = 0; m < M; ++m) activation_bias(t, off, q + m * nb, nb, bs + m * nb * S);
      ctx.run([&] {
        tbb::parallel_for(int64_t(0), (N + vnni512::kPanel - 1) / vnni512::kPanel, [&](int64_t p) {
          vnni512::run_packed(P, p, q, bs, M, M >= kPanelMinRows, C, ldc);
        });
      });
      return;
    }
    if (M < kPanelMinRows) {
      if (off != 0 || S > 1)  // the decoding tiles read Q6_K's per half, offset or not
        for (int64_t m = 0; m < M; ++m) activation_bias(t, off, q + m * nb, nb, bs + m * nb * S);
      ctx.run([&] {
        tbb::parallel_for(int64_t(0), (N + gemv::kOut - 1) / gemv::kOut, [&](int64_t i) {
          const int64_t n0 = i * gemv::kOut;
          gemv::run(v512, t, w, row_bytes, q, bs, nb, M, N, n0, int(std::min<int64_t>(gemv::kOut, N - n0)), C,
                    ldc);
        });
      });
      return;
    }
    const int64_t width = v512 ? vnni512::kPanel : avx2p::kPanel;
    ctx.run([&] {
      if (off != 0)
        tbb::parallel_for(int64_t(0), M,
                          [&](int64_t m) { activation_bias(t, off, q + m * nb, nb, bs + m * nb * S); });
      // One task per panel of outputs, each over every row.
      tbb::parallel_for(int64_t(0), (N + width - 1) / width, [&](int64_t p) {
        const int64_t n0 = p * width;
        const int cnt = int(std::min(width, N - n0));
        if (v512)
          vnni512::run_panel(t, w, row_bytes, q, bs, nb, M, n0, cnt, C, ldc);
        else
          avx2p::run_panel(t, w, row_bytes, q, bs, nb, M, n0, cnt, C, ldc);
      });
    });
    return;
  }
  ctx.run([&] {
    // Chunks of 64 rows x 64 outputs: a chunk's weight and activation rows stay in L2.
    tbb::parallel_for(tbb::blocked_range2d<int64_t>(0, M, 64, 0, N, 64),
                      [&](const tbb::blocked_range2d<int64_t>& r) {
                        const int64_t m0 = r.rows().begin(), m1 = r.rows().end(), n0 = r.cols().begin(),
                                      n1 = r.cols().end();
                        if (k == QKernel::Avx512Vnni)
                          return vnni::run(t, w, row_bytes, q, nb, m0, m1, n0, n1, C, ldc);
                        for (int64_t m = m0; m < m1; ++m)
                          for (int64_t n = n0; n < n1; ++n)
                            C[m * ldc + n] = dot_scalar(t, w + n * row_bytes, q + m * nb, nb);
                      });
  });
}
}  // namespace

std::shared_ptr<const QPacked> qpack(CpuContext& ctx, GgmlType t, const uint8_t* W, int64_t N, int64_t K) {
  if (!qkernel_supported(QKernel::Avx512Vnni512) || !vnni512::packs(t) || K % kQBlock != 0 || N <= 0)
    return {};
  using vnni512::kLanes, vnni512::kNV, vnni512::kPanel;
  auto P = std::make_shared<QPacked>();
  const bool nibbles = t != GgmlType::Q8_0;
  const int groups = nibbles ? 4 : 8, off = unsigned_offset(t);
  const int64_t nb = K / kQBlock, panels = (N + kPanel - 1) / kPanel, row_bytes = *type_bytes(t, K);
  P->type = t, P->N = N, P->nb = nb, P->panel_bytes = nb * kNV * groups * 64;
  P->w.resize(panels * P->panel_bytes);
  P->d.resize(panels * nb * kPanel);
  if (block_has_min(t)) P->m.resize(panels * nb * kPanel);
  ctx.run([&] {
    tbb::parallel_for(int64_t(0), panels, [&](int64_t p) {
      uint8_t* pw = P->w.data() + p * P->panel_bytes;
      for (int64_t n = p * kPanel; n < std::min(N, (p + 1) * kPanel); ++n) {
        const int j = int(n % kPanel) / kLanes, lane = int(n % kLanes);
        const uint8_t* row = W + n * row_bytes;
        for (int64_t b = 0; b < nb; ++b) {
          int8_t v[kQBlock];
          decode_scalar(t, row, b, v);
          uint8_t u[kQBlock];  // the unsigned form vpdpbusd multiplies
          for (int e = 0; e < kQBlock; ++e) u[e] = uint8_t(v[e] + off);
          // Group g is elements 4g..4g+3; with nibbles, groups 2q and 2q + 1 share byte q's halves.
          for (int g = 0; g < 8; ++g)
            for (int i = 0; i < 4; ++i) {
              uint8_t* at = pw + ((b * kNV + j) * groups + (nibbles ? g / 2 : g)) * 64 + lane * 4 + i;
              *at |= uint8_t(nibbles && g % 2 ? u[4 * g + i] << 4 : u[4 * g + i]);
            }
          const uint8_t* blk = row + b * block_bytes(t);
          const int64_t at = (p * nb + b) * kPanel + j * kLanes + lane;
          P->d[at] = load_u16(blk);
          if (block_has_min(t)) P->m[at] = load_u16(blk + 2);
        }
      }
    });
  });
  return P;
}

int64_t qpacked_bytes(const QPacked& p) {
  return p.w.size() + 2 * (p.d.size() + p.m.size());
}

void qgemm(CpuContext& ctx, QKernel k, const float* A, int64_t M, int64_t lda, std::span<const QPart> parts,
           int64_t K, float* C, int64_t ldc) {
  for (const QPart& p : parts) {
    check(k, p.type);
    if (!type_bytes(p.type, K))
      fail("qgemm: K = {} is not a whole number of {} blocks", K, type_info(uint32_t(p.type))->name);
  }
  if (M == 0 || parts.empty()) return;
  // The rows are quantized once for every part.
  const int64_t nb = K / kQBlock;
  thread_local std::vector<QActBlock> qa;
  qa.resize(size_t(M * nb));
  QActBlock* q = qa.data();
  if (M < kPanelMinRows)
    for (int64_t m = 0; m < M; ++m)
      quantize_activations(A + m * lda, K, q + m * nb);  // not worth a task each
  else
    ctx.run([&] {
      tbb::parallel_for(int64_t(0), M, [&](int64_t m) { quantize_activations(A + m * lda, K, q + m * nb); });
    });
  int64_t n0 = 0;
  for (const QPart& p : parts) {
    if (p.rows > 0) run_part(ctx, k, p, q, M, nb, C + n0, ldc);
    n0 += p.rows;
  }
}

void qgemm(CpuContext& ctx, QKernel k, GgmlType t, const float* A, int64_t M, int64_t lda, const void* W,
           int64_t N, int64_t K, float* C, int64_t ldc) {
  const QPart part{t, N, static_cast<const uint8_t*>(W)};
  qgemm(ctx, k, A, M, lda, {&part, 1}, K, C, ldc);
}

}  // namespace lp
