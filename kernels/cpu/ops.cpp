#include "kernels/cpu/ops.h"

#include <immintrin.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <oneapi/dnnl/dnnl.hpp>

#include "model/error.h"
#include "model/quant.h"

namespace lp {

const char* dtype_name(DType d) {
  return d == DType::F32 ? "f32" : "bf16";
}

bool cpu_has_native_bf16() {
  const auto isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

// Whether this oneDNN multiplies bf16 at all on this CPU: oneDNN 2.6 has bf16 matmuls from
// AVX-512 (emulated without AVX-512 BF16) up, none on AVX2-only CPUs. Asked once, by creating one.
bool dnnl_has_bf16_matmul() {
  static const bool ok = [] {
    try {
      using md = dnnl::memory::desc;
      const dnnl::engine eng{dnnl::engine::kind::cpu, 0};
      const md a({16, 16}, dnnl::memory::data_type::bf16, dnnl::memory::format_tag::ab);
      const md b({16, 16}, dnnl::memory::data_type::bf16, dnnl::memory::format_tag::ba);
      const md c({16, 16}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab);
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), eng);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

DType fastest_dtype() {
  return cpu_has_native_bf16() ? DType::BF16 : DType::F32;
}

// ---------------------------------------------------------------------------------------------
// exp: e^x = 2^n * e^r with n = round(x / ln2), |r| <= ln2/2, e^r by its degree-7 Taylor
// polynomial (truncation error < r^8/8! ~ 5e-9 relative, below float rounding).
namespace {
constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187e-06f;
constexpr float kLog2e = 1.4426950408889634f;

#if defined(__AVX512F__)
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));  // below: result is 0 (and -inf stays finite)
  x = _mm512_min_ps(x, _mm512_set1_ps(89.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}
#elif defined(__AVX2__) && defined(__FMA__)
// The same exp on 8 lanes for AVX2-only CPUs. AVX2 has no scalef: 2^n is applied as 2^a * 2^b
// (a = floor(n / 2), b = n - a, both within the normal exponents for n in [-150, 128]), so p * 2^a
// is exact and only the last product rounds, as ldexp does (subnormals included).
inline __m256 exp256(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-104.0f));
  x = _mm256_min_ps(x, _mm256_set1_ps(89.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  for (float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i a = _mm256_srai_epi32(ni, 1), b = _mm256_sub_epi32(ni, a);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 two_a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(a, bias), 23));
  const __m256 two_b = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(b, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, two_a), two_b);
}
inline float reduce_max256(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}
inline float reduce_add256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

inline float exp1(float x) {
  x = std::clamp(x, -104.0f, 89.0f);
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(-n, kLn2Hi, x);
  r = std::fma(-n, kLn2Lo, r);
  float p = 1.0f / 5040;
  for (float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = std::fma(p, r, c);
  return std::ldexp(p, int(n));
}
}  // namespace

void exp_inplace(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, exp512(_mm512_loadu_ps(x + i)));
#elif defined(__AVX2__) && defined(__FMA__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp256(_mm256_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = exp1(x[i]);
}

// ---------------------------------------------------------------------------------------------
// GEMM through oneDNN matmul primitives, cached per shape. Primitives are created on the
// calling thread before the parallel section; execution is single-threaded per part.
struct Gemm::Impl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int>;  // M N K lda ldc dtype
  struct Prim {
    dnnl::matmul p;
    dnnl::memory::desc scratch;
  };
  std::map<Key, Prim> cache;
  std::vector<uint16_t> a_bf16;  // [M][K] activations rounded to bf16
  std::vector<float> a_rounded;  // [M][K] the same, widened back (bf16 without a bf16 matmul)
  std::vector<uint8_t> a_pad;    // [Mp][K] activations padded to a bucketed row count
  std::vector<float> c_pad;      // [Mp][N]

  Prim get(int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldc, DType dt) {
    const Key key{M, N, K, lda, ldc, int(dt)};
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    using md = dnnl::memory::desc;
    using mdims = dnnl::memory::dims;
    const auto t = dt == DType::F32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
    md a({M, K}, t, mdims{lda, 1});
    md b({K, N}, t, mdims{1, K});  // W [N][K] read as B [K][N] column-major
    md c({M, N}, dnnl::memory::data_type::f32, mdims{ldc, 1});
    // User-managed scratchpad: with the library's default (one scratchpad shared by all
    // primitives) two tasks executing matmuls at once corrupt each other's partial results.
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, eng);
    Prim p{dnnl::matmul(pd), pd.scratchpad_desc()};
    if (cache.size() > 4096) cache.clear();  // bound memory when shapes keep changing
    cache.emplace(key, p);
    return p;
  }
};

