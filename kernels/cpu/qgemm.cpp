#include "kernels/cpu/qgemm.h"

#include <cpuid.h>
#include <immintrin.h>
#include <tbb/blocked_range2d.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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

// The fixed reduction of the 8 lane accumulators: (l, l + 4), then (l, l + 2), then (0, 1).
float reduce8_scalar(const float* a) {
  float s4[4], s2[2];
  for (int i = 0; i < 4; ++i) s4[i] = a[i] + a[i + 4];
  for (int i = 0; i < 2; ++i) s2[i] = s4[i] + s4[i + 2];
  return s2[0] + s2[1];
}

float dot_scalar(GgmlType t, const uint8_t* w_row, const QActBlock* a, int64_t nb) {
  float acc[8] = {}, corr = 0;
  int8_t w[kQBlock];
  for (int64_t b = 0; b < nb; ++b) {
    decode_scalar(t, w_row, b, w);
    const BlockScale bs = block_scale(t, w_row, b, f16_to_f32);
    const float scale[2] = {bs.d[0] * a[b].d, bs.d[1] * a[b].d};
    for (int l = 0; l < 8; ++l) {
      int32_t s = 0;
      for (int j = 4 * l; j < 4 * l + 4; ++j) s += int32_t(w[j]) * int32_t(a[b].q[j]);
      acc[l] = std::fma(float(s), scale[l >> 2], acc[l]);
    }
    if (block_has_min(t)) corr = std::fma(bs.m, a[b].s, corr);
  }
  return reduce8_scalar(acc) + corr;
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
LP_QTARGET inline float reduce8(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
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
LP_QTARGET inline float reduce8(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
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

// ---- AVX-512 VNNI, 512-bit: two outputs per vector ----
// A zmm holds the same block b of two weight rows (outputs n, n + 1: lanes 0-7 and 8-15) and
// the activation block twice, so each 256-bit half is exactly the 256-bit kernel's arithmetic for
// its output (same lanes, same block order, same reduction): bitwise the scalar twin still, at
// half the instructions per product. CPUs with two 512-bit ports (Intel Xeons from Ice Lake on)
// run it twice as fast as 256-bit; Zen 4 splits it in two halves.
namespace vnni512 {
namespace {
#define LP_QTARGET LP_TARGET_VNNI
LP_QTARGET inline __m512i pair(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
LP_QTARGET inline __m512 pair(__m256 lo, __m256 hi) {
  return _mm512_castpd_ps(
      _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}
template <GgmlType T>
LP_QTARGET inline BlockScale scales(const uint8_t* row, int64_t b) {
  return vnni::scales<T>(row, b);
}
// Output n's scale vector for block b from the chunk's converted scales (lanes 0-3 and 4-7).
template <int S>
LP_QTARGET inline __m256 scale8(const float* scl, int64_t nb, int n, int64_t b) {
  if constexpr (S == 2)
    return _mm256_set_m128(_mm_set1_ps(scl[(n * nb + b) * 2 + 1]), _mm_set1_ps(scl[(n * nb + b) * 2]));
  else
    return _mm256_set1_ps(scl[n * nb + b]);
}
template <GgmlType T, int MR, int NR>
LP_QTARGET inline void tile(const uint8_t* W, int64_t row_bytes, int64_t n0, const float* scl,
                            const QActBlock* qa, int64_t nb, int64_t m0, float* C, int64_t ldc) {
  if constexpr (NR % 2 != 0) {
    vnni::tile<T, MR, NR>(W, row_bytes, n0, scl, qa, nb, m0, C, ldc);
  } else {
    constexpr bool kSigned = is_signed(T);
    constexpr int P = NR / 2;
    __m512 acc[MR][P];
    for (int m = 0; m < MR; ++m)
      for (int p = 0; p < P; ++p) acc[m][p] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m512i w[P], start[P];
      __m512 dw[P];
      for (int p = 0; p < P; ++p) {
        w[p] = pair(vnni::load_w<T>(W + (n0 + 2 * p) * row_bytes, b),
                    vnni::load_w<T>(W + (n0 + 2 * p + 1) * row_bytes, b));
        // Signed weights: the activations go in as q + 128, the lanes start at -128 * sum(w).
        start[p] = kSigned ? _mm512_sub_epi32(_mm512_setzero_si512(),
                                              _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                                                  _mm512_set1_epi8(char(0x80)), w[p]))
                           : _mm512_setzero_si512();
        dw[p] = pair(scale8<n_scales(T)>(scl, nb, 2 * p, b), scale8<n_scales(T)>(scl, nb, 2 * p + 1, b));
      }
      for (int m = 0; m < MR; ++m) {
        const QActBlock& a = qa[(m0 + m) * nb + b];
        __m512i av = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q)));
        if (kSigned) av = _mm512_xor_si512(av, _mm512_set1_epi8(char(0x80)));
        const __m512 da = _mm512_set1_ps(a.d);
        for (int p = 0; p < P; ++p) {
          const __m512i s =
              kSigned ? _mm512_dpbusd_epi32(start[p], av, w[p]) : _mm512_dpbusd_epi32(start[p], w[p], av);
          acc[m][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[p], da), acc[m][p]);
        }
      }
    }
    for (int m = 0; m < MR; ++m)
      for (int p = 0; p < P; ++p) {
        const __m256 lo = _mm512_castps512_ps256(acc[m][p]);
        const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[m][p]), 1));
        C[(m0 + m) * ldc + n0 + 2 * p] = vnni::reduce8(lo);
        C[(m0 + m) * ldc + n0 + 2 * p + 1] = vnni::reduce8(hi);
      }
  }
}
// 32 zmm registers: 8 rows x 4 outputs (2 pairs) hold 16 accumulators, 2 weight pairs with their
// starts and scales.
constexpr int kMR = 8, kNR = 4, kMR1 = 8, kNR1 = 4;
#include "kernels/cpu/qgemm_rows.inc"
#undef LP_QTARGET
}  // namespace
}  // namespace vnni512

