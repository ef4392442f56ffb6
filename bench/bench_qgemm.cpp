// The integer GEMM over GGUF blocks (kernels/cpu/qgemm.h) beside this machine's peaks.
//
//   build/lp_bench --benchmark_filter='Peak|QGemm|ColdWeights/512/'
//
// BM_Peak_*: 2 threads, each a loop of independent FMAs (f32, 512- and 256-bit), vpdpbusd
// (int8, 4 multiply-adds per 32-bit lane) or, for AVX2 without VNNI, vpmaddubsw + vpaddw on registers only:
// the peak a kernel could reach here, counted as 2 operations per multiply-add. Each kind runs only where
// cpuid says the CPU has it. BM_Peak_AmxInt8: the same for AMX's tdpbusd (a 16 x 64 int8 tile times a 64 x 16
// one into 16 x 16 int32, four independent accumulator tiles), where the CPU has AMX and Linux grants the
// tiles (kernels/cpu/amx.h): the ceiling a tile kernel could reach here, beside VNNI's (the AMX kernel,
// QKernel::Amx, is BM_QGemmPacked/4; it reaches far less: docs/cpu-kernels.md). BM_QGemm: every kernel this
// CPU runs x Q8_0 / Q4_0 / Q4_1 at SmolLM2-135M's prefill shapes (and every kept type at Llama-3.1-8B's
// attention output, 512 x 4096 -> 4096), the weights cycling through 16 matrices so they come from memory as
// in a prefill (as BM_Gemm_ColdWeights does for the f32 GEMM); counters: int8 Gop/s (2 M N K per call).
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "bench/ceiling.h"
#include "kernels/context.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/membw.h"
#include "kernels/cpu/qgemm.h"
#include "model/quant.h"
#include "tests/random_blocks.h"

