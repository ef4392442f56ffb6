#include "kernels/cpu/attention.h"

#include <immintrin.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "kernels/cpu/simd.h"
#include "model/error.h"
#include "model/quant.h"

namespace lp {

using namespace simd;

// Attention, flash-style. Work item: a tile of up to kTileRows (query, head) rows of one kv
// group, enumerated token-major so the heads sharing a kv head share every key block. For each
// block of kBlock keys: S = Q K^T (kept in L1), an online softmax per row (running max m and
// sum l, earlier output rescaled when the max grows), O += P V. Each tile reads the keys and
// values it needs once; nothing of size T x T is ever stored.
namespace {
constexpr int kTileRows = 64;     // rows per work item
constexpr int kBlock = 64;        // keys per block (two 32-key score steps)
constexpr int kSubRows = 8;       // rows per score microkernel call
constexpr int kCompactRows = 16;  // rows from which a listed set's sparse blocks are gathered first
// A pass of few rows (a decoding step's: its kv group's heads, and the rows it revives) is split by
// keys instead, flash-decoding style: each work item reads its chunk of the group's keys once and
// leaves a partial softmax (running max, sum, unnormalised output) that a merge combines. Splitting
// the rows instead had each part read all of its group's keys: a decoding step read the K/V cache
// twice. The chunk is a fixed number of keys, never a thread count, so a row's result is the same
// on any number of threads and alone or in a batch.
constexpr int64_t kChunkKeys = 512;
// The score microkernels' row granule: a block's rows start at a multiple of it (AVX2's step always
// computes 4 rows; AVX-512's takes any count).
#if defined(__AVX512F__)
constexpr int kRowStep = 1;
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kRowStep = 4;
#else
constexpr int kRowStep = 1;
#endif

struct TileRow {
  const float* q;
  float* o;
  int64_t len;    // keys visible to this row: a prefix of the key set (a prefix set only) ...
  int64_t start;  // ... from this one on (a sliding window's first key; 0 without a window)
  int32_t pos;    // the query's position
  float* logits;  // the row's scaled logits per held slot, -inf where hidden (last_row_logits), or null
};

// A work item's softmax over its chunk of keys, per row: running max m, sum l, output O [Dh]
// (not yet divided by l).
struct Partial {
  float* m;
  float* l;
  float* O;
};

// Cached keys and values are float or f16 (uint16_t, KvType::F16); these load either as f32, an
// f16 converted in registers (F16C), so attention reads an f16 cache's bytes once and nothing
// else.
inline float load1(float x) {
  return x;
}
inline float load1(uint16_t h) {
  return f16_to_f32(h);
}
#if defined(__AVX512F__)
inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}
inline __m512 load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#elif defined(__AVX2__) && defined(__FMA__)
inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const uint16_t* p) {
#if defined(__F16C__)
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  alignas(32) float f[8];
  for (int i = 0; i < 8; ++i) f[i] = f16_to_f32(p[i]);
  return _mm256_load_ps(f);
#endif
}
#endif

// A decoding step's pass reads each key block once, straight from memory: with the hardware
// prefetchers alone it read an 8B-shaped f16 cache at 11.3 GB/s (BM_DecodeAttention8B/4096,
// a third of the read ceiling), its value loads waiting on memory. So each microkernel fetches
// the next block's matching lines into L1 as it goes, spread over its loop: 14.9 GB/s there, and
// 26.5 -> 34.2 GB/s after 512 tokens, where the cache (67 MB) comes from L3 (with scores_step64;
// builds alternated, medians of 3, Xeon family 6 model 167, 2026-11-30). A burst of the block's 512
// prefetches at its start reached 14.8 and 25 (it stalls the loads behind it); into L2, or 2 or 4 blocks
// ahead, 13.6-14.3 and 23.9-30; the cache in huge pages changed it by under 1 GB/s. At 4,096 tokens what
// remains is the misses a core keeps in flight: n elements from p.
template <class E>
inline void fetch_ahead(const E* p, int n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t o = 0; o < int64_t(n * sizeof(E)); o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
}

