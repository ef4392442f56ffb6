// The capacity report: what a user takes to a deployment decision. Per hardware x prompt length
// x method (none, each LazyLLM schedule asked for, static, random, or a recorded trace mapped to
// each length): TTFT, speedup, FLOPs, bytes, memory split and the op that bounds it; per hardware
// and method: the longest prompt that meets a TTFT objective and how many sequences fit a memory
// budget; provenance. The JSON follows reports/capacity-report.schema.json (version 1).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "pruning/method.h"
#include "pruning/schedule.h"
#include "sim/cost.h"
#include "traces/synthetic.h"
#include "traces/trace.h"

namespace lp::report {

// A method as the report states it: its name, the policy and schedule, and how it is costed.
struct ReportedMethod {
  std::string name;                     // "none", "lazyllm 0.3:0.3,0.6:0.3,0.9:0.3", "trace: run.jsonl", ...
  lp::Method method;                    // the policy and schedule (a trace's: as recorded)
  std::vector<PruneStep> steps;         // resolved for the model
  const trace::Trace* trace = nullptr;  // a recorded trace, mapped to each prompt length
  trace::Revivals revival;              // synthetic decoding's revivals (empty: none)
  std::string revivals = "none";        // what the report says about them
};

struct Request {
  ModelConfig model;
  std::string model_source;  // "preset llama-3.1-8b" or the GGUF path
  std::vector<hw::Profile> hws;
  std::vector<ReportedMethod> methods;  // the first must be "none" (the baseline)
  std::string trace_origin;             // the trace file, if a method replays one
  std::vector<int64_t> lengths;
  int64_t new_tokens = 0;
  std::optional<double> slo_ttft_ms;
  std::optional<double> mem_budget_gib;  // default: each profile's memory capacity
  int64_t batch = 1;
  sim::Precision precision;
  std::string tool_version, git_commit;
};

// What one report holds: a column per prompt length, a row per hardware and method.
inline constexpr size_t kMaxLengths = 1024;
inline constexpr size_t kMaxCells = 16384;

// Builds the report (replays every case; oneTBB-parallel over hardware x method x length).
// Throws lp::Error for an empty or invalid request.
nlohmann::ordered_json build_report(const Request& r);

// A readable table of the report, for stdout.
std::string summary_text(const nlohmann::ordered_json& report);

// The report's charts as (file name, SVG): TTFT vs prompt length, speedup vs share of tokens
// computed, per-op breakdown, and measured vs predicted when `validation` (validate --json) is
// given.
std::vector<std::pair<std::string, std::string>> report_charts(const nlohmann::ordered_json& report,
                                                               const nlohmann::json* validation);

// Checks a `validate --json` output before report_charts draws it: an object whose "cases" is an
// array of objects with finite, positive "measured_ttft_ms" and "predicted_ttft_ms" (optional
// string "policy" and "schedule"), and an optional numeric "ttft_mape". Throws lp::Error naming
// `origin` and the case.
void check_validation(const nlohmann::json& v, const std::string& origin);

// One self-contained HTML page: provenance, the tables and the charts inline.
std::string report_html(const nlohmann::ordered_json& report,
                        const std::vector<std::pair<std::string, std::string>>& charts);

}  // namespace lp::report
