// `lazyprefill simulate-serving` as one call, which the CLI and the Python module's
// simulate_serving both make: a serving deployment under load (sim/serving.h, sim/deployment.h)
// per hardware profile and method, at arrival rates or from an arrival file; or with `capacity`,
// the highest rate that meets latency objectives (sim/serving_capacity.h). The request carries the
// CLI's options with its defaults; its ranges are checked here, so both front ends refuse a value
// in the same words.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "sim/cost.h"
#include "sim/serving.h"
#include "sim/serving_capacity.h"
#include "sim/serving_metrics.h"

namespace lp::sim {

// A serving engine's scheduler limits and host times as a user gives them (--max-batch-tokens, ...);
// unset, the engine's (hw::scheduling_for). simulate-serving and calibrate-serving take them.
struct SchedulerOverrides {
  std::optional<int64_t> max_batch_tokens, chunk_tokens, max_seqs, kv_block_tokens;
  std::optional<double> iteration_overhead_ms, request_overhead_ms;
  std::string kv_mode;  // "reserve" | "on-demand" ("": the engine's)
  std::optional<bool> mixed;
};
// `hw`'s engine's scheduler as a serving configuration, the overrides given replacing it; each
// override's range checked (lp::UsageError naming its flag).
ServingConfig scheduler_config(const SchedulerOverrides& o, const hw::Profile& hw);
// The scheduler's fields as simulate-serving and calibrate-serving print them.
nlohmann::ordered_json scheduler_json(const hw::Profile& hw, const ServingConfig& cfg);

struct ServingStudyRequest {
  std::string model, model_config;        // a GGUF file's shape, or a preset or configuration file
  std::optional<ModelConfig> config;      // or the model itself (the Python module's Model)
  std::vector<hw::Profile> hws;           // at least one (the decode instances' with disaggregate)
  std::optional<hw::Profile> prefill_hw;  // disaggregate: the prefill instances' (default hws[0])
  Precision precision;
  std::string prune = "none,lazyllm";  // methods, comma-separated
  std::string schedule;                // "": the default; a method it does not fit runs its own
  std::string revival_model;           // "" or "builtin", or a calibrate-revivals file
  double revival_share = -1;           // in [0, 1]: a constant share; -1: the revival model
  std::string arrival_file;            // requests from a file instead of drawn ones
  std::vector<double> rates;           // requests/s (inf: all at once); empty: 1, or inf with concurrency
  double cv = 1;                       // of the gaps between arrivals: 1 Poisson
  int64_t requests = 1000;
  std::string prompt_tokens = "2048", output_tokens = "32";  // LengthDist specs
  uint64_t seed = 0;
  SchedulerOverrides sched;
  std::optional<int64_t> concurrency;  // closed loop: clients (unset: open loop)
  int64_t warmup = 0, cooldown = 0;    // requests served but left out of the figures
  double kv_budget_mib = 1024;
  double kv_element_bytes = 0;  // 0: the kv precision's
  int tp = 1, ep = 1, dp = 1, pp = 1;
  double moe_imbalance = 0, pp_link_gbs = 50;
  bool capacity = false;
  double slo_ttft_ms = 0, slo_itl_ms = 0;  // p90 objectives (0: none)
  int seeds = 3;                           // capacity: workloads searched
  double tolerance = 0.01;                 // capacity: the search's relative resolution
  bool prefix_cache = false;
  int64_t prefix_block_tokens = 16;
  std::string shared_prefix;  // TOKENS:GROUPS
  int replicas = 1;
  std::string router = "round-robin";
  std::string disaggregate;                 // P:D
  double kv_link_gbs = 0, kv_link_us = -1;  // 0 / -1: the prefill profile's scale-out network
  bool keep_requests = false;               // keep every run's requests (--log-requests)
};

// One hardware x method x rate run.
struct ServingRunResult {
  std::string hw, method;
  double rate = 0;  // requests/s; HUGE_VAL all at once; 0 an arrival file's
  ServingMetrics metrics;
  int64_t iterations = 0;
  std::optional<int64_t> preemptions;  // with on-demand K/V
  // A deployment's router and instances, and a disaggregated one's hand-overs, as printed.
  nlohmann::ordered_json deployment, handover;
  std::optional<double> prompt_tokens_cached_share;  // with the prefix cache
  std::vector<KvPoint> kv;                           // K/V reserved and used over time, bytes
  std::vector<RequestOutcome> requests;              // keep_requests: every request, in arrival order
  nlohmann::ordered_json to_json() const;
};

// One hardware x method capacity search.
struct CapacityRun {
  std::string hw, method;
  CapacityResult result;
  nlohmann::ordered_json to_json() const;
};

struct ServingStudyReport {
  std::string model;
  // The first profile's scheduler and, with several, every profile's; the workload; the objectives
  // (absent: null): as simulate-serving --json prints them.
  nlohmann::ordered_json scheduler, schedulers, workload, objectives;
  std::string schedule;
  std::vector<std::string> revivals;  // one line per pruning method: where its revivals come from
  Objectives slo;
  bool capacity = false;
  std::vector<ServingRunResult> runs;   // without capacity: hardware-major, then method, then rate
  std::vector<CapacityRun> capacities;  // with capacity
  // `simulate-serving --json`'s document.
  nlohmann::ordered_json to_json() const;
};

ServingStudyReport serving_study(const ServingStudyRequest& r);

// A run's requests as `serve --log-requests` lines (the fields a simulation has): read_requests takes
// them back as an arrival file. Needs keep_requests.
std::string simulated_request_log(const ServingRunResult& run);

}  // namespace lp::sim
