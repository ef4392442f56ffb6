// The deployment search (`lazyprefill plan`, docs/simulator.md "Planning a deployment"): every way to
// lay a model over a number of GPUs — aggregated replicas of a tensor-parallel group, or
// disaggregated prefill and decode pools — times the engine's token budget, its running-request
// limit and the pruning method, each simulated under the workload at a few loads; the Pareto
// frontier of output tokens/s per GPU against tokens/s per user, and the layout that gives the
// most tokens/s per GPU within the latency objectives.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "sim/deployment.h"
#include "sim/serving.h"
#include "sim/serving_metrics.h"
#include "sim/serving_workload.h"

namespace lp::sim {

struct PlanOptions {
  int gpus = 8;
  std::vector<ServingMethod> methods;  // at least one (unpruned: a default ServingMethod)
  LengthDist prompt, output;
  Objectives objectives;                                 // p90 TTFT and ITL; none: every point meets them
  std::vector<int64_t> batch_tokens{2048, 8192, 16384};  // the engine's token budget an iteration
  std::vector<int64_t> max_seqs{256, 1024};              // its running requests at most
  bool disaggregated = true;                             // also search prefill/decode pools
  // Loads each layout is simulated at: shares of its saturated request rate (every request at once).
  std::vector<double> load_shares{0.2, 0.5, 0.8};
  int64_t requests = 200;  // per simulation
  int64_t max_layouts = 100000;
  double memory_fraction = 0.9;  // of each GPU for weights and K/V (vLLM's gpu_memory_utilization)
  uint64_t seed = 0;
};

struct Layout {
  int tp = 1, replicas = 1;                 // aggregated; disaggregated: the prefill pool
  int decode_tp = 0, decode_instances = 0;  // disaggregated when decode_instances > 0
  int64_t max_batch_tokens = 0, max_seqs = 0;
  size_t method = 0;  // into PlanOptions::methods
  bool disaggregated() const { return decode_instances > 0; }
  int gpus() const { return tp * replicas + decode_tp * decode_instances; }
  std::string describe() const;  // "TP4 x 2" or "prefill TP2 x 2 + decode TP4 x 1"
};

struct PlanPoint {
  size_t layout = 0;
  double rate = 0;  // requests/s
  ServingMetrics metrics;
  double tokens_per_s_per_gpu = 0, tokens_per_s_per_user = 0;  // output tokens; per user: 1 / mean ITL
  bool meets = false;                                          // the objectives' p90s
};

struct PlanResult {
  std::vector<Layout> layouts;  // searched (each fits its GPUs)
  int64_t layouts_refused =
      0;  // laid out but not fitting (weights over the memory, a TP the model cannot split)
  std::vector<PlanPoint> points;
  std::vector<size_t> frontier;  // points on the Pareto frontier, fastest per user first
  std::optional<size_t> best;    // the point meeting the objectives with the most tokens/s per GPU
  // When no point meets them: the one closest to (its worst p90 over its objective, least first).
  std::optional<size_t> best_reachable;
  int64_t simulations = 0;
};

// Every layout of the options' GPUs on `hw` (each GPU one device of `hw`): aggregated TP groups
// (tp dividing gpus, at most hw.max_tp) and, with options.disaggregated, prefill and decode pools
// that together use every GPU, times token budgets, running-request limits and methods. Throws
// lp::UsageError when there are more than options.max_layouts, with the count.
std::vector<Layout> plan_layouts(const hw::Profile& hw, const PlanOptions& o);

// The search: every layout simulated (`base` the engine's scheduler, sim::serving_config of
// hw::scheduling_for) at its saturated rate's load shares, in parallel over layouts (oneTBB);
// the same result whatever the threads. Throws lp::Error for no method, no GPU, a bad option.
PlanResult plan(const ModelConfig& c, const hw::Profile& hw, const Precision& p, const ServingConfig& base,
                const PlanOptions& o);

// Launch commands for a layout on vLLM, SGLang and TensorRT-LLM (their documented flags), one string
// each; `model` the model's name as the engine takes it.
struct LaunchConfig {
  std::string engine, command;
};
std::vector<LaunchConfig> launch_configs(const Layout& l, const std::string& model);

}  // namespace lp::sim