namespace {

constexpr int64_t kIters = 1 << 22;

__attribute__((target("avx2,fma"))) float fma256_loop() {
  __m256 a[10];
  for (int i = 0; i < 10; ++i) a[i] = _mm256_set1_ps(float(i));
  const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
  for (int64_t it = 0; it < kIters; ++it)
    for (int i = 0; i < 10; ++i) a[i] = _mm256_fmadd_ps(a[i], b, c);
  float s = 0;
  for (int i = 0; i < 10; ++i) s += _mm256_cvtss_f32(a[i]);
  return s;
}
// AVX2's int8 product without VNNI: vpmaddubsw (32 multiply-adds, into 16 pairs of s16) with the
// pairs added in 16 bits (vpaddw), the fewest instructions an AVX2 kernel spends on 32 products
// (qgemm_avx2.cpp's tiles add up to 8 groups so before one vpmaddwd). Written as assembly: in C++
// the compiler folds identical products and spills the sums. Each iteration: 8 independent
// products of ymm0 and ymm1, added into 6 sums.
__attribute__((target("avx2,fma"))) int avx2_int8_loop() {
  int64_t n = kIters;
  asm volatile(
      "vpcmpeqb %%ymm0, %%ymm0, %%ymm0\n\tvpabsb %%ymm0, %%ymm0\n\tvpsignb %%ymm0, %%ymm0, %%ymm1\n\t"
      "vpxor %%ymm2, %%ymm2, %%ymm2\n\tvmovdqa %%ymm2, %%ymm3\n\tvmovdqa %%ymm2, %%ymm4\n\t"
      "vmovdqa %%ymm2, %%ymm5\n\tvmovdqa %%ymm2, %%ymm6\n\tvmovdqa %%ymm2, %%ymm7\n"
      "1:\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm8\n\tvpmaddubsw %%ymm1, %%ymm0, %%ymm9\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm10\n\tvpmaddubsw %%ymm1, %%ymm0, %%ymm11\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm12\n\tvpmaddubsw %%ymm1, %%ymm0, %%ymm13\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm14\n\tvpmaddubsw %%ymm1, %%ymm0, %%ymm15\n\t"
      "vpaddw %%ymm8, %%ymm2, %%ymm2\n\tvpaddw %%ymm9, %%ymm3, %%ymm3\n\t"
      "vpaddw %%ymm10, %%ymm4, %%ymm4\n\tvpaddw %%ymm11, %%ymm5, %%ymm5\n\t"
      "vpaddw %%ymm12, %%ymm6, %%ymm6\n\tvpaddw %%ymm13, %%ymm7, %%ymm7\n\t"
      "vpaddw %%ymm14, %%ymm2, %%ymm2\n\tvpaddw %%ymm15, %%ymm3, %%ymm3\n\t"
      "dec %0\n\tjnz 1b\n\tvzeroupper"
      : "+r"(n)
      :
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
        "xmm12", "xmm13", "xmm14", "xmm15", "cc");
  return int(n);
}
#define LP_TARGET_VNNI __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")))
LP_TARGET_VNNI float fma512_loop() {
  __m512 a[10];
  for (int i = 0; i < 10; ++i) a[i] = _mm512_set1_ps(float(i));
  const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
  for (int64_t it = 0; it < kIters; ++it)
    for (int i = 0; i < 10; ++i) a[i] = _mm512_fmadd_ps(a[i], b, c);
  float s = 0;
  for (int i = 0; i < 10; ++i) s += _mm512_reduce_add_ps(a[i]);
  return s;
}
LP_TARGET_VNNI int vnni_loop(bool wide) {
  const __m512i u = _mm512_set1_epi8(3), v = _mm512_set1_epi8(-2);
  int s = 0;
  if (wide) {
    __m512i a[10];
    for (int i = 0; i < 10; ++i) a[i] = _mm512_set1_epi32(i);
    for (int64_t it = 0; it < kIters; ++it)
      for (int i = 0; i < 10; ++i) a[i] = _mm512_dpbusd_epi32(a[i], u, v);
    for (int i = 0; i < 10; ++i) s += _mm512_reduce_add_epi32(a[i]);
  } else {
    __m256i a[10];
    const __m256i u2 = _mm512_castsi512_si256(u), v2 = _mm512_castsi512_si256(v);
    for (int i = 0; i < 10; ++i) a[i] = _mm256_set1_epi32(i);
    for (int64_t it = 0; it < kIters; ++it)
      for (int i = 0; i < 10; ++i) a[i] = _mm256_dpbusd_epi32(a[i], u2, v2);
    for (int i = 0; i < 10; ++i) s += _mm256_extract_epi32(a[i], 0);
  }
  return s;
}

constexpr int64_t kAmxIters = 1 << 18;

// AMX's tile configuration (palette 1): tiles 0-3 hold 16 x 16 int32 accumulators, 4-7 int8
// operands of 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile,amx-int8"))) int32_t amx_loop() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  alignas(64) int8_t a[16 * 64], b[16 * 64];
  alignas(64) int32_t c[16 * 16];
  for (int i = 0; i < 16 * 64; ++i) a[i] = int8_t(i % 7), b[i] = int8_t(i % 5);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, b, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, a, 64);
  for (int64_t it = 0; it < kAmxIters; ++it) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0];
}