void quantize_activations(const float* x, int64_t K, QActBlock* out) {
  if (K % kQBlock != 0) fail("quantize_activations: {} values are not a multiple of {}", K, kQBlock);
  for (int64_t b = 0; b < K / kQBlock; ++b) {
    const float* v = x + b * kQBlock;
    float amax = 0;
    bool finite = true;
    for (int j = 0; j < kQBlock; ++j) {
      amax = std::max(amax, std::fabs(v[j]));
      finite = finite && std::isfinite(v[j]);
    }
    QActBlock& o = out[b];
    if (!finite) {  // NaN out, as the f32 product would give (never a cast of NaN to int)
      o.d = o.s = std::numeric_limits<float>::quiet_NaN();
      std::fill(o.q, o.q + kQBlock, int8_t(0));
      continue;
    }
    o.d = amax / 127.f;
    const float id = amax > 0 ? 127.f / amax : 0.f;
    int32_t sum = 0;
    for (int j = 0; j < kQBlock; ++j) {
      const int32_t q = int32_t(std::nearbyint(v[j] * id));
      o.q[j] = int8_t(std::clamp(q, -127, 127));
      sum += o.q[j];
    }
    o.s = o.d * float(sum);
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
    const float id = finite && amax > 0 ? 127.f / amax : 0.f;
    const uint16_t h = f32_to_f16(d);  // NaN or, past f16's range, infinite: the loader refuses it
    blk[0] = uint8_t(h & 255);
    blk[1] = uint8_t(h >> 8);
    for (int j = 0; j < kQBlock; ++j)
      blk[2 + j] = uint8_t(int8_t(std::clamp(int32_t(std::nearbyint(v[j] * id)), -127, 127)));
  }
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
}  // namespace

bool qkernel_supported(QKernel k) {
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
      return vnni::dot(t, w, a, nblocks);
    case QKernel::Avx512Vnni512:
      return vnni512::dot(t, w, a, nblocks);
    case QKernel::Scalar:
      break;
  }
  return dot_scalar(t, w, a, nblocks);
}

void qgemm(CpuContext& ctx, QKernel k, GgmlType t, const float* A, int64_t M, int64_t lda, const void* W,
           int64_t N, int64_t K, float* C, int64_t ldc) {
  check(k, t);
  const auto row = type_bytes(t, K);
  if (!row) fail("qgemm: K = {} is not a whole number of {} blocks", K, type_info(uint32_t(t))->name);
  if (M == 0 || N == 0) return;
  const int64_t nb = K / kQBlock, row_bytes = *row;
  const auto* w = static_cast<const uint8_t*>(W);
  thread_local std::vector<QActBlock> qa;
  qa.resize(size_t(M * nb));
  QActBlock* q = qa.data();
  ctx.run([&] {
    tbb::parallel_for(int64_t(0), M, [&](int64_t m) { quantize_activations(A + m * lda, K, q + m * nb); });
    // Chunks of 64 rows x 64 outputs: a chunk's weight and activation rows stay in L2.
    tbb::parallel_for(tbb::blocked_range2d<int64_t>(0, M, 64, 0, N, 64),
                      [&](const tbb::blocked_range2d<int64_t>& r) {
                        const int64_t m0 = r.rows().begin(), m1 = r.rows().end(), n0 = r.cols().begin(),
                                      n1 = r.cols().end();
                        switch (k) {
                          case QKernel::Avx512Vnni512:
                            return vnni512::run(t, w, row_bytes, q, nb, m0, m1, n0, n1, C, ldc);
                          case QKernel::Avx512Vnni:
                            return vnni::run(t, w, row_bytes, q, nb, m0, m1, n0, n1, C, ldc);
                          case QKernel::Avx2:
                            return avx2::run(t, w, row_bytes, q, nb, m0, m1, n0, n1, C, ldc);
                          case QKernel::Scalar:
                            for (int64_t m = m0; m < m1; ++m)
                              for (int64_t n = n0; n < n1; ++n)
                                C[m * ldc + n] = dot_scalar(t, w + n * row_bytes, q + m * nb, nb);
                        }
                      });
  });
}

}  // namespace lp
