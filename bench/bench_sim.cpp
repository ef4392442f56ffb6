// Simulator speed: replaying a trace of 8192 prompt tokens, 32 layers and 256
// decoding steps in <= 5 ms, growing linearly with steps x layers; a sweep of 10,000 (profile x
// schedule x prompt length) configurations in <= 10 s on 2 cores with oneTBB.
//
//   build/lp_bench --benchmark_filter='Replay|Sweep'
//
// Serving (sim/serving.h): 100,000 requests in <= 5 s, cost linear in requests; a capacity search
// over 20 configurations in <= 60 s.
//
//   build/lp_bench --benchmark_filter='Serving'
//
// Mixture of experts (issue 53): simulate of DeepSeek-V3 at 32k tokens with LazyLLM beside its
// unpruned run in <= 50 ms; 100,000 requests of Qwen3-30B-A3B within 2x the dense figure above;
// a capacity search over 20 MoE configurations in <= 60 s.
//
//   build/lp_bench --benchmark_filter='MoE|ServingSim/100000'
//
// One `simulate` call as the CLI and the Python module make it (sim::simulate): the baseline of
// the module's call overhead (bench/python_simulate.py times the same requests from Python).
//
//   build/lp_bench --benchmark_filter='SimulateCall'
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <atomic>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "model/presets.h"
#include "pruning/schedule.h"
#include "sim/replay.h"
#include "sim/revival.h"
#include "sim/serving_capacity.h"
#include "sim/simulate.h"
#include "traces/synthetic.h"

