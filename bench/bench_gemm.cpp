// GEMM library comparison on SmolLM2-shaped products (why oneDNN: docs/cpu-kernels.md).
//
//   build/lp_bench --benchmark_filter=Gemm
//
// Candidates: our Gemm (oneDNN matmul, N split across TBB threads, f32 and bf16), and the
// cblas_sgemm of OpenBLAS and BLIS loaded with dlopen (so both can be measured in one binary
// without their identical symbol names clashing). Each case first checks its result against
// the scalar reference on a sample of outputs; a wrong kernel reports an error, not a time.
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/context.h"
#include "kernels/cpu/gemm.h"
#include "model/ops.h"
#include "model/quant.h"

namespace {

using Sgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                       float*, int);
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

struct Problem {
  int64_t M, K, N;
  std::vector<float> a, w, c;
  Problem(int64_t m, int64_t k, int64_t n) : M(m), K(k), N(n), a(m * k), w(n * k), c(m * n) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& x : a) x = u(rng);
    for (auto& x : w) x = u(rng);
  }
  // Relative check on sampled outputs; bound |err| <= K * eps * sum|a||w| (bf16: eps 2^-8).
  bool check(double eps) const {
    for (int64_t s = 0; s < 64; ++s) {
      const int64_t m = (s * 7919) % M, n = (s * 104729) % N;
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        ref += double(a[m * K + k]) * w[n * K + k];
        mag += std::fabs(double(a[m * K + k]) * w[n * K + k]);
      }
      if (std::fabs(c[m * N + n] - ref) > 2 * eps * mag + 1e-6) return false;
    }
    return true;
  }
};

void report(benchmark::State& st, const Problem& p) {
  st.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * p.M * p.N * p.K, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

void BM_Gemm_OneDNN(benchmark::State& st, lp::DType dt) {
  Problem p(st.range(0), st.range(1), st.range(2));
  lp::CpuContext ctx(int(st.range(3)));
  lp::Matrix W;
  W.rows = p.N;
  W.cols = p.K;
  W.dtype = dt;
  if (dt == lp::DType::F32) {
    W.f32.resize(p.N * p.K);
    std::copy(p.w.begin(), p.w.end(), W.f32.data());
  } else {
    W.bf16.resize(p.N * p.K);
    for (int64_t i = 0; i < p.N * p.K; ++i) W.bf16[i] = lp::f32_to_bf16(p.w[i]);
  }
  lp::Gemm g;
  g.run(ctx, p.a.data(), p.M, p.K, W, p.c.data(), p.N);
  if (!p.check(dt == lp::DType::F32 ? 1e-6 : 1.0 / 256)) {
    st.SkipWithError("result differs from the reference");
    return;
  }
  for (auto _ : st) g.run(ctx, p.a.data(), p.M, p.K, W, p.c.data(), p.N);
  report(st, p);
}

void BM_Gemm_Cblas(benchmark::State& st, const char* lib) {
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    st.SkipWithError((std::string(lib) + " not installed").c_str());
    return;
  }
  auto sgemm = reinterpret_cast<Sgemm>(dlsym(h, "cblas_sgemm"));
  if (!sgemm) {
    st.SkipWithError("no cblas_sgemm");
    return;
  }
  const std::string threads = std::to_string(st.range(3));
  setenv("OPENBLAS_NUM_THREADS", threads.c_str(), 1);
  setenv("BLIS_NUM_THREADS", threads.c_str(), 1);
  if (auto set = reinterpret_cast<void (*)(int)>(dlsym(h, "openblas_set_num_threads"))) set(int(st.range(3)));
  if (auto set = reinterpret_cast<void (*)(int)>(dlsym(h, "bli_thread_set_num_threads")))
    set(int(st.range(3)));
  Problem p(st.range(0), st.range(1), st.range(2));
  auto call = [&] {
    sgemm(kRowMajor, kNoTrans, kTrans, int(p.M), int(p.N), int(p.K), 1.0f, p.a.data(), int(p.K), p.w.data(),
          int(p.K), 0.0f, p.c.data(), int(p.N));
  };
  call();
  if (!p.check(1e-6)) {
    st.SkipWithError("result differs from the reference");
    return;
  }
  for (auto _ : st) call();
  report(st, p);
}

// M, K, N, threads: SmolLM2's gate/up (576 -> 1536) and down (1536 -> 576) at 2048 tokens; the
// fused gate/up (576 -> 3072) at decode sizes: one row, and 33/64/128 rows (a decode step with
// revived tokens, where Gemm::run keeps one row block and splits the columns).
void shapes(benchmark::internal::Benchmark* b) {
  b->Args({2048, 576, 1536, 2})
      ->Args({2048, 1536, 576, 2})
      ->Args({512, 576, 960, 2})
      ->Args({1, 576, 3072, 2})
      ->Args({33, 576, 3072, 2})
      ->Args({64, 576, 3072, 2})
      ->Args({128, 576, 3072, 2});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

// The engine's condition: every layer's weights have left the caches by the time the layer runs
// again (SmolLM2-135M's f32 weights are 540 MB). So each iteration multiplies by the next of 16
// distinct weights (the fused gate/up, 576 -> 3072, 7 MiB each; the down projection, 1536 -> 576,
// 3.4 MiB), so what a prefill GEMM pays to read and pack W from memory shows, where
// BM_Gemm_OneDNN keeps one W in the cache. Args: M, K, N.
void BM_Gemm_ColdWeights(benchmark::State& st) {
  constexpr int kMats = 16;
  const int64_t M = st.range(0), K = st.range(1), N = st.range(2);
  Problem p(M, K, N);
  lp::CpuContext ctx(2);
  std::vector<lp::Matrix> ws(kMats);
  for (lp::Matrix& w : ws) {
    w.rows = N;
    w.cols = K;
    w.dtype = lp::DType::F32;
    w.f32.resize(size_t(N * K));
    std::copy(p.w.begin(), p.w.end(), w.f32.data());
  }
  lp::Gemm g;
  g.run(ctx, p.a.data(), M, K, ws[0], p.c.data(), N);
  if (!p.check(1e-6)) {
    st.SkipWithError("result differs from the reference");
    return;
  }
  size_t i = 0;
  for (auto _ : st) {
    g.run(ctx, p.a.data(), M, K, ws[i], p.c.data(), N);
    i = (i + 1) % ws.size();
  }
  report(st, p);
}
void cold_shapes(benchmark::internal::Benchmark* b) {
  // 89, 126, 180: row counts LazyLLM's schedules leave (not multiples of 16).
  for (const int64_t m : {32, 64, 89, 126, 128, 180, 192, 256, 512, 1024, 2048}) {
    b->Args({m, 576, 3072});
    b->Args({m, 1536, 576});
    b->Args({m, 576, 576});
  }
  b->Args({512, 4096, 4096});  // Llama-3.1-8B's attention output (BM_QGemm has it too)
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_Gemm_ColdWeights)->Apply(cold_shapes);

BENCHMARK_CAPTURE(BM_Gemm_OneDNN, f32, lp::DType::F32)->Apply(shapes);
BENCHMARK_CAPTURE(BM_Gemm_OneDNN, bf16, lp::DType::BF16)->Apply(shapes);
BENCHMARK_CAPTURE(BM_Gemm_Cblas, openblas, "libopenblas.so.0")->Apply(shapes);
BENCHMARK_CAPTURE(BM_Gemm_Cblas, blis, "libblis.so.4")->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