Gemm::Gemm() : impl_(std::make_unique<Impl>()) {}
Gemm::~Gemm() = default;

// Matrix-vector products for decode (M <= kGemvRows): memory-bound, so a plain kernel that
// streams each weight row once beats a GEMM call's fixed cost. Rows are split in fixed blocks;
// each output element is one dot product in one task (thread-count independent).
namespace {
constexpr int64_t kGemvRows = 4;
constexpr int64_t kPadRows = 192;       // GEMMs up to this many rows are padded to a multiple of 16
constexpr double kMinPartFlops = 16e6;  // a GEMM part's least work (see Gemm::run)

inline float dot_f32(const float* w, const float* x, int64_t K) {
  int64_t k = 0;
  float s = 0;
#if defined(__AVX512F__)
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (; k + 32 <= K; k += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k + 16), _mm512_loadu_ps(x + k + 16), acc1);
  }
  s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
         acc3 = _mm256_setzero_ps();
  for (; k + 32 <= K; k += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(x + k + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 16), _mm256_loadu_ps(x + k + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 24), _mm256_loadu_ps(x + k + 24), acc3);
  }
  s = reduce_add256(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
#endif
  for (; k < K; ++k) s += w[k] * x[k];
  return s;
}

// x is already rounded to bf16 and widened back to f32, so products match the GEMM path.
inline float dot_bf16(const uint16_t* w, const float* x, int64_t K) {
  int64_t k = 0;
  float s = 0;
#if defined(__AVX512F__)
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  for (; k + 32 <= K; k += 32) {
    const __m512i w0 =
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(w + k))), 16);
    const __m512i w1 =
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(w + k + 16))), 16);
    acc0 = _mm512_fmadd_ps(_mm512_castsi512_ps(w0), _mm512_loadu_ps(x + k), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_castsi512_ps(w1), _mm512_loadu_ps(x + k + 16), acc1);
  }
  s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; k + 16 <= K; k += 16) {
    const __m256i w0 = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(w + k))), 16);
    const __m256i w1 =
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(w + k + 8))), 16);
    acc0 = _mm256_fmadd_ps(_mm256_castsi256_ps(w0), _mm256_loadu_ps(x + k), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_castsi256_ps(w1), _mm256_loadu_ps(x + k + 8), acc1);
  }
  s = reduce_add256(_mm256_add_ps(acc0, acc1));
#endif
  for (; k < K; ++k) s += bf16_to_f32(w[k]) * x[k];
  return s;
}

void gemv(CpuContext& ctx, const float* A, int64_t M, int64_t lda, const Matrix& W, float* C, int64_t ldc) {
  const int64_t N = W.rows, K = W.cols;
  std::vector<float> x(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k)
      x[m * K + k] = W.dtype == DType::BF16 ? bf16_to_f32(f32_to_bf16(A[m * lda + k])) : A[m * lda + k];
  ctx.run([&] {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, N, 64),
        [&](const tbb::blocked_range<int64_t>& r) {
          for (int64_t n = r.begin(); n < r.end(); ++n)
            for (int64_t m = 0; m < M; ++m)
              C[m * ldc + n] = W.dtype == DType::F32 ? dot_f32(W.f32.data() + n * K, x.data() + m * K, K)
                                                     : dot_bf16(W.bf16.data() + n * K, x.data() + m * K, K);
        },
        tbb::simple_partitioner());
  });
}
}  // namespace

