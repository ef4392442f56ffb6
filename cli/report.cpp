// `lazyprefill report`: the capacity report (JSON valid against reports/capacity-report.schema.json,
// SVG charts and one HTML page) for a model on hardware profiles over prompt lengths.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "git_commit.h"  // generated: LP_GIT_COMMIT
#include "hwmodels/profile.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "model/presets.h"
#include "reports/accuracy.h"
#include "reports/capacity.h"
#include "reports/plan_section.h"
#include "traces/trace.h"

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

// The report's request from the command line, its methods and their revivals included.
report::Request report_request(const ReportArgs& a, trace::Trace& recorded) {
  report::Request req;
  if (!a.eval.empty()) req.eval = report::read_eval(a.eval);
  if (!a.model.empty()) {
    req.model = costing_config_from_gguf(GgufFile::open(a.model));
    req.model_source = a.model;
  } else if (!a.model_config.empty()) {
    req.model = preset_config(a.model_config);
    req.model_source = "preset " + a.model_config;
  } else {
    usage_fail("give --model PATH or --model-config NAME");
  }
  if (req.model.name.empty()) req.model.name = a.model_config.empty() ? a.model : a.model_config;
  req.model = sim::expert_parallel(req.model, a.ep, a.moe_imbalance, a.dp, a.tp);
  req.hws = load_profiles(a.hw, a.engine);
  req.tp = a.tp;
  for (const hw::Profile& hw : req.hws) for_option("--tp", [&] { sim::check_tp(req.model, hw, a.tp); });
  sim::pipeline_starts(req.model.n_layer, a.pp);
  req.pipeline = {a.pp, a.pp_link_gbs * 1e9};
  req.lengths = parse_lengths(a.lengths, "--prompt-lengths");
  req.precision = a.precision;
  sim::validate(req.precision);
  req.new_tokens = a.new_tokens;
  req.batch = a.batch;
  if (!std::isnan(a.slo_ttft_ms)) req.slo_ttft_ms = a.slo_ttft_ms;
  if (!std::isnan(a.mem_budget_gib)) req.mem_budget_gib = a.mem_budget_gib;
  if (a.serving_ttft_p90_ms > 0 || a.serving_itl_p90_ms > 0) {
    report::ServingSpec s;
    s.objectives = {a.serving_ttft_p90_ms * 1e-3, a.serving_itl_p90_ms * 1e-3};
    s.prompt_tokens = a.serving_prompt_tokens;
    s.output_tokens = a.serving_output_tokens;
    s.requests = a.serving_requests;
    s.seeds = a.serving_seeds;
    s.max_batch_tokens = a.serving_max_batch_tokens;
    if (a.serving_kv_budget_gib > 0) s.kv_budget_gib = a.serving_kv_budget_gib;
    req.serving = s;
  }
  req.tool_version = LP_VERSION;
  req.git_commit = LP_GIT_COMMIT;

  if (!a.trace.empty()) {
    recorded = trace::read_trace(a.trace);
    req.trace_origin = a.trace;
  }
  std::vector<Schedule> given;
  for (const std::string& s : a.schedules) given.push_back(schedule_from_arg(s));
  req.methods =
      report::methods_to_report(req.model, split_list(a.prune), given, a.trace.empty() ? nullptr : &recorded);
  const std::optional<sim::RevivalModel> revival_model = sim::load_revivals(a.revival_model, a.revival_share);
  for (report::ReportedMethod& m : req.methods) {
    if (m.trace) {
      m.revivals = "recorded in the trace";
      continue;
    }
    sim::RevivalChoice rv = sim::choose_revivals(revival_model, a.revival_share, m.method.policy_name(),
                                                 req.model.n_layer, m.steps, a.map);
    m.revival = std::move(rv.share);
    m.revivals = std::move(rv.description);
  }
  return req;
}

// --validation FILE: a `validate --json` output whose figures the charts draw beside the predictions.
nlohmann::json read_validation(const std::string& path) {
  nlohmann::json validation;
  if (path.empty()) return validation;
  const std::string text = read_input_file(path, "--validation file", input_cap::kResults);
  try {
    validation = json_parse(text, path);
  } catch (const nlohmann::json::exception& e) {
    fail("--validation '{}' is not valid JSON ({})", path, e.what());
  }
  report::check_validation(validation, path);
  return validation;
}

}  // namespace

int cmd_report(const ReportArgs& a) {
  trace::Trace recorded;  // --trace's, which the request's methods point into
  const report::Request req = report_request(a, recorded);
  const nlohmann::json validation = read_validation(a.validation);
  std::optional<report::PlanSummary> plan;
  if (!a.plan.empty()) {
    const std::string text = read_input_file(a.plan, "--plan file", input_cap::kResults);
    nlohmann::json j;
    try {
      j = json_parse(text, a.plan);
    } catch (const nlohmann::json::exception& e) {
      fail("--plan '{}' is not valid JSON ({})", a.plan, e.what());
    }
    plan = report::read_plan(j, a.plan);
  }

  // The output folder: created if its parent exists; every file is written whole or not at all.
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(a.out) && !fs::create_directory(a.out, ec))
    fail("cannot write the report to '{}': {}", a.out, ec ? ec.message() : "not a folder");
  const report::Report rep = report::build_report(req);
  const auto charts = report::report_charts(rep, a.validation.empty() ? nullptr : &validation);
  const fs::path dir(a.out);
  {
    std::vector<std::string> inputs = split_list(a.hw);
    inputs.insert(inputs.end(), {a.trace, a.validation, a.revival_model, a.model, a.plan, a.eval});
    for (const char* f : {"capacity-report.json", "report.html", "plan-frontier.svg"})
      refuse_output_over_input((dir / f).string(), "--out", inputs);
  }
  const std::string rep_json = rep.to_json().dump(2);
  write_file_atomic((dir / "capacity-report.json").string(), rep_json + "\n", "report");
  for (const auto& [name, svg] : charts) write_file_atomic((dir / name).string(), svg, "chart");
  std::string sections;
  if (plan) {
    write_file_atomic((dir / "plan-frontier.svg").string(),
                      report::svg_line_chart(report::plan_frontier_chart(*plan)), "chart");
    sections = report::plan_html(*plan);
  }
  write_file_atomic((dir / "report.html").string(), report::report_html(rep, charts, sections),
                    "report page");
  if (a.json_out) {
    std::puts(rep_json.c_str());
  } else {
    std::fputs(report::summary_text(rep).c_str(), stdout);
    fmt::print("\nwrote {}/capacity-report.json, report.html and {} charts\n", a.out, charts.size());
  }
  return 0;
}

}  // namespace lp::cli