// ops per call of the loop: 10 chains x kIters x lanes x ops per lane.
template <class F>
void peak(benchmark::State& st, bool supported, double ops_per_thread, F loop) {
  if (!supported) {
    st.SkipWithError("this CPU lacks the instructions");
    return;
  }
  for (auto _ : st) {
    std::thread t1([&] { benchmark::DoNotOptimize(loop()); });
    std::thread t2([&] { benchmark::DoNotOptimize(loop()); });
    t1.join();
    t2.join();
  }
  st.counters["Gop/s"] =
      benchmark::Counter(2 * ops_per_thread, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Peak_Fma256(benchmark::State& st) {
  peak(st, lp::qkernel_supported(lp::QKernel::Avx2), 10.0 * kIters * 8 * 2, fma256_loop);
}
void BM_Peak_Fma512(benchmark::State& st) {
  peak(st, lp::qkernel_supported(lp::QKernel::Avx512Vnni), 10.0 * kIters * 16 * 2, fma512_loop);
}
void BM_Peak_Avx2Int8(benchmark::State& st) {
  peak(st, lp::qkernel_supported(lp::QKernel::Avx2), 8.0 * kIters * 32 * 2, avx2_int8_loop);
}
void BM_Peak_Vnni256(benchmark::State& st) {
  peak(st, lp::qkernel_supported(lp::QKernel::Avx512Vnni), 10.0 * kIters * 8 * 8,
       [] { return vnni_loop(false); });
}
void BM_Peak_Vnni512(benchmark::State& st) {
  peak(st, lp::qkernel_supported(lp::QKernel::Avx512Vnni), 10.0 * kIters * 16 * 8,
       [] { return vnni_loop(true); });
}
// 4 tiles x kAmxIters x (16 x 16 outputs x 64 multiply-adds) x 2.
void BM_Peak_AmxInt8(benchmark::State& st) {
  peak(st, lp::amx_int8_usable(), 4.0 * kAmxIters * 16 * 16 * 64 * 2, amx_loop);
}
BENCHMARK(BM_Peak_Fma256)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Peak_Fma512)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Peak_Avx2Int8)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Peak_Vnni256)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Peak_Vnni512)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Peak_AmxInt8)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_QGemm(benchmark::State& st) {
  const auto k = lp::QKernel(st.range(0));
  const auto t = lp::GgmlType(st.range(1));
  const int64_t M = st.range(2), K = st.range(3), N = st.range(4);
  if (!lp::qkernel_supported(k)) {
    st.SkipWithError("this CPU lacks the instructions");
    return;
  }
  const int64_t bytes = *lp::type_bytes(t, K) * N;
  std::vector<std::vector<uint8_t>> ws(16, std::vector<uint8_t>(static_cast<size_t>(bytes)));
  uint64_t seed = 1;
  for (auto& w : ws)  // every byte random, each scale field 0.01 (and each minimum -0.08)
    lp::testing::fill_random_blocks(t, w.data(), bytes / lp::type_info(uint32_t(t))->block_bytes, seed++,
                                    0.01f);
  std::mt19937 rng(1);
  std::vector<float> a(static_cast<size_t>(M * K)), c(static_cast<size_t>(M * N));
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& x : a) x = u(rng);
  lp::CpuContext ctx(2);
  size_t i = 0;
  for (auto _ : st) {
    lp::qgemm(ctx, k, t, a.data(), M, K, ws[i].data(), N, K, c.data(), N);
    i = (i + 1) % ws.size();
  }
  st.SetLabel(std::string(lp::qkernel_name(k)) + " " + std::string(lp::type_info(uint32_t(t))->name));
  st.counters["Gop/s"] = benchmark::Counter(2.0 * double(M) * double(N) * double(K),
                                            benchmark::Counter::kIsIterationInvariantRate);
}
void qgemm_shapes(benchmark::internal::Benchmark* b) {
  for (int k : {0, 1, 2, 3}) {
    for (int t : {int(lp::GgmlType::Q8_0), int(lp::GgmlType::Q4_0), int(lp::GgmlType::Q4_1)})
      for (int64_t m : {64, 512}) {
        b->Args({k, t, m, 576, 3072});
        b->Args({k, t, m, 1536, 576});
        b->Args({k, t, m, 576, 576});
      }
    // Llama-3.1-8B's attention output shape (K-quants need rows of whole 256-blocks; SmolLM2's 576
    // are not), every type; one and 8 rows of it (decoding, alone and 8 requests together) too.
    for (const lp::GgmlType t : lp::testing::kQuantTypes)
      for (int64_t m : {512, 8, 1}) b->Args({k, int(t), m, 4096, 4096});
    // Decoding SmolLM2-135M: one row through gate|up, down and the tied output (49,152 outputs),
    // and the rows of 4 and 8 requests decoding together (continuous batching).
    for (int t : {int(lp::GgmlType::Q8_0), int(lp::GgmlType::Q4_1)})
      for (const auto& [K, N] : {std::pair<int64_t, int64_t>{576, 3072}, {1536, 576}, {576, 49152}})
        for (int64_t m : {1, 4, 8}) b->Args({k, t, m, K, N});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_QGemm)->Apply(qgemm_shapes);

// BM_QGemmPacked/kernel/type/M/K/N: the AVX2 (1), 512-bit VNNI (3) and AMX (4) kernels over weights
// packed once at load (qpack, as the CPU backend holds every type but Q5_0/Q5_1), beside BM_QGemm/1
// and /3 over the same shapes, which pack per call (16 rows or more) or read the blocks as stored
// (fewer).
// Also Llama-3.1-8B's prefill shapes (512 rows x attention output 4096 -> 4096 and down
// 14336 -> 4096) in Q4_K_M's types, VNNI and AMX side by side.
void BM_QGemmPacked(benchmark::State& st) {
  const auto k = lp::QKernel(st.range(0));
  const auto t = lp::GgmlType(st.range(1));
  const int64_t M = st.range(2), K = st.range(3), N = st.range(4);
  if (!lp::qkernel_supported(k)) {
    st.SkipWithError("this CPU lacks the instructions");
    return;
  }
  lp::CpuContext ctx(2);
  const int64_t bytes = *lp::type_bytes(t, K) * N;
  // 16 copies, or as many as 512 MiB holds (at least 2): the 8B matrices are 9-61 MB each.
  const int64_t copies = std::clamp<int64_t>((int64_t(512) << 20) / bytes, 2, 16);
  std::vector<std::vector<uint8_t>> ws(size_t(copies), std::vector<uint8_t>(static_cast<size_t>(bytes)));
  std::vector<std::shared_ptr<const lp::QPacked>> packs;
  uint64_t seed = 1;
  for (auto& w : ws) {
    lp::testing::fill_random_blocks(t, w.data(), bytes / lp::type_info(uint32_t(t))->block_bytes, seed++,
                                    0.01f);
    packs.push_back(lp::qpack(ctx, t, w.data(), N, K));
  }
  std::mt19937 rng(1);
  std::vector<float> a(static_cast<size_t>(M * K)), c(static_cast<size_t>(M * N));
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& x : a) x = u(rng);
  size_t i = 0;
  for (auto _ : st) {
    const lp::QPart part{t, N, ws[i].data(), packs[i].get()};
    lp::qgemm(ctx, k, a.data(), M, K, {&part, 1}, K, c.data(), N);
    i = (i + 1) % ws.size();
  }
  st.SetLabel(std::string(lp::type_info(uint32_t(t))->name) + " packed " + lp::qkernel_name(k));
  st.counters["Gop/s"] = benchmark::Counter(2.0 * double(M) * double(N) * double(K),
                                            benchmark::Counter::kIsIterationInvariantRate);
}
void packed_shapes(benchmark::internal::Benchmark* b) {
  const int avx2 = int(lp::QKernel::Avx2), vnni = int(lp::QKernel::Avx512Vnni512),
            amx = int(lp::QKernel::Amx);
  for (int t : {int(lp::GgmlType::Q8_0), int(lp::GgmlType::Q4_0), int(lp::GgmlType::Q4_1)}) {
    for (int k : {avx2, vnni, amx})
      for (int64_t m : {64, 512}) b->Args({k, t, m, 576, 3072});
    for (int k : {avx2, vnni})
      for (const auto& [K, N] : {std::pair<int64_t, int64_t>{576, 3072}, {1536, 576}, {576, 49152}})
        for (int64_t m : {1, 4, 8}) b->Args({k, t, m, K, N});
  }
  for (int t : {int(lp::GgmlType::Q4_K), int(lp::GgmlType::Q6_K), int(lp::GgmlType::Q8_0)})
    for (const auto& [K, N] : {std::pair<int64_t, int64_t>{4096, 4096}, {14336, 4096}})
      for (int k : {avx2, vnni, amx}) b->Args({k, t, 512, K, N});
  // The K-quants' decoding rows on each kernel (BM_QGemm/k/t/1/4096/4096 reads the blocks as stored).
  for (int t : {int(lp::GgmlType::Q4_K), int(lp::GgmlType::Q5_K), int(lp::GgmlType::Q6_K)})
    for (int k : {avx2, vnni})
      for (int64_t m : {1, 8}) b->Args({k, t, m, 4096, 4096});
  // A 2,048-token prompt's rows through down: 44 MB of quantized activations, more than a 32 MiB
  // L3, so qgemm takes them in passes (docs/cpu-kernels.md, "Rows in passes").
  for (int t : {int(lp::GgmlType::Q4_K), int(lp::GgmlType::Q6_K)}) b->Args({vnni, t, 2048, 14336, 4096});
  // And through gate|up (4096 -> 28672): the prefill's largest GEMM, its panel within L2.
  b->Args({vnni, int(lp::GgmlType::Q4_K), 2048, 4096, 28672});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_QGemmPacked)->Apply(packed_shapes);

}  // namespace

