// The integer GEMM's AVX2 kernels (qgemm_kernels.h): vpmaddubsw (u8 x s8 -> pairs of s16) then
// vpmaddwd with ones (-> 8 s32 lanes, each the sum of 4 products). Everything from the target
// region on is compiled for AVX2 + FMA + F16C whatever the build's -march; everything before it
// (the standard library, the block formats) for the build's own target, so that no code the linker
// might share with another file takes this one's instructions.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/qgemm_blocks.h"
#include "kernels/cpu/qgemm_kernels.h"
#include "kernels/cpu/simd.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include "kernels/cpu/qgemm_ymm.h"

namespace lp::qk::avx2 {
namespace {

// The 256-bit tile's products: |w| x (a with w's sign) for signed weights, w x a for Q4_1's
// unsigned nibbles, then pairs of s16 summed into s32 lanes. 16 ymm registers: 4 x 2 tiles (8
// accumulators) keep the weights' vectors in registers too (2 x 4 and 4 x 4 ran 1.4-2.4x slower,
// 2 x 2 1.4x; BM_QGemm Q8_0 512 x 576 x 3072, 2026-11-24).
struct Dot {
  static constexpr int kMR = 4, kNR = 2, kMR1 = 4, kNR1 = 2;
  struct WPrep {
    __m256i w, absw;
  };
  template <bool Signed>
  static WPrep prep_w(__m256i w) {
    return {w, Signed ? _mm256_abs_epi8(w) : w};
  }
  struct APrep {
    __m256i a;
  };
  template <bool Signed>
  static APrep prep_a(const QActBlock& a) {
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q))};
  }
  // Lane l: the sum of w_j a_j over bytes 4l..4l+3 (|w| <= 128, |a| <= 127: no pair saturates).
  template <bool Signed>
  static __m256i isum(const WPrep& w, const APrep& a) {
    const __m256i p =
        Signed ? _mm256_maddubs_epi16(w.absw, _mm256_sign_epi8(a.a, w.w)) : _mm256_maddubs_epi16(w.w, a.a);
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
  }
};

