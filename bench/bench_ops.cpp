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

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "bench/ceiling.h"
#include "kernels/context.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ref.h"
#include "model/ops.h"
#include "model/quant.h"

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

// BM_DecodeAttention8B/keys: one decoding row's attention through Llama-3.1-8B's 32 layers (32
// heads over 8 kv heads of 128) over an f16 cache of `keys` keys each: after 4,096 tokens 537 MB,
// which comes from memory as in a decoding step. GB/s: the K/V bytes read; of_ceiling: their share
// of the read ceiling (bench/ceiling.h).
void BM_DecodeAttention8B(benchmark::State& st) {
  const int64_t keys = st.range(0), L = 32, H = 32, Hkv = 8, Dh = 128, Q = H * Dh, KV = Hkv * Dh;
  lp::CpuContext ctx(2);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> k(keys * KV), v(keys * KV), q(L * Q), out(Q);
  for (auto* vec : {&q, &k, &v})
    for (auto& x : *vec) x = nd(rng);
  std::vector<int32_t> pos(keys);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<lp::LayerKV> kv(static_cast<size_t>(L));
  for (auto& c : kv) {
    c.init(keys + 16, Hkv, Dh, lp::KvType::F16);
    c.append(k.data(), KV, v.data(), KV, pos.data(), keys);
  }
  const int32_t last = int32_t(keys - 1);
  lp::bench::Stopwatch clock;
  clock.start();
  for (auto _ : st)
    for (int64_t l = 0; l < L; ++l)
      lp::attention(ctx, q.data() + l * Q, Q, &last, 1, lp::KeySet{kv[size_t(l)]}, H, out.data(), Q);
  clock.stop();
  lp::bench::bandwidth_counters(st, double(L * keys * KV * 2 * 2), double(st.iterations()), clock.seconds());
}
BENCHMARK(BM_DecodeAttention8B)
    ->Arg(512)
    ->Arg(1024)
    ->Arg(2048)
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// BM_RevivalAttention/rows/layers/listed: a LazyLLM decoding step's attention at a layer past a
// pruning step (SmolLM2's heads, an f16 cache): the cache holds 70% of 3,310 prompt positions (the
// prefill's kept tokens, in order) and then `rows - 1` revived ones appended out of order; the
// query rows are the revived tokens and the new one, each seeing the listed keys up to its
// position. The step lists `listed`% of the held keys (its own selection: 70% one pruning layer
// on, 34% three), the rows always. The rows' causal lengths differ, so a key block past a row's
// position is work the row must skip, and so is a held key the step does not list.
void BM_RevivalAttention(benchmark::State& st) {
  const int64_t S = 3310, R = st.range(0), H = 9, Hkv = 3, Dh = 64, Q = H * Dh, KV = Hkv * Dh;
  lp::CpuContext ctx(2);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> k((S + 1) * KV), v((S + 1) * KV), q(R * Q), out(R * Q);
  for (auto* vec : {&q, &k, &v})
    for (auto& x : *vec) x = nd(rng);
  std::vector<int32_t> held, rest;
  std::bernoulli_distribution keep(0.7);
  for (int32_t p = 0; p < S; ++p) (keep(rng) ? held : rest).push_back(p);
  std::shuffle(rest.begin(), rest.end(), rng);
  std::vector<int32_t> revived(rest.begin(), rest.begin() + (R - 1));
  std::sort(revived.begin(), revived.end());
  std::vector<int32_t> order = held;  // slot order: the prefill's, then the revived, then the new token
  order.insert(order.end(), revived.begin(), revived.end());
  order.push_back(int32_t(S));
  // `layers` caches of the same content, visited in turn: 1 stays in the CPU's caches, 30 (a
  // model's worth, 2.5 MB each) come from memory as a decoding step's do.
  std::vector<lp::LayerKV> kvs(size_t(st.range(1)));
  std::vector<int32_t> slot_of(size_t(S + 1));
  for (size_t j = 0; j < order.size(); ++j) slot_of[size_t(order[j])] = int32_t(j);
  for (lp::LayerKV& kv : kvs) {
    kv.init(S + 1, Hkv, Dh, lp::KvType::F16);
    for (const int32_t p : order) kv.append(k.data() + p * KV, KV, v.data() + p * KV, KV, &p, 1);
  }
  const lp::LayerKV& kv = kvs[0];
  std::vector<int32_t> qpos = revived;
  qpos.push_back(int32_t(S));
  std::vector<int32_t> keys, slots;
  std::bernoulli_distribution listed(double(st.range(2)) / 100);
  for (int32_t p : held)
    if (listed(rng)) keys.push_back(p);
  keys.insert(keys.end(), qpos.begin(), qpos.end());
  std::sort(keys.begin(), keys.end());
  for (int32_t p : keys) slots.push_back(slot_of[size_t(p)]);
  lp::attention(ctx, q.data(), Q, qpos.data(), R, lp::KeySet{kv, slots}, H, out.data(), Q);
  // Check the first revived row and the new one against the reference over the same keys.
  std::vector<float> ks, vs;
  for (int32_t p : keys) {
    for (int64_t i = 0; i < KV; ++i) ks.push_back(lp::f16_to_f32(lp::f32_to_f16(k[size_t(p * KV + i)])));
    for (int64_t i = 0; i < KV; ++i) vs.push_back(lp::f16_to_f32(lp::f32_to_f16(v[size_t(p * KV + i)])));
  }
  for (int64_t r : {int64_t(0), R - 1}) {
    std::vector<float> ref(Q);
    lp::ref::attention(q.data() + r * Q, &qpos[size_t(r)], 1, ks.data(), vs.data(), keys.data(),
                       int64_t(keys.size()), H, Hkv, Dh, ref.data());
    for (int64_t i = 0; i < Q; ++i)
      if (std::fabs(ref[size_t(i)] - out[size_t(r * Q + i)]) > 1e-4) {
        st.SkipWithError("attention differs from the reference");
        return;
      }
  }
  int64_t pairs = 0;
  for (int32_t p : qpos) pairs += std::upper_bound(keys.begin(), keys.end(), p) - keys.begin();
  size_t layer = 0;
  for (auto _ : st) {
    lp::attention(ctx, q.data(), Q, qpos.data(), R, lp::KeySet{kvs[layer], slots}, H, out.data(), Q);
    layer = (layer + 1) % kvs.size();
  }
  lp::ModelConfig c;
  c.n_head = int(H);
  c.n_head_kv = int(Hkv);
  c.head_dim = int(Dh);
  const double flops = lp::op_flops(c, lp::Op::Attention, {R, pairs, int64_t(keys.size())});
  st.counters["GFLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}
BENCHMARK(BM_RevivalAttention)
    ->ArgsProduct({{1, 8, 40, 200}, {1, 30}, {100}})
    ->Args({1, 30, 34})
    ->Args({8, 30, 34})
    ->Args({40, 30, 34})
    ->Args({16, 30, 70})
    ->Args({16, 30, 34})
    ->Args({16, 30, 100})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