#if defined(__AVX512F__)
// S[r][0..31] = sum_d qs[r][d] * kt[d][0..31] for NR rows: 2*NR accumulators, 2 key loads and
// NR broadcasts per dimension. pf (or null): the same keys of the next block, fetched into L1 a
// dimension at a time while these multiply (fetch_ahead).
template <int NR, class E>
inline void scores_step(const float* qs, int64_t Dh, const E* kt, int64_t ldk, float* S, int64_t lds,
                        const E* pf) {
  __m512 acc[NR][2];
  for (int r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t d = 0; d < Dh; ++d) {
    if (pf) fetch_ahead(pf + d * ldk, 32);
    const __m512 k0v = load16(kt + d * ldk);
    const __m512 k1v = load16(kt + d * ldk + 16);
    for (int r = 0; r < NR; ++r) {
      const __m512 b = _mm512_set1_ps(qs[r * Dh + d]);
      acc[r][0] = _mm512_fmadd_ps(b, k0v, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(b, k1v, acc[r][1]);
    }
  }
  for (int r = 0; r < NR; ++r) {
    _mm512_storeu_ps(S + r * lds, acc[r][0]);
    _mm512_storeu_ps(S + r * lds + 16, acc[r][1]);
  }
}

// S[r][0..63] for NR <= 4 rows (a decoding step's kv group): the whole block a dimension at a
// time, so the keys are read front to back in one pass; the same sums as two scores_step calls
// (BM_DecodeAttention8B/512: 29.9 -> 32.6 GB/s; from memory, at 4,096, no change).
template <int NR, class E>
inline void scores_step64(const float* qs, int64_t Dh, const E* kt, int64_t ldk, float* S, int64_t lds,
                          const E* pf) {
  __m512 acc[NR][4];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t d = 0; d < Dh; ++d) {
    if (pf) fetch_ahead(pf + d * ldk, 64);
    __m512 kv[4];
    for (int j = 0; j < 4; ++j) kv[j] = load16(kt + d * ldk + 16 * j);
    for (int r = 0; r < NR; ++r) {
      const __m512 b = _mm512_set1_ps(qs[r * Dh + d]);
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_fmadd_ps(b, kv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(S + r * lds + 16 * j, acc[r][j]);
}

// scores_step for the rows left (at most kSubRows): a decoding step's tile has only its kv group's
// 3 or 4 heads, and 8-row steps spent 5 of 8 rows' multiply-adds on padding. Each row's scores are
// the same whatever the rows beside it.
template <class E>
inline void scores_rows(int left, const float* qs, int64_t Dh, const E* kt, int64_t ldk, float* S,
                        int64_t lds, const E* pf) {
  with_rows<kSubRows>(left,
                      [&](auto nr) { scores_step<decltype(nr)::value, E>(qs, Dh, kt, ldk, S, lds, pf); });
}

// O[r][0..63] += sum_k P[r][k] * V[k][0..63] for NR <= 4 rows and nk keys: one 64-wide column
// block of V (rows ld floats apart) and of O (rows ld apart), so Dh = 128 runs two of them.
// pf (or null): the same columns of the next block's values, fetched a key at a time.
template <int NR, class E>
inline void pv_step64(const float* P, int64_t ldp, const E* v, int64_t ld, int64_t nk, float* O,
                      const E* pf) {
  __m512 acc[NR][4];
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_loadu_ps(O + r * ld + 16 * j);
  for (int64_t k = 0; k < nk; ++k) {
    if (pf) fetch_ahead(pf + k * ld, 64);
    const E* vk = v + k * ld;
    const __m512 v0 = load16(vk), v1 = load16(vk + 16);
    const __m512 v2 = load16(vk + 32), v3 = load16(vk + 48);
    for (int r = 0; r < NR; ++r) {
      const __m512 p = _mm512_set1_ps(P[r * ldp + k]);
      acc[r][0] = _mm512_fmadd_ps(p, v0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(p, v1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(p, v2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(p, v3, acc[r][3]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(O + r * ld + 16 * j, acc[r][j]);
}
template <class E>
inline void pv_rows(int left, const float* P, int64_t ldp, const E* v, int64_t ld, int64_t nk, float* O,
                    const E* pf) {
  with_rows<4>(left, [&](auto nr) { pv_step64<decltype(nr)::value, E>(P, ldp, v, ld, nk, O, pf); });
}
#endif

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
// AVX2 (16 registers): S[r][0..15] = sum_d qs[r][d] * kt[d][0..15] for 4 rows, 8 accumulators,
// 2 key loads and 4 broadcasts per dimension; each score sums over d in order. pf: as
// scores_step's.
template <class E>
inline void scores_step_avx2(const float* qs, int64_t Dh, const E* kt, int64_t ldk, float* S, int64_t lds,
                             const E* pf) {
  __m256 acc[4][2];
  for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < Dh; ++d) {
    if (pf) fetch_ahead(pf + d * ldk, 16);
    const __m256 k0v = load8(kt + d * ldk);
    const __m256 k1v = load8(kt + d * ldk + 8);
    for (int r = 0; r < 4; ++r) {
      const __m256 b = _mm256_broadcast_ss(qs + r * Dh + d);
      acc[r][0] = _mm256_fmadd_ps(b, k0v, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(b, k1v, acc[r][1]);
    }
  }
  for (int r = 0; r < 4; ++r) {
    _mm256_storeu_ps(S + r * lds, acc[r][0]);
    _mm256_storeu_ps(S + r * lds + 8, acc[r][1]);
  }
}

// O[r][0..31] += sum_k P[r][k] * V[k][0..31] for 2 rows and nk keys (v rows Dh floats apart;
// O rows Dh apart): 8 accumulators, 4 value loads and 2 broadcasts per key. pf: as pv_step64's.
template <class E>
inline void pv_step32_avx2(const float* P, int64_t ldp, const E* v, int64_t Dh, int64_t nk, float* O, int nr,
                           const E* pf) {
  __m256 acc[2][4];
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < 4; ++j)
      acc[r][j] = r < nr ? _mm256_loadu_ps(O + r * Dh + 8 * j) : _mm256_setzero_ps();
  for (int64_t k = 0; k < nk; ++k) {
    if (pf) fetch_ahead(pf + k * Dh, 32);
    const E* vk = v + k * Dh;
    const __m256 v0 = load8(vk), v1 = load8(vk + 8);
    const __m256 v2 = load8(vk + 16), v3 = load8(vk + 24);
    for (int r = 0; r < 2; ++r) {
      const __m256 p = _mm256_broadcast_ss(P + r * ldp + k);
      acc[r][0] = _mm256_fmadd_ps(p, v0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(p, v1, acc[r][1]);
      acc[r][2] = _mm256_fmadd_ps(p, v2, acc[r][2]);
      acc[r][3] = _mm256_fmadd_ps(p, v3, acc[r][3]);
    }
  }
  for (int r = 0; r < nr; ++r)
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(O + r * Dh + 8 * j, acc[r][j]);
}
#endif

// For one row of a score block: mx = max(m_old, s[0..valid)), s[k] = exp(s[k] - mx) for k < valid
// and 0 up to bk, sum = sum of s.
inline void block_softmax(float* s, int64_t valid, int64_t bk, float m_old, float* mx_out, float* sum_out) {
  float mx = m_old;
  int64_t k = 0;
#if defined(__AVX512F__)
  // The tail in one masked step, here and for the exponentials below: a row's last causal block and
  // a compacted block end anywhere, and a scalar exp per key cost a quarter of a decoding step's
  // attention. The max is exact in any order; the sum adds the tail in order, as a scalar loop
  // would (the same bits: exp512 and exp1 are the same arithmetic).
  __m512 vm = _mm512_set1_ps(m_old);
  for (; k + 16 <= valid; k += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + k));
  const __mmask16 tail = __mmask16((1u << (valid - k)) - 1);
  vm = _mm512_mask_max_ps(vm, tail, vm, _mm512_maskz_loadu_ps(tail, s + k));
  k = valid;
  mx = _mm512_reduce_max_ps(vm);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 vm = _mm256_set1_ps(m_old);
  for (; k + 8 <= valid; k += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + k));
  mx = reduce_max256(vm);
#endif
  for (; k < valid; ++k) mx = std::max(mx, s[k]);
  float sum = 0;
  k = 0;
#if defined(__AVX512F__)
  const __m512 vmx = _mm512_set1_ps(mx);
  __m512 vs = _mm512_setzero_ps();
  for (; k + 16 <= valid; k += 16) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + k), vmx));
    _mm512_storeu_ps(s + k, e);
    vs = _mm512_add_ps(vs, e);
  }
  if (k < valid)
    _mm512_mask_storeu_ps(s + k, tail, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + k), vmx)));
  sum = _mm512_reduce_add_ps(vs);
  for (; k < valid; ++k) sum += s[k];
#elif defined(__AVX2__) && defined(__FMA__)
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 vs = _mm256_setzero_ps();
  for (; k + 8 <= valid; k += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + k), vmx));
    _mm256_storeu_ps(s + k, e);
    vs = _mm256_add_ps(vs, e);
  }
  sum = reduce_add256(vs);
