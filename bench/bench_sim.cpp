// Simulator speed: replaying a trace of 8192 prompt tokens, 32 layers and 256
// decoding steps in <= 5 ms, growing linearly with steps x layers; a sweep of 10,000 (profile x
// schedule x prompt length) configurations in <= 10 s on 2 cores with oneTBB.
//
//   build/lp_bench --benchmark_filter='Replay|Sweep'
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
#include "traces/synthetic.h"

namespace {

void BM_Replay(benchmark::State& st) {
  const int64_t steps = st.range(0);
  const lp::ModelConfig c = lp::preset_config("llama-3.1-8b");  // 32 layers
  const auto sched = lp::resolve_schedule(lp::default_schedule(), c.n_layer);
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
    schedules.push_back(
        lp::resolve_schedule(lp::parse_schedule(fmt::format("0.3:{0},0.6:{0},0.9:{0}", share)), c.n_layer));
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

}  // namespace
