// What both instruction sets' files build their kernels from, compiled under each file's target
// (qgemm_avx2.cpp and qgemm_avx512.cpp include it inside their target region; AVX2 + F16C is the
// least either has): a block's 32 weights as a 256-bit vector, the 256-bit tile over a `Dot` of
// the file's own (how a weight block and an activation block give 8 lanes of 4 products), and
// the decoding tiles' shared steps. Internal to those two files.
//
// In an anonymous namespace on purpose, as qgemm_blocks.h: each file's copy is compiled for its
// own target and never merged with the other's by the linker.
#pragma once

// Its includes come first in the including file, outside the target region, so that nothing of
// the standard library or of the other headers takes the region's target.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "kernels/cpu/qgemm_blocks.h"
#include "kernels/cpu/qgemm_kernels.h"
#include "kernels/cpu/simd.h"

namespace lp::qk {
namespace {

// One cache line fetched into L2 (prefetcht1), as inline assembly (the packed panels' reads ahead,
// both files). GCC 12 at -O3 emitted none of the K-quant panels' _mm_prefetch calls (a loop over
// their block's lines in qgemm_avx512.cpp's PackedPanel::prefetch; the same calls in a free
// function were kept), so until 2026-11-29 their decoding read every weight line on demand:
// BM_QGemv Q4_K 0.53-0.62 -> 0.65-0.71 of the read ceiling, Q6_K 0.49-0.54 -> 0.62-0.67
// (docs/cpu-kernels.md, "The prefetches the compiler dropped"). The address goes in a register:
// the line may lie past the buffer (the blocks after a panel's last), which a prefetch may touch
// and a C++ dereference may not.
inline void prefetch_l2(const void* p) {
  asm volatile("prefetcht1 (%0)" : : "r"(p));
}

// Block b + kPackedAhead's lines of a qpack panel (pw; pd: a simple type's f16 scales, null for a
// K-quant) read from memory into L2 while block b multiplies: both files' packed panels. Into L2
// and 8 blocks ahead rather than into L1 and 4: a decoding GEMV streams its weights at the rate the
// core keeps misses in flight, and L1's few miss buffers held Q8_0 to 23 GB/s where the machine
// reads 29-32 (AMD EPYC Zen 4, 2 threads, 2026-11-27, alternated runs of `run --dtype int8`:
// decoding Qwen3-0.6B-shaped Q8_0 32.6-33.1 -> 39.4-39.9 tokens/s, SmolLM2's Q4_1 184-229 ->
// 243-258, the Qwen3-30B-A3B-shaped MoE file 38.8-39.8 -> 44.4-55.7; BM_QGemmPacked/8/1/576/49152
// 39-43 -> 49-53 Gop/s; 16 blocks ahead: 47). A K-quant's block is one run of lines (its
// super-block's head before the first; 8, 16 and 24 blocks ahead measured within the machine's
// noise on BM_QGemv Q4_K and Q6_K, Xeon, 2026-11-29).
inline constexpr int64_t kPackedAhead = 8;
template <GgmlType T>
inline void prefetch_packed(const uint8_t* pw, const uint16_t* pd, int64_t b) {
  constexpr int kL16 = avx512::kLanes, kNV16 = avx512::kNV;
  constexpr KPanelLayout kL = kpanel_layout(T, kL16, kNV16);
  const int64_t a = b + kPackedAhead;
  const uint8_t* at = pw + packed_block_offset(T, kL16, kNV16, a);
  if constexpr (is_kquant(T)) {
    const uint8_t* p = at - ((a & 7) == 0 ? kL.head : 0);
    const int64_t lines = (kL.block + ((a & 7) == 0 ? kL.head : 0)) / 64;
    for (int64_t l = 0; l < lines; ++l) prefetch_l2(p + l * 64);
  } else {
    for (int64_t l = 0; l < kNV16 * (T != GgmlType::Q8_0 ? 4 : 8); ++l) prefetch_l2(at + l * 64);
    prefetch_l2(pd + a * avx512::kPanel);
  }
}

// Panel p of a packed matrix as each file's reader of it (Src<T>{weights, f16 scales, f16 minima},
// the last two null for a K-quant, whose live in the weights' stream): f(src, its first output,
// its output count), with src's type a compile-time constant.
template <template <GgmlType> class Src, class F>
inline void with_packed_panel(const QPacked& P, int64_t p, F&& f) {
  constexpr int kP = avx512::kPanel;
  const int64_t n0 = p * kP;
  const int cnt = int(std::min<int64_t>(kP, P.N - n0));
  with_type(P.type, [&](auto type) {
    constexpr GgmlType T = decltype(type)::value;
    if constexpr (packs(T)) {
      constexpr bool kq = is_kquant(T), mins = block_has_min(T);
      const int64_t scales = p * P.nb * kP;
      f(Src<T>{P.w.data() + p * P.panel_bytes, kq ? nullptr : P.d.data() + scales,
               !kq && mins ? P.m.data() + scales : nullptr},
        n0, cnt);
    }
  });
}

// ---- A block's weights and scales ----
// Byte e of the result: 16 where bit e of qh is set, else 0 (each byte takes qh's byte e / 8 and
// tests its bit e % 8).
inline __m256i fifth_bits(uint32_t qh) {
  const __m256i bytes =
      _mm256_shuffle_epi8(_mm256_set1_epi32(int(qh)),
                          _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(16));
}
// Block b's 32 weights as bytes in element order (decode_scalar's values).
template <GgmlType T>
inline __m256i load_w(const uint8_t* row, int64_t b) {
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
inline __m256i load_u(const uint8_t* row, int64_t b) {
  const __m256i w = load_w<T>(row, b);
  if constexpr (Offset != 0) return _mm256_add_epi8(w, _mm256_set1_epi8(char(Offset)));
  return w;
}
// Block b's scales and minimum, f16 converted by F16C (exact, as model/quant's f16_to_f32).
template <GgmlType T>
inline BlockScale scales(const uint8_t* row, int64_t b) {
  return block_scale(T, row, b, [](uint16_t h) { return _cvtsh_ss(h); });
}

// ---- The 256-bit tile ----
// A Dot gives: WPrep and APrep (a weight and an activation block made ready, once per block),
// prep_w<Signed>, prep_a<Signed>, isum<Signed> (lane l: the exact sum of w_j a_j over bytes
// 4l..4l+3), and the tile shapes kMR x kNR (signed weights) and kMR1 x kNR1 (with a minimum).
inline __m256i halves4(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
  return _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
}

// A tile of MR activation rows x NR weight rows (outputs): pairs p = m * NR + n in groups of four,
// each group's exact block sums reduced together (halves4) and then one f32 vector of four
// accumulators, the scalar twin's arithmetic (qgemm.h) for each, so tiles of any size give the
// same bits.
template <class Dot, GgmlType T, int MR, int NR>
inline void tile(const uint8_t* W, int64_t row_bytes, int64_t n0, const float* scl, const float* mn,
                 const QActBlock* qa, int64_t nb, int64_t m0, float* C, int64_t ldc) {
  constexpr bool kSigned = is_signed(T);
  constexpr int S = n_scales(T), P = MR * NR, G = (P + 3) / 4;
  __m128 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    typename Dot::WPrep wp[NR];
    for (int n = 0; n < NR; ++n)
      wp[n] = Dot::template prep_w<kSigned>(load_w<T>(W + (n0 + n) * row_bytes, b));
    // Pair 4g + i is (row (4g + i) / NR, output (4g + i) % NR); pairs past the tile are zero. With
    // NR = 1 or 2 every group has the same outputs, so their scale vectors are made once per block.
    static_assert(NR == 1 || NR == 2, "the groups of four pairs assume NR divides 4");
    __m128 dwv[S];
    for (int h = 0; h < S; ++h) {
      const float x0 = scl[b * S + h], x1 = NR == 2 ? scl[(nb + b) * S + h] : x0;
      dwv[h] = _mm_setr_ps(x0, x1, x0, x1);
    }
    __m128 mnv = _mm_setzero_ps();
    if constexpr (block_has_min(T)) {
      const float x0 = mn[b], x1 = NR == 2 ? mn[nb + b] : x0;
      mnv = _mm_setr_ps(x0, x1, x0, x1);
    }
    for (int g = 0; g < G; ++g) {
      __m256i v[4];
      float da[4], sa[4];
      for (int i = 0; i < 4; ++i) {
        const int p = 4 * g + i;
        if (p < P) {
          const QActBlock& a = qa[(m0 + p / NR) * nb + b];
          v[i] = Dot::template isum<kSigned>(wp[p % NR], Dot::template prep_a<kSigned>(a));
          da[i] = a.d;
          sa[i] = a.s;
        } else {
          v[i] = _mm256_setzero_si256();
          da[i] = sa[i] = 0.f;
        }
      }
      const __m128 dav = _mm_setr_ps(da[0], da[1], da[2], da[3]);
      const __m256i s = halves4(v[0], v[1], v[2], v[3]);
      const __m128i lo = _mm256_castsi256_si128(s), hi = _mm256_extracti128_si256(s, 1);
      // d_w * d_a rounded once, then one fused multiply-add per block (per half for Q6_K).
      if constexpr (S == 1) {
        acc[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_add_epi32(lo, hi)), _mm_mul_ps(dwv[0], dav), acc[g]);
      } else {
        acc[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(lo), _mm_mul_ps(dwv[0], dav), acc[g]);
        acc[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(hi), _mm_mul_ps(dwv[1], dav), acc[g]);
      }
      if constexpr (block_has_min(T))  // Q4_1, Q5_1, Q4_K, Q5_K: m_w * s_a, in the same chain
        acc[g] = _mm_fmadd_ps(mnv, _mm_setr_ps(sa[0], sa[1], sa[2], sa[3]), acc[g]);
    }
  }
  for (int g = 0; g < G; ++g) {
    float out[4];
    _mm_storeu_ps(out, acc[g]);
    for (int i = 0; i < 4 && 4 * g + i < P; ++i) {
      const int p = 4 * g + i;
      C[(m0 + p / NR) * ldc + n0 + p % NR] = out[i];
    }
  }
}

// The same for a K-quant (qgemm.h): per super-block each pair's block sums times the output's
// integer multipliers (isc [NR][nb][S], mins' imn [NR][nb]) summed exactly, then its f32 steps with
// the super-blocks' d and dmin (sup [NR][nb / 8][2]).
template <class Dot, GgmlType T, int MR, int NR>
inline void tile_k(const uint8_t* W, int64_t row_bytes, int64_t n0, const int32_t* isc, const int32_t* imn,
                   const float* sup, const QActBlock* qa, int64_t nb, int64_t m0, float* C, int64_t ldc) {
  constexpr bool kSigned = is_signed(T);
  constexpr int S = n_scales(T), P = MR * NR, G = (P + 3) / 4;
  static_assert(NR == 1 || NR == 2, "the groups of four pairs assume NR divides 4");
  __m128 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm_setzero_ps();
  const int64_t nsb = nb / 8;
  for (int64_t sb = 0; sb < nsb; ++sb) {
    __m128 fsum[G];
    __m128i msum[G];
    for (int g = 0; g < G; ++g) fsum[g] = _mm_setzero_ps(), msum[g] = _mm_setzero_si128();
    for (int64_t b = 8 * sb; b < 8 * sb + 8; ++b) {
      typename Dot::WPrep wp[NR];
      for (int n = 0; n < NR; ++n)
        wp[n] = Dot::template prep_w<kSigned>(load_w<T>(W + (n0 + n) * row_bytes, b));
      __m128 scv[S];
      for (int h = 0; h < S; ++h) {
        const float x0 = float(isc[b * S + h]), x1 = NR == 2 ? float(isc[(nb + b) * S + h]) : x0;
        scv[h] = _mm_setr_ps(x0, x1, x0, x1);
      }
      __m128i mnv = _mm_setzero_si128();
      if constexpr (block_has_min(T)) {
        const int x0 = imn[b], x1 = NR == 2 ? imn[nb + b] : x0;
        mnv = _mm_setr_epi32(x0, x1, x0, x1);
      }
      for (int g = 0; g < G; ++g) {
        __m256i v[4];
        int sa[4];
        for (int i = 0; i < 4; ++i) {
          const int p = 4 * g + i;
          if (p < P) {
            const QActBlock& a = qa[(m0 + p / NR) * nb + b];
            v[i] = Dot::template isum<kSigned>(wp[p % NR], Dot::template prep_a<kSigned>(a));
            sa[i] = a.sum;
          } else {
            v[i] = _mm256_setzero_si256();
            sa[i] = 0;
          }
        }
        const __m256i s = halves4(v[0], v[1], v[2], v[3]);
        const __m128i lo = _mm256_castsi256_si128(s), hi = _mm256_extracti128_si256(s, 1);
        if constexpr (S == 1) {
          fsum[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_add_epi32(lo, hi)), scv[0], fsum[g]);
        } else {
          fsum[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(lo), scv[0], fsum[g]);
          fsum[g] = _mm_fmadd_ps(_mm_cvtepi32_ps(hi), scv[1], fsum[g]);
        }
        if constexpr (block_has_min(T))
          msum[g] = _mm_add_epi32(msum[g], _mm_mullo_epi32(mnv, _mm_setr_epi32(sa[0], sa[1], sa[2], sa[3])));
      }
    }
    const float d0 = sup[sb * 2], d1 = NR == 2 ? sup[(nsb + sb) * 2] : d0;
    const float m0v = sup[sb * 2 + 1], m1v = NR == 2 ? sup[(nsb + sb) * 2 + 1] : m0v;
    const __m128 dv = _mm_setr_ps(d0, d1, d0, d1), mv = _mm_setr_ps(m0v, m1v, m0v, m1v);
    for (int g = 0; g < G; ++g) {
      float da[4];
      for (int i = 0; i < 4; ++i) {
        const int p = 4 * g + i;
        da[i] = p < P ? qa[(m0 + p / NR) * nb + 8 * sb].d : 0.f;
      }
      const __m128 dav = _mm_setr_ps(da[0], da[1], da[2], da[3]);
      acc[g] = _mm_fmadd_ps(fsum[g], _mm_mul_ps(dv, dav), acc[g]);
      if constexpr (block_has_min(T))
        acc[g] = _mm_fnmadd_ps(_mm_cvtepi32_ps(msum[g]), _mm_mul_ps(mv, dav), acc[g]);
    }
  }
  for (int g = 0; g < G; ++g) {
    float out[4];
    _mm_storeu_ps(out, acc[g]);
    for (int i = 0; i < 4 && 4 * g + i < P; ++i) {
      const int p = 4 * g + i;
      C[(m0 + p / NR) * ldc + n0 + p % NR] = out[i];
    }
  }
}
// The K-quants' rows: each output's integer multipliers and super-block scales taken once.
template <class Dot, GgmlType T>
void rows_k(const uint8_t* W, int64_t row_bytes, const QActBlock* qa, int64_t nb, int64_t m_begin,
            int64_t m_end, int64_t n_begin, int64_t n_end, float* C, int64_t ldc, const Scratchpad& s) {
  constexpr int MR = block_has_min(T) ? Dot::kMR1 : Dot::kMR, NR = block_has_min(T) ? Dot::kNR1 : Dot::kNR;
  constexpr int S = n_scales(T);
  const int64_t width = n_end - n_begin, nsb = nb / 8;
  auto* isc = reinterpret_cast<int32_t*>(s.d);
  float* sup = s.d + width * nb * S;
  auto* imn = reinterpret_cast<int32_t*>(s.mins);  // null for Q6_K, and read only by the others
  for (int64_t n = 0; n < width; ++n) {
    const uint8_t* row = W + (n_begin + n) * row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      const KScale ks = kblock_scale(T, row, b);
      for (int i = 0; i < S; ++i) isc[(n * nb + b) * S + i] = ks.sc[i];
      if constexpr (block_has_min(T)) imn[n * nb + b] = ks.mn;
    }
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const SuperScale ss = super_scale(T, row, sb, [](uint16_t h) { return _cvtsh_ss(h); });
      sup[(n * nsb + sb) * 2] = ss.d;
      sup[(n * nsb + sb) * 2 + 1] = ss.dmin;
    }
  }
  const auto at = [&](int64_t n) {
    const int64_t i = n - n_begin;
    return std::tuple{isc + i * nb * S, block_has_min(T) ? imn + i * nb : nullptr, sup + i * nsb * 2};
  };
  int64_t n = n_begin;
  for (; n + NR <= n_end; n += NR) {
    const auto [sc, mn, su] = at(n);
    int64_t m = m_begin;
    for (; m + MR <= m_end; m += MR) tile_k<Dot, T, MR, NR>(W, row_bytes, n, sc, mn, su, qa, nb, m, C, ldc);
    for (; m < m_end; ++m) tile_k<Dot, T, 1, NR>(W, row_bytes, n, sc, mn, su, qa, nb, m, C, ldc);
  }
  for (; n < n_end; ++n) {
    const auto [sc, mn, su] = at(n);
    for (int64_t m = m_begin; m < m_end; ++m)
      tile_k<Dot, T, 1, 1>(W, row_bytes, n, sc, mn, su, qa, nb, m, C, ldc);
  }
}