void Gemm::run(CpuContext& ctx, const float* A, int64_t M, int64_t lda, const Matrix& W, float* C,
               int64_t ldc) {
  if (M == 0) return;
  if (M <= kGemvRows) return gemv(ctx, A, M, lda, W, C, ldc);
  const int64_t N = W.rows, K = W.cols;
  const void* a_ptr = A;
  int64_t a_ld = lda;
  // bf16 where oneDNN has no bf16 matmul (AVX2-only CPUs): A is rounded to bf16 and kept as f32,
  // each part widens its rows of W to f32, and the f32 matmul gives the same products of the same
  // rounded values (one widening of W per call: 1/M of the multiply's work).
  const bool widen = W.dtype == DType::BF16 && !dnnl_has_bf16_matmul();
  if (W.dtype == DType::BF16) {
    impl_->a_bf16.resize(widen ? 0 : size_t(M * K));
    impl_->a_rounded.resize(widen ? size_t(M * K) : 0);
    uint16_t* narrow = impl_->a_bf16.data();
    float* wide = impl_->a_rounded.data();
    ctx.run([&] {
      tbb::parallel_for(int64_t(0), M, [&](int64_t m) {
        for (int64_t k = 0; k < K; ++k) {
          const uint16_t b = f32_to_bf16(A[m * lda + k]);
          if (widen)
            wide[m * K + k] = bf16_to_f32(b);
          else
            narrow[m * K + k] = b;
        }
      });
    });
    a_ptr = widen ? static_cast<const void*>(wide) : narrow;
    a_ld = K;
  }
  // Element sizes of A and W as the matmul reads them; the matmul's input type.
  const size_t esz = W.dtype == DType::F32 ? 4 : 2, a_esz = widen ? 4 : esz;
  const DType mm_dtype = widen ? DType::F32 : W.dtype;
  // Decoding with revivals gives a different M at nearly every call; a primitive per M would be
  // JIT-compiled over and over, so mid-size M is padded to a multiple of 16 through scratch.
  float* c_out = C;
  int64_t c_ld = ldc;
  const int64_t M_in = M;
  if (M <= kPadRows && M % 16 != 0) {
    M = (M + 15) / 16 * 16;
    impl_->a_pad.assign(size_t(M * K) * a_esz, 0);
    for (int64_t m = 0; m < M_in; ++m)
      std::memcpy(impl_->a_pad.data() + m * K * a_esz, static_cast<const char*>(a_ptr) + m * a_ld * a_esz,
                  K * a_esz);
    a_ptr = impl_->a_pad.data();
    a_ld = K;
    impl_->c_pad.resize(size_t(M * N));
    c_out = impl_->c_pad.data();
    c_ld = N;
  }
  // Tiles depend only on the shape, never on the thread count, so every element is computed
  // by the same kernel call whatever --threads is (results are bitwise thread-independent).
  // Up to 16 parts: rb row blocks x cb column blocks. Each part reads (and oneDNN packs) its
  // slice of W once and its rows of A once, so W is read rb times and A cb times; rb is the power
  // of two nearest sqrt(parts M / N), which makes that traffic least. Small M (decoding,
  // revivals) gets one row block, each weight read once: row blocks that each re-read all of W
  // ran at a quarter of the speed at M = 33..128, and a fixed 8 row blocks for prefill-sized M
  // cost 20-25% of a 200-256-row GEMM whose W comes from memory. Fewer parts for small products
  // (at least kMinPartFlops each): a 32-row down projection in 9 column blocks of 64 ran at half
  // the speed of 2 blocks (lp_bench's BM_Gemm_ColdWeights). Only the shape decides the tiles.
  int64_t parts = 16;
  while (parts > 2 && 2.0 * double(M) * double(N) * double(K) < kMinPartFlops * double(parts)) parts /= 2;
  int64_t rb = 1;
  while (rb < parts && double(rb) * double(rb) * 2 < double(parts) * double(M) / double(N)) rb *= 2;
  const int64_t cb = parts / rb;
  const int64_t mc = ((M + rb - 1) / rb + 15) / 16 * 16;
  const int64_t nc = std::max<int64_t>(64, ((N + cb - 1) / cb + 63) / 64 * 64);
  struct Part {
    int64_t m0, m, n0, n;
    Impl::Prim p;
  };
  std::vector<Part> ps;
  for (int64_t m0 = 0; m0 < M; m0 += mc)
    for (int64_t n0 = 0; n0 < N; n0 += nc) {
      const int64_t m = std::min(mc, M - m0), n = std::min(nc, N - n0);
      ps.push_back({m0, m, n0, n, impl_->get(m, n, K, a_ld, c_ld, mm_dtype)});
    }
  const auto mdt = mm_dtype == DType::F32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
  ctx.run([&] {
    tbb::parallel_for(size_t(0), ps.size(), [&](size_t i) {
      const Part& p = ps[i];
      using md = dnnl::memory::desc;
      using mdims = dnnl::memory::dims;
      dnnl::stream s(impl_->eng);
      const char* a_base = static_cast<const char*>(a_ptr) + p.m0 * a_ld * a_esz;
      const char* w_base = static_cast<const char*>(W.data()) + p.n0 * K * esz;
      thread_local std::vector<float> w_wide;
      if (widen) {
        w_wide.resize(size_t(p.n * K));
        const uint16_t* w16 = reinterpret_cast<const uint16_t*>(w_base);
        for (int64_t i = 0; i < p.n * K; ++i) w_wide[size_t(i)] = bf16_to_f32(w16[i]);
        w_base = reinterpret_cast<const char*>(w_wide.data());
      }
      dnnl::memory am(md({p.m, K}, mdt, mdims{a_ld, 1}), impl_->eng, const_cast<char*>(a_base));
      dnnl::memory bm(md({K, p.n}, mdt, mdims{1, K}), impl_->eng, const_cast<char*>(w_base));
      dnnl::memory cm(md({p.m, p.n}, dnnl::memory::data_type::f32, mdims{c_ld, 1}), impl_->eng,
                      c_out + p.m0 * c_ld + p.n0);
      const md& sp_md = p.p.scratch;
      thread_local std::vector<uint8_t> scratch;
      if (scratch.size() < sp_md.get_size()) scratch.resize(sp_md.get_size());
      dnnl::memory sp(sp_md, impl_->eng, scratch.data());
      p.p.p.execute(
          s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sp}});
      s.wait();
    });
  });
  if (c_out != C)
    for (int64_t m = 0; m < M_in; ++m) std::memcpy(C + m * ldc, c_out + m * c_ld, size_t(N) * 4);
}

