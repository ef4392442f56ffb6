// `lazyprefill report` as library calls, which the CLI and the Python module's report both make: the
// options with the CLI's defaults in, the capacity report (reports/capacity.h) out; and the report's
// folder (capacity-report.json, the SVG charts, report.html) written whole or not at all. The ranges
// are checked here, so both front ends refuse a value in the same words.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "reports/capacity.h"
#include "reports/plan_section.h"
#include "sim/cost.h"

namespace lp::report {

struct ReportOptions {
  std::string model, model_config;    // a GGUF file's shape, or a preset or configuration file
  std::optional<ModelConfig> config;  // or the model itself (the Python module's Model)
  std::vector<hw::Profile> hws;
  std::string trace;  // a recorded trace whose pruning pattern is mapped to each length
  std::string prune = "lazyllm,static-paper,random-drop";
  std::vector<std::string> schedules;
  std::vector<int64_t> lengths;  // prompt lengths, at least one
  sim::Precision precision;
  std::string revival_model;  // "" or "builtin", or a calibrate-revivals file
  double revival_share = -1;  // in [0, 1]: a constant share; -1: the revival model
  bool map = false;
  int64_t new_tokens = 0, batch = 1;
  int tp = 1, ep = 1, dp = 1, pp = 1;
  double moe_imbalance = 0, pp_link_gbs = 50;
  std::optional<double> slo_ttft_ms, mem_budget_gib;
  // Serving capacity: asked for with an objective (0: none).
  double serving_ttft_p90_ms = 0, serving_itl_p90_ms = 0, serving_kv_budget_gib = 0;
  std::string serving_prompt_tokens = "2048", serving_output_tokens = "128";
  int64_t serving_requests = 1000, serving_max_batch_tokens = 8192;
  int serving_seeds = 1;
  std::string eval;                      // an `eval --json` output: each pruned method's accuracy evidence
  std::string tool_version, git_commit;  // the provenance's
};

// The request checked and built (its methods and their revivals, a recorded trace read), then the
// report.
Report make_report(const ReportOptions& o);

// A `validate --json` output for the measured-against-predicted chart, checked ("": none, null).
nlohmann::json read_validation(const std::string& path);
// A saved `plan --out` result for the report's plan section ("": none).
std::optional<PlanSummary> read_plan_file(const std::string& path);

// Writes the folder `dir` (created if its parent exists): capacity-report.json, the charts,
// report.html and, with a plan, plan-frontier.svg; each file whole or not at all, none over one of
// `inputs`. Returns the number of charts.
size_t write_report_folder(const std::string& dir, const Report& rep, const nlohmann::json& validation,
                           const std::optional<PlanSummary>& plan, const std::vector<std::string>& inputs);

}  // namespace lp::report
