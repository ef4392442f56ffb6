// Per-op kernel benchmarks on SmolLM2 shapes: attention at 512/2048/4096 tokens, checked
// against the scalar reference before timing (on a sample of rows; the full reference is
// O(T^2) in double and too slow at 4096).
//
//   build/lp_bench --benchmark_filter=Attention
//
// BM_DecodeAttention/type/keys/N: a decoding step's attention for N requests one after another
// (one query row each, SmolLM2's 30 layers, each request's own cache of `keys` keys) over an f32
// (type 0) or f16 (1) cache; GB/s counts the K/V bytes read once. Its figures and what was tried on them:
// docs/serving.md.
#include <benchmark/benchmark.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/context.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ref.h"
#include "model/ops.h"

namespace {

void BM_Attention(benchmark::State& st) {
  const int64_t T = st.range(0), H = 9, Hkv = 3, Dh = 64, Q = H * Dh, KV = Hkv * Dh;
  lp::CpuContext ctx(int(st.range(1)));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> q(T * Q), k(T * KV), v(T * KV), out(T * Q);
  for (auto* vec : {&q, &k, &v})
    for (auto& x : *vec) x = nd(rng);
  std::vector<int32_t> pos(T);
  std::iota(pos.begin(), pos.end(), 0);
  lp::LayerKV kv;
  kv.init(T, Hkv, Dh);
  kv.append(k.data(), KV, v.data(), KV, pos.data(), T);
  lp::attention(ctx, q.data(), Q, pos.data(), T, lp::KeySet{kv}, H, out.data(), Q);
  // Check the last query row (it attends to every key) against the reference.
  std::vector<float> ref(Q);
  lp::ref::attention(q.data() + (T - 1) * Q, pos.data() + T - 1, 1, k.data(), v.data(), pos.data(), T, H, Hkv,
                     Dh, ref.data());
  for (int64_t i = 0; i < Q; ++i)
    if (std::fabs(ref[i] - out[(T - 1) * Q + i]) > 1e-4) {
      st.SkipWithError("attention differs from the reference");
      return;
    }
  for (auto _ : st) {
    kv.n = T;
    lp::attention(ctx, q.data(), Q, pos.data(), T, lp::KeySet{kv}, H, out.data(), Q);
  }
  lp::ModelConfig c;
  c.n_head = int(H);
  c.n_head_kv = int(Hkv);
  c.head_dim = int(Dh);
  const double flops = lp::op_flops(c, lp::Op::Attention, {T, lp::causal_pairs(T), T});
  st.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Attention)
    ->Args({512, 2})
    ->Args({2048, 2})
    ->Args({2048, 1})
    ->Args({4096, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_DecodeAttention(benchmark::State& st) {
  const auto type = st.range(0) ? lp::KvType::F16 : lp::KvType::F32;
  const int64_t keys = st.range(1), N = st.range(2), L = 30, H = 9, Hkv = 3, Dh = 64, Q = H * Dh,
                KV = Hkv * Dh;
  lp::CpuContext ctx(2);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> k(keys * KV), v(keys * KV), q(N * L * Q), out(Q);
  for (auto* vec : {&q, &k, &v})
    for (auto& x : *vec) x = nd(rng);
  std::vector<int32_t> pos(keys);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<lp::LayerKV> kv(size_t(N * L));
  for (auto& c : kv) {
    c.init(keys + 16, Hkv, Dh, type);
    c.append(k.data(), KV, v.data(), KV, pos.data(), keys);
  }
  const int32_t last = int32_t(keys - 1);
  for (auto _ : st)
    for (int64_t l = 0; l < L; ++l)
      for (int64_t i = 0; i < N; ++i)
        lp::attention(ctx, q.data() + (l * N + i) * Q, Q, &last, 1, lp::KeySet{kv[size_t(l * N + i)]}, H,
                      out.data(), Q);
  st.counters["GB/s"] =
      benchmark::Counter(double(N * L * keys * KV * 2 * 4), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}
BENCHMARK(BM_DecodeAttention)
    ->ArgsProduct({{0, 1}, {256, 2048}, {1, 8}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
