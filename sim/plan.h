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
  // Pipeline stages searched in aggregated layouts (a replica of tp x pp GPUs; stages within a
  // node's max_tp GPUs hand over its interconnect, else the scale-out network).
  std::vector<int> pp{1, 2, 4};
  // A mixture-of-experts model: also search whole experts over each tensor-parallel group (EP = TP,
  // vLLM's --enable-expert-parallel) beside experts split as every weight is.
  bool expert_parallel = true;
  bool expert_only = false;  // with expert_parallel: only those layouts (where EP applies)
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
  int pp = 1;         // pipeline stages of an aggregated replica
  bool ep = false;    // experts whole over each tensor-parallel group (EP = its TP)
  bool disaggregated() const { return decode_instances > 0; }
  int gpus() const { return tp * pp * replicas + decode_tp * decode_instances; }
  std::string describe() const;  // "TP4 x 2", "TP4 PP2 EP x 1" or "prefill TP2 x 2 + decode TP4 x 1"
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

// Every layout of the options' GPUs on `hw` (each GPU one device of `hw`): aggregated replicas of
// TP x PP GPUs (tp a power of two up to hw.max_tp, pp of options.pp, tp x pp dividing gpus) and,
// with options.disaggregated, prefill and decode pools that together use every GPU; each with and
// without expert parallelism when `moe` and options.expert_parallel (tp > 1); times token budgets,
// running-request limits and methods. Throws lp::UsageError when there are more than
// options.max_layouts, with the count.
std::vector<Layout> plan_layouts(const hw::Profile& hw, const PlanOptions& o, bool moe = false);

// One layout's part of the search: whether it fits, its simulations and its points (PlanPoint::layout
// not yet set).
struct LayoutRun {
  bool fits = false;
  int64_t simulations = 0;
  std::vector<PlanPoint> points;
};

// The layouts `all` (of plan_layouts) simulated as plan does, those i with i mod `ranks` = `rank`
// (the others left empty: another process's share, `mpirun -n P lazyprefill plan`), in parallel
// (oneTBB). Throws as plan.
std::vector<LayoutRun> simulate_layouts(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                                        const ServingConfig& base, const PlanOptions& o,
                                        const std::vector<Layout>& all, int rank = 0, int ranks = 1);
// The result of every layout's run: the fitting layouts and their points in layout order, the
// frontier, the best within the objectives or the closest.
PlanResult plan_result(const std::vector<Layout>& all, const std::vector<LayoutRun>& runs,
                       const Objectives& objectives);
// A share of runs (rank's of ranks, as simulate_layouts made it) as bytes for another process of
// the same build, and back into `into` (sized for every layout); unpack throws lp::Error for bytes
// that are not such a share.
std::string pack_layout_runs(const std::vector<LayoutRun>& runs, int rank, int ranks);
void unpack_layout_runs(const std::string& bytes, int rank, int ranks, std::vector<LayoutRun>& into);

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