// ---- Panels: 8 outputs across a ymm's lanes ----
// The 512-bit kernel's panel order on AVX2 (no vpdpbusd): vpmaddubsw (u8 x s8 -> pairs of s16)
// then vpmaddwd with ones give each lane the sum of its 4 products, as one vpdpbusd does, and a
// block's exact sums are again in the lanes with no reduction. Q4_0, Q5_0 and Q6_K carry their
// offset as there (pair sums at most 2 x 63 x 127); Q8_0 cannot (2 x 255 x 127 would saturate), so
// its panel holds the signed weights and their absolute values and multiplies |w| by the
// activations with w's sign, as the 256-bit tiles do.
// 2 rows x 2 vectors: 4 f32 accumulators, 4 integer block sums, 2 weight vectors (4 for Q8_0) and
// the broadcast activations in the 16 ymm registers.
constexpr int kMR = 2;
constexpr int offset_of(GgmlType t) {
  return t == GgmlType::Q8_0 ? 0 : unsigned_offset(t);
}
// Outputs n0..n0 + cnt into a panel (panel_scratch's layout); lanes past the outputs are zero.
template <GgmlType T>
void pack(const uint8_t* W, int64_t row_bytes, int64_t n0, int cnt, int64_t nb, const Scratchpad& p) {
  constexpr int S = n_scales(T);
  const int64_t plane = nb * kNV * 8 * 32;
  const ScratchSize size = panel_scratch(T, nb);
  std::memset(p.w, 0, size_t(size.weight_bytes));
  std::fill_n(p.d, size.scales, 0.f);
  if constexpr (block_has_min(T)) std::fill_n(p.mins, size.mins, 0.f);
  uint8_t* pw = p.w;
  alignas(32) uint8_t u[32], a[32];
  for (int n = 0; n < cnt; ++n) {
    const int j = n / kLanes, lane = n % kLanes;
    const uint8_t* row = W + (n0 + n) * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i v = load_u<T, offset_of(T)>(row, b);
      _mm256_store_si256(reinterpret_cast<__m256i*>(u), v);
      if constexpr (T == GgmlType::Q8_0)
        _mm256_store_si256(reinterpret_cast<__m256i*>(a), _mm256_abs_epi8(v));
      for (int g = 0; g < 8; ++g) {
        uint8_t* dst = pw + ((b * kNV + j) * 8 + g) * 32 + lane * 4;
        std::memcpy(dst, u + 4 * g, 4);
        if constexpr (T == GgmlType::Q8_0) std::memcpy(dst + plane, a + 4 * g, 4);
      }
      if constexpr (is_kquant(T)) {
        const KScale ks = kblock_scale(T, row, b);
        auto* isc = reinterpret_cast<int32_t*>(p.d);
        for (int h = 0; h < S; ++h) isc[((b * S + h) * kNV + j) * kLanes + lane] = ks.sc[h];
        if constexpr (block_has_min(T))
          reinterpret_cast<int32_t*>(p.mins)[(b * kNV + j) * kLanes + lane] = ks.mn;
        if (b % 8 == 0) {
          const SuperScale ss = super_scale(T, row, b / 8, [](uint16_t h) { return _cvtsh_ss(h); });
          float* ps = p.d + nb * S * kPanel + (b / 8) * 2 * kPanel;
          ps[j * kLanes + lane] = ss.d;
          ps[kPanel + j * kLanes + lane] = ss.dmin;
        }
        continue;
      }
      const BlockScale bs = scales<T>(row, b);
      for (int h = 0; h < S; ++h) p.d[((b * S + h) * kNV + j) * kLanes + lane] = bs.d[h];
      if constexpr (block_has_min(T)) p.mins[(b * kNV + j) * kLanes + lane] = bs.m;
    }
  }
}
// The largest weight a panel multiplies as unsigned: 4, 5 or 6 bits, or Q8_0's magnitudes (up to
// 128, its -128 included).
constexpr int max_weight(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0:
      return 128;
    case GgmlType::Q6_K:
      return 63;
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q5_K:
      return 31;
    default:
      return 15;
  }
}
// How many groups' vpmaddubsw pairs add up in 16 bits before vpmaddwd widens them: each pair is at
// most 2 x 127 x the largest weight (activations are within +-127), and the sum of G of them must
// stay within 32767: 8 for 4-bit weights, 4 for 5-bit, 2 for Q6_K, 1 for Q8_0. Each divides a
// scale's groups (8, Q6_K's 4).
constexpr int groups16(GgmlType t) {
  const int g = 32767 / (2 * 127 * max_weight(t));
  return g >= 8 ? 8 : g >= 4 ? 4 : g >= 2 ? 2 : 1;
}
static_assert(groups16(GgmlType::Q4_K) == 8 && groups16(GgmlType::Q5_0) == 4 &&
              groups16(GgmlType::Q5_K) == 4 && groups16(GgmlType::Q6_K) == 2 &&
              groups16(GgmlType::Q8_0) == 1);
// Group g0 + k's vpmaddubsw pairs `p` into the 16-bit running sum of groups g0..g0 + groups16(T) - 1
// (k == 0 starts it). Chains of 4 and more are kept opaque to the compiler: GCC otherwise
// reassociates them into a tree, every product live at once and spilled to the stack; ordered, the
// 2 x 2 tiles over Q4_K took 35 ms for 512 x 4096 -> 4096 against 51 (ONEDNN_MAX_CPU_ISA=AVX2
// BM_QGemmPacked/1/12/512/4096/4096, Zen 5, 2026-11-30) and 8 decoding rows 0.68 against 0.81-0.84;
// Q6_K's chain of two measured slower ordered (43 -> 56 ms).
template <GgmlType T>
inline void add_pairs(__m256i& sum, __m256i p, int k) {
  if (k == 0) {
    sum = p;
    return;
  }
  sum = _mm256_add_epi16(sum, p);
  if constexpr (groups16(T) >= 4) asm("" : "+x"(sum));
}
// Block b's (Q6_K: half h's) exact sums for rows m0..m0+MR over a panel's kNV vectors: each lane
// starts at bias's -offset x sum(a) and adds a vpmaddubsw per group of 4 weights (Q8_0: its
// magnitudes, in the plane after the bytes, times the activations given the weights' signs), the
// pairs of groups16 groups added in 16 bits before one vpmaddwd widens them.
template <GgmlType T, int MR>
inline void block_sums(const uint8_t* pw, int64_t plane, const QActBlock* qa, const int32_t* bias, int64_t nb,
                       int64_t m0, int64_t b, int h, __m256i (&s)[MR][kNV]) {
  constexpr int S = n_scales(T), G = 8 / S, G16 = groups16(T);
  constexpr bool kQ8 = T == GgmlType::Q8_0;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int m = 0; m < MR; ++m) {
    const __m256i start =
        offset_of(T) != 0 ? _mm256_set1_epi32(bias[((m0 + m) * nb + b) * S + h]) : _mm256_setzero_si256();
    for (int j = 0; j < kNV; ++j) s[m][j] = start;
  }
