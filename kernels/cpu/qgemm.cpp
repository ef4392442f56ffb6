#include "kernels/cpu/qgemm.h"

#include <cpuid.h>
#include <immintrin.h>
#include <tbb/blocked_range2d.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/cpu/amx.h"
#include "kernels/cpu/qgemm_blocks.h"
#include "kernels/cpu/qgemm_kernels.h"
#include "model/error.h"

// The dispatcher of the integer GEMM (qgemm.h): the scalar twin, activation quantization, the
// kernels' choice by CPU and shape, their tasks over the context's threads and each task's working
// memory. The kernels themselves: qgemm_avx2.cpp and qgemm_avx512.cpp (qgemm_kernels.h).
namespace lp {

using namespace qk;  // the block formats (qgemm_blocks.h)

namespace {
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

// The reference arithmetic of every kernel (qgemm.h): per block, and per 16-element half for Q6_K,
// the exact integer dot product and one fused multiply-add with the scale d_w * d_a (rounded once),
// then for the types with a minimum one fused multiply-add of m_w with s_a, all into a single
// accumulator in block order.
// The K-quants' (qgemm.h): per super-block sum_j sc_j x dot_j as f32 multiply-adds in block order
// (and the exact sum_j mn_j x sum(q_j)), then its f32 steps. The activations carry one scale per super-block
// (quantize_activations_super): block 8i's d is the super-block's.
float dot_scalar_k(GgmlType t, const uint8_t* w_row, const QActBlock* a, int64_t nb) {
  const int S = n_scales(t), len = kQBlock / S;
  float acc = 0;
  int8_t w[kQBlock];
  for (int64_t sb = 0; sb < nb / 8; ++sb) {
    float fsum = 0;
    int32_t msum = 0;
    for (int64_t b = 8 * sb; b < 8 * sb + 8; ++b) {
      decode_scalar(t, w_row, b, w);
      const KScale ks = kblock_scale(t, w_row, b);
      for (int h = 0; h < S; ++h) {
        int32_t s = 0;
        for (int j = h * len; j < (h + 1) * len; ++j) s += int32_t(w[j]) * int32_t(a[b].q[j]);
        fsum = std::fma(float(s), float(ks.sc[h]), fsum);
      }
      msum += ks.mn * a[b].sum;
    }
    const SuperScale ss = super_scale(t, w_row, sb, f16_to_f32);
    const float da = a[8 * sb].d;
    acc = std::fma(fsum, ss.d * da, acc);
    if (block_has_min(t)) acc = std::fma(float(msum), -(ss.dmin * da), acc);
  }
  return acc;
}

float dot_scalar(GgmlType t, const uint8_t* w_row, const QActBlock* a, int64_t nb) {
  if (is_kquant(t)) return dot_scalar_k(t, w_row, a, nb);
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
// The block's values at the scale of a largest magnitude amax (the block's own, or its
// super-block's); finite: all of them (and amax) are.
void quantize_block_at(const float* v, float amax, bool finite, QActBlock& o) {
  if (!finite) {
    o.d = o.s = std::numeric_limits<float>::quiet_NaN();
    o.sum = 0;
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
  o.sum = sum;
  o.s = o.d * float(sum);
}
void largest(const float* v, int64_t n, float& amax, bool& finite) {
  amax = 0;
  finite = true;
  for (int64_t j = 0; j < n; ++j) {
    amax = std::max(amax, std::fabs(v[j]));
    finite = finite && std::isfinite(v[j]);
  }
}
void quantize_block_scalar(const float* v, QActBlock& o) {
  float amax = 0;
  bool finite = true;
  largest(v, kQBlock, amax, finite);
  quantize_block_at(v, amax, finite, o);
}
}  // namespace

#if defined(__AVX512F__) && defined(__AVX512BW__)
namespace {
// quantize_block_at in vectors for finite values (each value's product and rounding are the scalar
// ones, the integer sum exact in any order): the same bits.
inline void quantize_block_vec(const float* v, float amax, QActBlock& o) {
  static_assert(kQBlock == 32);
  o.d = amax / 127.f;
  const __m512 id = _mm512_set1_ps(inverse_scale(amax));
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  const auto q = [&](__m512 a) {
    const __m512 r =
        _mm512_roundscale_ps(_mm512_mul_ps(a, id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(r), lo), hi);
  };
  const __m512i q0 = q(_mm512_loadu_ps(v)), q1 = q(_mm512_loadu_ps(v + 16));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o.q), _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o.q + 16), _mm512_cvtepi32_epi8(q1));
  o.sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
  o.s = o.d * float(o.sum);
}
}  // namespace
#endif

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
    quantize_block_vec(v, _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a0), _mm512_abs_ps(a1))), o);
