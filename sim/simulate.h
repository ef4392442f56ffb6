// One replay as `lazyprefill simulate` runs it and the Python module's `simulate` calls it: the
// steps of a trace file, or synthetic ones made from a pruning policy, costed on each hardware
// profile beside the same work unpruned (replay_beside_unpruned). KV-Runahead and KV Prediction
// (sim/runahead.h, sim/kv_predict.h) are their own calls.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "sim/cost.h"
#include "sim/replay.h"

namespace lp::sim {

// The model a simulation costs: the configuration of the GGUF file `model`, else the preset
// `model_config` (lp::UsageError when neither is given); `name` gets what names it in outputs.
ModelConfig model_to_cost(const std::string& model, const std::string& model_config, std::string* name);
// The target a request gives once: `config` (the Python module's Model), named by its name ("custom"
// without one), else model_to_cost; lp::UsageError when `config` comes with a file or a preset.
ModelConfig request_target(const std::string& model, const std::string& model_config,
                           const std::optional<ModelConfig>& config, std::string* name);

// The options of `lazyprefill simulate` (docs/simulator.md), with its defaults. Errors name the
// CLI's flags (`--tp: ...`), the one vocabulary of both front ends.
struct SimulateRequest {
  std::string trace;                  // a trace file; "" for synthetic steps (prompt_tokens > 0)
  std::string model, model_config;    // the target: a GGUF file's shape, or a preset ("": the trace's)
  std::optional<ModelConfig> config;  // or the target itself (the Python module's Model objects)
  std::vector<hw::Profile> hws;       // at least one
  std::string prune = "none";         // the synthetic steps' policy
  std::string schedule;               // theirs ("": the policy's default)
  int64_t prompt_tokens = 0;          // synthetic: the prompt; with a trace: map it onto this length
  int64_t new_tokens = 0;             // synthetic: tokens generated (the first by the prefill)
  std::string revival_model;          // "" or "builtin", or a calibrate-revivals file
  double revival_share = -1;          // in [0, 1]: a constant share instead of the revival model; -1: none
  bool map = false;                   // a trace or revival model of another shape mapped onto the target
  Precision precision;
  int tp = 1, ep = 1, dp = 1, pp = 1, pp_microbatches = 1;
  double moe_imbalance = 0;   // the busiest GPU's routed pairs over the mean; 0: expected
  double pp_link_gbs = 50;    // the pipeline stages' link, GB/s a GPU
  int64_t step_times = 4096;  // decoding steps whose times each prediction keeps
  bool per_layer = false;     // keep the prefill's per-layer op costs
};

// One profile's prediction beside the unpruned one.
struct SimulateResult {
  hw::Profile hw;
  Prediction pruned, unpruned;
  bool fits_in_memory() const { return pruned.memory.total() <= hw.memory_capacity; }
  nlohmann::ordered_json to_json(const Precision& p, bool per_layer) const;
};

struct SimulateReport {
  std::string model;   // what names the target in outputs
  ModelConfig config;  // the target as given
  ModelConfig costed;  // as one GPU costs it (expert and data parallelism applied)
  std::string trace;   // the trace file, or "synthetic"
  std::string policy, schedule;
  std::string revivals;               // where the decoding steps' revivals come from, in words
  int64_t prompt_tokens = 0;          // as given, dropped tokens included
  int64_t prompt_tokens_dropped = 0;  // dropped before the model (a drop schedule)
  int64_t decode_steps = 0;
  Precision precision;
  int tp = 1, dp = 1, pp = 1, pp_microbatches = 1;
  bool per_layer = false;
  std::vector<SimulateResult> results;  // one per profile, in the request's order
  // `simulate --json`'s document.
  nlohmann::ordered_json to_json() const;
};

// Validates the request (lp::UsageError naming the flag, before any work: every number in the
// range the CLI documents, which the CLI leaves to this), builds the steps and replays them on
// every profile.
SimulateReport simulate(const SimulateRequest& r);

}  // namespace lp::sim