#pragma GCC unroll 8
  for (int g0 = h * G; g0 < (h + 1) * G; g0 += G16) {
    __m256i pairs[MR][kNV];
#pragma GCC unroll 8
    for (int g = g0; g < g0 + G16; ++g) {
      __m256i w[kNV];
      for (int j = 0; j < kNV; ++j)
        w[j] = _mm256_load_si256(reinterpret_cast<const __m256i*>(pw + ((b * kNV + j) * 8 + g) * 32));
      for (int m = 0; m < MR; ++m) {
        const __m256i a = _mm256_set1_epi32(load_i32(qa[(m0 + m) * nb + b].q + 4 * g));
        for (int j = 0; j < kNV; ++j) {
          __m256i p;
          if constexpr (kQ8)
            p = _mm256_maddubs_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(
                                         pw + plane + ((b * kNV + j) * 8 + g) * 32)),
                                     _mm256_sign_epi8(a, w[j]));
          else
            p = _mm256_maddubs_epi16(w[j], a);
          add_pairs<T>(pairs[m][j], p, g - g0);
        }
      }
    }
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < kNV; ++j) s[m][j] = _mm256_add_epi32(s[m][j], _mm256_madd_epi16(pairs[m][j], ones));
  }
}
template <GgmlType T, int MR>
inline void tile(const uint8_t* pw, int64_t plane, const float* pd, const float* pm, const QActBlock* qa,
                 const int32_t* bias, int64_t nb, int64_t m0, float* C, int64_t ldc,
                 const __m256i (&k)[kNV]) {
  constexpr int S = n_scales(T);
  __m256 acc[MR][kNV];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < kNV; ++j) acc[m][j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int h = 0; h < S; ++h) {
      __m256i s[MR][kNV];
      block_sums<T, MR>(pw, plane, qa, bias, nb, m0, b, h, s);
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
// The same for a K-quant (qgemm.h): per super-block the blocks' exact sums times their multipliers
// into fsum (f32 multiply-adds in block order), the minima's mn x sum(q) into msum (vpmaddwd: both
// fit 16 bits), then its
// f32 steps (pd: the multipliers as int32, then the super-blocks' d and dmin).
template <GgmlType T, int MR>
inline void tile_k(const uint8_t* pw, const float* pd, const float* pm, const QActBlock* qa,
                   const int32_t* bias, int64_t nb, int64_t m0, float* C, int64_t ldc,
                   const __m256i (&k)[kNV]) {
  constexpr int S = n_scales(T);
  const auto* isc = reinterpret_cast<const int32_t*>(pd);
  const auto* imn = reinterpret_cast<const int32_t*>(pm);
  const float* sup = pd + nb * S * kPanel;
  __m256 acc[MR][kNV];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < kNV; ++j) acc[m][j] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    __m256 fsum[MR][kNV];
    __m256i msum[MR][kNV];
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < kNV; ++j) fsum[m][j] = _mm256_setzero_ps(), msum[m][j] = _mm256_setzero_si256();
    for (int64_t b = 8 * sb; b < 8 * sb + 8; ++b) {
      for (int h = 0; h < S; ++h) {
        __m256i s[MR][kNV];
        block_sums<T, MR>(pw, 0, qa, bias, nb, m0, b, h, s);
        for (int j = 0; j < kNV; ++j) {
          const __m256 sc = _mm256_cvtepi32_ps(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(isc + ((b * S + h) * kNV + j) * kLanes)));
          for (int m = 0; m < MR; ++m)
            fsum[m][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[m][j]), sc, fsum[m][j]);
        }
      }
      if constexpr (block_has_min(T))
        for (int j = 0; j < kNV; ++j) {
          const __m256i mn =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(imn + (b * kNV + j) * kLanes));
          for (int m = 0; m < MR; ++m)
            msum[m][j] = _mm256_add_epi32(
                msum[m][j],
                _mm256_madd_epi16(mn, _mm256_set1_epi32(int(uint16_t(qa[(m0 + m) * nb + b].sum)))));
        }
    }
    for (int j = 0; j < kNV; ++j) {
      const __m256 d = _mm256_loadu_ps(sup + sb * 2 * kPanel + j * kLanes);
      const __m256 dmin = _mm256_loadu_ps(sup + sb * 2 * kPanel + kPanel + j * kLanes);
      for (int m = 0; m < MR; ++m) {
        const __m256 da = _mm256_set1_ps(qa[(m0 + m) * nb + 8 * sb].d);
        acc[m][j] = _mm256_fmadd_ps(fsum[m][j], _mm256_mul_ps(d, da), acc[m][j]);
        if constexpr (block_has_min(T))
          acc[m][j] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum[m][j]), _mm256_mul_ps(dmin, da), acc[m][j]);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < kNV; ++j) _mm256_maskstore_ps(C + (m0 + m) * ldc + j * kLanes, k[j], acc[m][j]);
}
// Every row over a panel in the scratch (panel_scratch's layout) of cnt outputs at C.
template <GgmlType T>
void multiply_rows(const Scratchpad& p, const QActBlock* qa, const int32_t* bias, int64_t nb, int64_t M,
                   int cnt, float* C, int64_t ldc) {
  __m256i k[kNV];
  for (int j = 0; j < kNV; ++j)
    k[j] = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt - j * kLanes), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const int64_t plane = nb * kNV * 8 * 32;
  const float* pm = block_has_min(T) ? p.mins : nullptr;
  for (int64_t m = 0; m < M; m += kMR)
    simd::with_rows<kMR>(int(M - m), [&](auto mr) {
      if constexpr (is_kquant(T))
        tile_k<T, decltype(mr)::value>(p.w, p.d, pm, qa, bias, nb, m, C, ldc, k);
      else
        tile<T, decltype(mr)::value>(p.w, plane, p.d, pm, qa, bias, nb, m, C, ldc, k);
    });
}
template <GgmlType T>
void multiply_panel(const uint8_t* W, int64_t row_bytes, const QActBlock* qa, const int32_t* bias, int64_t nb,
                    int64_t M, int64_t n0, int cnt, float* C, int64_t ldc, const Scratchpad& p) {
  pack<T>(W, row_bytes, n0, cnt, nb, p);
  multiply_rows<T>(p, qa, bias, nb, M, cnt, C + n0, ldc);
}