#else
    quantize_block_scalar(v, o);
#endif
  }
}

void quantize_activations_super(const float* x, int64_t K, QActBlock* out) {
  if (K % kQSuper != 0) fail("quantize_activations_super: {} values are not a multiple of {}", K, kQSuper);
  constexpr int64_t per = kQSuper / kQBlock;
  for (int64_t sb = 0; sb < K / kQSuper; ++sb) {
    const float* v = x + sb * kQSuper;
    float amax = 0;
    bool finite = true;
#if defined(__AVX512F__)
    __m512 m = _mm512_setzero_ps();
    __mmask16 ok = 0xffff;
    for (int64_t i = 0; i < kQSuper; i += 16) {
      const __m512 a = _mm512_loadu_ps(v + i);
      ok &= _mm512_cmp_ps_mask(_mm512_sub_ps(a, a), _mm512_setzero_ps(), _CMP_EQ_OQ);  // x - x: 0 iff finite
      m = _mm512_max_ps(m, _mm512_abs_ps(a));
    }
    amax = _mm512_reduce_max_ps(m);
    finite = ok == 0xffff;
#else
    largest(v, kQSuper, amax, finite);
#endif
    for (int64_t b = 0; b < per; ++b) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
      if (finite) {
        quantize_block_vec(v + b * kQBlock, amax, out[sb * per + b]);
        continue;
      }
#endif
      quantize_block_at(v + b * kQBlock, amax, finite, out[sb * per + b]);
    }
    for (int64_t b = 0; b < per; b += 2) {
      QActBlock* o = out + sb * per + b;
      o->pair = act_sum_pair(o[0].sum, o[1].sum);
    }
  }
}

void quantize_activations_for(GgmlType t, const float* x, int64_t K, QActBlock* out) {
  if (qk::is_kquant(t))
    quantize_activations_super(x, K, out);
  else
    quantize_activations(x, K, out);
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
    case QKernel::Amx:
      return "amx-int8";
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
    case QKernel::Amx:
      return detect(QKernel::Avx512Vnni512) && amx_int8_usable();
  }
  return false;
}
}  // namespace

QKernel qkernel_cap(const char* v) {
  if (!v) return QKernel::Amx;
  std::string s(v);
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (s == "SSE41" || s == "AVX") return QKernel::Scalar;
  if (s == "AVX2" || s == "AVX2_VNNI" || s == "AVX2_VNNI_2" || s == "AVX512_CORE") return QKernel::Avx2;
  if (s == "AVX512_CORE_VNNI" || s == "AVX512_CORE_BF16" || s == "AVX512_CORE_FP16" || s == "AVX10_1_512")
    return QKernel::Avx512Vnni512;
  return QKernel::Amx;
}

// Asked on every GEMM (check), so detected once: cpuid traps to the hypervisor in a virtual machine,
// and asking each time cost 14 us a call here, more than a decoding step's 576 x 576 GEMM itself.
bool qkernel_supported(QKernel k) {
  static const QKernel cap = qkernel_cap(std::getenv("ONEDNN_MAX_CPU_ISA"));
  static const bool supported[] = {detect(QKernel::Scalar), detect(QKernel::Avx2),
                                   detect(QKernel::Avx512Vnni), detect(QKernel::Avx512Vnni512),
                                   detect(QKernel::Amx)};
  return supported[int(k)] && int(k) <= int(cap);  // the enum's order (qgemm.h)
}

QKernel best_qkernel() {
  // Not Amx: it measured no faster than the VNNI panels on Q4_K_M's types (docs/cpu-kernels.md).
  static const QKernel k = qkernel_supported(QKernel::Avx512Vnni512) ? QKernel::Avx512Vnni512
                           : qkernel_supported(QKernel::Avx2)        ? QKernel::Avx2
                                                                     : QKernel::Scalar;
  return k;
}

bool qkernel_uses_panels(QKernel k) {
  return k == QKernel::Avx2 || k == QKernel::Avx512Vnni512 || k == QKernel::Amx;
}

