// The integer GEMM's AVX-512 VNNI kernels (qgemm_kernels.h): vpdpbusd (u8 x s8, 4 products summed
// into each s32 lane) in 256-bit tiles, 512-bit panels and 512-bit decoding tiles, and the AMX
// tile kernel over the same panels. Everything from the target region on is compiled for AVX-512
// F/BW/VL/VNNI (with AVX2 + FMA + F16C) and AMX-TILE/INT8 whatever the build's -march; everything
// before it for the build's own target (see qgemm_avx2.cpp). The compiler never emits an AMX
// instruction of its own accord: only amx_rows' intrinsics do, and the dispatcher calls it only
// where amx_int8_usable().
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/qgemm_blocks.h"
#include "kernels/cpu/qgemm_kernels.h"
#include "kernels/cpu/simd.h"

#if defined(__clang__)
#pragma clang attribute push(                                                                        \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")
#endif

#include "kernels/cpu/qgemm_ymm.h"

namespace lp::qk::avx512 {
namespace {

// The 256-bit tile's products with vpdpbusd. 32 ymm registers with AVX-512VL: tall tiles share
// each weight block's preparation over more rows: Q8_0 512 x 576 x 3072 took 11.1 ms in 8 x 2,
// 12.7 in 6 x 2, 14.0 in 4 x 2, 16.4 in 4 x 4, 24.8 in 2 x 4; Q4_1 (a scalar minimum term per
// pair) 19.9 in 6 x 2, 21.9 in 4 x 4, 29.7 in 8 x 2 (BM_QGemm, medians of 3, 2026-11-24, AMD EPYC).
struct Dot {
  static constexpr int kMR = 8, kNR = 2, kMR1 = 8, kNR1 = 2;
  // Signed weights: vpdpbusd multiplies unsigned by signed, so the activations go in as q + 128
  // and the lanes start at -128 * (sum of their 4 weights), computed once per weight block.
  struct WPrep {
    __m256i w, start;
  };
  template <bool Signed>
  static WPrep prep_w(__m256i w) {
    if (!Signed) return {w, _mm256_setzero_si256()};
    const __m256i comp = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(char(0x80)), w);
    return {w, _mm256_sub_epi32(_mm256_setzero_si256(), comp)};
  }
  struct APrep {
    __m256i a;  // q + 128 as u8 for signed weights, q (s8) for Q4_1's unsigned nibbles
  };
  template <bool Signed>
  static APrep prep_a(const QActBlock& a) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q));
    return {Signed ? _mm256_xor_si256(q, _mm256_set1_epi8(char(0x80))) : q};
  }
  template <bool Signed>
  static __m256i isum(const WPrep& w, const APrep& a) {
    return Signed ? _mm256_dpbusd_epi32(w.start, a.a, w.w) : _mm256_dpbusd_epi32(w.start, w.w, a.a);
  }
};

