// TTFT of pruned prefill on the default model, every policy in the same run, 2 threads, f32.
//
//   build/lp_bench --benchmark_filter=Prune
//
// For each prompt length the `none` case runs first; every later case reports
// speedup_vs_none (measured, same run) and ideal_speedup (FLOPs of none / FLOPs of the case, both
// counted by op_flops through the engine's op timers). Target: measured >= 0.9 x ideal
// at 4096 tokens. Memory: kv_mib and aux_mib after the prefill, mem_vs_none = (KV + Aux Cache) /
// none's KV.
//
// BM_PruneDecode: 256 decoding steps after the prefill (LazyLLM re-selection with revival from
// the Aux Cache; frozen keeps its set), each iteration beside an unpruned run.
//
// Prompts are real English text (the licence texts every Debian system ships in
// /usr/share/common-licenses), because which tokens the last token attends to, and so how many
// are revived while decoding, depends on the text.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <numeric>
#include <string>

#include "bench/ceiling.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "kernels/context.h"
#include "model/io.h"
#include "model/paths.h"
#include "pruning/policy.h"
#include "pruning/schedule.h"

namespace {

lp::CpuContext& ctx() {
  static lp::CpuContext c(2);
  return c;
}

// The model in f32 (BM_Prune: its FLOP counts are the ideal) or int8 (BM_PruneDecode: what `run`
// picks for the default file on the CPU).
const lp::Model& model(lp::DType dtype = lp::DType::F32) {
  static std::map<lp::DType, std::unique_ptr<lp::Model>> models;
  std::unique_ptr<lp::Model>& m = models[dtype];
  if (!m) {
    const char* env = std::getenv("LAZYPREFILL_MODEL");
    m = lp::Model::load(env && *env ? env : lp::default_model_path(), dtype, ctx());
  }
  return *m;
}

// N tokens of real text at positions 0..N-1 (the text repeats if it is shorter than N).
std::pair<std::vector<int32_t>, std::vector<int32_t>> prompt(int64_t N, const lp::Model& m) {
  static const std::vector<int32_t> text_ids = m.tokenizer().encode(lp::builtin_english_text(), true, false);
  std::vector<int32_t> ids(static_cast<size_t>(N)), pos(ids.size());
  for (int64_t i = 0; i < N; ++i) ids[size_t(i)] = text_ids[size_t(i) % text_ids.size()];
  std::iota(pos.begin(), pos.end(), 0);
  return {ids, pos};
}

struct NoneRun {
  double seconds = 0, flops = 0, kv_bytes = 0;
};
std::map<int64_t, NoneRun> g_none;  // T -> the unpruned prefill

void BM_Prune(benchmark::State& st, lp::PolicyKind kind, const char* schedule) {
  const int64_t N = st.range(0);
  const lp::Model& m = model();
  const auto [ids, pos] = prompt(N, m);
  const auto steps =
      lp::resolve_schedule(lp::parse_schedule(schedule), m.config().n_layer, m.config().global_layers());
  lp::Session s(ctx(), m, N);
  std::vector<float> logits(static_cast<size_t>(m.config().n_vocab));
  const int64_t last = N - 1;
  double seconds = 0, flops = 0;
  int64_t iters = 0;
  for (auto _ : st) {
    s.reset();
    auto policy = lp::make_policy(kind, 1);
    lp::PruneRequest req{steps, policy.get()};
    lp::OpTimers t;
    const auto t0 = std::chrono::steady_clock::now();
    s.forward(ids, pos, {&last, 1}, logits.data(), kind == lp::PolicyKind::None ? nullptr : &req, nullptr,
              &t);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    flops = t.total_flops();
    ++iters;
  }
  seconds /= double(iters);
  const double kv = double(s.kv_bytes_used()), aux = double(s.aux().bytes());
  if (kind == lp::PolicyKind::None) g_none[N] = {seconds, flops, kv};
  if (auto it = g_none.find(N); it != g_none.end()) {
    st.counters["speedup_vs_none"] = it->second.seconds / seconds;
    st.counters["ideal_speedup"] = it->second.flops / flops;
    st.counters["mem_vs_none"] = (kv + aux) / it->second.kv_bytes;
  }
  st.counters["tokens/s"] = benchmark::Counter(double(N), benchmark::Counter::kIsIterationInvariantRate);
  st.counters["kv_mib"] = kv / 1048576.0;
  st.counters["aux_mib"] = aux / 1048576.0;
}

void lengths(benchmark::internal::Benchmark* b) {
  b->Arg(2048)->Arg(4096)->Arg(8192)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
}

BENCHMARK_CAPTURE(BM_Prune, none, lp::PolicyKind::None, "none")->Apply(lengths);
BENCHMARK_CAPTURE(BM_Prune, lazyllm_default, lp::PolicyKind::LazyLLM, "0.3:0.3,0.6:0.3,0.9:0.3")
    ->Apply(lengths);
BENCHMARK_CAPTURE(BM_Prune, lazyllm_aggressive, lp::PolicyKind::LazyLLM, "0.1:0.5,0.3:0.5,0.5:0.5")
    ->Apply(lengths);
BENCHMARK_CAPTURE(BM_Prune, frozen_default, lp::PolicyKind::Frozen, "0.3:0.3,0.6:0.3,0.9:0.3")
    ->Apply(lengths);
BENCHMARK_CAPTURE(BM_Prune, random_layers_default, lp::PolicyKind::RandomLayers, "0.3:0.3,0.6:0.3,0.9:0.3")
    ->Apply(lengths);
// The paper's static pruning at its default (random-drop is an unpruned prefill of fewer tokens:
// BM_Prune/none at the shorter length).
BENCHMARK_CAPTURE(BM_Prune, static_paper_default, lp::PolicyKind::StaticPaper, "0.1:0.35")->Apply(lengths);

}  // namespace