// ---- qpack's panels, 8 lanes at a time ----
// A packed panel is the 512-bit kernel's (QPacked, qgemm_kernels.h): 32 outputs as two vectors of 16
// lanes. Here each vector is two ymm halves, quarter q = 2j + half holding outputs 8q..8q + 7, and
// every value is read as PackedPanel reads it (nibbles and high planes joined into bytes, f16
// scales and byte multipliers widened exactly), so the results are the per-call panels' bits.
template <GgmlType T>
struct PackedQuarters {
  static constexpr GgmlType kType = T;
  static constexpr int kL16 = avx512::kLanes, kNV16 = avx512::kNV, kP = avx512::kPanel, kQuarters = 4;
  static constexpr bool kNibbles = T != GgmlType::Q8_0, kK = is_kquant(T);
  static constexpr int kPlanes = high_planes(T);
  static constexpr KPanelLayout kL = kpanel_layout(T, kL16, kNV16);
  const uint8_t* pw;
  const uint16_t *pd, *pm;  // the simple types'
  const uint8_t* at(int64_t b) const { return pw + packed_block_offset(T, kL16, kNV16, b); }
  const uint16_t* head(int64_t sb) const { return reinterpret_cast<const uint16_t*>(pw + sb * kL.super()); }
  static __m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static __m256 f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static __m256i bytes8(const uint8_t* p, bool is_signed) {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return is_signed ? _mm256_cvtepi8_epi32(x) : _mm256_cvtepu8_epi32(x);
  }
  // Group g (elements 4g..4g + 3) of quarter q's 8 outputs in block b, as qpack's unsigned bytes.
  __m256i w(int64_t b, int q, int g) const {
    const uint8_t* blk = at(b);
    const int j = q / 2, half = (q % 2) * 32;
    if constexpr (!kNibbles) return load(blk + (j * 8 + g) * 64 + half);
    const __m256i x = load(blk + (j * 4 + g / 2) * 64 + half);
    const __m256i lo = _mm256_and_si256(g % 2 ? _mm256_srli_epi16(x, 4) : x, _mm256_set1_epi8(15));
    if constexpr (kPlanes == 1) {  // bit g of each byte: 16 more
      const __m256i h = load(blk + kL.hi + j * 64 + half), bit = _mm256_set1_epi8(char(1 << g));
      return _mm256_or_si256(
          lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit), _mm256_set1_epi8(16)));
    } else if constexpr (kPlanes == 2) {  // bits 2 (g % 4) and up of plane g / 4, as bits 4-5
      const __m256i h = load(blk + kL.hi + (j * 2 + g / 4) * 64 + half);
      const int k = g % 4;
      const __m256i sh = k == 0   ? _mm256_slli_epi16(h, 4)
                         : k == 1 ? _mm256_slli_epi16(h, 2)
                         : k == 2 ? h
                                  : _mm256_srli_epi16(h, 2);
      return _mm256_or_si256(lo, _mm256_and_si256(sh, _mm256_set1_epi8(0x30)));
    } else {
      return lo;
    }
  }
  __m256 d(int64_t b, int q) const { return f16(pd + b * kP + 8 * q); }
  __m256 m(int64_t b, int q) const { return f16(pm + b * kP + 8 * q); }
  __m256i isc(int64_t b, int h, int q) const {
    return bytes8(at(b) + kL.sc + h * kP + 8 * q, T == GgmlType::Q6_K);
  }
  __m256i imn(int64_t b, int q) const { return bytes8(at(b) + kL.mn + 8 * q, false); }
  // Blocks 8 sb + 2i and 8 sb + 2i + 1's minima multipliers as a word's 16-bit halves (QActBlock::pair's).
  __m256i imn_pair(int64_t sb, int i, int q) const {
    return _mm256_or_si256(imn(8 * sb + 2 * i, q), _mm256_slli_epi32(imn(8 * sb + 2 * i + 1, q), 16));
  }
  __m256 sd(int64_t sb, int q) const { return f16(head(sb) + 8 * q); }
  __m256 sdmin(int64_t sb, int q) const { return f16(head(sb) + kP + 8 * q); }
  // Block b + kPackedAhead's lines into L2 while block b multiplies (prefetch_packed).
  void prefetch(int64_t b) const { prefetch_packed<T>(pw, pd, b); }
};
// Rows a decoding tile over a packed panel takes together: 8 rows x 4096 -> 4096 (ONEDNN_MAX_CPU_ISA=AVX2
// BM_QGemmPacked/1/t/8/4096/4096, two runs, Zen 5, 2026-11-30) took Q5_K 1.44-1.49 ms a row at a time,
// 1.00-1.01 two at a time, 0.99-1.01 three; Q6_K 1.26-1.27, 0.90-0.91, 0.88-0.96; Q4_K and Q4_1 alike
// in all three (16 registers: two rows' sums and pairs for a quarter pair, the rest spilled to L1).
constexpr int kPackedRows = 2;
// Decoding over a packed panel (fewer rows than a panel pays for), MR rows at a time (each group's
// weights decoded once for them), quarters 2j and 2j + 1 together: block b's (Q6_K: half h's)
// exact sums in 8 lanes a quarter, then the 512-bit tile's f32 steps (the scalar twin's), per
// block or, for a K-quant, per super-block. Q8_0 is read back to signed bytes and multiplied as
// |w| x (a with w's sign), as the per-call panels do.
template <GgmlType T, int MR>
void packed_tile(const PackedQuarters<T>& src, const QActBlock* qa, const int32_t* bias, int64_t nb,
                 int64_t m0, int cnt, float* C, int64_t ldc) {
  constexpr int S = n_scales(T), G = 8 / S, G16 = groups16(T), Q = PackedQuarters<T>::kQuarters;
  constexpr bool kQ8 = T == GgmlType::Q8_0;
  const __m256i ones = _mm256_set1_epi16(1);
  const QActBlock* row[MR];
  for (int m = 0; m < MR; ++m) row[m] = qa + (m0 + m) * nb;
  __m256 acc[MR][Q], fsum[MR][Q];
  for (int m = 0; m < MR; ++m)
    for (int q = 0; q < Q; ++q) acc[m][q] = fsum[m][q] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    src.prefetch(b);
    for (int j = 0; j < 2; ++j) {
#pragma GCC unroll 2
      for (int h = 0; h < S; ++h) {
        __m256i s[MR][2];
        for (int m = 0; m < MR; ++m)
          for (int i = 0; i < 2; ++i)
            s[m][i] = offset_of(T) != 0 ? _mm256_set1_epi32(bias[((m0 + m) * nb + b) * S + h])
                                        : _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int g0 = h * G; g0 < (h + 1) * G; g0 += G16) {
          __m256i p[MR][2];
#pragma GCC unroll 8
          for (int g = g0; g < g0 + G16; ++g) {
            __m256i av[MR];
            for (int m = 0; m < MR; ++m) av[m] = _mm256_set1_epi32(load_i32(row[m][b].q + 4 * g));
            for (int i = 0; i < 2; ++i) {
              const __m256i w = src.w(b, 2 * j + i, g);
              if constexpr (kQ8) {
                const __m256i ws = _mm256_xor_si256(w, _mm256_set1_epi8(char(0x80))),
                              aw = _mm256_abs_epi8(ws);
                for (int m = 0; m < MR; ++m)
                  add_pairs<T>(p[m][i], _mm256_maddubs_epi16(aw, _mm256_sign_epi8(av[m], ws)), g - g0);
              } else {
                for (int m = 0; m < MR; ++m) add_pairs<T>(p[m][i], _mm256_maddubs_epi16(w, av[m]), g - g0);
              }
            }
          }
          for (int m = 0; m < MR; ++m)
            for (int i = 0; i < 2; ++i) s[m][i] = _mm256_add_epi32(s[m][i], _mm256_madd_epi16(p[m][i], ones));
        }
        for (int i = 0; i < 2; ++i) {
          const int q = 2 * j + i;
          if constexpr (is_kquant(T)) {
            const __m256 sc = _mm256_cvtepi32_ps(src.isc(b, h, q));
            for (int m = 0; m < MR; ++m)
              fsum[m][q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[m][i]), sc, fsum[m][q]);
          } else {
            const __m256 d = src.d(b, q);
            for (int m = 0; m < MR; ++m)
              acc[m][q] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[m][i]),
                                          _mm256_mul_ps(d, _mm256_set1_ps(row[m][b].d)), acc[m][q]);
          }
        }
      }
      if constexpr (!is_kquant(T) && block_has_min(T))
        for (int q = 2 * j; q < 2 * j + 2; ++q) {
          const __m256 mn = src.m(b, q);
          for (int m = 0; m < MR; ++m)
            acc[m][q] = _mm256_fmadd_ps(mn, _mm256_set1_ps(row[m][b].s), acc[m][q]);
        }
    }
    if constexpr (is_kquant(T)) {
      if ((b & 7) != 7) continue;
      const int64_t sb = b >> 3;
      for (int q = 0; q < Q; ++q) {
        const __m256 d = src.sd(sb, q);
        __m256 dmin = _mm256_setzero_ps();
        __m256i mn[4];
        if constexpr (block_has_min(T)) {
          dmin = src.sdmin(sb, q);
          for (int i = 0; i < 4; ++i) mn[i] = src.imn_pair(sb, i, q);
        }
        for (int m = 0; m < MR; ++m) {
          const __m256 da = _mm256_set1_ps(row[m][8 * sb].d);
          acc[m][q] = _mm256_fmadd_ps(fsum[m][q], _mm256_mul_ps(d, da), acc[m][q]);
          fsum[m][q] = _mm256_setzero_ps();
          if constexpr (block_has_min(T)) {
            __m256i msum = _mm256_setzero_si256();
            for (int i = 0; i < 4; ++i)
              msum = _mm256_add_epi32(
                  msum, _mm256_madd_epi16(mn[i], _mm256_set1_epi32(row[m][8 * sb + 2 * i].pair)));
            acc[m][q] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, da), acc[m][q]);
          }
        }
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int q = 0; q < Q; ++q) decoding::store(C + (m0 + m) * ldc + 8 * q, cnt - 8 * q, acc[m][q]);
}
template <GgmlType T>
void packed_rows(const PackedQuarters<T>& src, const QActBlock* qa, const int32_t* bias, int64_t nb,
                 int64_t M, int cnt, float* C, int64_t ldc) {
  for (int64_t m = 0; m < M; m += kPackedRows)
    simd::with_rows<kPackedRows>(
        int(M - m), [&](auto mr) { packed_tile<T, decltype(mr)::value>(src, qa, bias, nb, m, cnt, C, ldc); });
}
// Half hp of a packed panel (its vector hp: quarters 2 hp and 2 hp + 1) widened into a per-call
// panel (panel_scratch's layout), the values pack<T> would write from the blocks.
template <GgmlType T>
void widen(const PackedQuarters<T>& src, int64_t nb, int hp, const Scratchpad& p) {
  constexpr int S = n_scales(T);
  const int64_t plane = nb * kNV * 8 * 32;
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < kNV; ++j) {
      const int q = 2 * hp + j;
      for (int g = 0; g < 8; ++g) {
        uint8_t* dst = p.w + ((b * kNV + j) * 8 + g) * 32;
        const __m256i w = src.w(b, q, g);
        if constexpr (T == GgmlType::Q8_0) {
          const __m256i ws = _mm256_xor_si256(w, _mm256_set1_epi8(char(0x80)));
          _mm256_store_si256(reinterpret_cast<__m256i*>(dst), ws);
          _mm256_store_si256(reinterpret_cast<__m256i*>(dst + plane), _mm256_abs_epi8(ws));
        } else {
          _mm256_store_si256(reinterpret_cast<__m256i*>(dst), w);
        }
      }
      if constexpr (is_kquant(T)) {
        for (int h = 0; h < S; ++h)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.d + ((b * S + h) * kNV + j) * kLanes),
                              src.isc(b, h, q));
        if constexpr (block_has_min(T))
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.mins + (b * kNV + j) * kLanes), src.imn(b, q));
        if (b % 8 == 0) {
          float* ps = p.d + nb * S * kPanel + (b / 8) * 2 * kPanel;
          _mm256_storeu_ps(ps + j * kLanes, src.sd(b / 8, q));
          _mm256_storeu_ps(ps + kPanel + j * kLanes,
                           block_has_min(T) ? src.sdmin(b / 8, q) : _mm256_setzero_ps());
        }
      } else {
        _mm256_storeu_ps(p.d + (b * kNV + j) * kLanes, src.d(b, q));
        if constexpr (block_has_min(T)) _mm256_storeu_ps(p.mins + (b * kNV + j) * kLanes, src.m(b, q));
      }
    }
}
// ---- Decoding ----
// Per 128-bit chunk c: lane k = the sum of the 4 lanes of v_k's chunk c.
inline __m256i reduce4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
  const __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(v0, v1), _mm256_unpackhi_epi32(v0, v1));
  const __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(v2, v3), _mm256_unpackhi_epi32(v2, v3));
  return _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
}
// The decoding tiles for decoding::run, the 512-bit kernel's on AVX2: one ymm per output, the
// panels' arithmetic per block (Q8_0 signed, |w| x sign(a, w); the others unsigned with their
// offset); up to 4 rows at a time (16 registers: 4 accumulators beside the 8 weight vectors).
struct Decoding {
  static constexpr int kRows = 4;
  template <GgmlType T, int MR>
  static void run_tile(const uint8_t* W, int64_t row_bytes, int64_t N, int64_t n0, int cnt, const float* pd,
                       const float* pm, const QActBlock* qa, const int32_t* bias, int64_t nb, int64_t m0,
                       float* C, int64_t ldc) {
    constexpr bool kQ8 = T == GgmlType::Q8_0;
    const __m256i ones = _mm256_set1_epi16(1);
    const decoding::Tile t(W, row_bytes, N, n0, cnt, nb);
    decoding::Sums acc[MR];
    const float* sup = is_kquant(T) ? pd + nb * n_scales(T) * decoding::kOut : nullptr;  // its d and dmin
    for (int64_t b = 0; b < nb; ++b) {
      t.prefetch(b);
      const auto sc = decoding::block_scales<T>(t, b, pd, pm);
      __m256i w[decoding::kOut];
      for (int k = 0; k < decoding::kOut; ++k) w[k] = load_u<T, offset_of(T)>(t.row[k], b);
      for (int m = 0; m < MR; ++m) {
        const QActBlock& a = qa[(m0 + m) * nb + b];
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q));
        __m256i s[decoding::kOut];
        for (int k = 0; k < decoding::kOut; ++k) {
          const __m256i pairs = kQ8 ? _mm256_maddubs_epi16(_mm256_abs_epi8(w[k]), _mm256_sign_epi8(av, w[k]))
                                    : _mm256_maddubs_epi16(w[k], av);
          s[k] = _mm256_madd_epi16(pairs, ones);
        }
        const __m256i ra = reduce4(s[0], s[1], s[2], s[3]), rb = reduce4(s[4], s[5], s[6], s[7]);
        decoding::accumulate<T, offset_of(T)>(_mm256_permute2x128_si256(ra, rb, 0x20),
                                              _mm256_permute2x128_si256(ra, rb, 0x31), sc, a,
                                              bias + ((m0 + m) * nb + b) * n_scales(T), b, sup, acc[m]);
      }
    }
    for (int m = 0; m < MR; ++m) decoding::store(C + (m0 + m) * ldc + n0, cnt, acc[m].acc);
  }
};

}  // namespace

