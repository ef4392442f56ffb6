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

CLI::App* add_report(CLI::App& app, ReportArgs& a) {
  auto* r = app.add_subcommand(
      "report",
      R"(Write a capacity report (JSON, SVG charts, HTML) for a model on hardware over prompt lengths.
  lazyprefill report --model-config llama-3.1-8b --hw h100-sxm,l4 --prompt-lengths 2048,8192,32768 \
      --slo-ttft-ms 500 --mem-budget-gib 40 --out reports/out
  lazyprefill report --model-config llama-2-7b --hw a100-80gb --trace run.jsonl --prompt-lengths 1024,4096 --out r/)");
  add_model_choice(*r, a.model, a.model_config, "report on");
  add_hardware(*r, a.hw, a.engine);
  r->add_option("--trace", a.trace, "A recorded trace whose pruning pattern is mapped to each length");
  r->add_option(
       "--prune", a.prune,
       "Methods besides none, comma-separated: lazyllm, the paper's baselines static-paper and "
       "random-drop, the ablations frozen and random-layers (default lazyllm,static-paper,random-drop)")
      ->check(policy_names(true));
  r->add_option("--schedule", a.schedules,
                "A LazyLLM schedule to report (repeat for several; default 0.3:0.3,0.6:0.3,0.9:0.3 without a "
                "trace); frozen and random-layers use the trace's or the first; static-paper and random-drop "
                "those that fit them (one L:S step; a share alone), else their defaults 0.1:0.35 and 0.3")
      ->check(non_empty_schedule());
  r->add_option("--prompt-lengths", a.lengths, "Comma-separated prompt lengths in tokens")->required();
  r->add_option("--new-tokens", a.new_tokens, "Tokens generated after each prompt (default 0: TTFT only)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20));
  auto* share =
      r->add_option("--revival-share", a.revival_share,
                    "Decoding: a constant share of the active tokens revived after each pruning layer "
                    "instead of the revival model (0: the optimistic bound)")
          ->check(CLI::Range(0.0, 1.0));
  r->add_option("--revival-model", a.revival_model,
                "Decoding: revival model file from calibrate-revivals (default: the built-in one)")
      ->excludes(share);
  r->add_flag("--map", a.map,
              "Allow a --revival-model fitted on another layer count (stages by relative depth)");
  r->add_option("--slo-ttft-ms", a.slo_ttft_ms, "TTFT objective: report the longest prompt that meets it")
      ->check(finite_number() & CLI::PositiveNumber);
  r->add_option("--mem-budget-gib", a.mem_budget_gib, "Memory budget per device (default: its capacity)")
      ->check(finite_number() & CLI::PositiveNumber);
  r->add_option("--tp", a.tp, "Tensor-parallel degree (default 1); times and memory are per GPU")
      ->check(CLI::Range(1, 4096));
  add_expert_parallel(*r, a.ep, a.moe_imbalance, a.dp);
  r->add_option("--pp", a.pp, "Pipeline stages, each on its own --tp GPUs (default 1)")
      ->check(CLI::Range(1, 4096));
  r->add_option("--pp-link-gbs", a.pp_link_gbs, "With --pp: the link between stages, GB/s a GPU (default 50)")
      ->check(CLI::PositiveNumber);
  r->add_option("--batch", a.batch, "Sequences prefilled together (default 1)")
      ->check(CLI::Range(int64_t(1), int64_t(4096)));
  add_precision(*r, a.precision);
  r->add_option("--serving-slo-ttft-p90-ms", a.serving_ttft_p90_ms,
                "Serving capacity: the highest Poisson arrival rate whose p90 TTFT stays under this, per "
                "hardware and method, and a chart of p90 TTFT against the rate (sim/serving.h)")
      ->check(CLI::Range(1e-3, 1e9));
  r->add_option("--serving-slo-itl-p90-ms", a.serving_itl_p90_ms,
                "Serving capacity: also (or only) p90 inter-token latency under this")
      ->check(CLI::Range(1e-3, 1e9));
  r->add_option("--serving-prompt-tokens", a.serving_prompt_tokens,
                "Serving: prompt lengths, N, LO:HI or file:PATH (default 2048)");
  r->add_option("--serving-output-tokens", a.serving_output_tokens,
                "Serving: output lengths, N, LO:HI or file:PATH (default 128)");
  r->add_option("--serving-requests", a.serving_requests,
                "Serving: requests per simulated run (default 1000)")
      ->check(CLI::Range(int64_t(10), int64_t(1) << 22));
  r->add_option("--serving-seeds", a.serving_seeds,
                "Serving: workloads per search, their median kept (default 1)")
      ->check(CLI::Range(1, 64));
  r->add_option("--serving-max-batch-tokens", a.serving_max_batch_tokens,
                "Serving: rows per iteration (default 8192)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  r->add_option("--serving-kv-budget-gib", a.serving_kv_budget_gib,
                "Serving: K/V budget per device (default: the memory budget less the weights)")
      ->check(CLI::Range(1e-3, 1e6));
  r->add_option("--validation", a.validation, "validate --json output, for the measured-vs-predicted chart");
  r->add_option("--eval", a.eval, "An eval --json result: each pruned method's accuracy evidence")
      ->check(non_empty_path());
  r->add_option("--plan", a.plan, "A saved `plan --out` result: the report gains its deployment plan")
      ->check(non_empty_path());
  r->add_option("--out", a.out, "Folder for capacity-report.json, the charts and report.html")->required();
  r->add_flag("--json", a.json_out, "Print the report JSON instead of the summary table");
  return r;
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
  const std::optional<sim::RevivalModel> revival_model = load_revivals(a.revival_model, a.revival_share);
  for (report::ReportedMethod& m : req.methods) {
    if (m.trace) {
      m.revivals = "recorded in the trace";
      continue;
    }
    RevivalChoice rv = choose_revivals(revival_model, a.revival_share, m.method.policy_name(),
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

int cmd_report(const ReportArgs& a, const CLI::App& /*sub*/) {
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
