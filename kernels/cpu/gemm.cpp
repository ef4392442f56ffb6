#include "kernels/cpu/gemm.h"

#include <immintrin.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "kernels/cpu/qgemm.h"
#include "kernels/cpu/simd.h"
#include "model/error.h"
#include "model/quant.h"

namespace lp {

using namespace simd;

const char* dtype_name(DType d) {
  return d == DType::F32 ? "f32" : d == DType::BF16 ? "bf16" : "int8";
}

bool Matrix::mixed() const {
  return std::any_of(parts.begin(), parts.end(),
                     [&](const QPart& p) { return p.type != parts.front().type; });
}

int64_t Matrix::bytes() const {
  if (dtype != DType::Int8) return rows * row_bytes();
  int64_t b = 0;
  for (const QPart& p : parts) b += p.rows * *type_bytes(p.type, cols);
  return b;
}

int64_t Matrix::row_bytes() const {
  if (dtype == DType::Int8)
    return mixed() ? bytes() / std::max<int64_t>(rows, 1) : *type_bytes(qtype(), cols);
  return dtype == DType::F32 ? cols * 4 : cols * 2;
}

void Matrix::row_f32(int64_t r, float* out) const {
  if (dtype == DType::F32) {
    std::memcpy(out, f32.data() + r * cols, size_t(cols) * 4);
  } else if (dtype == DType::BF16) {
    for (int64_t i = 0; i < cols; ++i) out[i] = bf16_to_f32(bf16[r * cols + i]);
  } else {
    for (const QPart& p : parts) {
      if (r < p.rows) return dequantize(p.type, p.data + r * *type_bytes(p.type, cols), out, cols);
      r -= p.rows;
    }
    fail("Matrix::row_f32: row past the matrix");
  }
}

std::vector<uint8_t> Matrix::contiguous_blocks(GgmlType* type) const {
  *type = mixed() ? GgmlType::Q8_0 : qtype();
  const int64_t out_bytes = *type_bytes(*type, cols);
  std::vector<uint8_t> out(static_cast<size_t>(rows * out_bytes));
  int64_t row0 = 0;
  for (const QPart& p : parts) {
    const int64_t in_bytes = *type_bytes(p.type, cols);
    for (int64_t r = 0; r < p.rows; ++r) {
      uint8_t* dst = out.data() + (row0 + r) * out_bytes;
      if (p.type == *type)
        std::memcpy(dst, p.data + r * in_bytes, size_t(in_bytes));
      else
        requantize_q8_0(p.type, p.data + r * in_bytes, cols, dst);
    }
    row0 += p.rows;
  }
  return out;
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
  if (W.dtype == DType::Int8) return qgemm(ctx, best_qkernel(), A, M, lda, W.parts, W.cols, C, ldc);
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
    // Both threads copy (a serial copy in and out cost 5-12% of a 126-row GEMM); only the pad
    // rows are zeroed.
    impl_->a_pad.resize(size_t(M * K) * a_esz);
    uint8_t* pad = impl_->a_pad.data();
    const char* src = static_cast<const char*>(a_ptr);
    const int64_t src_ld = a_ld;
    ctx.run([&] {
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, M, 16), [&](const tbb::blocked_range<int64_t>& r) {
        for (int64_t m = r.begin(); m < r.end(); ++m)
          if (m < M_in)
            std::memcpy(pad + m * K * a_esz, src + m * src_ld * a_esz, size_t(K) * a_esz);
          else
            std::memset(pad + m * K * a_esz, 0, size_t(K) * a_esz);
      });
    });
    a_ptr = pad;
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
  const int64_t mc = ((M + rb - 1) / rb + 15) / 16 * 16;
  // Column blocks: parts / rb of them, each a multiple of 64 columns wide (narrower blocks re-read
  // A more often). An odd count leaves one part to one thread while the other waits, so an odd
  // count becomes the even one next to it (one more if every block stays at least 128 wide, else
  // one fewer) with widths equal in 16-column units (a vector of f32). At 64-192 rows a 576-wide
  // output went in 3 blocks of 192 and in 4 of 144 runs 1.3x faster (BM_Gemm_ColdWeights); blocks
  // of 96 ran 1.2-1.5x slower than of 128.
  const int64_t units = (N + 15) / 16;
  const int64_t nc = std::max<int64_t>(64, ((N + parts / rb - 1) / (parts / rb) + 63) / 64 * 64);
  int64_t cb = (N + nc - 1) / nc;
  std::vector<int64_t> widths(size_t(cb), nc);
  if (cb > 1 && cb % 2 == 1) {
    cb = units / (cb + 1) >= 8 ? cb + 1 : cb - 1;
    widths.clear();
    for (int64_t j = 0; j < cb; ++j) widths.push_back(16 * (units / cb + (j < units % cb ? 1 : 0)));
  }
  struct Part {
    int64_t m0, m, n0, n;
    Impl::Prim p;
  };
  std::vector<Part> ps;
  for (int64_t m0 = 0; m0 < M; m0 += mc)
    for (int64_t n0 = 0; const int64_t w : widths) {
      const int64_t m = std::min(mc, M - m0), n = std::min(w, N - n0);
      ps.push_back({m0, m, n0, n, impl_->get(m, n, K, a_ld, c_ld, mm_dtype)});
      n0 += n;
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
      if (widen) {
        float* w_wide = ctx.scratch<float>(Scratch::GemmWidened, p.n * K);
        const uint16_t* w16 = reinterpret_cast<const uint16_t*>(w_base);
        for (int64_t i = 0; i < p.n * K; ++i) w_wide[i] = bf16_to_f32(w16[i]);
        w_base = reinterpret_cast<const char*>(w_wide);
      }
      dnnl::memory am(md({p.m, K}, mdt, mdims{a_ld, 1}), impl_->eng, const_cast<char*>(a_base));
      dnnl::memory bm(md({K, p.n}, mdt, mdims{1, K}), impl_->eng, const_cast<char*>(w_base));
      dnnl::memory cm(md({p.m, p.n}, dnnl::memory::data_type::f32, mdims{c_ld, 1}), impl_->eng,
                      c_out + p.m0 * c_ld + p.n0);
      const md& sp_md = p.p.scratch;
      dnnl::memory sp(sp_md, impl_->eng, ctx.scratch_bytes(Scratch::GemmScratchpad, sp_md.get_size()));
      p.p.p.execute(
          s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}, {DNNL_ARG_SCRATCHPAD, sp}});
      s.wait();
    });
  });
  if (c_out != C)
    ctx.run([&] {
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, M_in, 16), [&](const tbb::blocked_range<int64_t>& r) {
        for (int64_t m = r.begin(); m < r.end(); ++m)
          std::memcpy(C + m * ldc, c_out + m * c_ld, size_t(N) * 4);
      });
    });
}

}  // namespace lp
