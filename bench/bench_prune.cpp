// TTFT of pruned prefill on the default model, every policy in the same run, 2 threads, f32.
//
//   build/lp_bench --benchmark_filter=Prune
//
// For each prompt length the `none` case runs first; every later case reports
// speedup_vs_none (measured, same run) and ideal_speedup (FLOPs of none / FLOPs of the case, both
// counted by op_flops through the engine's op timers). Target (issue 3): measured >= 0.9 x ideal
// at 4096 tokens. Decode after a pruned prefill is not measured here (revival is pending).
#include <benchmark/benchmark.h>

#include <chrono>
#include <map>
#include <memory>
#include <numeric>
#include <random>

#include "kernels/context.h"
#include "kernels/pruning.h"
#include "kernels/runner.h"
#include "kernels/sampler.h"
#include "kernels/schedule.h"
#include "model/paths.h"

namespace {

lp::CpuContext& ctx() {
  static lp::CpuContext c(2);
  return c;
}

const lp::Model& model() {
  static std::unique_ptr<lp::Model> m;
  if (!m) {
    const char* env = std::getenv("LAZYPREFILL_MODEL");
    m = lp::Model::load(env && *env ? env : lp::default_model_path(), lp::DType::F32, ctx());
  }
  return *m;
}

// N seeded token ids (special tokens skipped) at positions 0..N-1.
std::pair<std::vector<int32_t>, std::vector<int32_t>> prompt(int64_t N, int32_t vocab) {
  std::mt19937 rng(42);
  std::vector<int32_t> ids(static_cast<size_t>(N)), pos(ids.size());
  for (auto& i : ids) i = int32_t(100 + rng() % uint32_t(vocab - 100));
  std::iota(pos.begin(), pos.end(), 0);
  return {ids, pos};
}

std::map<int64_t, std::pair<double, double>> g_none;  // T -> (seconds, flops)

void BM_Prune(benchmark::State& st, lp::PolicyKind kind, const char* schedule) {
  const int64_t N = st.range(0);
  const lp::Model& m = model();
  const auto [ids, pos] = prompt(N, m.config().n_vocab);
  const auto steps = lp::resolve_schedule(lp::parse_schedule(schedule), m.config().n_layer);
  lp::Session s(m, N);
  std::vector<float> logits(static_cast<size_t>(m.config().n_vocab));
  const int64_t last = N - 1;
  double seconds = 0, flops = 0;
  int64_t iters = 0;
  for (auto _ : st) {
    s.reset();
    auto policy = lp::make_policy(kind, 1);
    lp::PruneRequest req{steps, policy.get()};
    lp::OpTimers t;
    s.forward(ctx(), ids, pos, {&last, 1}, logits.data(), &t, kind == lp::PolicyKind::None ? nullptr : &req);
    seconds += t.total_seconds();
    flops = t.total_flops();
    ++iters;
  }
  seconds /= double(iters);
  if (kind == lp::PolicyKind::None) g_none[N] = {seconds, flops};
  if (auto it = g_none.find(N); it != g_none.end()) {
    st.counters["speedup_vs_none"] = it->second.first / seconds;
    st.counters["ideal_speedup"] = it->second.second / flops;
  }
  st.counters["tokens/s"] = benchmark::Counter(double(N), benchmark::Counter::kIsIterationInvariantRate);
  st.counters["kv_mib"] = double(s.kv_bytes_used()) / 1048576.0;
  st.counters["aux_mib"] = double(s.aux().bytes()) / 1048576.0;
}

void lengths(benchmark::internal::Benchmark* b) {
  b->Arg(2048)->Arg(4096)->Arg(8192)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
}

BENCHMARK_CAPTURE(BM_Prune, none, lp::PolicyKind::None, "none")->Apply(lengths);
BENCHMARK_CAPTURE(BM_Prune, lazyllm_default, lp::PolicyKind::LazyLLM, "0.3:0.3,0.6:0.3,0.9:0.3")
    ->Apply(lengths);
BENCHMARK_CAPTURE(BM_Prune, lazyllm_aggressive, lp::PolicyKind::LazyLLM, "0.1:0.5,0.3:0.5,0.5:0.5")
    ->Apply(lengths);
BENCHMARK_CAPTURE(BM_Prune, static_default, lp::PolicyKind::Static, "0.3:0.3,0.6:0.3,0.9:0.3")
    ->Apply(lengths);
BENCHMARK_CAPTURE(BM_Prune, random_default, lp::PolicyKind::Random, "0.3:0.3,0.6:0.3,0.9:0.3")
    ->Apply(lengths);

}  // namespace

namespace {

// Decoding after a pruned prefill: steps/s of `none` and of each policy's decode (LazyLLM
// re-selection with revival), 2048-token prompt, 8 steps; slowdown_vs_none = time / none's time.
std::map<int64_t, double> g_none_decode;

void BM_PruneDecode(benchmark::State& st, lp::PolicyKind kind, const char* schedule) {
  const int64_t N = st.range(0), steps_n = 8;
  const lp::Model& m = model();
  const auto [ids, pos] = prompt(N, m.config().n_vocab);
  const auto steps = lp::resolve_schedule(lp::parse_schedule(schedule), m.config().n_layer);
  lp::Session s(m, N + steps_n);
  std::vector<float> logits(static_cast<size_t>(m.config().n_vocab));
  const int64_t last = N - 1, row = 0;
  double seconds = 0;
  int64_t revived = 0, iters = 0;
  for (auto _ : st) {
    st.PauseTiming();
    s.reset();
    auto policy = lp::make_policy(kind, 1);
    lp::PruneRequest req{steps, policy.get()};
    s.forward(ctx(), ids, pos, {&last, 1}, logits.data(), nullptr,
              kind == lp::PolicyKind::None ? nullptr : &req);
    st.ResumeTiming();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps_n; ++i) {
      const int32_t tok = lp::argmax(logits), p = int32_t(N + i);
      if (kind == lp::PolicyKind::None) {
        s.forward(ctx(), {&tok, 1}, {&p, 1}, {&row, 1}, logits.data());
      } else {
        lp::ForwardStats fs;
        s.decode_step(ctx(), tok, p, logits.data(), nullptr, req, &fs);
        for (int64_t r : fs.revived) revived += r;
      }
    }
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++iters;
  }
  seconds /= double(iters);
  if (kind == lp::PolicyKind::None) g_none_decode[N] = seconds;
  if (auto it = g_none_decode.find(N); it != g_none_decode.end())
    st.counters["slowdown_vs_none"] = seconds / it->second;
  st.counters["steps/s"] = benchmark::Counter(double(steps_n), benchmark::Counter::kIsIterationInvariantRate);
  st.counters["revivals_per_step"] = double(revived) / double(iters * steps_n);
}

BENCHMARK_CAPTURE(BM_PruneDecode, none, lp::PolicyKind::None, "none")
    ->Arg(2048)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_PruneDecode, lazyllm_default, lp::PolicyKind::LazyLLM, "0.3:0.3,0.6:0.3,0.9:0.3")
    ->Arg(2048)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_PruneDecode, static_default, lp::PolicyKind::Static, "0.3:0.3,0.6:0.3,0.9:0.3")
    ->Arg(2048)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