std::vector<QKernel> supported_qkernels() {
  std::vector<QKernel> v;
  for (QKernel k :
       {QKernel::Scalar, QKernel::Avx2, QKernel::Avx512Vnni, QKernel::Avx512Vnni512, QKernel::Amx})
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
// Fewer rows than this run the decoding tiles under the 512-bit and AVX2 kernels where the part is
// not packed at load (a packed part's panels are read as packed). Packing per call does not pay at 8 rows:
// BM_QGemm Q4_1 8 x 576 x 3072 took 0.19 ms packing per call, 0.14-0.22 ms in the tiles (2026-11-26, AMD
// EPYC); packed at load, 0.06-0.08 ms (BM_QGemmPacked).
constexpr int64_t kPanelMinRows = 16;
void check(QKernel k, GgmlType t) {
  if (!qgemm_supports(t)) fail("the integer GEMM does not multiply {} weights", type_info(uint32_t(t))->name);
  if (!qkernel_supported(k)) fail("this CPU cannot run the {} integer kernel", qkernel_name(k));
}

// This thread's working memory for one task of a kernel (CpuContext::scratch); none asked, none
// looked up (a decoding step runs hundreds of tasks of a few microseconds).
qk::Scratchpad take(CpuContext& ctx, const qk::ScratchSize& z) {
  qk::Scratchpad s;
  if (z.weight_bytes > 0) s.w = ctx.scratch<uint8_t>(Scratch::QWeights, z.weight_bytes);
  if (z.scales > 0) s.d = ctx.scratch<float>(Scratch::QScales, z.scales);
  if (z.mins > 0) s.mins = ctx.scratch<float>(Scratch::QMins, z.mins);
  return s;
}
}  // namespace

float qdot(QKernel k, GgmlType t, const void* w_row, const QActBlock* a, int64_t nblocks) {
  check(k, t);
  const auto* w = static_cast<const uint8_t*>(w_row);
  if (k == QKernel::Scalar) return dot_scalar(t, w, a, nblocks);
  // One output by the 256-bit tiles (the 512-bit kernel's too: one row never fills a panel).
  const qk::ScratchSize z = qk::tiles_scratch(t, nblocks, 1);
  std::vector<float> d(size_t(z.scales)), mins(size_t(z.mins));
  const qk::Scratchpad s{nullptr, d.data(), mins.data()};
  float c = 0;
  if (k == QKernel::Avx2)
    qk::avx2::tiles(t, w, 0, a, nblocks, 0, 1, 0, 1, &c, 1, s);
  else
    qk::avx512::tiles(t, w, 0, a, nblocks, 0, 1, 0, 1, &c, 1, s);
  return c;
}