#endif
  for (; k < valid; ++k) {
    s[k] = exp1(s[k] - mx);
    sum += s[k];
  }
  std::fill(s + valid, s + bk, 0.0f);
  *mx_out = mx;
  *sum_out = sum;
}

// The cache's keys and values as element type E (float for KvType::F32, uint16_t for F16).
template <class E>
std::pair<const E*, const E*> storage(const LayerKV& kv) {
  if constexpr (std::is_same_v<E, float>)
    return {kv.kt.data(), kv.v.data()};
  else
    return {kv.kt16.data(), kv.v16.data()};
}

// A listed key set's visibility, read in the cache's slot order (softmax does not care about key
// order): slot s is visible to a query at position q when vis[s] <= q (vis[s] is the slot's
// position if listed, else INT32_MAX). Per block of kBlock slots, lo is the least vis and hi the
// greatest: a query before lo sees none of the block, one at or past hi sees all of it, and the
// ones between are masked key by key. So revived tokens appended out of order, and the held keys
// a decoding step leaves out, cost no gather: the tiles read the cache's blocks as they lie.
// compact: the blocks whose keys visible to any query (vis <= last_pos) are at most 3/4 of them are
// gathered first (run_block's comment). Decided for the whole call, never per tile, so a row's
// result does not depend on how the rows were tiled (alone or in a batch).
struct KeyMask {
  const int32_t* vis;
  const int32_t* lo;
  const int32_t* hi;
  bool compact = false;
  int32_t last_pos = 0;
};

// A compacted key block: kc [Dh][ldc] f32 = the block's keys kt [Dh][kBlock] at slots idx[0..n)
// (ascending; `keep` their bits), zero from n to ldc (the score steps' padded lanes). kc has 16
// floats of room past ldc.
template <class E>
void gather_keys(const E* kt, int64_t Dh, const uint8_t* idx, uint64_t keep, int64_t n, int64_t ldc,
                 float* kc) {
  for (int64_t d = 0; d < Dh; ++d) {
    const E* src = kt + d * kBlock;
    float* dst = kc + d * ldc;
#if defined(__AVX512F__)
    (void)idx;
    int64_t at = 0;
    for (int c = 0; c < kBlock / 16; ++c) {
      const __mmask16 mk = __mmask16(keep >> (16 * c));
      if (!mk) continue;
      _mm512_storeu_ps(dst + at, _mm512_maskz_compress_ps(mk, load16(src + 16 * c)));
      at += std::popcount(uint32_t(mk));
    }
#else
    (void)keep;
    for (int64_t j = 0; j < n; ++j) dst[j] = load1(src[idx[j]]);
#endif
    std::fill(dst + n, dst + ldc, 0.0f);
  }
}
// Its values: vc [n][Dh] f32 = v [kBlock][Dh] at rows idx[0..n).
template <class E>
void gather_values(const E* v, int64_t Dh, const uint8_t* idx, int64_t n, float* vc) {
  for (int64_t j = 0; j < n; ++j) {
    const E* src = v + int64_t(idx[j]) * Dh;
    float* dst = vc + j * Dh;
#if defined(__AVX512F__)
    if (Dh % 16 == 0) {
      for (int64_t d = 0; d < Dh; d += 16) _mm512_storeu_ps(dst + d, load16(src + d));
      continue;
    }
#endif
    if constexpr (std::is_same_v<E, float>)
      std::copy(src, src + Dh, dst);
    else
      f16_to_f32_n(src, dst, Dh);
  }
}