// ---- 512-bit panels: outputs across the lanes ----
// The 256-bit kernels above hold one output's block in a vector and reduce its lanes per block.
// This one holds 16 outputs in the 16 lanes of a zmm: each vpdpbusd adds 4 products to each of 16
// outputs (the activations' 4 bytes broadcast from memory), and after 8 of them a block's exact
// sums are in the lanes, ready for one conversion, one multiply and one fused multiply-add per 16
// outputs. The weights of a panel of 32 outputs are copied once per GEMM into that order, as the
// unsigned bytes vpdpbusd needs (a signed type's offset, 128 for Q8_0 and 8, 16, 32 for Q4_0,
// Q5_0, Q6_K, is added to each weight and taken back as -offset x the activation block's sum, the
// lanes' starting value), and every row of the GEMM passes over the panel. Per output it is the
// scalar twin's arithmetic. Weights packed once at load (qpack, PackedPanel) run every M here;
// otherwise small M (decoding) runs the decoding tiles below (kPanelMinRows, qgemm.cpp).
// 6 rows x 2 vectors: 12 f32 accumulators, 12 integer block sums and the 2 weight vectors in the 32
// zmm registers.
constexpr int kMR = 6;
// A K-quant's tile also keeps each row's super-block sums in registers (6 rows: 36 zmm values, so
// GCC spills some, the accumulators touched once a super-block; 6 measured against 4 and 5 on
// BM_QGemmPacked/3/12/512/4096/4096, Xeon, 2026-11-29: medians 19.0 ms against 20.6 for 4).
constexpr int kMRK = 6;
constexpr int offset_of(GgmlType t) {
  return unsigned_offset(t);
}
// Outputs n0..n0 + cnt into a panel (panel_scratch's layout: weights [nb][kNV][8 groups of 4
// elements][16 lanes][4 bytes]). Lanes past the outputs are zero.
template <GgmlType T>
void pack(const uint8_t* W, int64_t row_bytes, int64_t n0, int cnt, int64_t nb, const Scratchpad& p) {
  constexpr int S = n_scales(T);
  const ScratchSize size = panel_scratch(T, nb);
  std::memset(p.w, 0, size_t(size.weight_bytes));
  std::fill_n(p.d, size.scales, 0.f);
  if constexpr (block_has_min(T)) std::fill_n(p.mins, size.mins, 0.f);
  uint8_t* pw = p.w;
  const __m256i groups = _mm256_setr_epi32(0, 64, 128, 192, 256, 320, 384, 448);
  for (int n = 0; n < cnt; ++n) {
    const int j = n / kLanes, lane = n % kLanes;
    const uint8_t* row = W + (n0 + n) * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      // The template call in parentheses: clang's intrinsic is a macro, and its comma would split it.
      _mm256_i32scatter_epi32(pw + (b * kNV + j) * 8 * 64 + lane * 4, groups,
                              (load_u<T, offset_of(T)>(row, b)), 1);
      if constexpr (is_kquant(T)) {
        const KScale ks = kblock_scale(T, row, b);
        auto* isc = reinterpret_cast<int32_t*>(p.d);
        for (int h = 0; h < S; ++h) isc[((b * S + h) * kNV + j) * kLanes + lane] = ks.sc[h];
        if constexpr (block_has_min(T)) {  // BytePanel::imn_pair's layout
          auto* mp = reinterpret_cast<uint16_t*>(p.mins);
          mp[((((b / 8) * 4 + (b % 8) / 2) * kNV + j) * kLanes + lane) * 2 + b % 2] = uint16_t(ks.mn);
        }
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
// A zeroed register by its own vpxord, which the core clears at renaming (no execution port). Left
// to itself GCC 12 zeroes one register and copies it into each block's 12 sums of a 6-row tile,
// 12 vmovdqa32 per block beside its 96 vpdpbusd.
inline __m512i zero_idiom() {
  __m512i z;
  asm volatile("vpxord %0, %0, %0" : "=v"(z));  // volatile: one per call, not one shared
  return z;
}
// A panel as the GEMM packs it per call: the weights' unsigned bytes, f32 scales and minima (a
// K-quant's: its integer multipliers, and its super-blocks' d and dmin after the scales, at ps).
struct BytePanel {
  const uint8_t* pw;
  const float *pd, *pm, *ps = nullptr;
  __m512i isc(int64_t b, int S, int h, int j) const {
    return _mm512_loadu_si512(pd + ((b * S + h) * kNV + j) * kLanes);
  }
  // Minima pairs: lane l of pair q of super-block sb holds blocks 8 sb + 2q and 8 sb + 2q + 1's as
  // two 16-bit halves (what vpdpwssd multiplies by a row's two block sums).
  __m512i imn_pair(int64_t sb, int q, int j) const {
    return _mm512_loadu_si512(pm + ((sb * 4 + q) * kNV + j) * kLanes);
  }
  __m512 sd(int64_t sb, int j) const { return _mm512_loadu_ps(ps + sb * 2 * kPanel + j * kLanes); }
  __m512 sdmin(int64_t sb, int j) const {
    return _mm512_loadu_ps(ps + sb * 2 * kPanel + kPanel + j * kLanes);
  }
  __m512i w(int64_t b, int j, int g) const { return _mm512_load_si512(pw + ((b * kNV + j) * 8 + g) * 64); }
  __m512 d(int64_t b, int S, int h, int j) const {
    return _mm512_loadu_ps(pd + ((b * S + h) * kNV + j) * kLanes);
  }
  __m512 m(int64_t b, int j) const { return _mm512_loadu_ps(pm + (b * kNV + j) * kLanes); }
  void prefetch(int64_t) const {}  // packed per call: in cache
  // Block b's 8 groups of vector j: an AMX B tile (8 rows of [16 outputs][4 bytes]).
  const uint8_t* tile(int64_t b, int j) const { return pw + (b * kNV + j) * 8 * 64; }
};
// A panel as qpack keeps it (QPacked, qgemm_kernels.h): nibbles (and Q5_K's and Q6_K's high bits
// beside them) joined into bytes in registers, the f16 scales widened there (exactly), a K-quant's
// integer multipliers widened and its super-block's d and dmin converted there, so every lane holds
// the values the per-call panel holds.
template <GgmlType T>
struct PackedPanel {
  static constexpr GgmlType kType = T;
  static constexpr bool kNibbles = T != GgmlType::Q8_0, kK = is_kquant(T);
  static constexpr int kPlanes = high_planes(T);
  static constexpr KPanelLayout kL = kpanel_layout(T, kLanes, kNV);
  const uint8_t* pw;
  const uint16_t *pd, *pm;  // the simple types'
  // Where block b's weights start (a K-quant's: in its super-block, after the head).
  const uint8_t* at(int64_t b) const { return pw + packed_block_offset(T, kLanes, kNV, b); }
  const uint16_t* head(int64_t b) const {
    return reinterpret_cast<const uint16_t*>(pw + (b >> 3) * kL.super());
  }
  __m512i w(int64_t b, int j, int g) const {
    const uint8_t* blk = at(b);
    if constexpr (!kNibbles) return _mm512_load_si512(blk + (j * 8 + g) * 64);
    const __m512i x = _mm512_load_si512(blk + (j * 4 + g / 2) * 64);
    const __m512i lo = _mm512_and_si512(g % 2 ? _mm512_srli_epi16(x, 4) : x, _mm512_set1_epi8(15));
    if constexpr (kPlanes == 1) {  // bit g of each byte: 16 more
      const __m512i h = _mm512_load_si512(blk + kL.hi + j * 64);
      return _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(h, _mm512_set1_epi8(char(1 << g))), lo,
                                  _mm512_set1_epi8(16));
    } else if constexpr (kPlanes == 2) {  // bits 2 (g % 4) and up of plane g / 4, as bits 4-5
      const __m512i h = _mm512_load_si512(blk + kL.hi + (j * 2 + g / 4) * 64);
      const int k = g % 4;
      const __m512i sh = k == 0   ? _mm512_slli_epi16(h, 4)
                         : k == 1 ? _mm512_slli_epi16(h, 2)
                         : k == 2 ? h
                                  : _mm512_srli_epi16(h, 2);
      return _mm512_or_si512(lo, _mm512_and_si512(sh, _mm512_set1_epi8(0x30)));
    } else {
      return lo;
    }
  }
  // A simple type's block scale and minimum (a K-quant's come as isc, imn_pair, sd and sdmin).
  __m512 d(int64_t b, int /*S*/, int /*h*/, int j) const {
    static_assert(!kK);
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(pd + (b * kNV + j) * kLanes)));
  }
  // A K-quant's integer multipliers of block b (half h) and its minimum's, and super-block sb's d
  // and dmin (Q6_K: none), widened exactly.
  __m512i isc(int64_t b, int /*S*/, int h, int j) const {
    const __m128i sc =
        _mm_load_si128(reinterpret_cast<const __m128i*>(at(b) + kL.sc + (h * kNV + j) * kLanes));
    return T == GgmlType::Q6_K ? _mm512_cvtepi8_epi32(sc) : _mm512_cvtepu8_epi32(sc);
  }
  __m512i imn(int64_t b, int j) const {
    return _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(at(b) + kL.mn + j * kLanes)));
  }
  __m512i imn_pair(int64_t sb, int q, int j) const {
    return _mm512_or_si512(imn(8 * sb + 2 * q, j), _mm512_slli_epi32(imn(8 * sb + 2 * q + 1, j), 16));
  }
  __m512 sd(int64_t sb, int j) const {
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(head(sb * 8) + j * kLanes)));
  }
  __m512 sdmin(int64_t sb, int j) const {
    return _mm512_cvtph_ps(
        _mm256_load_si256(reinterpret_cast<const __m256i*>(head(sb * 8) + kPanel + j * kLanes)));
  }
  __m512 m(int64_t b, int j) const {
    static_assert(!kK);
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(pm + (b * kNV + j) * kLanes)));
  }
  // Block b + kPackedAhead's lines into L2 while block b multiplies (prefetch_packed).
  void prefetch(int64_t b) const { prefetch_packed<T>(pw, pd, b); }
};
// Block b's (Q6_K: half h's) exact sums for rows m0..m0+MR over the panel's kNV vectors: each lane
// starts at bias's -offset x sum(a) and takes a vpdpbusd per group of 4 weights. Unrolled: each
// group's bits are where its index says (Q6_K's high planes); left as a loop, GCC 12 kept a branch
// per group (Q6_K decoding 0.65 -> 0.5 of the read ceiling).
template <GgmlType T, int MR, class Src>
inline void block_sums(const Src& src, const QActBlock* qa, const int32_t* bias, int64_t nb, int64_t m0,
                       int64_t b, int h, __m512i (&s)[MR][kNV]) {
  constexpr int S = n_scales(T), G = 8 / S;
  for (int m = 0; m < MR; ++m) {
    if constexpr (offset_of(T) != 0) {
      const __m512i start = _mm512_set1_epi32(bias[((m0 + m) * nb + b) * S + h]);
      for (int j = 0; j < kNV; ++j) s[m][j] = start;
    } else {
      for (int j = 0; j < kNV; ++j) s[m][j] = zero_idiom();
    }
  }
#pragma GCC unroll 8
  for (int g = h * G; g < (h + 1) * G; ++g) {
    __m512i w[kNV];
    for (int j = 0; j < kNV; ++j) w[j] = src.w(b, j, g);
    for (int m = 0; m < MR; ++m) {
      const __m512i a = _mm512_set1_epi32(load_i32(qa[(m0 + m) * nb + b].q + 4 * g));
      for (int j = 0; j < kNV; ++j) s[m][j] = _mm512_dpbusd_epi32(s[m][j], w[j], a);
    }
  }
}
// Rows m0..m0+MR of a panel's outputs (C points at its first output; k[j] masks the lanes that are
// outputs). bias: -offset x the sum of each activation block (half for Q6_K), [M][nb][S].
template <GgmlType T, int MR, class Src>
inline void tile(const Src& src, const QActBlock* qa, const int32_t* bias, int64_t nb, int64_t m0, float* C,
                 int64_t ldc, const __mmask16 (&k)[kNV]) {
  constexpr int S = n_scales(T);
  __m512 acc[MR][kNV];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < kNV; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    src.prefetch(b);
    for (int h = 0; h < S; ++h) {
      __m512i s[MR][kNV];
      block_sums<T, MR>(src, qa, bias, nb, m0, b, h, s);
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
// The same for a K-quant (qgemm.h): per super-block the blocks' exact sums (less the offset, from
// bias) times their multipliers into fsum (convert and FMA, in block order: vpmulld's two port-0 µops
// made Q4_K's prefill 1.1x slower), the minima's mn x sum(q) into msum (vpdpwssd: both fit 16 bits),
// then the super-block's f32 steps.
template <GgmlType T, int MR, class Src>
inline void tile_k(const Src& src, const QActBlock* qa, const int32_t* bias, int64_t nb, int64_t m0, float* C,
                   int64_t ldc, const __mmask16 (&k)[kNV]) {
  constexpr int S = n_scales(T);
  __m512 acc[MR][kNV];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < kNV; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    __m512 fsum[MR][kNV];
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < kNV; ++j) fsum[m][j] = _mm512_setzero_ps();
    for (int64_t b = 8 * sb; b < 8 * sb + 8; ++b) {
      src.prefetch(b);
      // Unrolled as block_sums' groups are (Q6_K's halves).
#pragma GCC unroll 2
      for (int h = 0; h < S; ++h) {
        __m512i s[MR][kNV];
        block_sums<T, MR>(src, qa, bias, nb, m0, b, h, s);
        for (int j = 0; j < kNV; ++j) {
          const __m512 sc = _mm512_cvtepi32_ps(src.isc(b, S, h, j));
          for (int m = 0; m < MR; ++m)
            fsum[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[m][j]), sc, fsum[m][j]);
        }
      }
    }
    // The minima's sum_j mn_j x sum(q_j) per row: 4 vpdpwssd, two blocks each, their activation
    // sums broadcast from memory (QActBlock::pair).
    for (int j = 0; j < kNV; ++j) {
      const __m512 d = src.sd(sb, j), dmin = block_has_min(T) ? src.sdmin(sb, j) : _mm512_setzero_ps();
      __m512i mn[4];
      if constexpr (block_has_min(T))
        for (int q = 0; q < 4; ++q) mn[q] = src.imn_pair(sb, q, j);
      for (int m = 0; m < MR; ++m) {
        const __m512 da = _mm512_set1_ps(qa[(m0 + m) * nb + 8 * sb].d);
        acc[m][j] = _mm512_fmadd_ps(fsum[m][j], _mm512_mul_ps(d, da), acc[m][j]);
        if constexpr (block_has_min(T)) {
          __m512i msum = _mm512_setzero_si512();
          for (int q = 0; q < 4; ++q)
            msum =
                _mm512_dpwssd_epi32(msum, mn[q], _mm512_set1_epi32(qa[(m0 + m) * nb + 8 * sb + 2 * q].pair));
          acc[m][j] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, da), acc[m][j]);
        }
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < kNV; ++j) _mm512_mask_storeu_ps(C + (m0 + m) * ldc + j * kLanes, k[j], acc[m][j]);
}
// Every row over one panel of cnt outputs (<= kPanel) at C.
template <GgmlType T, class Src>
void rows(const Src& src, const QActBlock* qa, const int32_t* bias, int64_t nb, int64_t M, int cnt, float* C,
          int64_t ldc) {
  __mmask16 k[kNV];
  for (int j = 0; j < kNV; ++j) {
    const int lanes = std::clamp(cnt - j * kLanes, 0, kLanes);
    k[j] = __mmask16((1u << lanes) - 1);
  }
  if constexpr (is_kquant(T)) {
    for (int64_t m = 0; m < M; m += kMRK)
      simd::with_rows<kMRK>(
          int(M - m), [&](auto mr) { tile_k<T, decltype(mr)::value>(src, qa, bias, nb, m, C, ldc, k); });
  } else {
    for (int64_t m = 0; m < M; m += kMR)
      simd::with_rows<kMR>(int(M - m),
                           [&](auto mr) { tile<T, decltype(mr)::value>(src, qa, bias, nb, m, C, ldc, k); });
  }
}
// ---- AMX: the same panels as int8 tile products ----
// On CPUs with AMX (Sapphire Rapids and later) one tdpbssd/tdpbsud multiplies a tile of 16 rows of
// activations (s8) by a tile of 16 outputs' weights (a block of vector j in a panel is 8 rows of
// [16 outputs][4 bytes], an AMX B tile as it lies) into 16 x 16 exact int32 sums. Each product
// covers one block (K = 32; Q6_K one 16-element half, K = 16), because every block has its own
// scale: the sums go to memory and each row's 16 outputs take the scalar twin's steps in f32
// (convert, d_w x d_a, fused multiply-add, the minimum's), so the result is the VNNI panels' bit
// for bit. The weights are multiplied as signed bytes where the type has an offset (widened less
// it), so no activation sum is taken back. A step is 32 rows x the panel's 32 outputs: 4 products
// from 4 tile loads; the activations are laid out per block (TileRows: 16 rows one contiguous A
// tile); the next kSteps steps' products are issued before these steps' f32 work, into the other
// of two buffers.
// What bounds it (Xeon family 6 model 167, 2 cores, 2026-11-30): a product at K = 32 costs the tile
// unit what one at K = 64 does (about 16 cycles; BM_Peak_AmxInt8's 14.6 Top/s is for K = 64), the
// tile registers are not renamed (a tile load waits for the products still reading that tile; in
// a profile half the time sat on the tile instructions), and the f32 steps, 3-4 vector operations
// per row, block and 16 outputs against the VNNI panels' 12, did not overlap them. So it measured
// at par with the VNNI panels (BM_QGemmPacked/4 against /3, 512 rows, medians of 3: Q8_0 0.86-1.19x
// the time, Q4_K 1.15x at 4096 -> 4096 and 1.5x at 14336 -> 4096, Q6_K 0.86-0.99x), and
// best_qkernel does not pick it. A tile kernel that wins needs K = 64 or more per product: blocks
// whose scales can be applied in the integer domain (docs/cpu-kernels.md, "AMX").
constexpr int kSteps = 2;
struct TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
// Tiles 0 and 1 activations (16 rows x k bytes), 2 and 3 weights (k / 4 rows of 64 bytes), 4-7
// the sums (16 rows x 16 int32): tile 4 + 2 rr + j is rows rr, vector j. k = 32 (a block) or 16
// (Q6_K's halves).
inline void configure_tiles(int k) {
  alignas(64) TileConfig c;
  for (int t : {0, 1}) c.rows[t] = 16, c.colsb[t] = uint16_t(k);
  for (int t : {2, 3}) c.rows[t] = uint8_t(k / 4), c.colsb[t] = 64;
  for (int t : {4, 5, 6, 7}) c.rows[t] = 16, c.colsb[t] = 64;
  _tile_loadconfig(&c);
}
using TileSums = int32_t[4][16][16];  // one step's 4 products
// Steps st0..st0 + n (a step: block st / S, half st % S) of rows m0..m0 + 32 into sums. Signed:
// the weights as signed bytes (their offset taken off when widened), else unsigned.
template <int S, bool Signed, class Src>
inline void tile_products(const Src& src, const TileRows& a, int64_t st0, int n, int64_t m0, TileSums* sums) {
  for (int i = 0; i < n; ++i) {
    const int64_t st = st0 + i, b = st / S, h = st % S;
    const int8_t* A = a.q + (b * a.Mp + m0) * kQBlock + h * 16;
    _tile_loadd(0, A, kQBlock);
    _tile_loadd(1, A + 16 * kQBlock, kQBlock);
    _tile_loadd(2, src.tile(b, 0) + h * 4 * 64, 64);
    _tile_loadd(3, src.tile(b, 1) + h * 4 * 64, 64);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    if constexpr (Signed) {
      _tile_dpbssd(4, 0, 2);
      _tile_dpbssd(5, 0, 3);
      _tile_dpbssd(6, 1, 2);
      _tile_dpbssd(7, 1, 3);
    } else {
      _tile_dpbsud(4, 0, 2);
      _tile_dpbsud(5, 0, 3);
      _tile_dpbsud(6, 1, 2);
      _tile_dpbsud(7, 1, 3);
    }
    _tile_stored(4, sums[i][0], 64);
    _tile_stored(5, sums[i][1], 64);
    _tile_stored(6, sums[i][2], 64);
    _tile_stored(7, sums[i][3], 64);
  }
}
// Those steps' sums into the accumulators acc [32 rows][kPanel], in step order per output. Per
// vector j the N steps' scales stay in registers over the 32 rows (a row and step: a load of the
// sums, the activation's scale broadcast with the multiply, convert, multiply, fused multiply-add).
template <GgmlType T, int N, class Src>
inline void fold(const Src& src, const TileRows& a, int64_t st0, int64_t m0, const TileSums* sums,
                 float (*acc)[kPanel]) {
  constexpr int S = n_scales(T);
  for (int j = 0; j < kNV; ++j) {
    __m512 dw[N], mw[N];
    const float *da[N], *sa[N];
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) {
      const int64_t st = st0 + i, b = st / S;
      dw[i] = src.d(b, S, int(st % S), j);
      if constexpr (block_has_min(T)) mw[i] = src.m(b, j);
      da[i] = a.d + b * a.Mp + m0;
      sa[i] = a.s + b * a.Mp + m0;
    }
    for (int rr = 0; rr < 2; ++rr)
      for (int r = 0; r < 16; ++r) {
        const int row = rr * 16 + r;
        float* at = acc[row] + j * kLanes;
        __m512 x = _mm512_load_ps(at);
#pragma GCC unroll 8
        for (int i = 0; i < N; ++i) {
          const __m512i s = _mm512_load_si512(sums[i][rr * 2 + j][r]);
          x = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[i], _mm512_set1_ps(da[i][row])), x);
          if constexpr (block_has_min(T)) x = _mm512_fmadd_ps(mw[i], _mm512_set1_ps(sa[i][row]), x);
        }
        _mm512_store_ps(at, x);
      }
  }
}
// A K-quant's steps (qgemm.h): each block's (half's) sums times its multipliers into fsum
// [32 rows][kPanel] (f32 multiply-adds in step order); where the steps end a super-block, its f32
// steps into acc (the minima's mn x sum(q) summed there from TileRows::sum) and fsum back to zero. A batch of
// steps never straddles super-blocks (8 S of them, a multiple of kSteps).
template <GgmlType T, int N, class Src>
inline void fold_k(const Src& src, const TileRows& a, int64_t st0, int64_t m0, const TileSums* sums,
                   float (*acc)[kPanel], float (*fsum)[kPanel]) {
  constexpr int S = n_scales(T);
  const int64_t last = st0 + N - 1, sb = last / S / 8;
  const bool ends = (last / S) % 8 == 7 && last % S == S - 1;
  for (int j = 0; j < kNV; ++j) {
    __m512 sc[N];
    for (int i = 0; i < N; ++i) sc[i] = _mm512_cvtepi32_ps(src.isc((st0 + i) / S, S, int((st0 + i) % S), j));
    const __m512 d = ends ? src.sd(sb, j) : _mm512_setzero_ps();
    const __m512 dmin = ends && block_has_min(T) ? src.sdmin(sb, j) : _mm512_setzero_ps();
    for (int rr = 0; rr < 2; ++rr)
      for (int r = 0; r < 16; ++r) {
        const int row = rr * 16 + r;
        float* at = fsum[row] + j * kLanes;
        __m512 x = _mm512_load_ps(at);
        for (int i = 0; i < N; ++i)
          x = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums[i][rr * 2 + j][r])), sc[i], x);
        if (!ends) {
          _mm512_store_ps(at, x);
          continue;
        }
        _mm512_store_ps(at, _mm512_setzero_ps());
        float* out = acc[row] + j * kLanes;
        const __m512 da = _mm512_set1_ps(a.d[8 * sb * a.Mp + m0 + row]);
        __m512 y = _mm512_fmadd_ps(x, _mm512_mul_ps(d, da), _mm512_load_ps(out));
        if constexpr (block_has_min(T)) {
          __m512i msum = _mm512_setzero_si512();
          for (int q = 0; q < 4; ++q) {
            const int64_t b = 8 * sb + 2 * q;
            msum = _mm512_dpwssd_epi32(msum, src.imn_pair(sb, q, j),
                                       _mm512_set1_epi32(act_sum_pair(a.sum[b * a.Mp + m0 + row],
                                                                      a.sum[(b + 1) * a.Mp + m0 + row])));
          }
          y = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(dmin, da), y);
        }
        _mm512_store_ps(out, y);
      }
  }
}
// Every row over one panel of cnt outputs at C, as rows() gives them. src: a BytePanel whose
// bytes are the weights themselves (signed: widen's or pack's bytes less the type's offset), or
// for the types without an offset their unsigned bytes, so no activation sum is taken back.
template <GgmlType T, class Src>
void amx_rows(const Src& src, const TileRows& a, int64_t nb, int64_t M, int cnt, float* C, int64_t ldc) {
  constexpr int S = n_scales(T);
  constexpr bool kSigned = offset_of(T) != 0;
  static_assert(kSteps % S == 0);  // a Q6_K block's two halves in one batch: the twin's order
  const int64_t steps = nb * S;
  alignas(64) TileSums sums[2][kSteps];
  alignas(64) float acc[2 * 16][kPanel];
  alignas(64) float fsum[2 * 16][kPanel];  // a K-quant's super-block sums so far
  __mmask16 k[kNV];
  for (int j = 0; j < kNV; ++j) k[j] = __mmask16((1u << std::clamp(cnt - j * kLanes, 0, kLanes)) - 1);
  configure_tiles(kQBlock / S);
  for (int64_t m0 = 0; m0 < M; m0 += 32) {
    std::fill_n(&acc[0][0], 32 * kPanel, 0.f);
    if constexpr (is_kquant(T)) std::fill_n(&fsum[0][0], 32 * kPanel, 0.f);
    tile_products<S, kSigned>(src, a, 0, int(std::min<int64_t>(kSteps, steps)), m0, sums[0]);
    for (int64_t st = 0, buf = 0; st < steps; st += kSteps, buf ^= 1) {
      // The next steps' products first: the tile unit works through them during this fold.
      const int64_t next = st + kSteps;
      if (next < steps)
        tile_products<S, kSigned>(src, a, next, int(std::min<int64_t>(kSteps, steps - next)), m0,
                                  sums[buf ^ 1]);
      const int n = int(std::min<int64_t>(kSteps, steps - st));
      static_assert(kSteps == 2);
      if constexpr (is_kquant(T))
        fold_k<T, kSteps>(src, a, st, m0, sums[buf], acc, fsum);  // 8 S steps a super-block
      else if (n == kSteps)
        fold<T, kSteps>(src, a, st, m0, sums[buf], acc);
      else
        fold<T, 1>(src, a, st, m0, sums[buf], acc);  // an odd last block
    }
    for (int r = 0; r < 32 && m0 + r < M; ++r)
      for (int j = 0; j < kNV; ++j)
        _mm512_mask_storeu_ps(C + (m0 + r) * ldc + j * kLanes, k[j], _mm512_load_ps(acc[r] + j * kLanes));
  }
  _tile_release();
}

