// A saved deployment search (`plan --out FILE`) in the capacity report (`report --plan FILE`): the
// file read back strictly (it may be old, edited or not a plan at all), the best layout or the
// closest, its launch commands and accuracy evidence, the frontier as a table and a chart.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "reports/plot.h"

namespace lp::report {

struct PlanRow {
  std::string layout, method;
  int64_t max_batch_tokens = 0, max_seqs = 0, gpus = 0;
  double rate_per_s = 0, tokens_per_s_per_gpu = 0, tokens_per_s_per_user = 0, ttft_p90_ms = 0, itl_p90_ms = 0;
  bool meets = false;
  std::string accuracy;  // pruned rows: the evidence in words, or "accuracy not measured"; else empty
};

struct PlanSummary {
  std::string model, hw, engine, prompt_tokens, output_tokens;
  int64_t gpus = 0, layouts_searched = 0, layouts_refused = 0, simulations = 0;
  std::optional<double> ttft_p90_ms, itl_p90_ms;            // the objectives given
  std::optional<PlanRow> best;                              // meeting the objectives
  std::optional<PlanRow> closest;                           // none meets them: the closest
  std::vector<std::pair<std::string, std::string>> launch;  // (engine, command) of the chosen row
  std::vector<PlanRow> frontier;
};

// Reads a `plan --json` / `--out` object. Throws lp::Error naming `origin` and the field for a
// missing or mistyped field or a file that is not a plan.
PlanSummary read_plan(const nlohmann::json& j, const std::string& origin);
// The frontier as a chart (tokens/s a GPU against tokens/s a user), the chosen row marked.
LineChart plan_frontier_chart(const PlanSummary& p);
// The report page's section: a heading, the chosen layout, its launch commands, the frontier table
// and the chart inline; every text escaped.
std::string plan_html(const PlanSummary& p);

}  // namespace lp::report
