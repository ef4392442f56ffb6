// Continuous batching on the default model (SmolLM2-135M-Instruct, int8 as `serve` runs it), 2
// threads: N requests decoding together, one batch per step (engine/batch.h), every GEMM once over
// their N rows, against one request alone (N = 1).
//
//   build/lp_bench --benchmark_filter=BatchedDecode
//
// Each request has its own 256-token prompt (prefilled untimed) and its own K/V; a timed iteration
// is 16 decoding steps of all N. Counter tokens/s: generated tokens of all N per second. The
// issue's target: at N = 8 at least 3x the tokens/s of N = 1.
#include <benchmark/benchmark.h>

#include <memory>
#include <numeric>
#include <random>

#include "engine/batch.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "kernels/context.h"
#include "model/paths.h"

namespace {

lp::CpuContext& ctx() {
  static lp::CpuContext c(2);
  return c;
}

const lp::Model& int8_model() {
  static std::unique_ptr<lp::Model> m = [] {
    const char* env = std::getenv("LAZYPREFILL_MODEL");
    return lp::Model::load(env && *env ? env : lp::default_model_path(), lp::DType::Int8, ctx());
  }();
  return *m;
}

void BM_BatchedDecode(benchmark::State& st) {
  const int64_t N = st.range(0), prompt = 256, steps = 16;
  const lp::Model& m = int8_model();
  const int32_t V = m.config().n_vocab;
  std::vector<std::unique_ptr<lp::Session>> sessions;
  std::vector<std::vector<float>> logits(static_cast<size_t>(N), std::vector<float>(static_cast<size_t>(V)));
  std::vector<int32_t> pos(static_cast<size_t>(prompt));
  std::iota(pos.begin(), pos.end(), 0);
  const int64_t last = prompt - 1;
  const auto prefill = [&] {
    for (int64_t i = 0; i < N; ++i) {
      std::mt19937 rng(uint32_t(7 + i));
      std::vector<int32_t> ids(static_cast<size_t>(prompt));
      for (auto& id : ids) id = int32_t(100 + rng() % uint32_t(V - 100));
      sessions[size_t(i)]->reset();
      sessions[size_t(i)]->forward(ids, pos, {&last, 1}, logits[size_t(i)].data());
    }
  };
  for (int64_t i = 0; i < N; ++i) sessions.push_back(std::make_unique<lp::Session>(ctx(), m, prompt + steps));
  std::vector<lp::Session::Pass> passes(static_cast<size_t>(N));
  std::vector<lp::BatchMember> members(static_cast<size_t>(N));
  for (auto _ : st) {
    st.PauseTiming();
    prefill();
    st.ResumeTiming();
    for (int64_t s = 0; s < steps; ++s) {
      const int32_t p = int32_t(prompt + s);
      const int64_t row = 0;
      for (int64_t i = 0; i < N; ++i) {
        const int32_t tok = lp::argmax(logits[size_t(i)]);
        passes[size_t(i)] =
            sessions[size_t(i)]->begin_forward({&tok, 1}, {&p, 1}, {&row, 1}, nullptr, nullptr, nullptr);
        members[size_t(i)] = {sessions[size_t(i)].get(), &passes[size_t(i)], logits[size_t(i)].data()};
      }
      lp::run_batch(members);
    }
  }
  st.counters["tokens/s"] =
      benchmark::Counter(double(N * steps), benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK(BM_BatchedDecode)
    ->Arg(1)
    ->Arg(2)
    ->Arg(4)
    ->Arg(8)
    ->Arg(16)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
