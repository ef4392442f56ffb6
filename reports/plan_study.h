// `lazyprefill plan` as one call, which the CLI and the Python module's plan both make: the
// deployment search of sim/plan.h over one GPU kind with the CLI's options and defaults, each pruned
// method's accuracy evidence from an `eval --json` output (reports/accuracy.h, hence this room), the
// best layout's launch commands, and `plan --json`'s document. The ranges are checked here, so both
// front ends refuse a value in the same words. Where the layouts are simulated is the caller's to
// choose (`RunLayouts`): here by default, or shared between `mpirun` ranks by the CLI.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "sim/cost.h"
#include "sim/plan.h"

namespace lp::report {

struct PlanRequest {
  std::string model, model_config;    // a GGUF file's shape, or a preset or configuration file
  std::optional<ModelConfig> config;  // or the model itself (the Python module's Model)
  std::vector<hw::Profile> hws;       // exactly one: a GPU of the deployment
  sim::Precision precision;
  int gpus = 8;
  std::string prune = "none,lazyllm";  // methods searched, comma-separated
  std::vector<std::string> schedules;  // the pruning methods' (each at the schedules that fit it)
  std::string prompt_tokens = "4096", output_tokens = "256";  // LengthDist specs
  std::vector<int64_t> batch_tokens{2048, 8192, 16384}, max_seqs{256, 1024};
  std::vector<int> pp{1, 2, 4};
  std::string expert_parallel = "both";  // both, on, off
  std::vector<double> loads{0.2, 0.5, 0.8};
  double slo_ttft_ms = 0, slo_itl_ms = 0;  // p90 objectives (0: none)
  double memory_fraction = 0.9;
  int64_t requests = 200, max_layouts = 100000;
  bool aggregated_only = false;
  uint64_t seed = 0;
  std::string eval;  // an `eval --json` output: each pruned method's accuracy evidence
};

struct PlanReport {
  std::string model;
  hw::Profile hw;
  int gpus = 8;
  sim::PlanOptions options;  // as searched: the methods, the workload, the objectives
  std::vector<double> loads;
  double slo_ttft_ms = 0, slo_itl_ms = 0;  // as given
  // Per method, its policy and schedule as an evaluation names them ("none" for the unpruned).
  std::vector<std::pair<std::string, std::string>> policy_schedule;
  sim::PlanResult result;
  nlohmann::ordered_json accuracy;  // per pruned method: its evidence, or that none was measured
  // The point shown as the answer: the best within the objectives, else the closest (none: nothing fits).
  std::optional<size_t> chosen() const { return result.best ? result.best : result.best_reachable; }
  // A point of the result as the document has it (with the method's accuracy where it prunes).
  nlohmann::ordered_json point_json(size_t i) const;
  // The chosen layout's launch commands: vLLM's, SGLang's, TensorRT-LLM's, and lazyprefill serve's
  // where the method prunes.
  std::vector<sim::LaunchConfig> launch(size_t i) const;
  // `plan --json`'s document.
  nlohmann::ordered_json to_json() const;
};

// Simulates `all` layouts: `share(rank, ranks)` simulates one process's share; the caller runs the
// shares where it likes and returns every run on the process that reports, nothing on the others.
// `what` describes the search, which every process must agree on.
using RunLayouts = std::function<std::optional<std::vector<sim::LayoutRun>>(
    const std::string& what, const std::function<std::vector<sim::LayoutRun>(int rank, int ranks)>& share)>;

// The search (here, or through `run`); nullopt on a process that does not report.
std::optional<PlanReport> plan(const PlanRequest& r, const RunLayouts& run = {});

}  // namespace lp::report