// For one row of a score block: s[k] = -inf where vis[k] > pos (a listed key after the query, or one
// not listed), for the n keys of the block.
inline void hide_after(float* s, const int32_t* vis, int32_t pos, int64_t n) {
  int64_t k = 0;
#if defined(__AVX512F__)
  const __m512i vp = _mm512_set1_epi32(pos);
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  for (; k + 16 <= n; k += 16) {
    const __mmask16 after =
        _mm512_cmpgt_epi32_mask(_mm512_loadu_si512(reinterpret_cast<const void*>(vis + k)), vp);
    _mm512_storeu_ps(s + k, _mm512_mask_mov_ps(_mm512_loadu_ps(s + k), after, ninf));
  }
#endif
  for (; k < n; ++k)
    if (vis[k] > pos) s[k] = -INFINITY;
}

// window > 0: a key window or more positions before a row's query is hidden from it (a listed set:
// masked key by key; a prefix set: the row's keys start at TileRow::start).
// Keys [kb0, kb1) of the set (kb0 a multiple of kBlock; kb1 past the end reads to it). part null:
// the rows' outputs are final (every key was in range); else their partial softmax goes to part.
template <class E>
void attention_tile(const TileRow* rows, int nr, const KeySet& keys, int64_t g, float scale,
                    const KeyMask* mask, int32_t window, int64_t kb0, int64_t kb1, const Partial* part) {
  static_assert(kBlock == kKeyBlock, "attention's key blocks are the cache's (read in place)");
  static_assert(kChunkKeys % kBlock == 0, "a key chunk is whole blocks");
  const LayerKV& kv = keys.kv;
  const int64_t Dh = kv.Dh;
  const auto [kt, v] = storage<E>(kv);
  // Keys to read: a prefix of the slots (the longest row's, or every held slot for a listed set).
  int64_t nk = mask ? kv.n : 0;
  if (!mask)
    for (int r = 0; r < nr; ++r) nk = std::max(nk, rows[r].len);
  nk = std::min(nk, kb1);
  // Rows in position order (a tile's rows are token-major; tokens ascend in every pass the engine
  // runs) see a block from some row on, so the rows before it skip the block's work.
  bool ascending = true;
  for (int r = 1; r < nr; ++r) ascending = ascending && rows[r].pos >= rows[r - 1].pos;
  const auto sees_block = [&](int r, int64_t k0) {
    return mask ? rows[r].pos >= mask->lo[k0 / kBlock] : rows[r].len > k0 && rows[r].start < k0 + kBlock;
  };
  // A prefix set's blocks before every row's window are skipped.
  int64_t k_begin = 0;
  if (!mask && window > 0) {
    k_begin = rows[0].start;
    for (int r = 1; r < nr; ++r) k_begin = std::min(k_begin, rows[r].start);
    k_begin = k_begin / kBlock * kBlock;
  }
  k_begin = std::max(k_begin, kb0);

  // Tile-local state: pre-scaled queries, the score block, running max/sum, the output.
  thread_local std::vector<float> qs_buf, o_buf;
  alignas(64) float S[kTileRows * kBlock];
  float m[kTileRows], l[kTileRows];
  const int nr_pad = (nr + kSubRows - 1) / kSubRows * kSubRows;
  qs_buf.assign(size_t(nr_pad * Dh), 0.0f);
  o_buf.assign(size_t(nr * Dh), 0.0f);
  float* qs = qs_buf.data();
  float* O = o_buf.data();
  for (int r = 0; r < nr; ++r) {
    for (int64_t d = 0; d < Dh; ++d) qs[r * Dh + d] = rows[r].q[d] * scale;
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }

  // The work of one key block from the scores to O += P V, for rows r_lo.. (the rows before see
  // none of it): bk keys, kb [Dh][ldk] (transposed, f16 or f32) and vb [bk][Dh]. vis (a listed set)
  // the keys' visibility and hi the greatest of it; idx (a compacted block) each key's slot in the
  // block of kBlock slots at k0, where the scoring row's logits go.
  // nkt, nv: the next block's keys and values to fetch ahead (null: none).
  const auto run_block = [&](const auto* bkt, int64_t ldk, const auto* bv, int64_t bk, int64_t k0, int r_lo,
                             const int32_t* vis, int32_t hi, const uint8_t* idx, const decltype(bkt) nkt,
                             const decltype(bv) nv) {
  // Scores for the block (the keys are zero past the last, so the padded lanes are finite).
#if defined(__AVX512F__)
    const bool vector_scores = Dh <= 256;
#elif defined(__AVX2__) && defined(__FMA__)
    const bool vector_scores = true;
#else
    const bool vector_scores = false;
#endif
    if (vector_scores) {
#if defined(__AVX512F__)
      if (nr - r_lo <= 4 && bk > 32 && ldk >= 64)
        with_rows<4>(nr - r_lo, [&](auto n) {
          scores_step64<decltype(n)::value>(qs + r_lo * Dh, Dh, bkt, ldk, S + r_lo * kBlock, kBlock, nkt);
        });
      else
        for (int64_t s0 = 0; s0 < bk; s0 += 32)
          for (int r0 = r_lo; r0 < nr; r0 += kSubRows)
            scores_rows(nr - r0, qs + r0 * Dh, Dh, bkt + s0, ldk, S + r0 * kBlock + s0, kBlock,
                        nkt && r0 == r_lo ? nkt + s0 : nullptr);
#elif defined(__AVX2__) && defined(__FMA__)
      for (int64_t s0 = 0; s0 < bk; s0 += 16)
        for (int r0 = r_lo; r0 < nr; r0 += 4)
          scores_step_avx2(qs + r0 * Dh, Dh, bkt + s0, ldk, S + r0 * kBlock + s0, kBlock,
                           nkt && r0 == r_lo ? nkt + s0 : nullptr);
#endif
    } else {
      // Without AVX2 (or with AVX-512 past width 256): an axpy per dimension over the contiguous
      // keys of the block, which the compiler vectorises; each score still sums over d in order.
      for (int r = r_lo; r < nr; ++r) {
        float* sr = S + r * kBlock;
        std::fill(sr, sr + bk, 0.0f);
        for (int64_t d = 0; d < Dh; ++d) {
          const float qd = qs[r * Dh + d];
          const auto* kr = bkt + d * ldk;
#pragma omp simd
          for (int64_t k = 0; k < bk; ++k) sr[k] += qd * load1(kr[k]);
        }
      }
    }
    // Online softmax: keys a row does not see get P = 0 (a prefix set: those at or past its
    // length; a listed set: those its mask hides, set to -inf, whose exp is 0).
    for (int r = r_lo; r < nr; ++r) {
      float* sr = S + r * kBlock;
      int64_t valid = 0;
      if (!mask) {
        valid = std::clamp<int64_t>(rows[r].len - k0, 0, bk);
        const int64_t before = rows[r].start - k0;  // keys of the block before the row's window
        if (before >= valid)
          valid = 0;
        else
          for (int64_t k = 0; k < before; ++k) sr[k] = -INFINITY;
      } else if (sees_block(r, k0)) {
        valid = bk;
        if (window > 0) {
          int64_t seen = 0;
          for (int64_t k = 0; k < bk; ++k) {
            const int32_t p = vis[k];
            if (p > rows[r].pos || int64_t(rows[r].pos) - p >= window)
              sr[k] = -INFINITY;
            else
              ++seen;
          }
          if (seen == 0) valid = 0;
        } else if (rows[r].pos < hi) {
          hide_after(sr, vis, rows[r].pos, bk);
        }
      }
      if (rows[r].logits) {  // the scoring row's logits, before the softmax overwrites them
        float* lg = rows[r].logits + k0;
        if (idx) {
          std::fill(lg, lg + std::min<int64_t>(kBlock, nk - k0), -INFINITY);
          for (int64_t k = 0; k < valid; ++k) lg[idx[k]] = sr[k];
        } else {
          std::copy(sr, sr + valid, lg);
          std::fill(lg + valid, lg + bk, -INFINITY);
        }
      }
      if (valid == 0) {
        std::fill(sr, sr + bk, 0.0f);
        continue;
      }
      float mx, sum;
      block_softmax(sr, valid, bk, m[r], &mx, &sum);
      if (mx != m[r]) {
        const float c = m[r] == -INFINITY ? 0.0f : std::exp(m[r] - mx);
        l[r] *= c;
        for (int64_t d = 0; d < Dh; ++d) O[r * Dh + d] *= c;
        m[r] = mx;
      }
      l[r] += sum;
    }
    // O += P V for the block.
#if defined(__AVX512F__)
    if (Dh % 64 == 0) {  // 64 (SmolLM2), 128 (Llama): before, 128 took the scalar loop below at 1/6 the speed
      for (int r0 = r_lo; r0 < nr; r0 += 4)
        for (int64_t d0 = 0; d0 < Dh; d0 += 64)
          pv_rows(nr - r0, S + r0 * kBlock, kBlock, bv + d0, Dh, bk, O + r0 * Dh + d0,
                  nv && r0 == r_lo ? nv + d0 : nullptr);
      return;
    }
#elif defined(__AVX2__) && defined(__FMA__)
    if (Dh % 32 == 0) {
      for (int r0 = r_lo; r0 < nr; r0 += 2)
        for (int64_t d0 = 0; d0 < Dh; d0 += 32)
          pv_step32_avx2(S + r0 * kBlock, kBlock, bv + d0, Dh, bk, O + r0 * Dh + d0, std::min(2, nr - r0),
                         nv && r0 == r_lo ? nv + d0 : nullptr);
      return;
    }
#endif
    for (int r = r_lo; r < nr; ++r)
      for (int64_t k = 0; k < bk; ++k) {
        const float p = S[r * kBlock + k];
        const auto* vk = bv + k * Dh;
        for (int64_t d = 0; d < Dh; ++d) O[r * Dh + d] += p * load1(vk[d]);
      }
  };

  // A listed set's block whose visible keys are few, for many rows (a decoding step's revived
  // rows past a pruning layer, where the step lists 34-70% of the held keys): its visible keys and
  // values gathered into f32 first, so the rows' scores and P V skip the hidden ones. For a few rows
  // the gather would cost more than the work it saves (KeyMask::compact).
  thread_local std::vector<float> kc_buf, vc_buf;
  const bool may_compact = mask && mask->compact && window == 0;
  if (may_compact) {
    kc_buf.resize(size_t(Dh * kBlock + 16));
    vc_buf.resize(size_t(kBlock * Dh));
  }

  for (int64_t k0 = k_begin; k0 < nk; k0 += kBlock) {
    const int64_t bk = std::min<int64_t>(kBlock, nk - k0);  // keys used in this block
    int r_lo = 0;                                           // rows before r_lo see none of it
    if (ascending)
      while (r_lo < nr && !sees_block(r_lo, k0)) ++r_lo;
    if (r_lo == nr) continue;
    // From a whole row step (the row buffers are padded to kSubRows); the rows before the true
    // r_lo get valid == 0 below.
    r_lo = r_lo / kRowStep * kRowStep;
    const E* bkt = kt + kv.kt_index(g, 0, k0);  // [Dh][kBlock]
    const E* bv = v + kv.v_index(g, k0);        // [bk][Dh]
    if (may_compact) {
      uint8_t idx[kBlock];
      int32_t vis[kBlock];
      int64_t n_vis = 0;
      uint64_t keep = 0;
      int32_t hi = std::numeric_limits<int32_t>::min();
      for (int64_t k = 0; k < bk; ++k)
        if (mask->vis[k0 + k] <= mask->last_pos) {
          keep |= uint64_t(1) << k;
          idx[n_vis] = uint8_t(k);
          vis[n_vis++] = mask->vis[k0 + k];
          hi = std::max(hi, mask->vis[k0 + k]);
        }
      if (n_vis == 0) continue;
      if (n_vis * 4 <= bk * 3) {
        const int64_t ldc = (n_vis + 31) / 32 * 32;  // whole 32-key score steps, zero past n_vis
        gather_keys(bkt, Dh, idx, keep, n_vis, ldc, kc_buf.data());
        gather_values(bv, Dh, idx, n_vis, vc_buf.data());
        run_block(kc_buf.data(), ldc, vc_buf.data(), n_vis, k0, r_lo, vis, hi, idx, nullptr, nullptr);
        continue;
      }
    }
    // The next block's keys and values (whole: any of its keys may be read), fetched during this one.
    const bool next = k0 + kBlock < nk;
    run_block(bkt, kBlock, bv, bk, k0, r_lo, mask ? mask->vis + k0 : nullptr,
              mask ? mask->hi[k0 / kBlock] : 0, nullptr, next ? kt + kv.kt_index(g, 0, k0 + kBlock) : nullptr,
              next ? v + kv.v_index(g, k0 + kBlock) : nullptr);
  }
  if (part) {
    std::copy(m, m + nr, part->m);
    std::copy(l, l + nr, part->l);
    std::copy(O, O + nr * Dh, part->O);
    return;
  }
  for (int r = 0; r < nr; ++r) {
    const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
    for (int64_t d = 0; d < Dh; ++d) rows[r].o[d] = O[r * Dh + d] * inv;
  }
}
}  // namespace

