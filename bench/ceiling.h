// The read bandwidth a decoding benchmark is measured against (kernels/cpu/membw.h): measured once
// per process on 2 threads (the benchmarks' own), the better of 4 KiB and huge pages, and the
// counters every decoding benchmark adds with it.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>

#include "engine/model.h"
#include "kernels/context.h"
#include "kernels/cpu/membw.h"

namespace lp::bench {

inline double read_ceiling_gbs() {
  static const double gbs = [] {
    CpuContext ctx(2);
    return std::max(measure_bandwidth(ctx, MemPattern::Read, {.huge_pages = false}).gbs,
                    measure_bandwidth(ctx, MemPattern::Read, {.huge_pages = true}).gbs);
  }();
  return gbs;
}

// Seconds of the timed work, summed by the benchmark around what it times (Google Benchmark does not
// hand its own clock to the function, and a rate counter would print as "GB/s=.../s").
class Stopwatch {
 public:
  void start() { t0_ = std::chrono::steady_clock::now(); }
  void stop() { secs_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  double seconds() const { return secs_; }

 private:
  std::chrono::steady_clock::time_point t0_;
  double secs_ = 0;
};

// MB/token (what one step reads), GB/s (the rate it was read at over `seconds` for `tokens` steps)
// and of_ceiling (that over the read ceiling).
inline void bandwidth_counters(benchmark::State& st, double bytes_per_token, double tokens, double seconds) {
  const double gbs = seconds > 0 ? bytes_per_token * tokens / seconds / 1e9 : 0;
  st.counters["MB/token"] = bytes_per_token / 1e6;
  st.counters["GB/s"] = gbs;
  st.counters["ceiling_GB/s"] = read_ceiling_gbs();
  st.counters["of_ceiling"] = gbs / read_ceiling_gbs();
}

// What one decoding step of a dense model reads: every layer matrix and the LM head once (as held:
// blocks, bf16 or f32; the embedding lookup's one row left out), and K and V of `context` tokens on
// every layer (kv_bytes an element: 2 for the f16 cache of int8 and bf16, 4 for f32).
inline double decode_step_bytes(const Model& m, double context, int kv_bytes) {
  const Weights& w = m.weights();
  double b = double(w.lm_head().bytes());
  for (const LayerWeights& l : w.layers) {
    b += double(l.wqkv.bytes() + l.wo.bytes() + l.w_gate_up.bytes() + l.w_down.bytes() + l.router.bytes());
    for (size_t e = 0; e < l.expert_gate_up.size(); ++e)  // every expert: an upper bound for MoE
      b += double(l.expert_gate_up[e].bytes() + l.expert_down[e].bytes());
  }
  const ModelConfig& c = m.config();
  return b + context * double(c.n_layer) * 2.0 * double(c.n_head_kv * c.head_dim) * kv_bytes;
}

}  // namespace lp::bench
