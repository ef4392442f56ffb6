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
#include "reports/accuracy.h"
#include "sim/cost.h"
#include "sim/replay.h"
#include "sim/serving_metrics.h"
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

// The methods a report compares, in its order: none; the recorded trace's (`recorded`, not null);
// LazyLLM at each of `given` that fits it (else its default schedule, unless a trace is given);
// the ablations (frozen, random-layers) at the first LazyLLM (or recorded) schedule; the paper's
// baselines (static-paper, random-drop) at the given schedules that fit them, else their own.
// Only the policies `policies` names besides none; revivals are the caller's to fill in.
std::vector<ReportedMethod> methods_to_report(const ModelConfig& c, const std::vector<std::string>& policies,
                                              const std::vector<Schedule>& given,
                                              const trace::Trace* recorded);

// Serving capacity (sim/serving.h): asked for with at least one objective.
struct ServingSpec {
  sim::Objectives objectives;
  std::string prompt_tokens = "2048", output_tokens = "128";  // LengthDist forms
  int64_t requests = 1000;
  int seeds = 1;
  int64_t max_batch_tokens = 8192;
  std::optional<double> kv_budget_gib;  // default: the memory budget less the weights
  double tolerance = 0.02;
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
  // The deployment's layout: tensor parallelism and pipeline stages here, expert parallelism and
  // data-parallel attention in `model` (sim::expert_parallel). Times and memory are one GPU's.
  int tp = 1;
  sim::Pipeline pipeline;
  sim::Precision precision;
  std::optional<ServingSpec> serving;
  std::string tool_version, git_commit;
  nlohmann::json eval;  // an `eval --json` result (null: none): each pruned method's accuracy evidence
};

// What one report holds: a column per prompt length, a row per hardware and method.
inline constexpr size_t kMaxLengths = 1024;
inline constexpr size_t kMaxCells = 16384;

// One cell of the report: a hardware profile, a method and a prompt length.
struct Result {
  size_t hw = 0, method = 0;  // indices into Provenance::hardware and ::methods
  int64_t prompt_tokens = 0;
  double ttft_ms = 0, baseline_ttft_ms = 0, speedup = 0;
  double prompt_tokens_computed_fraction = 1;
  double prefill_flop = 0, prefill_bytes = 0;
  double decode_step_mean_ms = 0, total_ms = 0;
  sim::Memory memory;
  bool fits_in_memory = false;
  int64_t concurrent_sequences = 0;  // sequences whose KV and Aux Cache fit beside the weights
  Op bound_op = Op::QKV;             // the op that takes the longest in the prefill
  sim::OpCosts ops{};                // the prefill per op (calls == 0: the op did not run)
};

// Per hardware and method: the longest prompt within the TTFT objective, the sequences that fit.
struct Capacity {
  size_t hw = 0, method = 0;
  std::optional<int64_t> max_prompt_tokens_within_slo;  // empty: no length meets the objective
  std::string slo_note;                                 // empty: no objective was given
  int64_t longest_prompt_tokens = 0;
  int64_t concurrent_sequences_at_longest = 0;
  double memory_budget_bytes = 0;
};

// Per hardware and method under load: the highest Poisson arrival rate that meets the serving
// objectives, and p90 TTFT and ITL along a grid of rates (shared by the methods of a hardware).
struct ServingCapacity {
  size_t hw = 0, method = 0;
  bool met = false;
  double rate = 0, rate_min = 0, rate_max = 0, resolution = 0;  // requests/s
  double ttft_p90_ms = 0, itl_p90_ms = 0;  // at `rate`; unmet: at the lowest rate tried (the best)
  double kv_budget_bytes = 0;
  std::vector<double> curve_rate, curve_ttft_p90_ms, curve_itl_p90_ms;
};

// Where the numbers come from.
struct Provenance {
  struct HardwareLine {
    std::string name, description, engine;
    bool efficiency_default = true;  // datasheet defaults, or calibrated
    std::string efficiency_source, peak_source;
  };
  struct MethodLine {
    std::string name;
    lp::Method method;
    std::string revivals;
    // A pruned method's accuracy evidence (Request::eval's rows for its policy and schedule; none:
    // "accuracy not measured").
    std::vector<AccuracyEvidence> accuracy;
    bool pruned() const { return method.policy != PolicyKind::None; }
    std::string accuracy_words() const;  // "kv at 4096 tokens: accuracy 0.9 (-0.1, 10 samples); ..."
  };
  std::string tool_version, git_commit, generated_utc;
  ModelConfig model;
  std::string model_source;
  std::vector<HardwareLine> hardware;
  std::optional<std::string> trace;  // the recorded trace replayed, if any
  std::vector<MethodLine> methods;   // the first is "none", the baseline
  sim::Precision precision;
  int64_t batch = 1, new_tokens = 0;
  int tp = 1, dp = 1, ep = 1, pp = 1;
  std::optional<double> slo_ttft_ms, mem_budget_gib;
};

struct Report {
  Provenance provenance;
  std::vector<int64_t> prompt_lengths;
  std::vector<Result> results;     // hardware-major, then method, then prompt length
  std::vector<Capacity> capacity;  // hardware-major, then method
  std::optional<ServingSpec> serving;
  std::vector<ServingCapacity> serving_capacity;  // hardware-major, then the methods a server runs

  const Result& result(size_t hw, size_t method, size_t length) const {
    return results[(hw * provenance.methods.size() + method) * prompt_lengths.size() + length];
  }
  // The report as reports/capacity-report.schema.json (version 2: version 1 and `serving`) lays it
  // out.
  nlohmann::ordered_json to_json() const;
};

// Builds the report (replays every case; oneTBB-parallel over hardware x method x length).
// Throws lp::Error for an empty or invalid request.
Report build_report(const Request& r);

// A readable table of the report, for stdout.
std::string summary_text(const Report& report);

// The report's charts as (file name, SVG): TTFT vs prompt length, speedup vs share of tokens
// computed, per-op breakdown, and measured vs predicted when `validation` (validate --json) is
// given.
std::vector<std::pair<std::string, std::string>> report_charts(const Report& report,
                                                               const nlohmann::json* validation);

// Checks a `validate --json` output before report_charts draws it: an object whose "cases" is an
// array of objects with finite, positive "measured_ttft_ms" and "predicted_ttft_ms" (optional
// string "policy" and "schedule"), and an optional numeric "ttft_mape". Throws lp::Error naming
// `origin` and the case.
void check_validation(const nlohmann::json& v, const std::string& origin);

// One self-contained HTML page: provenance, the tables, `sections` (HTML, e.g. plan_html's) and the
// charts inline.
std::string report_html(const Report& report, const std::vector<std::pair<std::string, std::string>>& charts,
                        const std::string& sections = "");

}  // namespace lp::report