// Every row of outputs n0..n0 + cnt (cnt <= kPanel).
template <GgmlType T>
void multiply_panel(const uint8_t* W, int64_t row_bytes, const QActBlock* qa, const int32_t* bias, int64_t nb,
                    int64_t M, int64_t n0, int cnt, float* C, int64_t ldc, const TileRows* amx,
                    const Scratchpad& p) {
  pack<T>(W, row_bytes, n0, cnt, nb, p);
  const BytePanel src{p.w, p.d, block_has_min(T) ? p.mins : nullptr, p.d + nb * n_scales(T) * kPanel};
  if (amx) {
    if constexpr (offset_of(T) != 0)
      for (int64_t i = 0; i < panel_scratch(T, nb).weight_bytes; i += 64)
        _mm512_store_si512(p.w + i,
                           _mm512_sub_epi8(_mm512_load_si512(p.w + i), _mm512_set1_epi8(char(offset_of(T)))));
    return amx_rows<T>(src, *amx, nb, M, cnt, C + n0, ldc);
  }
  rows<T>(src, qa, bias, nb, M, cnt, C + n0, ldc);
}
// A packed panel widened into BytePanel's storage: nibbles to bytes (less sub, mod 256), f16 to f32.
template <GgmlType T>
void widen(const PackedPanel<T>& src, int64_t nb, const Scratchpad& p, int sub = 0) {
  constexpr int S = n_scales(T);
  uint8_t* pw = p.w;
  const __m512i off = _mm512_set1_epi8(char(sub));
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < kNV; ++j) {
      for (int g = 0; g < 8; ++g)
        _mm512_store_si512(pw + ((b * kNV + j) * 8 + g) * 64, _mm512_sub_epi8(src.w(b, j, g), off));
      if constexpr (is_kquant(T)) {
        for (int h = 0; h < S; ++h)
          _mm512_storeu_si512(p.d + ((b * S + h) * kNV + j) * kLanes, src.isc(b, S, h, j));
        if (b % 8 == 0) {
          if constexpr (block_has_min(T))
            for (int q = 0; q < 4; ++q)
              _mm512_storeu_si512(p.mins + ((b / 8 * 4 + q) * kNV + j) * kLanes, src.imn_pair(b / 8, q, j));
          float* ps = p.d + nb * S * kPanel + (b / 8) * 2 * kPanel;
          _mm512_storeu_ps(ps + j * kLanes, src.sd(b / 8, j));
          if constexpr (block_has_min(T)) _mm512_storeu_ps(ps + kPanel + j * kLanes, src.sdmin(b / 8, j));
        }
      } else {
        for (int h = 0; h < S; ++h)
          _mm512_storeu_ps(p.d + ((b * S + h) * kNV + j) * kLanes, src.d(b, S, h, j));
        if constexpr (block_has_min(T)) _mm512_storeu_ps(p.mins + (b * kNV + j) * kLanes, src.m(b, j));
      }
    }
}
// Every row over panel p of a packed matrix. Many rows (wide) multiply it widened once to bytes:
// each tile of 6 rows passes over the panel again, and as bytes vpdpbusd reads its weights from
// memory, where nibbles take a shift and a mask per tile (Q4_1 512 x 576 x 3072: 4.9 ms from the
// nibbles, 3.7 ms packing per call, BM_QGemmPacked, 2026-11-26).
void run_packed(const QPacked& P, int64_t p, const QActBlock* qa, const int32_t* bias, int64_t M, bool wide,
                const TileRows* amx, float* C, int64_t ldc, const Scratchpad& w) {
  with_packed_panel<PackedPanel>(P, p, [&](const auto& src, int64_t n0, int cnt) {
    constexpr GgmlType T = std::decay_t<decltype(src)>::kType;
    // (Decoding's scratch has no scales: the panel is multiplied as packed, never widened.)
    const BytePanel bytes{w.w, w.d, block_has_min(T) ? w.mins : nullptr,
                          w.d ? w.d + P.nb * n_scales(T) * kPanel : nullptr};
    if (amx) {
      widen<T>(src, P.nb, w, offset_of(T));
      return amx_rows<T>(bytes, *amx, P.nb, M, cnt, C + n0, ldc);
    }
    if (!wide || !src.kNibbles) return rows<T>(src, qa, bias, P.nb, M, cnt, C + n0, ldc);
    widen<T>(src, P.nb, w);
    rows<T>(bytes, qa, bias, P.nb, M, cnt, C + n0, ldc);
  });
}