namespace {
// The quantized rows q [M][nb] as the AMX kernel reads them (qk::avx512::TileRows), in this
// thread's scratch.
qk::avx512::TileRows tile_rows(CpuContext& ctx, const QActBlock* q, int64_t M, int64_t nb, Scratch slot) {
  qk::avx512::TileRows r;
  r.Mp = (M + qk::avx512::kAmxRows - 1) / qk::avx512::kAmxRows * qk::avx512::kAmxRows;
  const int64_t n = r.Mp * nb;
  auto* base = ctx.scratch<uint8_t>(slot, n * (kQBlock + 4 + 4 + 4));
  r.q = reinterpret_cast<int8_t*>(base);
  r.d = reinterpret_cast<float*>(base + n * kQBlock);
  r.s = r.d + n;
  r.sum = reinterpret_cast<int32_t*>(r.s + n);
  ctx.run([&] {
    tbb::parallel_for(int64_t(0), nb, [&](int64_t b) {
      for (int64_t m = 0; m < r.Mp; ++m) {
        const QActBlock z{}, &a = m < M ? q[m * nb + b] : z;
        std::memcpy(r.q + (b * r.Mp + m) * kQBlock, a.q, kQBlock);
        r.d[b * r.Mp + m] = a.d;
        r.s[b * r.Mp + m] = a.s;
        r.sum[b * r.Mp + m] = a.sum;
      }
    });
  });
  return r;
}

// One part's outputs from the quantized rows q [M][nb] (C already offset to its first column);
// tiles: the same rows for the AMX kernel, or null.
void run_part(CpuContext& ctx, QKernel k, const QPart& part, const QActBlock* q, int64_t M, int64_t nb,
              const qk::avx512::TileRows* tiles, float* C, int64_t ldc) {
  const GgmlType t = part.type;
  const uint8_t* w = part.data;
  const int64_t N = part.rows, row_bytes = *type_bytes(t, nb * kQBlock);
  const bool v512 = k == QKernel::Avx512Vnni512 || k == QKernel::Amx;
  if (k == QKernel::Scalar || k == QKernel::Avx512Vnni) {
    ctx.run([&] {
      // Chunks of 64 rows x 64 outputs: a chunk's weight and activation rows stay in L2.
      tbb::parallel_for(tbb::blocked_range2d<int64_t>(0, M, 64, 0, N, 64),
                        [&](const tbb::blocked_range2d<int64_t>& r) {
                          const int64_t m0 = r.rows().begin(), m1 = r.rows().end(), n0 = r.cols().begin(),
                                        n1 = r.cols().end();
                          if (k == QKernel::Avx512Vnni)
                            return qk::avx512::tiles(t, w, row_bytes, q, nb, m0, m1, n0, n1, C, ldc,
                                                     take(ctx, qk::tiles_scratch(t, nb, n1 - n0)));
                          for (int64_t m = m0; m < m1; ++m)
                            for (int64_t n = n0; n < n1; ++n)
                              C[m * ldc + n] = dot_scalar(t, w + n * row_bytes, q + m * nb, nb);
                        });
    });
    return;
  }
  // The panel and decoding kernels: -offset x each activation block's sum, for the types they
  // multiply unsigned.
  const int64_t S = n_scales(t);
  const int off = v512 ? qk::avx512::offset(t) : qk::avx2::offset(t);
  int32_t* bs = ctx.scratch<int32_t>(Scratch::QBias, M * nb * S);
  if (qkernel_uses_panels(k) && part.packed) {
    const QPacked& P = *part.packed;
    if (P.type != t || P.N != N || P.nb != nb)
      internal_fail("qgemm: a packed part does not match its blocks");
    if (off != 0 && !tiles)
      for (int64_t m = 0; m < M; ++m) activation_bias(t, off, q + m * nb, nb, bs + m * nb * S);
    const bool wide = M >= kPanelMinRows;
    ctx.run([&] {
      tbb::parallel_for(int64_t(0), (N + qk::avx512::kPanel - 1) / qk::avx512::kPanel, [&](int64_t p) {
        if (v512)
          qk::avx512::packed(P, p, q, bs, M, wide, tiles, C, ldc,
                             take(ctx, qk::avx512::packed_scratch(P, wide, tiles)));
        else
          qk::avx2::packed(P, p, q, bs, M, wide, C, ldc, take(ctx, qk::avx2::packed_scratch(P, wide)));
      });
    });
    return;
  }
  if (M < kPanelMinRows) {
    if (off != 0 || S > 1)  // the decoding tiles read Q6_K's per half, offset or not
      for (int64_t m = 0; m < M; ++m) activation_bias(t, off, q + m * nb, nb, bs + m * nb * S);
    ctx.run([&] {
      tbb::parallel_for(int64_t(0), (N + qk::kGemvOut - 1) / qk::kGemvOut, [&](int64_t i) {
        const int64_t n0 = i * qk::kGemvOut;
        const int cnt = int(std::min<int64_t>(qk::kGemvOut, N - n0));
        const qk::Scratchpad s = take(ctx, qk::gemv_scratch(t, nb));
        if (v512)
          qk::avx512::gemv(t, w, row_bytes, q, bs, nb, M, N, n0, cnt, C, ldc, s);
        else
          qk::avx2::gemv(t, w, row_bytes, q, bs, nb, M, N, n0, cnt, C, ldc, s);
      });
    });
    return;
  }
  const int64_t width = v512 ? qk::avx512::kPanel : qk::avx2::kPanel;
  ctx.run([&] {
    if (off != 0 && !tiles)
      tbb::parallel_for(int64_t(0), M,
                        [&](int64_t m) { activation_bias(t, off, q + m * nb, nb, bs + m * nb * S); });
    // One task per panel of outputs, each over every row.
    tbb::parallel_for(int64_t(0), (N + width - 1) / width, [&](int64_t p) {
      const int64_t n0 = p * width;
      const int cnt = int(std::min(width, N - n0));
      if (v512)
        qk::avx512::panel(t, w, row_bytes, q, bs, nb, M, n0, cnt, C, ldc, tiles,
                          take(ctx, qk::avx512::panel_scratch(t, nb)));
      else
        qk::avx2::panel(t, w, row_bytes, q, bs, nb, M, n0, cnt, C, ldc,
                        take(ctx, qk::avx2::panel_scratch(t, nb)));
    });
  });
}
}  // namespace