// ---------------------------------------------------------------------------------------------
void rmsnorm(CpuContext& ctx, const float* x, const float* w, float* out, int64_t T, int64_t D, float eps) {
  ctx.run([&] {
    tbb::parallel_for(int64_t(0), T, [&](int64_t t) {
      const float* xr = x + t * D;
      float ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
      const float scale = 1.0f / std::sqrt(ss / float(D) + eps);
      float* o = out + t * D;
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) o[i] = xr[i] * scale * w[i];
    });
  });
}

RopeTable rope_table(const int32_t* pos, int64_t T, int64_t rope_dim, float theta, const float* ff) {
  RopeTable tab;
  tab.T = T;
  tab.half = rope_dim / 2;
  tab.cos.resize(size_t(T * tab.half));
  tab.sin.resize(size_t(T * tab.half));
  std::vector<double> freq(size_t(tab.half));
  for (int64_t i = 0; i < tab.half; ++i) {
    freq[i] = std::pow(double(theta), -2.0 * double(i) / double(rope_dim));
    if (ff) freq[i] /= ff[i];
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < tab.half; ++i) {
      const double a = double(pos[t]) * freq[i];
      tab.cos[t * tab.half + i] = float(std::cos(a));
      tab.sin[t * tab.half + i] = float(std::sin(a));
    }
  return tab;
}

void rope(CpuContext& ctx, float* x, int64_t T, int64_t ld, int64_t n_heads, int64_t Dh,
          const RopeTable& tab) {
  ctx.run([&] {
    tbb::parallel_for(int64_t(0), T, [&](int64_t t) {
      const float* c = tab.cos.data() + t * tab.half;
      const float* s = tab.sin.data() + t * tab.half;
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = x + t * ld + h * Dh;
        for (int64_t i = 0; i < tab.half; ++i) {
          const float x0 = v[2 * i], x1 = v[2 * i + 1];
          v[2 * i] = x0 * c[i] - x1 * s[i];
          v[2 * i + 1] = x0 * s[i] + x1 * c[i];
        }
      }
    });
  });
}