// ---- Decoding ----
// Per 128-bit chunk c: lane k = the sum of the 4 lanes of v_k's chunk c.
inline __m512i reduce4(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
  const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1));
  const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(v2, v3), _mm512_unpackhi_epi32(v2, v3));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}
// Block b of two rows as one zmm of unsigned bytes (load_u's values, row r0 in the low half). The
// simple types decode both at once: Q4_0 and Q4_1's 16 bytes broadcast to both 128-bit lanes of a
// half, the second lane shifted right by 4 (its high nibbles), Q5's fifth bits as a 64-bit mask.
template <GgmlType T>
inline __m512i load_u2(const uint8_t* r0, const uint8_t* r1, int64_t b) {
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
    return _mm512_inserti64x4(_mm512_castsi256_si512(load_u<T, offset_of(T)>(r0, b)),
                              (load_u<T, offset_of(T)>(r1, b)), 1);  // in parentheses: a macro in clang
  }
}
// The decoding tiles for decoding::run: rows m0..m0+MR (up to 8: 32 registers, 8 accumulators
// beside the 4 weight vectors) x outputs n0..n0+cnt (cnt <= 8). Output k and k + 4 share a zmm
// (one vpdpbusd for both, the activation block broadcast to both halves), so after reduce4 chunk
// c lane k holds output k + 4 (c / 2)'s half c % 2.
struct Decoding {
  static constexpr int kRows = 8;
  template <GgmlType T, int MR>
  static void run_tile(const uint8_t* W, int64_t row_bytes, int64_t N, int64_t n0, int cnt, const float* pd,
                       const float* pm, const QActBlock* qa, const int32_t* bias, int64_t nb, int64_t m0,
                       float* C, int64_t ldc) {
    const decoding::Tile t(W, row_bytes, N, n0, cnt, nb);
    decoding::Sums acc[MR];
    const float* sup = is_kquant(T) ? pd + nb * n_scales(T) * decoding::kOut : nullptr;  // its d and dmin
    for (int64_t b = 0; b < nb; ++b) {
      t.prefetch(b);
      const auto sc = decoding::block_scales<T>(t, b, pd, pm);
      __m512i w[4];
      for (int k = 0; k < 4; ++k) w[k] = load_u2<T>(t.row[k], t.row[k + 4], b);
      for (int m = 0; m < MR; ++m) {
        const QActBlock& a = qa[(m0 + m) * nb + b];
        const __m512i av = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q)));
        __m512i s[4];
        for (int k = 0; k < 4; ++k) s[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[k], av);
        const __m512i r = reduce4(s[0], s[1], s[2], s[3]);
        const __m512i hh = _mm512_shuffle_i32x4(r, r, _MM_SHUFFLE(3, 1, 2, 0));  // [half 0 | half 1]
        decoding::accumulate<T, offset_of(T)>(_mm512_castsi512_si256(hh), _mm512_extracti64x4_epi64(hh, 1),
                                              sc, a, bias + ((m0 + m) * nb + b) * n_scales(T), b, sup,
                                              acc[m]);
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
           int64_t nb, int64_t M, int64_t n0, int cnt, float* C, int64_t ldc, const TileRows* amx,
           const Scratchpad& s) {
  with_type(t, [&](auto type) {
    multiply_panel<decltype(type)::value>(W, row_bytes, qa, bias, nb, M, n0, cnt, C, ldc, amx, s);
  });
}

void packed(const QPacked& P, int64_t p, const QActBlock* qa, const int32_t* bias, int64_t M, bool wide,
            const TileRows* amx, float* C, int64_t ldc, const Scratchpad& s) {
  run_packed(P, p, qa, bias, M, wide, amx, C, ldc, s);
}

void gemv(GgmlType t, const uint8_t* W, int64_t row_bytes, const QActBlock* qa, const int32_t* bias,
          int64_t nb, int64_t M, int64_t N, int64_t n0, int cnt, float* C, int64_t ldc, const Scratchpad& s) {
  with_type(t, [&](auto type) {
    decoding::run<Decoding, decltype(type)::value>(W, row_bytes, qa, bias, nb, M, N, n0, cnt, C, ldc, s);
  });
}

}  // namespace lp::qk::avx512

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
