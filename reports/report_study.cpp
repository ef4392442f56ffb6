#include "reports/report_study.h"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "reports/accuracy.h"
#include "reports/plot.h"
#include "sim/replay.h"
#include "sim/revival.h"
#include "sim/simulate.h"
#include "traces/trace.h"

namespace lp::report {
namespace {

void check_options(const ReportOptions& o) {
  if (o.hws.empty()) usage_fail("--hw names no hardware profile");
  if (o.lengths.empty()) usage_fail("--prompt-lengths is empty (give e.g. 1024,4096,16384)");
  for (const int64_t n : o.lengths) check_range("--prompt-lengths", n, int64_t(1), int64_t(1) << 24);
  check_range("--new-tokens", o.new_tokens, int64_t(0), int64_t(1) << 20);
  if (o.revival_share != -1) check_range("--revival-share", o.revival_share, 0.0, 1.0);
  if (o.slo_ttft_ms && !(std::isfinite(*o.slo_ttft_ms) && *o.slo_ttft_ms > 0))
    usage_fail("--slo-ttft-ms must be a positive number, got {}", *o.slo_ttft_ms);
  if (o.mem_budget_gib && !(std::isfinite(*o.mem_budget_gib) && *o.mem_budget_gib > 0))
    usage_fail("--mem-budget-gib must be a positive number, got {}", *o.mem_budget_gib);
  check_range("--tp", o.tp, 1, 4096);
  check_range("--pp", o.pp, 1, 4096);
  check_positive("--pp-link-gbs", o.pp_link_gbs);
  check_range("--batch", o.batch, int64_t(1), int64_t(4096));
  if (o.serving_ttft_p90_ms != 0) check_range("--serving-slo-ttft-p90-ms", o.serving_ttft_p90_ms, 1e-3, 1e9);
  if (o.serving_itl_p90_ms != 0) check_range("--serving-slo-itl-p90-ms", o.serving_itl_p90_ms, 1e-3, 1e9);
  check_range("--serving-requests", o.serving_requests, int64_t(10), int64_t(1) << 22);
  check_range("--serving-seeds", o.serving_seeds, 1, 64);
  check_range("--serving-max-batch-tokens", o.serving_max_batch_tokens, int64_t(1), int64_t(1) << 24);
  if (o.serving_kv_budget_gib != 0)
    check_range("--serving-kv-budget-gib", o.serving_kv_budget_gib, 1e-3, 1e6);
}

}  // namespace

Report make_report(const ReportOptions& o) {
  check_options(o);
  Request req;
  if (!o.eval.empty()) req.eval = read_eval(o.eval);
  std::string name;
  req.model = sim::request_target(o.model, o.model_config, o.config, &name);
  req.model_source = o.config           ? "configuration " + name
                     : !o.model.empty() ? o.model
                                        : "preset " + o.model_config;
  if (req.model.name.empty()) req.model.name = o.model_config.empty() ? o.model : o.model_config;
  if (req.model.name.empty()) req.model.name = "custom";
  req.model = sim::expert_parallel(req.model, o.ep, o.moe_imbalance, o.dp, o.tp);
  req.hws = o.hws;
  req.tp = o.tp;
  for (const hw::Profile& hw : req.hws) for_option("--tp", [&] { sim::check_tp(req.model, hw, o.tp); });
  sim::pipeline_starts(req.model.n_layer, o.pp);
  req.pipeline = {o.pp, o.pp_link_gbs * 1e9};
  req.lengths = o.lengths;
  req.precision = o.precision;
  sim::validate(req.precision);
  req.new_tokens = o.new_tokens;
  req.batch = o.batch;
  req.slo_ttft_ms = o.slo_ttft_ms;
  req.mem_budget_gib = o.mem_budget_gib;
  if (o.serving_ttft_p90_ms > 0 || o.serving_itl_p90_ms > 0) {
    ServingSpec s;
    s.objectives = {o.serving_ttft_p90_ms * 1e-3, o.serving_itl_p90_ms * 1e-3};
    s.prompt_tokens = o.serving_prompt_tokens;
    s.output_tokens = o.serving_output_tokens;
    s.requests = o.serving_requests;
    s.seeds = o.serving_seeds;
    s.max_batch_tokens = o.serving_max_batch_tokens;
    if (o.serving_kv_budget_gib > 0) s.kv_budget_gib = o.serving_kv_budget_gib;
    req.serving = s;
  }
  req.tool_version = o.tool_version;
  req.git_commit = o.git_commit;

  trace::Trace recorded;  // the trace's, which the request's methods point into
  if (!o.trace.empty()) {
    recorded = trace::read_trace(o.trace);
    req.trace_origin = o.trace;
  }
  std::vector<Schedule> given;
  for (const std::string& s : o.schedules) given.push_back(schedule_from_arg(s));
  req.methods =
      methods_to_report(req.model, split_list(o.prune), given, o.trace.empty() ? nullptr : &recorded);
  const std::optional<sim::RevivalModel> revival_model = sim::load_revivals(o.revival_model, o.revival_share);
  for (ReportedMethod& m : req.methods) {
    if (m.trace) {
      m.revivals = "recorded in the trace";
      continue;
    }
    sim::RevivalChoice rv = sim::choose_revivals(revival_model, o.revival_share, m.method.policy_name(),
                                                 req.model.n_layer, m.steps, o.map);
    m.revival = std::move(rv.share);
    m.revivals = std::move(rv.description);
  }
  return build_report(req);
}

nlohmann::json read_validation(const std::string& path) {
  nlohmann::json validation;
  if (path.empty()) return validation;
  const std::string text = read_input_file(path, "--validation file", input_cap::kResults);
  try {
    validation = json_parse(text, path);
  } catch (const nlohmann::json::exception& e) {
    fail("--validation '{}' is not valid JSON ({})", path, e.what());
  }
  check_validation(validation, path);
  return validation;
}

std::optional<PlanSummary> read_plan_file(const std::string& path) {
  if (path.empty()) return std::nullopt;
  const std::string text = read_input_file(path, "--plan file", input_cap::kResults);
  nlohmann::json j;
  try {
    j = json_parse(text, path);
  } catch (const nlohmann::json::exception& e) {
    fail("--plan '{}' is not valid JSON ({})", path, e.what());
  }
  return read_plan(j, path);
}

size_t write_report_folder(const std::string& dir, const Report& rep, const nlohmann::json& validation,
                           const std::optional<PlanSummary>& plan, const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir) && !fs::create_directory(dir, ec))
    fail("cannot write the report to '{}': {}", dir, ec ? ec.message() : "not a folder");
  const auto charts = report_charts(rep, validation.is_null() ? nullptr : &validation);
  const fs::path d(dir);
  for (const char* f : {"capacity-report.json", "report.html", "plan-frontier.svg"})
    refuse_output_over_input((d / f).string(), "--out", inputs);
  write_file_atomic((d / "capacity-report.json").string(), rep.to_json().dump(2) + "\n", "report");
  for (const auto& [name, svg] : charts) write_file_atomic((d / name).string(), svg, "chart");
  std::string sections;
  if (plan) {
    write_file_atomic((d / "plan-frontier.svg").string(), svg_line_chart(plan_frontier_chart(*plan)),
                      "chart");
    sections = plan_html(*plan);
  }
  write_file_atomic((d / "report.html").string(), report_html(rep, charts, sections), "report page");
  return charts.size();
}

}  // namespace lp::report
