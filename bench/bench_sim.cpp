// Simulator speed: replaying a trace of 8192 prompt tokens, 32 layers and 256 decoding steps
// (issue 4 target: <= 5 ms), and how the cost grows with steps x layers.
//
//   build/lp_bench --benchmark_filter=Replay
#include <benchmark/benchmark.h>

#include "hwmodels/profile.h"
#include "model/presets.h"
#include "sim/replay.h"
#include "traces/schedule.h"
#include "traces/synthetic.h"

namespace {

void BM_Replay(benchmark::State& st) {
  const int64_t steps = st.range(0);
  const lp::ModelConfig c = lp::preset_config("llama-3.1-8b");  // 32 layers
  const auto sched = lp::resolve_schedule(lp::default_schedule(), c.n_layer);
  const lp::trace::Trace t = lp::trace::synthetic_trace(c, "lazyllm", sched, 8192, steps, 0.01);
  const lp::hw::Profile hw = lp::hw::load_profile("h100-sxm");
  for (auto _ : st) {
    const lp::sim::Prediction p = lp::sim::replay(t, c, hw, lp::sim::Precision{});
    benchmark::DoNotOptimize(p.total_s);
  }
  st.counters["step_layers"] = double((steps + 1) * c.n_layer);
  st.counters["ns_per_step_layer"] =
      benchmark::Counter(double((steps + 1) * c.n_layer), benchmark::Counter::kIsIterationInvariantRate |
                                                              benchmark::Counter::kInvert);
}
BENCHMARK(BM_Replay)->Arg(0)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

}  // namespace