namespace {
// One head's share of the scores: p [n] its logits over the set's keys (in the set's order), turned
// into its softmax, and scores[k] += p[k] / H.
void add_head_scores(float* p, int64_t n, int64_t H, float* scores) {
  float mx, sum;
  block_softmax(p, n, n, -INFINITY, &mx, &sum);
  const float w = 1.0f / (sum * float(H));
#pragma omp simd
  for (int64_t k = 0; k < n; ++k) scores[k] += p[k] * w;
}

// Head h's logits over the set's keys, in the set's order, from its logits per held slot.
void set_logits(const float* per_slot, const KeySet& keys, float* p) {
  const int64_t n = keys.size();
  if (keys.slots.empty())
    std::copy(per_slot, per_slot + n, p);
  else
    for (int64_t k = 0; k < n; ++k) p[k] = per_slot[keys.slots[size_t(k)]];
}

template <class E>
void last_row_scores_t(const float* q, const KeySet& keys, int64_t H, float* scores, float scale,
                       int32_t q_pos, int32_t window) {
  const LayerKV& kv = keys.kv;
  const int64_t Hkv = kv.Hkv, Dh = kv.Dh, group = H / Hkv, n_keys = keys.size();
  // Logits are computed for every held slot, contiguously (an axpy per dimension over each key
  // block, once for all of a kv group's heads), and a listed key set then picks its slots: one
  // gather per key and head instead of one per key, head and dimension. The listed keys are most
  // of the held ones (decoding keeps >= 1/3 of them).
  const int64_t n_held = keys.slots.empty() ? n_keys : kv.n;
  std::vector<float> logit(static_cast<size_t>(group * n_held)), p(static_cast<size_t>(n_keys));
  std::vector<float> row(static_cast<size_t>(kKeyBlock));
  std::fill(scores, scores + n_keys, 0.0f);
  const E* kt = storage<E>(kv).first;
  for (int64_t g = 0; g < Hkv; ++g) {
    std::fill(logit.begin(), logit.end(), 0.0f);
    for (int64_t k0 = 0; k0 < n_held; k0 += kKeyBlock) {
      const int64_t bk = std::min(kKeyBlock, n_held - k0);
      for (int64_t d = 0; d < Dh; ++d) {
        const E* src = kt + kv.kt_index(g, d, k0);
        const float* r = reinterpret_cast<const float*>(src);
        if constexpr (!std::is_same_v<E, float>) {
          f16_to_f32_n(src, row.data(), bk);
          r = row.data();
        }
        for (int64_t i = 0; i < group; ++i) {
          const float qd = q[(g * group + i) * Dh + d] * scale;
          float* lg = logit.data() + i * n_held + k0;
#pragma omp simd
          for (int64_t k = 0; k < bk; ++k) lg[k] += qd * r[k];
        }
      }
    }
    // The heads in order, as the scores sum them.
    for (int64_t i = 0; i < group; ++i) {
      set_logits(logit.data() + i * n_held, keys, p.data());
      if (window > 0)  // keys the last row's window leaves out get no attention
        for (int64_t k = 0; k < n_keys; ++k) {
          const int32_t kp = kv.pos[size_t(keys.slots.empty() ? k : keys.slots[size_t(k)])];
          if (int64_t(q_pos) - kp >= window) p[size_t(k)] = -INFINITY;
        }
      add_head_scores(p.data(), n_keys, H, scores);
    }
  }
}
}  // namespace