void swiglu(CpuContext& ctx, const float* gate, int64_t ld_gate, const float* up, int64_t ld_up, float* out,
            int64_t ld_out, int64_t T, int64_t F) {
  ctx.run([&] {
    tbb::parallel_for(int64_t(0), T, [&](int64_t t) {
      const float* g = gate + t * ld_gate;
      const float* u = up + t * ld_up;
      float* o = out + t * ld_out;
      int64_t i = 0;
#if defined(__AVX512F__)
      for (; i + 16 <= F; i += 16) {
        const __m512 gv = _mm512_loadu_ps(g + i);
        const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        const __m512 silu = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(o + i, _mm512_mul_ps(silu, _mm512_loadu_ps(u + i)));
      }
#elif defined(__AVX2__) && defined(__FMA__)
      for (; i + 8 <= F; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        const __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
      }
#endif
      for (; i < F; ++i) o[i] = g[i] / (1.0f + exp1(-g[i])) * u[i];
    });
  });
}

void add_inplace(CpuContext& ctx, float* x, const float* y, int64_t n) {
  ctx.run([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 4096), [&](const tbb::blocked_range<int64_t>& r) {
#pragma omp simd
      for (int64_t i = r.begin(); i < r.end(); ++i) x[i] += y[i];
    });
  });
}

// ---------------------------------------------------------------------------------------------
void LayerKV::init(int64_t capacity, int64_t n_kv_heads, int64_t head_dim) {
  // Capacity rounded up to the key tile so tiles may read (zeroed) slots past n.
  cap = (capacity + 31) / 32 * 32;
  kt_ld = cap + 16;
  Hkv = n_kv_heads;
  Dh = head_dim;
  kt.resize(Hkv * Dh * kt_ld);
  v.resize(Hkv * cap * Dh);
  pos.assign(size_t(cap), 0);
  clear();
}

void LayerKV::clear() {
  n = 0;
  sorted = true;
  slot_of.clear();
}

void LayerKV::append(const float* k, int64_t ldk, const float* vv, int64_t ldv, const int32_t* p, int64_t T) {
  if (n + T > cap) fail("KV cache full: {} + {} tokens exceed its capacity {}", n, T, cap);
  for (int64_t t = 0; t < T; ++t) {
    if (p[t] < 0) fail("KV append: negative position {}", p[t]);
    if (t > 0 && p[t] <= p[t - 1]) fail("KV append: positions must increase within a call");
    if (find(p[t]) >= 0) fail("KV append: position {} already has K/V", p[t]);
  }
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = n + t;
    if (s > 0 && p[t] < pos[size_t(s - 1)]) sorted = false;
    pos[size_t(s)] = p[t];
    if (size_t(p[t]) >= slot_of.size()) slot_of.resize(size_t(p[t]) + 1, -1);
    slot_of[size_t(p[t])] = int32_t(s);
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t d = 0; d < Dh; ++d) {
        kt[(g * Dh + d) * kt_ld + s] = k[t * ldk + g * Dh + d];
        v[(g * cap + s) * Dh + d] = vv[t * ldv + g * Dh + d];
      }
  }
  n += T;
}

std::vector<int32_t> LayerKV::slots_in_order() const {
  std::vector<int32_t> out;
  out.reserve(size_t(n));
  if (sorted) {
    for (int64_t s = 0; s < n; ++s) out.push_back(int32_t(s));
  } else {
    for (int32_t s : slot_of)
      if (s >= 0) out.push_back(s);
  }
  return out;
}