// The outputs n_begin..n_end of rows m_begin..m_end over Dot's tiles (Dot::kMR activation rows x
// Dot::kNR outputs for signed weights, kMR1 x kNR1 for the types with a minimum, sized to the
// register file and measured with BM_QGemm). Each output's block scales (and minima) are converted
// once into s.d ([width][nb][S]) and s.mins ([width][nb]), not once per tile.
template <class Dot, GgmlType T>
void rows(const uint8_t* W, int64_t row_bytes, const QActBlock* qa, int64_t nb, int64_t m_begin,
          int64_t m_end, int64_t n_begin, int64_t n_end, float* C, int64_t ldc, const Scratchpad& s) {
  constexpr int MR = block_has_min(T) ? Dot::kMR1 : Dot::kMR, NR = block_has_min(T) ? Dot::kNR1 : Dot::kNR;
  constexpr int S = n_scales(T);
  const int64_t width = n_end - n_begin;
  float* scl = s.d;
  float* mins = s.mins;  // null for the types without a minimum, and read only by the others
  for (int64_t n = 0; n < width; ++n)
    for (int64_t b = 0; b < nb; ++b) {
      const BlockScale bs = scales<T>(W + (n_begin + n) * row_bytes, b);
      for (int i = 0; i < S; ++i) scl[(n * nb + b) * S + i] = bs.d[i];
      if constexpr (block_has_min(T)) mins[n * nb + b] = bs.m;
    }
  const auto mins_of = [&](int64_t n) { return block_has_min(T) ? mins + (n - n_begin) * nb : nullptr; };
  int64_t n = n_begin;
  for (; n + NR <= n_end; n += NR) {
    const float* sc = scl + (n - n_begin) * nb * S;
    int64_t m = m_begin;
    for (; m + MR <= m_end; m += MR) tile<Dot, T, MR, NR>(W, row_bytes, n, sc, mins_of(n), qa, nb, m, C, ldc);
    for (; m < m_end; ++m) tile<Dot, T, 1, NR>(W, row_bytes, n, sc, mins_of(n), qa, nb, m, C, ldc);
  }
  for (; n < n_end; ++n)
    for (int64_t m = m_begin; m < m_end; ++m)
      tile<Dot, T, 1, 1>(W, row_bytes, n, scl + (n - n_begin) * nb * S, mins_of(n), qa, nb, m, C, ldc);
}
template <class Dot>
void tiles(GgmlType t, const uint8_t* W, int64_t row_bytes, const QActBlock* qa, int64_t nb, int64_t m_begin,
           int64_t m_end, int64_t n_begin, int64_t n_end, float* C, int64_t ldc, const Scratchpad& s) {
  with_type(t, [&](auto type) {
    constexpr GgmlType T = decltype(type)::value;
    if constexpr (is_kquant(T))
      rows_k<Dot, T>(W, row_bytes, qa, nb, m_begin, m_end, n_begin, n_end, C, ldc, s);
    else
      rows<Dot, T>(W, row_bytes, qa, nb, m_begin, m_end, n_begin, n_end, C, ldc, s);
  });
}

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
// activations' bytes, one load per block, serve all 8 outputs. Each file's gemv_tile does the
// multiplying; these are the steps around it.
namespace decoding {
constexpr int kOut = kGemvOut;
// Stores the 8 x 8 matrix whose rows are r[0..7] column by column: out[8j + i] = r[i][j].
inline void transpose8(const __m256 (&r)[8], float* out) {
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
// tile's loop; the K-quants' are taken here once per tile, per super-block of 8 blocks (the 6-bit
// multipliers of all 8 at once), as integers into [nb][S][8] and minima [nb][8], their d and dmin
// after the scales ([nb / 8][2][8], f32). Lanes past cnt repeat the last output (their results are
// never stored).
template <GgmlType T>
void tile_scales(const uint8_t* W, int64_t row_bytes, int64_t n0, int cnt, int64_t nb, float* d,
                 float* mins) {
  const uint8_t* row[kOut];
  for (int i = 0; i < kOut; ++i) row[i] = W + (n0 + std::min(i, cnt - 1)) * row_bytes;
  // Each output's 8 (Q6_K: 16) values of a super-block as vectors, then transposed to [block][8]
  // (integers through the f32 transpose as their bits), and its d and dmin to [nb / 8][2][8].
  float* sup = d + nb * n_scales(T) * kOut;
  const auto bits = [](__m256i v) { return _mm256_castsi256_ps(v); };
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    __m256 v[2][kOut], m[kOut];
    for (int i = 0; i < kOut; ++i) {
      const uint8_t* p = row[i] + sb * block_bytes(T);
      const SuperScale ss = super_scale(T, p, 0, [](uint16_t h) { return _cvtsh_ss(h); });
      sup[(sb * 2) * kOut + i] = ss.d;
      sup[(sb * 2 + 1) * kOut + i] = ss.dmin;
      if constexpr (T == GgmlType::Q6_K) {  // its 16 int8 scales, [8 blocks][2 halves] in order
        const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
        v[0][i] = bits(_mm256_cvtepi8_epi32(sc));
        v[1][i] = bits(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)));
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
        v[0][i] = bits(_mm256_cvtepu8_epi32(sc));
        m[i] = bits(_mm256_cvtepu8_epi32(mn));
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
inline void loop_scales(const uint8_t* const (&row)[kOut], int64_t b, __m256& d, __m256& m) {
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
// Block b's scales for the tile's 8 outputs: d0 (d1: Q6_K's second half) and the minima m; a
// K-quant's multipliers f0, f1 (exact in f32) and its minimum's, im.
struct BlockScales {
  __m256 d0, d1, m, f0, f1;
  __m256i im;
};
template <GgmlType T>
inline BlockScales block_scales(const Tile& t, int64_t b, const float* pd, const float* pm) {
  BlockScales s{_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_si256()};
  if constexpr (scales_in_loop(T)) {
    loop_scales<T>(t.row, b, s.d0, s.m);
  } else {
    s.f0 =
        _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pd + b * n_scales(T) * kOut)));
    if constexpr (n_scales(T) == 2)
      s.f1 =
          _mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pd + b * 2 * kOut + kOut)));
    if constexpr (block_has_min(T))
      s.im = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pm + b * kOut));
  }
  return s;
}
// A row's running sums over the tile's 8 outputs: the f32 accumulators and a K-quant's sums of its
// super-block so far (the multipliers' in f32, the minima's in integers).
struct Sums {
  __m256 acc = _mm256_setzero_ps(), fsum = _mm256_setzero_ps();
  __m256i msum = _mm256_setzero_si256();
};
// One row's block b into its sums, from the 8 outputs' half-block sums h0 and h1: the offset taken
// back (-Offset x the activation half's sum, bi), then the scalar twin's sequence (a K-quant's: the
// integer multiply-adds, and at a super-block's last block its f32 steps with pd's d and dmin after
// the nb blocks' multipliers).
template <GgmlType T, int Offset>
inline void accumulate(__m256i h0, __m256i h1, const BlockScales& sc, const QActBlock& a, const int32_t* bi,
                       int64_t b, const float* sup, Sums& st) {
  if constexpr (is_kquant(T)) {
    if constexpr (n_scales(T) == 1) {
      st.fsum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(h0, h1)), sc.f0, st.fsum);
    } else {
      h0 = _mm256_add_epi32(h0, _mm256_set1_epi32(bi[0]));
      h1 = _mm256_add_epi32(h1, _mm256_set1_epi32(bi[1]));
      st.fsum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h0), sc.f0, st.fsum);
      st.fsum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h1), sc.f1, st.fsum);
    }
    if constexpr (block_has_min(T))
      st.msum = _mm256_add_epi32(st.msum, _mm256_mullo_epi32(sc.im, _mm256_set1_epi32(a.sum)));
    if ((b & 7) != 7) return;
    const float* ss = sup + (b >> 3) * 2 * kOut;
    const __m256 da = _mm256_set1_ps(a.d);
    st.acc = _mm256_fmadd_ps(st.fsum, _mm256_mul_ps(_mm256_loadu_ps(ss), da), st.acc);
    if constexpr (block_has_min(T))
      st.acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(st.msum), _mm256_mul_ps(_mm256_loadu_ps(ss + kOut), da),
                                st.acc);
    st.fsum = _mm256_setzero_ps();
    st.msum = _mm256_setzero_si256();
    return;
  }
  __m256& acc = st.acc;
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
}
// The first cnt of a row's 8 outputs.
inline void store(float* c, int cnt, __m256 acc) {
  _mm256_maskstore_ps(
      c, _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), acc);
}
// Every row (M < kPanelMinRows) of outputs n0..n0 + cnt, in groups of up to Kernel::kRows rows,
// each group Kernel::run_tile<T, rows>: a group decodes each weight block once for all its rows,
// so 8 rows (8 requests decoding together) take one pass over the weights instead of two. The
// K-quants' scales go to s.d and s.mins (gemv_scratch).
template <class Kernel, GgmlType T>
void run(const uint8_t* W, int64_t row_bytes, const QActBlock* qa, const int32_t* bias, int64_t nb, int64_t M,
         int64_t N, int64_t n0, int cnt, float* C, int64_t ldc, const Scratchpad& s) {
  if constexpr (!scales_in_loop(T)) tile_scales<T>(W, row_bytes, n0, cnt, nb, s.d, s.mins);
  for (int64_t m = 0; m < M; m += Kernel::kRows)
    simd::with_rows<Kernel::kRows>(int(M - m), [&](auto mr) {
      Kernel::template run_tile<T, decltype(mr)::value>(W, row_bytes, N, n0, cnt, s.d, s.mins, qa, bias, nb,
                                                        m, C, ldc);
    });
}
}  // namespace decoding

}  // namespace
}  // namespace lp::qk