namespace {

void BM_Replay(benchmark::State& st) {
  const int64_t steps = st.range(0);
  const lp::ModelConfig c = lp::preset_config("llama-3.1-8b");  // 32 layers
  const auto sched = lp::resolve_schedule(lp::default_schedule(), c.n_layer, c.global_layers());
  const lp::trace::Trace t =
      lp::trace::synthetic_trace(c, "lazyllm", sched, 8192, steps, [](size_t, int64_t) {
        return lp::trace::StageRevival{0.01, -1};
      });
  const lp::hw::Profile hw = lp::hw::load_profile("h100-sxm");
  for (auto _ : st) {
    const lp::sim::Prediction p = lp::sim::replay(t, c, hw, lp::sim::Precision{});
    benchmark::DoNotOptimize(p.total_s);
  }
  st.counters["step_layers"] = double((steps + 1) * c.n_layer);
  st.counters["ns_per_step_layer"] =
      benchmark::Counter(double((steps + 1) * c.n_layer),
                         benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_Replay)->Arg(0)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

// sim::simulate of llama-3.1-8b with LazyLLM's default schedule on an H100: a prompt of range(0)
// tokens and range(1) generated; range(2) 1 loads the profile by name in every call (as a call
// naming it does), 0 passes the loaded one. bench/python_simulate.py makes the same calls from Python.
void BM_SimulateCall(benchmark::State& st) {
  lp::sim::SimulateRequest r;
  r.model_config = "llama-3.1-8b";
  r.prune = "lazyllm";
  r.prompt_tokens = st.range(0);
  r.new_tokens = st.range(1);
  const bool by_name = st.range(2) == 1;
  const lp::hw::Profile hw = lp::hw::load_profile("h100-sxm");
  for (auto _ : st) {
    r.hws = {by_name ? lp::hw::load_profile("h100-sxm") : hw};
    const lp::sim::SimulateReport rep = lp::sim::simulate(r);
    benchmark::DoNotOptimize(rep.results[0].pruned.total_s);
  }
}
BENCHMARK(BM_SimulateCall)
    ->ArgNames({"prompt", "new", "by_name"})
    ->Args({8192, 0, 0})
    ->Args({8192, 0, 1})
    ->Args({8192, 64, 0})
    ->Args({8192, 64, 1})
    ->Unit(benchmark::kMicrosecond);

// 9 profiles x 10 schedules x 112 prompt lengths (256 .. 28,672) = 10,080 configurations of
// llama-3.1-8b, each a synthetic pruned prefill plus its unpruned baseline, replayed and compared.
void BM_Sweep(benchmark::State& st) {
  tbb::global_control threads(tbb::global_control::max_allowed_parallelism, 2);
  const lp::ModelConfig c = lp::preset_config("llama-3.1-8b");
  std::vector<lp::hw::Profile> hws;
  for (const std::string& n : lp::hw::builtin_profile_names()) hws.push_back(lp::hw::load_profile(n));
  std::vector<std::vector<lp::PruneStep>> schedules;
  for (int i = 0; i < 10; ++i) {
    const double share = 0.1 + 0.05 * i;
    schedules.push_back(lp::resolve_schedule(
        lp::parse_schedule(fmt::format("0.3:{0},0.6:{0},0.9:{0}", share)), c.n_layer, c.global_layers()));
  }
  std::vector<int64_t> lengths;
  for (int i = 1; i <= 112; ++i) lengths.push_back(256 * i);
  const size_t n = hws.size() * schedules.size() * lengths.size();
  std::atomic<int64_t> sum_speedup_milli{0};
  for (auto _ : st) {
    tbb::parallel_for(size_t(0), n, [&](size_t k) {
      const lp::hw::Profile& hw = hws[k % hws.size()];
      const auto& sched = schedules[(k / hws.size()) % schedules.size()];
      const int64_t T = lengths[k / (hws.size() * schedules.size())];
      const lp::sim::Prediction p =
          lp::sim::replay(lp::trace::synthetic_trace(c, "lazyllm", sched, T, 0), c, hw, {});
      const lp::sim::Prediction b =
          lp::sim::replay(lp::trace::synthetic_trace(c, "none", {}, T, 0), c, hw, {});
      sum_speedup_milli += int64_t(1000 * b.ttft_s / p.ttft_s);
    });
  }
  st.counters["configs"] = double(n);
  st.counters["configs/s"] = benchmark::Counter(double(n), benchmark::Counter::kIsIterationInvariantRate);
  benchmark::DoNotOptimize(sum_speedup_milli.load());
}
BENCHMARK(BM_Sweep)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

// N requests of `model` on an H100 in `p` under LazyLLM with the built-in revival model: prompts
// uniform over 1,024-8,192 tokens, outputs over 16-256, Poisson at 2 requests/s.
void serving_sim(benchmark::State& st, const char* model, const lp::sim::Precision& p,
                 double kv_element_bytes) {
  const int64_t n = st.range(0);
  const lp::ModelConfig c = lp::preset_config(model);
  const lp::hw::Profile hw = lp::hw::load_profile("h100-sxm");
  const lp::Method lazyllm{lp::PolicyKind::LazyLLM, lp::default_schedule()};
  const lp::sim::ServingMethod m = lp::sim::serving_method(
      lazyllm, c,
      lp::sim::revival_shares(lp::sim::load_revival_model(""), c.n_layer,
                              lp::resolve_schedule(lazyllm.schedule, c.n_layer, c.global_layers()), true));
  lp::sim::ServingConfig cfg;
  cfg.kv_budget_bytes = 40.0 * (1 << 30);
  cfg.kv_element_bytes = kv_element_bytes;
  cfg.max_batch_tokens = 8192;
  const auto reqs = lp::sim::make_workload(n, {2.0, 1.0}, lp::sim::LengthDist::parse("1024:8192", "p", "p"),
                                           lp::sim::LengthDist::parse("16:256", "o", "o"), 1);
  int64_t iterations = 0;
  for (auto _ : st) {
    const lp::sim::ServingRun r = lp::sim::simulate_serving(c, hw, p, m, cfg, reqs);
    iterations = r.iterations;
    benchmark::DoNotOptimize(r.end_s);
  }
  st.counters["iterations"] = double(iterations);
  st.counters["requests/s"] = benchmark::Counter(double(n), benchmark::Counter::kIsIterationInvariantRate);
}

// Llama-3.1-8B in bf16 (about 60% of the unpruned capacity: batches of 10-30 decoding requests).
void BM_ServingSim(benchmark::State& st) {
  serving_sim(st, "llama-3.1-8b", {}, 2);
}
BENCHMARK(BM_ServingSim)
    ->Arg(10000)
    ->Arg(100000)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(1);

// Capacity searches at p90 TTFT <= 1 s and p90 ITL <= 50 ms of `model` in `p` on two profiles x
// 2 methods x 5 prompt lengths = 20 configurations, 1,000 requests x 1 seed each, 2% resolution.
void capacity_searches(benchmark::State& st, const char* model, const std::vector<lp::hw::Profile>& hws,
                       const lp::sim::Precision& p, double kv_element_bytes) {
  const lp::ModelConfig c = lp::preset_config(model);
  lp::sim::ServingConfig cfg;
  cfg.kv_budget_bytes = 16.0 * (1 << 30);
  cfg.kv_element_bytes = kv_element_bytes;
  cfg.max_batch_tokens = 8192;
  lp::sim::CapacityOptions o;
  o.objectives = {1.0, 0.05};
  o.requests = 1000;
  o.seeds = 1;
  o.tolerance = 0.02;
  const auto out = lp::sim::LengthDist::parse("64", "o", "o");
  int64_t sims = 0, configs = 0;
  for (auto _ : st) {
    for (const auto& hw : hws)
      for (const char* policy : {"none", "lazyllm"})
        for (const char* len : {"1024", "2048", "4096", "8192", "2048:8192"}) {
          const lp::PolicyKind k = lp::parse_policy(policy);
          const lp::sim::ServingMethod m = lp::sim::serving_method(
              {k, k == lp::PolicyKind::None ? lp::Schedule{} : lp::default_schedule()}, c);
          const auto r = lp::sim::find_capacity(c, hw, p, m, cfg, {1, 1},
                                                lp::sim::LengthDist::parse(len, "p", "p"), out, o);
          sims += r.simulations;
          ++configs;
          benchmark::DoNotOptimize(r.rate);
        }
  }
  st.counters["configs"] = double(configs);
  st.counters["simulations"] = double(sims);
}

// Llama-3.1-8B in bf16 on an H100 and an L4.
void BM_ServingCapacity(benchmark::State& st) {
  capacity_searches(st, "llama-3.1-8b", {lp::hw::load_profile("h100-sxm"), lp::hw::load_profile("l4")}, {},
                    2);
}
BENCHMARK(BM_ServingCapacity)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

// `simulate --model-config deepseek-v3 --prompt-tokens 32768 --prune lazyllm` on an H200 in fp8
// over 8 GPUs (tp 8): the pruned run and its unpruned baseline, the revival model's decoding
// steps when the argument is > 0.
void BM_SimulateMoE(benchmark::State& st) {
  const int64_t steps = st.range(0);
  const lp::ModelConfig c = lp::preset_config("deepseek-v3");
  const lp::hw::Profile hw = lp::hw::load_profile("h200");
  const lp::sim::Precision fp8{"fp8", "fp8", "fp8"};
  const lp::Method lazyllm{lp::PolicyKind::LazyLLM, lp::default_schedule()};
  const auto sched = lp::resolve_schedule(lazyllm.schedule, c.n_layer, c.global_layers());
  const lp::trace::Revivals rv =
      lp::sim::revival_shares(lp::sim::load_revival_model(""), c.n_layer, sched, true);
  for (auto _ : st) {
    const lp::sim::Prediction p =
        lp::sim::replay_synthetic(c, "lazyllm", sched, 32768, steps, rv, hw, fp8, 1, 8, 0);
    const lp::sim::Prediction b =
        lp::sim::replay_synthetic(c, "none", {}, 32768, steps, {}, hw, fp8, 1, 8, 0);
    benchmark::DoNotOptimize(p.total_s + b.total_s);
  }
}
BENCHMARK(BM_SimulateMoE)->Arg(0)->Arg(256)->Unit(benchmark::kMillisecond);

// BM_ServingSim's workload on Qwen3-30B-A3B (48 layers, 128 experts of 768, 8 a token) in fp8.
void BM_ServingSimMoE(benchmark::State& st) {
  serving_sim(st, "qwen3-30b-a3b", {"fp8", "fp8", "fp8"}, 1);
}
BENCHMARK(BM_ServingSimMoE)->Arg(100000)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

// The same 20 searches of Qwen3-30B-A3B in fp8 on an H100 and an H200.
void BM_ServingCapacityMoE(benchmark::State& st) {
  capacity_searches(st, "qwen3-30b-a3b", {lp::hw::load_profile("h100-sxm"), lp::hw::load_profile("h200")},
                    {"fp8", "fp8", "fp8"}, 1);
}
BENCHMARK(BM_ServingCapacityMoE)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(1);

}  // namespace