// Attention, flash-style. Work item: a tile of up to kTileRows (query, head) rows of one kv
// group, enumerated token-major so the heads sharing a kv head share every key block. For each
// block of kBlock keys: S = Q K^T (kept in L1), an online softmax per row (running max m and
// sum l, earlier output rescaled when the max grows), O += P V. Each tile reads the keys and
// values it needs once; nothing of size T x T is ever stored.
namespace {
constexpr int kTileRows = 64;  // rows per work item
constexpr int kBlock = 64;     // keys per block (two 32-key score steps)
constexpr int kSubRows = 8;    // rows per score microkernel call

struct TileRow {
  const float* q;
  float* o;
  int64_t len;  // keys visible to this row (a prefix of the cache)
};

#if defined(__AVX512F__)
// S[r][0..31] = sum_d qs[r][d] * kt[d][0..31] for NR rows: 2*NR accumulators, 2 key loads and
// NR broadcasts per dimension.
template <int NR>
inline void scores_step(const float* qs, int64_t Dh, const float* kt, int64_t ldk, float* S, int64_t lds) {
  __m512 acc[NR][2];
  for (int r = 0; r < NR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t d = 0; d < Dh; ++d) {
    const __m512 k0v = _mm512_loadu_ps(kt + d * ldk);
    const __m512 k1v = _mm512_loadu_ps(kt + d * ldk + 16);
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

// O[r][0..63] += sum_k P[r][k] * V[k][0..63] for 4 rows and nk keys (Dh = 64).
inline void pv_step64(const float* P, int64_t ldp, const float* v, int64_t nk, float* O, int nr) {
  __m512 acc[4][4];
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < 4; ++j)
      acc[r][j] = r < nr ? _mm512_loadu_ps(O + r * 64 + 16 * j) : _mm512_setzero_ps();
  for (int64_t k = 0; k < nk; ++k) {
    const float* vk = v + k * 64;
    const __m512 v0 = _mm512_loadu_ps(vk), v1 = _mm512_loadu_ps(vk + 16);
    const __m512 v2 = _mm512_loadu_ps(vk + 32), v3 = _mm512_loadu_ps(vk + 48);
    for (int r = 0; r < 4; ++r) {
      const __m512 p = _mm512_set1_ps(P[r * ldp + k]);
      acc[r][0] = _mm512_fmadd_ps(p, v0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(p, v1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(p, v2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(p, v3, acc[r][3]);
    }
  }
  for (int r = 0; r < nr; ++r)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(O + r * 64 + 16 * j, acc[r][j]);
}
#endif

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
// AVX2 (16 registers): S[r][0..15] = sum_d qs[r][d] * kt[d][0..15] for 4 rows, 8 accumulators,
// 2 key loads and 4 broadcasts per dimension; each score sums over d in order.
inline void scores_step_avx2(const float* qs, int64_t Dh, const float* kt, int64_t ldk, float* S,
                             int64_t lds) {
  __m256 acc[4][2];
  for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < Dh; ++d) {
    const __m256 k0v = _mm256_loadu_ps(kt + d * ldk);
    const __m256 k1v = _mm256_loadu_ps(kt + d * ldk + 8);
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
// O rows Dh apart): 8 accumulators, 4 value loads and 2 broadcasts per key.
inline void pv_step32_avx2(const float* P, int64_t ldp, const float* v, int64_t Dh, int64_t nk, float* O,
                           int nr) {
  __m256 acc[2][4];
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < 4; ++j)
      acc[r][j] = r < nr ? _mm256_loadu_ps(O + r * Dh + 8 * j) : _mm256_setzero_ps();
  for (int64_t k = 0; k < nk; ++k) {
    const float* vk = v + k * Dh;
    const __m256 v0 = _mm256_loadu_ps(vk), v1 = _mm256_loadu_ps(vk + 8);
    const __m256 v2 = _mm256_loadu_ps(vk + 16), v3 = _mm256_loadu_ps(vk + 24);
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
  __m512 vm = _mm512_set1_ps(m_old);
  for (; k + 16 <= valid; k += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + k));
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
  sum = _mm512_reduce_add_ps(vs);
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

// Keys [k0, k0 + bk) of a key set for kv group g: pointers into the cache when the set is the
// sorted prefix, else a copy of the listed slots in a tile-local block (zero past bk, so the
// 32-key score steps read finite values). Values are copied only when v_buf is given.
struct KeyBlock {
  const float* kt;  // [Dh][ldk]
  int64_t ldk;
  const float* v;  // [bk][Dh]
};
inline KeyBlock key_block(const KeySet& keys, int64_t g, int64_t k0, int64_t bk, float* kt_buf,
                          float* v_buf) {
  const LayerKV& kv = keys.kv;
  const int64_t Dh = kv.Dh;
  const float* kt = kv.kt.data() + g * Dh * kv.kt_ld;
  const float* v = kv.v.data() + g * kv.cap * Dh;
  if (keys.slots.empty()) return {kt + k0, kv.kt_ld, v + k0 * Dh};
  const int32_t* sl = keys.slots.data() + k0;
  for (int64_t d = 0; d < Dh; ++d) {
    const float* src = kt + d * kv.kt_ld;
    float* dst = kt_buf + d * kBlock;
    for (int64_t j = 0; j < bk; ++j) dst[j] = src[sl[j]];
    std::fill(dst + bk, dst + kBlock, 0.0f);
  }
  if (v_buf)
    for (int64_t j = 0; j < bk; ++j) std::memcpy(v_buf + j * Dh, v + int64_t(sl[j]) * Dh, size_t(Dh) * 4);
  return {kt_buf, kBlock, v_buf};
}

void attention_tile(const TileRow* rows, int nr, const KeySet& keys, int64_t g, float scale) {
  const int64_t Dh = keys.kv.Dh;
  thread_local std::vector<float> kt_buf, v_buf;
  if (!keys.slots.empty()) {
    kt_buf.resize(size_t(Dh * kBlock));
    v_buf.resize(size_t(kBlock * Dh));
  }
  int64_t nk = 0;
  for (int r = 0; r < nr; ++r) nk = std::max(nk, rows[r].len);

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

  for (int64_t k0 = 0; k0 < nk; k0 += kBlock) {
    const int64_t bk = std::min<int64_t>(kBlock, nk - k0);  // keys used in this block
    const KeyBlock kb = key_block(keys, g, k0, bk, kt_buf.data(), v_buf.data());
    // Scores for the block (the cache is zero past n, so the padded lanes are finite).
#if defined(__AVX512F__)
    const bool vector_scores = Dh <= 256;
#elif defined(__AVX2__) && defined(__FMA__)
    const bool vector_scores = true;
#else
    const bool vector_scores = false;
#endif
    if (vector_scores) {
#if defined(__AVX512F__)
      for (int64_t s0 = 0; s0 < bk; s0 += 32)
        for (int r0 = 0; r0 < nr; r0 += kSubRows)
          scores_step<kSubRows>(qs + r0 * Dh, Dh, kb.kt + s0, kb.ldk, S + r0 * kBlock + s0, kBlock);
#elif defined(__AVX2__) && defined(__FMA__)
      for (int64_t s0 = 0; s0 < bk; s0 += 16)
        for (int r0 = 0; r0 < nr; r0 += 4)
          scores_step_avx2(qs + r0 * Dh, Dh, kb.kt + s0, kb.ldk, S + r0 * kBlock + s0, kBlock);
#endif
    } else {
      // Without AVX2 (or with AVX-512 past width 256): an axpy per dimension over the contiguous
      // keys of the block, which the compiler vectorises; each score still sums over d in order.
      for (int r = 0; r < nr; ++r) {
        float* sr = S + r * kBlock;
        std::fill(sr, sr + bk, 0.0f);
        for (int64_t d = 0; d < Dh; ++d) {
          const float qd = qs[r * Dh + d];
          const float* kr = kb.kt + d * kb.ldk;
#pragma omp simd
          for (int64_t k = 0; k < bk; ++k) sr[k] += qd * kr[k];
        }
      }
    }
    // Online softmax: keys at or past a row's length are masked (their P is 0).
    for (int r = 0; r < nr; ++r) {
      float* sr = S + r * kBlock;
      const int64_t valid = std::clamp<int64_t>(rows[r].len - k0, 0, bk);
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
    if (Dh == 64) {
      for (int r0 = 0; r0 < nr; r0 += 4)
        pv_step64(S + r0 * kBlock, kBlock, kb.v, bk, O + r0 * 64, std::min(4, nr - r0));
      continue;
    }
#elif defined(__AVX2__) && defined(__FMA__)
    if (Dh % 32 == 0) {
      for (int r0 = 0; r0 < nr; r0 += 2)
        for (int64_t d0 = 0; d0 < Dh; d0 += 32)
          pv_step32_avx2(S + r0 * kBlock, kBlock, kb.v + d0, Dh, bk, O + r0 * Dh + d0, std::min(2, nr - r0));
      continue;
    }
#endif
    for (int r = 0; r < nr; ++r)
      for (int64_t k = 0; k < bk; ++k) {
        const float p = S[r * kBlock + k];
        const float* vk = kb.v + k * Dh;
        for (int64_t d = 0; d < Dh; ++d) O[r * Dh + d] += p * vk[d];
      }
  }
  for (int r = 0; r < nr; ++r) {
    const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
    for (int64_t d = 0; d < Dh; ++d) rows[r].o[d] = O[r * Dh + d] * inv;
  }
}
}  // namespace

void last_row_scores(const float* q, const KeySet& keys, int64_t H, float* scores) {
  const LayerKV& kv = keys.kv;
  const int64_t Hkv = kv.Hkv, Dh = kv.Dh, group = H / Hkv, ldk = kv.kt_ld, n_keys = keys.size();
  // Logits are computed for every held slot, contiguously (an axpy per dimension), and a listed
  // key set then picks its slots: one gather per key and head instead of one per key, head and
  // dimension. The listed keys are most of the held ones (decoding keeps >= 1/3 of them).
  const int64_t n_held = keys.slots.empty() ? n_keys : kv.n;
  const float scale = 1.0f / std::sqrt(float(Dh));
  std::vector<float> logit(static_cast<size_t>(n_held)), p(static_cast<size_t>(n_keys));
  std::fill(scores, scores + n_keys, 0.0f);
  for (int64_t h = 0; h < H; ++h) {
    const float* kt = kv.kt.data() + (h / group) * Dh * ldk;
    std::fill(logit.begin(), logit.end(), 0.0f);
    for (int64_t d = 0; d < Dh; ++d) {
      const float qd = q[h * Dh + d] * scale;
      const float* row = kt + d * ldk;
#pragma omp simd
      for (int64_t k = 0; k < n_held; ++k) logit[k] += qd * row[k];
    }
    if (keys.slots.empty())
      std::copy(logit.begin(), logit.end(), p.begin());
    else
      for (int64_t k = 0; k < n_keys; ++k) p[size_t(k)] = logit[size_t(keys.slots[size_t(k)])];
    float mx, sum;
    block_softmax(p.data(), n_keys, n_keys, -INFINITY, &mx, &sum);
    const float w = 1.0f / (sum * float(H));
#pragma omp simd
    for (int64_t k = 0; k < n_keys; ++k) scores[k] += p[k] * w;
  }
}

void attention(CpuContext& ctx, const float* q, int64_t ldq, const int32_t* q_pos, int64_t T,
               const KeySet& keys, int64_t H, float* out, int64_t ldo) {
  const LayerKV& kv = keys.kv;
  const int64_t Hkv = kv.Hkv, Dh = kv.Dh, group = H / Hkv;
  if (keys.slots.empty() && !kv.sorted)
    fail("attention: the KV cache is not in position order; pass its slots");
  const float scale = 1.0f / std::sqrt(float(Dh));
  // Keys visible to each query: the key set's prefix with position <= the query's position.
  const int64_t nk = keys.size();
  std::vector<int32_t> kpos;
  const int32_t* kp = kv.pos.data();
  if (!keys.slots.empty()) {
    kpos.resize(size_t(nk));
    for (int64_t i = 0; i < nk; ++i) kpos[size_t(i)] = kv.pos[size_t(keys.slots[size_t(i)])];
    kp = kpos.data();
  }
  std::vector<int64_t> len(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) len[t] = std::upper_bound(kp, kp + nk, q_pos[t]) - kp;
  const int64_t rows_per_group = T * group;
  const int64_t tiles_per_group = (rows_per_group + kTileRows - 1) / kTileRows;
  ctx.run([&] {
    // Largest tiles (latest queries) first, so the causal imbalance evens out at the end.
    tbb::parallel_for(int64_t(0), Hkv * tiles_per_group, [&](int64_t w) {
      const int64_t g = w % Hkv;
      const int64_t tile = tiles_per_group - 1 - w / Hkv;
      TileRow rows[kTileRows];
      int nr = 0;
      for (int64_t i = tile * kTileRows; i < std::min(rows_per_group, (tile + 1) * kTileRows); ++i) {
        const int64_t t = i / group, h = g * group + i % group;
        rows[nr++] = {q + t * ldq + h * Dh, out + t * ldo + h * Dh, len[t]};
      }
      attention_tile(rows, nr, keys, g, scale);
    });
  });
}

}  // namespace lp
