// `lazyprefill report`: the capacity report (JSON valid against reports/capacity-report.schema.json,
// SVG charts and one HTML page) for a model on hardware profiles over prompt lengths.
#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "git_commit.h"  // generated: LP_GIT_COMMIT
#include "hwmodels/profile.h"
#include "model/error.h"
#include "model/io.h"
#include "reports/report_study.h"

namespace lp::cli {

std::vector<int64_t> parse_lengths(const std::string& s, const char* option) {
  std::vector<int64_t> out;
  for (const std::string& item : split_list(s)) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 1) usage_fail("{}: '{}' is not a positive whole number", option, item);
    out.push_back(v);
  }
  if (out.empty()) usage_fail("{} is empty (give e.g. 1024,4096,16384)", option);
  return out;
}

std::vector<int64_t> parse_distinct_lengths(const std::string& s, const char* option) {
  std::vector<int64_t> out = parse_lengths(s, option);
  for (size_t i = 0; i < out.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (out[i] == out[j]) usage_fail("{} lists {} twice", option, out[i]);
  return out;
}

namespace {

report::ReportOptions to_options(const ReportArgs& a) {
  report::ReportOptions o;
  o.model = a.model;
  o.model_config = a.model_config;
  o.hws = load_profiles(a.hw, a.engine);
  o.trace = a.trace;
  o.prune = a.prune;
  o.schedules = a.schedules;
  o.lengths = parse_lengths(a.lengths, "--prompt-lengths");
  o.precision = a.precision;
  o.revival_model = a.revival_model;
  o.revival_share = a.revival_share;
  o.map = a.map;
  o.new_tokens = a.new_tokens;
  o.batch = a.batch;
  o.tp = a.tp, o.ep = a.ep, o.dp = a.dp, o.pp = a.pp;
  o.moe_imbalance = a.moe_imbalance;
  o.pp_link_gbs = a.pp_link_gbs;
  o.slo_ttft_ms = a.slo_ttft_ms;
  o.mem_budget_gib = a.mem_budget_gib;
  o.serving_ttft_p90_ms = a.serving_ttft_p90_ms;
  o.serving_itl_p90_ms = a.serving_itl_p90_ms;
  o.serving_kv_budget_gib = a.serving_kv_budget_gib;
  o.serving_prompt_tokens = a.serving_prompt_tokens;
  o.serving_output_tokens = a.serving_output_tokens;
  o.serving_requests = a.serving_requests;
  o.serving_max_batch_tokens = a.serving_max_batch_tokens;
  o.serving_seeds = a.serving_seeds;
  o.eval = a.eval;
  o.tool_version = LP_VERSION;
  o.git_commit = LP_GIT_COMMIT;
  return o;
}

}  // namespace

int cmd_report(const ReportArgs& a) {
  const report::ReportOptions o = to_options(a);
  // The inputs read first, so that a bad one is refused before the report is built.
  const nlohmann::json validation = report::read_validation(a.validation);
  const std::optional<report::PlanSummary> plan = report::read_plan_file(a.plan);
  const report::Report rep = report::make_report(o);
  std::vector<std::string> inputs = split_list(a.hw);
  inputs.insert(inputs.end(), {a.trace, a.validation, a.revival_model, a.model, a.plan, a.eval});
  const size_t charts = report::write_report_folder(a.out, rep, validation, plan, inputs);
  if (a.json_out) {
    std::puts(rep.to_json().dump(2).c_str());
  } else {
    std::fputs(report::summary_text(rep).c_str(), stdout);
    fmt::print("\nwrote {}/capacity-report.json, report.html and {} charts\n", a.out, charts);
  }
  return 0;
}

}  // namespace lp::cli