std::shared_ptr<const QPacked> qpack(CpuContext& ctx, GgmlType t, const uint8_t* W, int64_t N, int64_t K) {
  if (!qkernel_supported(QKernel::Avx2) || !packs(t) || K % kQBlock != 0 || N <= 0) return {};
  const bool kq = is_kquant(t);
  if (kq && K % 256 != 0) return {};
  using qk::avx512::kLanes, qk::avx512::kNV, qk::avx512::kPanel;
  auto P = std::make_shared<QPacked>();
  const bool nibbles = t != GgmlType::Q8_0;
  const int planes = high_planes(t);
  const int64_t nb = K / kQBlock, panels = (N + kPanel - 1) / kPanel, row_bytes = *type_bytes(t, K);
  const qk::KPanelLayout L = qk::kpanel_layout(t, kLanes, kNV);
  P->type = t, P->N = N, P->nb = nb;
  // Where a block past the last would start (less the super-block head it would find first).
  P->panel_bytes = qk::packed_block_offset(t, kLanes, kNV, nb) - (kq ? L.head : 0);
  // Not zeroed here: each panel's task zeroes its own, so the pages are touched in parallel.
  P->w.resize(panels * P->panel_bytes, false);
  if (!kq) P->d.resize(panels * nb * kPanel);
  if (!kq && block_has_min(t)) P->m.resize(panels * nb * kPanel);
  const auto put = [](uint8_t* at, uint32_t word) {  // ORs a lane's 4 bytes in
    uint32_t was;
    std::memcpy(&was, at, 4);
    was |= word;
    std::memcpy(at, &was, 4);
  };
  ctx.run([&] {
    tbb::parallel_for(int64_t(0), panels, [&](int64_t p) {
      uint8_t* const panel = P->w.data() + p * P->panel_bytes;
      std::memset(panel, 0, size_t(P->panel_bytes));  // lanes past N stay 0
      for (int64_t n = p * kPanel; n < std::min(N, (p + 1) * kPanel); ++n) {
        const int j = int(n % kPanel) / kLanes, lane = int(n % kLanes), lane_at = j * kLanes + lane;
        const uint8_t* row = W + n * row_bytes;
        for (int64_t b = 0; b < nb; ++b) {
          // Where block b's weights go (and, for a K-quant, its high planes and multipliers).
          uint8_t* blk = panel + qk::packed_block_offset(t, kLanes, kNV, b);
          // Group g is elements 4g..4g+3 in their unsigned form (what vpdpbusd multiplies), one 32-bit
          // word a lane; with nibbles, groups 2q and 2q + 1 share byte q's halves, and the bits
          // above the nibbles (at most two, so each stays in its byte when shifted) go to the planes.
          uint32_t u[8];
          qk::avx2::unsigned_groups(t, row, b, u);
          for (int g = 0; g < 8; ++g) {
            if (!nibbles) {
              put(blk + (j * 8 + g) * 64 + lane * 4, u[g]);
              continue;
            }
            const uint32_t low = u[g] & 0x0f0f0f0fu, high = (u[g] >> 4) & 0x0f0f0f0fu;
            put(blk + (j * 4 + g / 2) * 64 + lane * 4, g % 2 ? low << 4 : low);
            if (planes == 1) put(blk + L.hi + j * 64 + lane * 4, high << g);
            if (planes == 2) put(blk + L.hi + (j * 2 + g / 4) * 64 + lane * 4, high << (2 * (g % 4)));
          }
          if (!kq) {
            const uint8_t* src = row + b * block_bytes(t);
            P->d[(p * nb + b) * kPanel + lane_at] = load_u16(src);
            if (block_has_min(t)) P->m[(p * nb + b) * kPanel + lane_at] = load_u16(src + 2);
            continue;
          }
          const uint8_t* sb = row + (b / 8) * block_bytes(t);
          auto* head = reinterpret_cast<uint16_t*>(panel + (b / 8) * L.super());  // 64-byte aligned
          if (t == GgmlType::Q6_K) {
            head[lane_at] = load_u16(sb + 208);
            for (int h = 0; h < 2; ++h) blk[L.sc + h * kPanel + lane_at] = sb[192 + 2 * (b % 8) + h];
          } else {
            head[lane_at] = load_u16(sb), head[kPanel + lane_at] = load_u16(sb + 2);
            int sc = 0, mn = 0;
            kquant_scale_min(sb + 4, int(b % 8), sc, mn);
            blk[L.sc + lane_at] = uint8_t(sc);
            blk[L.mn + lane_at] = uint8_t(mn);
          }
        }
      }
    });
  });
  return P;
}

