// The subcommands, one file each (cli/README.md): XArgs, the typed options of subcommand X, and
// cmd_X, which runs it when selected; main lists them in one table. The options are registered on
// the command line by add_X (cli/options.h), apart, so that the units running the subcommands do not
// compile CLI11. Errors are lp::Error, printed by main as one line.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hwmodels/profile.h"
#include "kernels/context.h"
#include "kernels/weights.h"
#include "model/error.h"
#include "pruning/method.h"
#include "pruning/schedule.h"
#include "sim/cost.h"
#include "sim/revival.h"
#include "sim/serving.h"
#include "sim/serving_study.h"
#include "traces/synthetic.h"

namespace lp::cli {

// "1024,4096" -> {1024, 4096}; anything but positive whole numbers, or none, is a usage error
// naming `option`.
std::vector<int64_t> parse_lengths(const std::string& s, const char* option);
// parse_lengths, each length at most once: a repeat is a usage error naming it (eval, validate).
std::vector<int64_t> parse_distinct_lengths(const std::string& s, const char* option);
// Loads every profile a --hw list names; an empty list is a usage error. A non-empty `engine`
// (--engine) replaces each profile's engine preset.
std::vector<hw::Profile> load_profiles(const std::string& list, const std::string& engine = "");
// `--dtype`: auto (none: Model::load_as chooses per backend), f32, bf16 or int8; a usage error else.
std::optional<DType> dtype_option(const std::string& s);

struct RunArgs {
  std::string model, prompt, prompt_file, dtype = "auto";
  int max_new_tokens = 64;
  int threads = default_thread_count();
  bool chat = false, json_out = false, trace_detail = false;
  bool prompt_given = false;  // --prompt was given ("" is an empty prompt, not a missing one)
  float temperature = 0.0f, top_p = 1.0f;
  uint64_t seed = 0;
  std::string prune = "none", schedule, trace;
  std::string backend = "cpu";
  bool op_timers = false;
  bool cuda_graphs = false;     // --cuda-graphs (cuda::BackendOptions::cuda_graphs)
  std::string warmup = "auto";  // auto (on with --backend cuda), on, off
  // KV-Runahead under mpirun (cli/run_runahead.cpp): the partition, the profile that balances it,
  // and the bound on each wait for another rank.
  bool runahead = false;
  std::string partition = "auto", runahead_hw = "cpu-local";
  double runahead_timeout_s = 300;
};
int cmd_run(const RunArgs& a);
int cmd_run_runahead(const RunArgs& a);  // cli/run_runahead.cpp

struct InspectArgs {
  std::string model, trace;  // a trace given: summarise it instead of the model
  std::string kv_growth;     // with a trace: the paper's Figure 7 (prompt K/V per layer group) as SVG
  bool json_out = false;
};
int cmd_inspect(const InspectArgs& a);

struct SimulateArgs {
  std::string trace, prune, schedule, model, model_config, hw, engine;
  sim::Precision precision;
  int64_t prompt_tokens = 0, new_tokens = 0;
  std::string revival_model;  // "" or "builtin": the built-in revival model
  int tp = 1, ep = 1;         // tensor and expert parallelism (sim::expert_parallel)
  int dp = 1;                 // data-parallel attention groups around the experts
  double moe_imbalance = 0;   // the busiest GPU's routed pairs over the mean; 0: expected
  int pp = 1;                 // pipeline stages (sim::Pipeline)
  double pp_link_gbs = 50;    // their link, GB/s a GPU
  int pp_microbatches = 1;    // the prefill's chunks through them
  int64_t step_times = 4096;  // decoding steps whose times --json lists
  double revival_share = -1;  // >= 0: a constant share instead of the revival model
  bool map = false, json_out = false, per_layer = false;
  // KV-Runahead (sim/runahead.h): ranks (0: off), the partition, the link, each rank's share.
  int runahead = 0;
  std::string partition = "auto";
  double link_gbs = 0, link_latency_us = -1, rank_share = 1;
  std::string kv_predict;  // KV Prediction's auxiliary preset (sim/kv_predict.h); "" off
};
int cmd_simulate(const SimulateArgs& a);
int cmd_simulate_runahead(const SimulateArgs& a);    // cli/simulate_runahead.cpp
int cmd_simulate_kv_predict(const SimulateArgs& a);  // cli/simulate_kv_predict.cpp

// A serving engine's scheduler limits and host times: given, they override the engine's
// (sim::scheduler_config): simulate-serving and calibrate-serving.
using SchedulerArgs = sim::SchedulerOverrides;

struct SimulateServingArgs {
  std::string model, model_config, hw, engine, prune = "none,lazyllm", schedule, revival_model, arrival_file;
  sim::Precision precision;
  double revival_share = -1;
  std::vector<std::string> rates;
  double cv = 1;
  int64_t requests = 1000;
  std::string prompt_tokens = "2048", output_tokens = "32";
  uint64_t seed = 0;
  SchedulerArgs sched;
  std::optional<int64_t> concurrency;  // closed loop: clients (vllm bench serve --max-concurrency)
  // Requests served but left out of the figures: the first (AIPerf's --warmup-request-count) and the
  // last (a closed loop's drain; guidellm's --warmup/--cooldown as counts).
  int64_t warmup = 0, cooldown = 0;
  double kv_budget_mib = 1024, kv_element_bytes = 0;
  int tp = 1, ep = 1, dp = 1, pp = 1, seeds = 3;
  double moe_imbalance = 0, pp_link_gbs = 50;
  bool capacity = false, json_out = false;
  double slo_ttft_ms = 0, slo_itl_ms = 0, tolerance = 0.01;
  std::string out;
  std::string log_requests;  // one run's simulated requests, as serve --log-requests writes them
  bool prefix_cache = false;
  int64_t prefix_block_tokens = 16;
  std::string shared_prefix;  // TOKENS:GROUPS
  // Deployments (sim/deployment.h): replicas behind a router, or disaggregated P:D instances.
  int replicas = 1;
  std::string router = "round-robin", disaggregate, prefill_hw;
  double kv_link_gbs = 0, kv_link_us = -1;  // 0 / -1: the profile's scale-out network
};
int cmd_simulate_serving(const SimulateServingArgs& a);

struct CalibrateArgs {
  std::string runs, base, out, name, engine;
  std::vector<std::string> measurements, model_map, hw_map, fit;
  std::string weights, compute, kv;  // override the precision each measurement's dtype implies
  bool json_out = false;
};
int cmd_calibrate(const CalibrateArgs& a);

struct PlanArgs {
  std::string model, model_config, hw, engine, prune = "none,lazyllm", eval, out, chart;
  std::vector<std::string> schedules;
  sim::Precision precision;
  int gpus = 8;
  std::string prompt_tokens = "4096", output_tokens = "256";
  std::vector<int64_t> batch_tokens{2048, 8192, 16384}, max_seqs{256, 1024};
  std::vector<int> pp{1, 2, 4};
  std::string expert_parallel = "both";  // both, on, off
  std::vector<double> loads{0.2, 0.5, 0.8};
  double slo_ttft_ms = 0, slo_itl_ms = 0, memory_fraction = 0.9;
  int64_t requests = 200, max_layouts = 100000, frontier_rows = 20;
  bool aggregated_only = false, json_out = false;
  uint64_t seed = 0;
};
int cmd_plan(const PlanArgs& a);

struct CalibrateServingArgs {
  std::vector<std::string> benchmarks;  // vllm bench serve, guidellm, AIPerf or genai-perf files
  std::string model, model_config, hw, engine, fit = "scale,iteration", out;
  sim::Precision precision;
  SchedulerArgs sched;
  std::optional<double> kv_budget_mib;  // unset: kv_fraction of the memory less the weights
  double kv_fraction = 0.9;             // vLLM's gpu_memory_utilization
  double kv_element_bytes = 0;
  int tp = 1;
  uint64_t seed = 0;
  bool json_out = false;
};
int cmd_calibrate_serving(const CalibrateServingArgs& a);

struct CalibrateRevivalsArgs {
  std::vector<std::string> traces, held_out;
  std::string model, out, hw = "cpu-local";
  sim::Precision precision;  // of the held-out comparison
  bool map = false, json_out = false;
};
int cmd_calibrate_revivals(const CalibrateRevivalsArgs& a);

struct ValidateArgs {
  std::string model, base = "cpu-local", out_dir, dtype = "f32";
  std::string serving, model_config, serving_dtype = "Q4_1";  // --serving DIR: a measured load test
  std::string runahead;       // --runahead DIR: measured KV-Runahead runs and single-process runs
  std::string profile_out;    // --serving, --runahead: also write the fitted profile here
  std::string revival_model;  // --serving: LazyLLM's revivals from this model (default DIR/revivals.json)
  bool revival_share_from_log = false;  // --serving: a constant share per stage and step, from the log
  std::string prefix_load;  // --serving: also a load test of the prefix cache, replayed on DIR's calibration
  std::string lengths;      // the local grid's prompt lengths instead of --quick's or the default's
  int threads = 0, rounds = 3;
  bool quick = false, json_out = false;
};
int cmd_validate(const ValidateArgs& a);
int cmd_validate_serving(const ValidateArgs& a);   // cli/validate_serving.cpp
int cmd_validate_runahead(const ValidateArgs& a);  // cli/validate_runahead.cpp

struct ReportArgs {
  std::string model, model_config, hw, trace, prune = "lazyllm,static-paper,random-drop", lengths, validation,
                                              out, engine, plan, eval;
  std::vector<std::string> schedules;
  sim::Precision precision;
  std::string revival_model;  // "" or "builtin": the built-in revival model
  int64_t new_tokens = 0, batch = 1;
  int tp = 1, ep = 1, dp = 1, pp = 1;  // the deployment's layout (simulate's options)
  double moe_imbalance = 0, pp_link_gbs = 50;
  std::optional<double> slo_ttft_ms, mem_budget_gib;  // unset: none (a given 0 or NaN is refused)
  double revival_share = -1;                          // >= 0: a constant share instead of the revival model
  bool json_out = false, map = false;
  // Serving capacity (0: no objective; the section is left out without one).
  double serving_ttft_p90_ms = 0, serving_itl_p90_ms = 0, serving_kv_budget_gib = 0;
  std::string serving_prompt_tokens = "2048", serving_output_tokens = "128";
  int64_t serving_requests = 1000, serving_max_batch_tokens = 8192;
  int serving_seeds = 1;
};
int cmd_report(const ReportArgs& a);

struct CompareArgs {  // cli/compare.cpp
  std::string model, model_config, hw, engine, prompt_tokens = "8192,32768,131072", kv_predict, eval, chart;
  std::vector<std::string> schedules;
  sim::Precision precision;
  int devices = 8;
  bool json_out = false;
};
int cmd_compare(const CompareArgs& a);

struct SweepArgs {
  std::string grid, out;
  int threads = 0;
};
int cmd_sweep(const SweepArgs& a);

struct EvalArgs {
  std::string model, tasks = "passkey", lengths, prune = "lazyllm,static-paper,random-drop", corpus, out;
  std::vector<std::string> schedules;
  std::string grid;  // "single-layer": the paper's Figure 6 grid instead of --schedule
  int samples = 20, threads = 0, agreement_tokens = 8, drop_seeds = 5;
  uint64_t seed = 1;
  bool json_out = false, with_prompts = false, prefix_cache = false;
  bool prune_given = false, task_given = false;  // --prune, --task given (else the mode's defaults)
};
int cmd_eval(const EvalArgs& a);
// eval: mild to aggressive, the points of each policy's speed-accuracy curve when no --schedule is given.
inline constexpr const char* kDefaultLadder[] = {"0.3:0.2,0.6:0.2,0.9:0.2", "0.3:0.3,0.6:0.3,0.9:0.3",
                                                 "0.2:0.4,0.4:0.4,0.6:0.4", "0.1:0.5,0.3:0.5,0.5:0.5"};
// The paper's baselines' ladders, step for step about the share of (token, layer) pairs LazyLLM's
// computes (79, 69, 50 and 33% on 30 layers): static-paper after 10% of the depth prunes S of the
// prompt, computing 0.1 + 0.9 (1 - S); random-drop computes 1 - S.
inline constexpr const char* kStaticPaperLadder[] = {"0.1:0.25", "0.1:0.35", "0.1:0.55", "0.1:0.75"};
inline constexpr const char* kRandomDropLadder[] = {"0.2", "0.3", "0.5", "0.67"};

struct ServeArgs {
  std::string model, host = "127.0.0.1", served_name, prune = "none", schedule, dtype = "auto",
                     backend = "cpu", log_requests;
  int port = 8000, threads = default_thread_count(), max_connections = 256;
  // kv_budget_mib 0: 1024 on the CPU; on a GPU what --gpu-memory-utilization leaves (serve.cpp).
  int64_t max_batch_tokens = 2048, kv_budget_mib = 0, max_body_kib = 4096, chat_max_tokens = 512;
  int64_t max_model_len = 0;     // 0: the model's context (on a GPU, at most what its memory holds)
  int64_t prefix_cache_mib = 0;  // 0: within the K/V budget on the CPU, 4096 with --backend cuda
  double gpu_memory_utilization = 0.9;
  bool cuda_graphs = false;  // --cuda-graphs (cuda::BackendOptions::cuda_graphs)
  bool no_prefix_cache = false;
  int64_t prefix_block_tokens = 16;
  int max_n = 8;
  double header_timeout_s = 10, body_timeout_s = 30, shutdown_grace_s = 30, health_stall_s = 120,
         health_generate_timeout_s = 30;
  std::vector<std::string> api_keys, allowed_hosts, allowed_origins;
  std::string api_key_file, metric_names = "both";
  bool metrics_need_key = false;
};
int cmd_serve(const ServeArgs& a);

}  // namespace lp::cli