namespace {

// Decoding after a pruned prefill: the case, a 2,048-token prompt and 256 generated tokens
// (greedy), int8 as `run` picks for the default file. Revivals cluster in the first steps; the
// steady state is every step after the first 32. Each iteration runs the case and an unpruned run
// (`none`) back to back, in alternating order (a shared VM's slow minute lands on both), and the
// ratios are medians of the iterations' own ratios:
//   step_ms / steady_ms    the case's mean decoding-step time, all steps / after the first 32
//   slowdown_vs_none       mean step time / none's
//   steady_slowdown        the same after the first 32 steps (target <= 1.3)
//   first32_slowdown       the same over the first 32 (the revival burst)
//   bookkeeping_share      time in score, select and gather ops per step / none's step time: the
//                          pruning machinery itself, without the rows it decides to compute
//   rows_per_step          token rows computed per step, summed over layers (none: n_layer); also
//                          first32_rows_per_step and steady_rows_per_step
//   total_vs_none          (prefill + 256 steps) / none's (target < 1): the paper's at-most-once
//                          rule bounds the work; whether it also bounds the time is what this says
struct DecodeRun {
  double prefill = 0, first = 0, steady = 0, bookkeeping = 0, first_rows = 0, steady_rows = 0;
};
constexpr int64_t kDecodeSteps = 256, kFirstSteps = 32;

DecodeRun run_decode(lp::Session& s, const lp::Model& m, const std::vector<int32_t>& ids,
                     const std::vector<int32_t>& pos, lp::PolicyKind kind,
                     std::span<const lp::PruneStep> steps) {
  using Clock = std::chrono::steady_clock;
  const auto secs = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  const int64_t N = int64_t(ids.size()), last = N - 1, row = 0;
  std::vector<float> logits(static_cast<size_t>(m.config().n_vocab));
  s.reset();
  auto policy = lp::make_policy(kind, 1);
  lp::PruneRequest req{steps, policy.get()};
  DecodeRun r;
  const auto t0 = Clock::now();
  s.forward(ids, pos, {&last, 1}, logits.data(), kind == lp::PolicyKind::None ? nullptr : &req);
  const auto t1 = Clock::now();
  r.prefill = secs(t0, t1);
  lp::OpTimers t;
  auto tf = t1;
  for (int64_t i = 0; i < kDecodeSteps; ++i) {
    if (i == kFirstSteps) tf = Clock::now();
    const int32_t tok = lp::argmax(logits), p = int32_t(N + i);
    lp::trace::Step fs;
    if (kind == lp::PolicyKind::None)
      s.forward({&tok, 1}, {&p, 1}, {&row, 1}, logits.data(), nullptr, &fs, &t);
    else
      s.decode_step(tok, p, logits.data(), &req, &fs, &t);
    for (int64_t q : fs.queries) (i < kFirstSteps ? r.first_rows : r.steady_rows) += double(q);
  }
  const auto t2 = Clock::now();
  r.first = secs(t1, tf);
  r.steady = secs(tf, t2);
  for (lp::Op op : {lp::Op::Score, lp::Op::Select, lp::Op::Gather}) r.bookkeeping += t.total(op).seconds;
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void BM_PruneDecode(benchmark::State& st, lp::PolicyKind kind, const char* schedule) {
  const int64_t N = st.range(0);
  const lp::Model& m = model(lp::DType::Int8);
  const auto [ids, pos] = prompt(N, m);
  const auto steps =
      lp::resolve_schedule(lp::parse_schedule(schedule), m.config().n_layer, m.config().global_layers());
  lp::Session s(ctx(), m, N + kDecodeSteps);
  std::vector<DecodeRun> cases, nones;
  for (auto _ : st) {
    const bool none_first = cases.size() % 2 == 0;
    if (none_first) nones.push_back(run_decode(s, m, ids, pos, lp::PolicyKind::None, steps));
    cases.push_back(run_decode(s, m, ids, pos, kind, steps));
    if (!none_first) nones.push_back(run_decode(s, m, ids, pos, lp::PolicyKind::None, steps));
  }
  const auto step = [](const DecodeRun& r) { return (r.first + r.steady) / kDecodeSteps; };
  const auto steady = [](const DecodeRun& r) { return r.steady / (kDecodeSteps - kFirstSteps); };
  const auto total = [&](const DecodeRun& r) { return r.prefill + kDecodeSteps * step(r); };
  const auto med = [&](auto f) {
    std::vector<double> v;
    for (size_t i = 0; i < cases.size(); ++i) v.push_back(f(cases[i], nones[i]));
    return median(v);
  };
  st.counters["slowdown_vs_none"] =
      med([&](const DecodeRun& c, const DecodeRun& n) { return step(c) / step(n); });
  st.counters["steady_slowdown"] =
      med([&](const DecodeRun& c, const DecodeRun& n) { return steady(c) / steady(n); });
  st.counters["first32_slowdown"] =
      med([](const DecodeRun& c, const DecodeRun& n) { return c.first / n.first; });
  st.counters["total_vs_none"] =
      med([&](const DecodeRun& c, const DecodeRun& n) { return total(c) / total(n); });
  st.counters["bookkeeping_share"] =
      med([&](const DecodeRun& c, const DecodeRun& n) { return c.bookkeeping / kDecodeSteps / step(n); });
  st.counters["prefill_ms"] = med([](const DecodeRun& c, const DecodeRun&) { return c.prefill * 1e3; });
  st.counters["none_prefill_ms"] = med([](const DecodeRun&, const DecodeRun& n) { return n.prefill * 1e3; });
  st.counters["step_ms"] = med([&](const DecodeRun& c, const DecodeRun&) { return step(c) * 1e3; });
  st.counters["steady_ms"] = med([&](const DecodeRun& c, const DecodeRun&) { return steady(c) * 1e3; });
  st.counters["none_steady_ms"] = med([&](const DecodeRun&, const DecodeRun& n) { return steady(n) * 1e3; });
  st.counters["first32_rows_per_step"] =
      med([](const DecodeRun& c, const DecodeRun&) { return c.first_rows / kFirstSteps; });
  st.counters["steady_rows_per_step"] =
      med([](const DecodeRun& c, const DecodeRun&) { return c.steady_rows / (kDecodeSteps - kFirstSteps); });
  // The case's steps against the memory wall: an unpruned step's reads (weights and all K/V) at the
  // rate the case's steps ran.
  double seconds = 0;
  for (const DecodeRun& c : cases) seconds += c.first + c.steady;
  lp::bench::bandwidth_counters(
      st, lp::bench::decode_step_bytes(m, double(N + kDecodeSteps / 2), s.backend().kv_element_bytes()),
      double(kDecodeSteps * int64_t(cases.size())), seconds);
}

void decode_lengths(benchmark::internal::Benchmark* b) {
  b->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
}

// Each case runs `none` beside it.
BENCHMARK_CAPTURE(BM_PruneDecode, lazyllm_default, lp::PolicyKind::LazyLLM, "0.3:0.3,0.6:0.3,0.9:0.3")
    ->Apply(decode_lengths);
BENCHMARK_CAPTURE(BM_PruneDecode, frozen_default, lp::PolicyKind::Frozen, "0.3:0.3,0.6:0.3,0.9:0.3")
    ->Apply(decode_lengths);
BENCHMARK_CAPTURE(BM_PruneDecode, random_layers_default, lp::PolicyKind::RandomLayers,
                  "0.3:0.3,0.6:0.3,0.9:0.3")
    ->Apply(decode_lengths);

}  // namespace