int64_t qpacked_bytes(const QPacked& p) {
  return p.w.size() + 2 * (p.d.size() + p.m.size());
}

namespace {
void qgemm_rows(CpuContext& ctx, QKernel k, const float* A, int64_t M, int64_t lda,
                std::span<const QPart> parts, int64_t K, float* C, int64_t ldc);
}  // namespace

int64_t qgemm_pass_rows(int64_t M, int64_t K, int64_t cache_bytes) {
  const int64_t row_bytes = K / kQBlock * int64_t(sizeof(QActBlock));
  const int64_t budget = cache_bytes / 3;
  if (M < kPanelMinRows || budget <= 0 || M * row_bytes <= budget) return M;
  // Whole tiles of 6 rows (and of AMX's 16): a multiple of 48.
  const int64_t rows = std::max<int64_t>(48, budget / row_bytes / 48 * 48);
  const int64_t passes = (M + rows - 1) / rows;
  return std::min(M, ((M + passes - 1) / passes + 47) / 48 * 48);
}

void qgemm(CpuContext& ctx, QKernel k, const float* A, int64_t M, int64_t lda, std::span<const QPart> parts,
           int64_t K, float* C, int64_t ldc) {
  for (const QPart& p : parts) {
    check(k, p.type);
    if (!type_bytes(p.type, K))
      fail("qgemm: K = {} is not a whole number of {} blocks", K, type_info(uint32_t(p.type))->name);
  }
  if (M == 0 || parts.empty()) return;
  // In passes whose quantized rows stay in the last-level cache while every panel multiplies them:
  // one pass over 2,048 rows of down (14336 -> 4096, 44 MB of QActBlocks) read them from memory
  // once per panel (docs/cpu-kernels.md, "Rows in passes").
  const int64_t pass = qgemm_pass_rows(M, K, ctx.cache_bytes());
  for (int64_t m0 = 0; m0 < M; m0 += pass)
    qgemm_rows(ctx, k, A + m0 * lda, std::min(pass, M - m0), lda, parts, K, C + m0 * ldc, ldc);
}

namespace {
void qgemm_rows(CpuContext& ctx, QKernel k, const float* A, int64_t M, int64_t lda,
                std::span<const QPart> parts, int64_t K, float* C, int64_t ldc) {
  // The rows are quantized once for every part of a kind: a scale per block for the simple types,
  // per super-block for the K-quants.
  const int64_t nb = K / kQBlock;
  const auto quantized = [&](bool super) {
    QActBlock* q = ctx.scratch<QActBlock>(super ? Scratch::QActivationsK : Scratch::QActivations, M * nb);
    const auto one = [&](int64_t m) {
      if (super)
        quantize_activations_super(A + m * lda, K, q + m * nb);
      else
        quantize_activations(A + m * lda, K, q + m * nb);
    };
    if (M < kPanelMinRows)
      for (int64_t m = 0; m < M; ++m) one(m);  // not worth a task each
    else
      ctx.run([&] { tbb::parallel_for(int64_t(0), M, one); });
    return q;
  };
  const QActBlock* q[2] = {nullptr, nullptr};
  for (const QPart& p : parts)
    if (p.rows > 0 && !q[is_kquant(p.type)]) q[is_kquant(p.type)] = quantized(is_kquant(p.type));
  // The tile kernel takes the panels' calls (16 rows or more); fewer rows run the decoding tiles.
  qk::avx512::TileRows tiles[2];
  if (k == QKernel::Amx && M >= kPanelMinRows)
    for (int i = 0; i < 2; ++i)
      if (q[i]) tiles[i] = tile_rows(ctx, q[i], M, nb, i == 0 ? Scratch::QTileRows : Scratch::QTileRowsK);
  int64_t n0 = 0;
  for (const QPart& p : parts) {
    const int i = is_kquant(p.type);
    if (p.rows > 0) run_part(ctx, k, p, q[i], M, nb, tiles[i].q ? &tiles[i] : nullptr, C + n0, ldc);
    n0 += p.rows;
  }
}
}  // namespace

void qgemm(CpuContext& ctx, QKernel k, GgmlType t, const float* A, int64_t M, int64_t lda, const void* W,
           int64_t N, int64_t K, float* C, int64_t ldc) {
  const QPart part{t, N, static_cast<const uint8_t*>(W)};
  qgemm(ctx, k, A, M, lda, {&part, 1}, K, C, ldc);
}

}  // namespace lp