namespace {

// BM_QGemv/type/K/N: one decoding row through Llama-3.1-8B's layer matrices (qkv 4096 -> 6144,
// gate|up 4096 -> 28672, down 14336 -> 4096; and Q6_K's output layer 4096 -> 128256) in each
// weight type, as the CPU backend holds them
// (packed at load where qpack packs the type on this CPU, else the blocks as stored), the kernel
// best_qkernel picks. The weights cycle through copies that fill max(1 GiB, 4 x the last-level
// cache), so each call reads its matrix from DRAM as a decoding step does. Counters: the weights'
// GB/s and their share of the read ceiling (bench/ceiling.h).
void BM_QGemv(benchmark::State& st) {
  const auto t = lp::GgmlType(st.range(0));
  const int64_t K = st.range(1), N = st.range(2);
  lp::CpuContext ctx(2);
  const lp::QKernel k = lp::best_qkernel();
  const int64_t bytes = *lp::type_bytes(t, K) * N;
  const int64_t copies = std::max<int64_t>(2, (lp::default_bandwidth_bytes() + bytes - 1) / bytes);
  std::vector<std::vector<uint8_t>> ws(static_cast<size_t>(copies));
  ws[0].resize(static_cast<size_t>(bytes));
  lp::testing::fill_random_blocks(t, ws[0].data(), bytes / lp::type_info(uint32_t(t))->block_bytes, 1, 0.01f);
  for (size_t i = 1; i < ws.size(); ++i) ws[i] = ws[0];  // the same values: it is the traffic that counts
  std::vector<std::shared_ptr<const lp::QPacked>> packs;
  for (auto& w : ws)  // the blocks stay (the engine's stay mapped), but only the packs are read
    packs.push_back(lp::qkernel_uses_panels(k) ? lp::qpack(ctx, t, w.data(), N, K) : nullptr);
  std::mt19937 rng(1);
  std::vector<float> a(static_cast<size_t>(K)), c(static_cast<size_t>(N));
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& x : a) x = u(rng);
  size_t i = 0;
  lp::bench::Stopwatch clock;
  clock.start();
  for (auto _ : st) {
    const lp::QPart part{t, N, ws[i].data(), packs[i].get()};
    lp::qgemm(ctx, k, a.data(), 1, K, {&part, 1}, K, c.data(), N);
    i = (i + 1) % ws.size();
  }
  clock.stop();
  st.SetLabel(std::string(lp::type_info(uint32_t(t))->name) + (packs[0] ? " packed " : " as stored ") +
              lp::qkernel_name(k));
  lp::bench::bandwidth_counters(st, double(bytes), double(st.iterations()), clock.seconds());
}
void gemv_shapes(benchmark::internal::Benchmark* b) {
  for (const lp::GgmlType t : {lp::GgmlType::Q4_0, lp::GgmlType::Q4_1, lp::GgmlType::Q4_K, lp::GgmlType::Q5_K,
                               lp::GgmlType::Q6_K, lp::GgmlType::Q8_0})
    for (const auto& [K, N] : {std::pair<int64_t, int64_t>{4096, 6144}, {4096, 28672}, {14336, 4096}})
      b->Args({int(t), K, N});
  b->Args({int(lp::GgmlType::Q6_K), 4096, 128256});  // the output layer, Q4_K_M's lm_head
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}
BENCHMARK(BM_QGemv)->Apply(gemv_shapes);

}  // namespace