int offset(GgmlType t) {
  return offset_of(t);
}

void tiles(GgmlType t, const uint8_t* W, int64_t row_bytes, const QActBlock* qa, int64_t nb, int64_t m0,
           int64_t m1, int64_t n0, int64_t n1, float* C, int64_t ldc, const Scratchpad& s) {
  qk::tiles<Dot>(t, W, row_bytes, qa, nb, m0, m1, n0, n1, C, ldc, s);
}

void panel(GgmlType t, const uint8_t* W, int64_t row_bytes, const QActBlock* qa, const int32_t* bias,
           int64_t nb, int64_t M, int64_t n0, int cnt, float* C, int64_t ldc, const Scratchpad& s) {
  with_type(t, [&](auto type) {
    multiply_panel<decltype(type)::value>(W, row_bytes, qa, bias, nb, M, n0, cnt, C, ldc, s);
  });
}

void gemv(GgmlType t, const uint8_t* W, int64_t row_bytes, const QActBlock* qa, const int32_t* bias,
          int64_t nb, int64_t M, int64_t N, int64_t n0, int cnt, float* C, int64_t ldc, const Scratchpad& s) {
  with_type(t, [&](auto type) {
    decoding::run<Decoding, decltype(type)::value>(W, row_bytes, qa, bias, nb, M, N, n0, cnt, C, ldc, s);
  });
}

// Every row over panel p of a packed matrix: decoding reads it as packed; many rows (wide) widen
// each half once and pass over it as over a per-call panel.
void packed(const QPacked& P, int64_t p, const QActBlock* qa, const int32_t* bias, int64_t M, bool wide,
            float* C, int64_t ldc, const Scratchpad& s) {
  with_packed_panel<PackedQuarters>(P, p, [&](const auto& src, int64_t n0, int cnt) {
    constexpr GgmlType T = std::decay_t<decltype(src)>::kType;
    if (!wide) return packed_rows<T>(src, qa, bias, P.nb, M, cnt, C + n0, ldc);
    for (int hp = 0; hp * kPanel < cnt; ++hp) {
      widen<T>(src, P.nb, hp, s);
      multiply_rows<T>(s, qa, bias, P.nb, M, std::min(kPanel, cnt - hp * kPanel), C + n0 + hp * kPanel, ldc);
    }
  });
}

void unsigned_groups(GgmlType t, const uint8_t* row, int64_t b, uint32_t* groups) {
  with_type(t, [&](auto type) {
    constexpr GgmlType T = decltype(type)::value;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(groups), load_u<T, unsigned_offset(T)>(row, b));
  });
}

}  // namespace lp::qk::avx2

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