void last_row_scores(const float* q, const KeySet& keys, int64_t H, float* scores, float scale, int32_t q_pos,
                     int32_t window) {
  if (scale <= 0) scale = 1.0f / std::sqrt(float(keys.kv.Dh));
  if (keys.kv.type == KvType::F16)
    last_row_scores_t<uint16_t>(q, keys, H, scores, scale, q_pos, window);
  else
    last_row_scores_t<float>(q, keys, H, scores, scale, q_pos, window);
}

void last_row_scores_from_logits(const float* logits, const KeySet& keys, int64_t H, float* scores) {
  const int64_t n = keys.size();
  std::vector<float> p(static_cast<size_t>(n));
  std::fill(scores, scores + n, 0.0f);
  for (int64_t h = 0; h < H; ++h) {
    set_logits(logits + h * keys.kv.n, keys, p.data());
    add_head_scores(p.data(), n, H, scores);
  }
}

void attention(CpuContext& ctx, const float* q, int64_t ldq, const int32_t* q_pos, int64_t T,
               const KeySet& keys, int64_t H, float* out, int64_t ldo, float scale, int32_t window,
               float* last_row_logits) {
  const LayerKV& kv = keys.kv;
  const int64_t Hkv = kv.Hkv, Dh = kv.Dh, group = H / Hkv;
  if (keys.slots.empty() && !kv.sorted)
    fail("attention: the KV cache is not in position order; pass its slots");
  if (scale <= 0) scale = 1.0f / std::sqrt(float(Dh));
  // A prefix set: the keys visible to each query are those with position <= its own, a prefix
  // (from the first inside its window, with one). A listed set: a mask over the held slots (KeyMask).
  std::vector<int64_t> len(static_cast<size_t>(T)), start(static_cast<size_t>(T), 0);
  std::vector<int32_t> vis, lo, hi;
  KeyMask mask{};
  const bool listed = !keys.slots.empty();
  if (!listed) {
    const int32_t* kp = kv.pos.data();
    for (int64_t t = 0; t < T; ++t) {
      len[size_t(t)] = std::upper_bound(kp, kp + kv.n, q_pos[t]) - kp;
      if (window > 0)
        start[size_t(t)] = std::upper_bound(kp, kp + kv.n, int64_t(q_pos[t]) - window,
                                            [](int64_t a, int32_t b) { return a < b; }) -
                           kp;
    }
  } else {
    constexpr int32_t kHidden = std::numeric_limits<int32_t>::max();
    vis.assign(size_t(kv.n), kHidden);
    for (const int32_t sl : keys.slots) vis[size_t(sl)] = kv.pos[size_t(sl)];
    const int64_t nb = (kv.n + kBlock - 1) / kBlock;
    lo.assign(size_t(nb), kHidden);
    hi.assign(size_t(nb), std::numeric_limits<int32_t>::min());
    for (int64_t b = 0; b < nb; ++b) {  // a block's least and greatest (vectorised)
      const int32_t* vb = vis.data() + b * kBlock;
      const int64_t n = std::min<int64_t>(kBlock, kv.n - b * kBlock);
      int32_t l = kHidden, h = std::numeric_limits<int32_t>::min();
#pragma omp simd reduction(min : l) reduction(max : h)
      for (int64_t s = 0; s < n; ++s) {
        l = std::min(l, vb[s]);
        h = std::max(h, vb[s]);
      }
      lo[size_t(b)] = l;
      hi[size_t(b)] = h;
    }
    mask = {vis.data(), lo.data(), hi.data()};
    mask.compact = window == 0 && T * group >= kCompactRows;
    mask.last_pos = *std::max_element(q_pos, q_pos + T);
  }
  const int64_t rows_per_group = T * group;
  // Few rows: split the keys (kChunkKeys each; one chunk when they are fewer). Else, or when that
  // still leaves fewer than two work items per thread, split the rows: a row's result is the same
  // in any row tile, and a split tile reads its group's keys again, so inside side_by_side (the
  // members of a batch, every thread busy already) the rows are not split.
  int64_t n_read = listed ? kv.n : 0;  // the slots the tiles read
  if (!listed)
    for (int64_t t = 0; t < T; ++t) n_read = std::max(n_read, len[size_t(t)]);
  const int64_t chunks =
      rows_per_group <= kTileRows ? std::max<int64_t>(1, (n_read + kChunkKeys - 1) / kChunkKeys) : 1;
  int64_t tile_rows = kTileRows;
  while (tile_rows > 1 &&
         Hkv * chunks * ((rows_per_group + tile_rows - 1) / tile_rows) < 2 * ctx.split_threads())
    tile_rows /= 2;
  const int64_t tiles_per_group = (rows_per_group + tile_rows - 1) / tile_rows;
  const KeyMask* mk = listed ? &mask : nullptr;
  // The chunks' partial softmaxes: [group][tile][chunk] blocks of tile_rows rows (m, l, O).
  const int64_t part_rows = chunks > 1 ? Hkv * tiles_per_group * chunks * tile_rows : 0;
  std::vector<float> part_m(static_cast<size_t>(part_rows)), part_l(static_cast<size_t>(part_rows));
  std::vector<float> part_o(static_cast<size_t>(part_rows * Dh));
  const auto rows_of = [&](int64_t g, int64_t tile, TileRow* rows) {
    int nr = 0;
    for (int64_t i = tile * tile_rows; i < std::min(rows_per_group, (tile + 1) * tile_rows); ++i) {
      const int64_t t = i / group, h = g * group + i % group;
      float* lg = last_row_logits && t == T - 1 ? last_row_logits + h * kv.n : nullptr;
      rows[nr++] = {
          q + t * ldq + h * Dh, out + t * ldo + h * Dh, len[size_t(t)], start[size_t(t)], q_pos[t], lg};
    }
    return nr;
  };
  if (last_row_logits) std::fill(last_row_logits, last_row_logits + H * kv.n, -INFINITY);
  ctx.run([&] {
    // Largest tiles (latest queries) first, so the causal imbalance evens out at the end.
    tbb::parallel_for(int64_t(0), Hkv * tiles_per_group * chunks, [&](int64_t w) {
      const int64_t c = w % chunks, g = (w / chunks) % Hkv;
      const int64_t tile = tiles_per_group - 1 - w / (chunks * Hkv);
      TileRow rows[kTileRows];
      const int nr = rows_of(g, tile, rows);
      Partial part{}, *pp = nullptr;
      if (chunks > 1) {
        const int64_t at = ((g * tiles_per_group + tile) * chunks + c) * tile_rows;
        part = {part_m.data() + at, part_l.data() + at, part_o.data() + at * Dh};
        pp = &part;
      }
      const int64_t kb0 = c * kChunkKeys, kb1 = chunks > 1 ? kb0 + kChunkKeys : n_read;
      if (kv.type == KvType::F16)
        attention_tile<uint16_t>(rows, nr, keys, g, scale, mk, window, kb0, kb1, pp);
      else
        attention_tile<float>(rows, nr, keys, g, scale, mk, window, kb0, kb1, pp);
    });
  });
  if (chunks == 1) return;
  // The merge: out = sum_c O_c e^(m_c - M) / sum_c l_c e^(m_c - M), M the greatest m_c (the rows
  // no key is visible to stay 0, as a tile leaves them).
  for (int64_t g = 0; g < Hkv; ++g)
    for (int64_t tile = 0; tile < tiles_per_group; ++tile) {
      TileRow rows[kTileRows];
      const int nr = rows_of(g, tile, rows);
      const int64_t at = (g * tiles_per_group + tile) * chunks * tile_rows;
      for (int r = 0; r < nr; ++r) {
        float M = -INFINITY;
        for (int64_t c = 0; c < chunks; ++c) M = std::max(M, part_m[size_t(at + c * tile_rows + r)]);
        float* o = rows[r].o;
        std::fill(o, o + Dh, 0.0f);
        if (M == -INFINITY) continue;
        float L = 0;
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t i = at + c * tile_rows + r;
          if (part_m[size_t(i)] == -INFINITY) continue;
          const float f = std::exp(part_m[size_t(i)] - M);
          L += part_l[size_t(i)] * f;
          const float* oc = part_o.data() + i * Dh;
          for (int64_t d = 0; d < Dh; ++d) o[d] += oc[d] * f;
        }
        const float inv = L > 0 ? 1.0f / L : 0.0f;
        for (int64_t d = 0; d < Dh; ++d) o[d] *= inv;
      }
    }
}

}  // namespace lp
