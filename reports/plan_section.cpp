#include "reports/plan_section.h"

#include <fmt/format.h>

#include "model/error.h"
#include "model/json_checks.h"
#include "reports/accuracy.h"

namespace lp::report {
namespace {

using json = nlohmann::json;

// A row's accuracy evidence in words (as accuracy_words writes the report's), from what plan wrote:
// its rows, or the words "accuracy not measured"; empty for an unpruned row.
std::string accuracy_of(const json& row, const std::string& where) {
  if (!row.contains("accuracy")) return "";
  const json& a = row["accuracy"];
  if (a.is_string()) return a.get<std::string>();
  if (!a.is_array()) fail("{}: field 'accuracy' must be a string or an array", where);
  std::vector<AccuracyEvidence> rows;
  for (const json& e : a) {
    if (!e.is_object()) fail("{}: an 'accuracy' entry must be an object", where);
    rows.push_back({json_field<std::string>(e, "task", where), json_field<std::string>(e, "metric", where),
                    json_field<int64_t>(e, "length", where), json_field<double>(e, "value", where),
                    json_field<double>(e, "change", where), json_field<int64_t>(e, "samples", where)});
  }
  return accuracy_words(rows);
}

PlanRow read_row(const json& r, const std::string& where) {
  if (!r.is_object()) fail("{}: must be an object", where);
  PlanRow row;
  row.layout = json_field<std::string>(r, "layout", where);
  row.method = json_field<std::string>(r, "method", where);
  row.gpus = json_field<int64_t>(r, "gpus", where);
  row.max_batch_tokens = json_field<int64_t>(r, "max_batch_tokens", where);
  row.max_seqs = json_field<int64_t>(r, "max_seqs", where);
  row.rate_per_s = json_field<double>(r, "rate_per_s", where);
  row.tokens_per_s_per_gpu = json_field<double>(r, "output_tokens_per_s_per_gpu", where);
  row.tokens_per_s_per_user = json_field<double>(r, "output_tokens_per_s_per_user", where);
  row.ttft_p90_ms = json_field<double>(r, "ttft_p90_ms", where);
  row.itl_p90_ms = json_field<double>(r, "itl_p90_ms", where);
  row.meets = json_field<bool>(r, "meets_objectives", where);
  for (const double v :
       {row.rate_per_s, row.tokens_per_s_per_gpu, row.tokens_per_s_per_user, row.ttft_p90_ms, row.itl_p90_ms})
    if (!std::isfinite(v) || v < 0) fail("{}: figures must be finite and not negative, got {}", where, v);
  row.accuracy = accuracy_of(r, where);
  return row;
}

std::string row_cells(const PlanRow& r) {
  return fmt::format(
      "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1f}</td><td>{:.1f}</td><td>{:.0f}</td><td>{:.1f}</"
      "td><td>{}</td>",
      xml_escape(r.layout), xml_escape(r.method), r.max_batch_tokens, r.max_seqs, r.tokens_per_s_per_gpu,
      r.tokens_per_s_per_user, r.ttft_p90_ms, r.itl_p90_ms, r.meets ? "yes" : "no");
}

}  // namespace

PlanSummary read_plan(const json& j, const std::string& origin) {
  if (!j.is_object() || j.value("tool", "") != "lazyprefill plan")
    fail("{}: not a `lazyprefill plan` result (its 'tool' must be \"lazyprefill plan\")", origin);
  PlanSummary p;
  p.model = json_field<std::string>(j, "model", origin);
  p.hw = json_field<std::string>(j, "hw", origin);
  p.engine = json_field<std::string>(j, "engine", origin);
  p.gpus = json_field<int64_t>(j, "gpus", origin);
  p.layouts_searched = json_field<int64_t>(j, "layouts_searched", origin);
  p.layouts_refused = json_field<int64_t>(j, "layouts_refused", origin);
  p.simulations = json_field<int64_t>(j, "simulations", origin);
  const json& w = json_member(j, "workload", origin);
  p.prompt_tokens = json_field<std::string>(w, "prompt_tokens", origin + ": workload");
  p.output_tokens = json_field<std::string>(w, "output_tokens", origin + ": workload");
  const json& o = json_member(j, "objectives", origin);
  p.ttft_p90_ms = json_optional<double>(o, "ttft_p90_ms", origin + ": objectives");
  p.itl_p90_ms = json_optional<double>(o, "itl_p90_ms", origin + ": objectives");
  const json& frontier = json_member(j, "frontier", origin);
  if (!frontier.is_array()) fail("{}: field 'frontier' must be an array", origin);
  for (size_t i = 0; i < frontier.size(); ++i)
    p.frontier.push_back(read_row(frontier[i], fmt::format("{}: frontier row {}", origin, i + 1)));
  for (const char* key : {"best", "best_reachable"}) {
    if (!j.contains(key)) continue;
    const std::string where = fmt::format("{}: {}", origin, key);
    PlanRow row = read_row(j[key], where);
    const json& launch = json_member(j[key], "launch", where);
    if (!launch.is_array()) fail("{}: field 'launch' must be an array", where);
    for (const json& l : launch) {
      if (!l.is_object()) fail("{}: a launch entry must be an object", where);
      p.launch.emplace_back(json_field<std::string>(l, "engine", where),
                            json_field<std::string>(l, "command", where));
    }
    (std::string(key) == "best" ? p.best : p.closest) = std::move(row);
  }
  return p;
}

LineChart plan_frontier_chart(const PlanSummary& p) {
  LineChart c;
  c.title = "Deployment plan: the Pareto frontier";
  c.subtitle = fmt::format("{} on {} x {} ({}), {} + {} tokens", p.model, p.gpus, p.hw, p.engine,
                           p.prompt_tokens, p.output_tokens);
  c.x = {"output tokens/s a user (1 / mean ITL)"};
  c.y = {"output tokens/s a GPU"};
  Series f{"Pareto frontier", {}, {}, true, true};
  for (const PlanRow& r : p.frontier)
    f.x.push_back(r.tokens_per_s_per_user), f.y.push_back(r.tokens_per_s_per_gpu);
  if (!f.x.empty()) c.series.push_back(std::move(f));
  const std::optional<PlanRow>& chosen = p.best ? p.best : p.closest;
  if (chosen)
    c.series.push_back({p.best ? "best within the objectives" : "closest to the objectives",
                        {chosen->tokens_per_s_per_user},
                        {chosen->tokens_per_s_per_gpu},
                        false,
                        true});
  return c;
}

std::string plan_html(const PlanSummary& p) {
  std::string h = fmt::format("<h2>Deployment plan: {} on {} x {} ({})</h2>\n", xml_escape(p.model), p.gpus,
                              xml_escape(p.hw), xml_escape(p.engine));
  const auto objective = [](const std::optional<double>& v, const char* unit) {
    return v ? fmt::format("{:.4g} {}", *v, unit) : std::string("none");
  };
  h += fmt::format(
      "<p>Workload {} prompt + {} output tokens; objectives p90 TTFT {}, p90 ITL {}; {} layouts searched, {} "
      "do not fit, {} simulations (<code>lazyprefill plan</code>).</p>\n",
      xml_escape(p.prompt_tokens), xml_escape(p.output_tokens), objective(p.ttft_p90_ms, "ms"),
      objective(p.itl_p90_ms, "ms"), p.layouts_searched, p.layouts_refused, p.simulations);
  const std::string head =
      "<tr><th>layout</th><th>method</th><th>token budget</th><th>requests at most</th><th>tokens/s a "
      "GPU</th><th>tokens/s a user</th><th>p90 TTFT (ms)</th><th>p90 ITL (ms)</th><th>meets</th></tr>\n";
  const std::optional<PlanRow>& chosen = p.best ? p.best : p.closest;
  if (chosen) {
    h += fmt::format("<h3>{}</h3>\n<table>{}<tr>{}</tr></table>\n",
                     p.best ? "Best within the objectives" : "No layout meets the objectives; the closest",
                     head, row_cells(*chosen));
    if (!chosen->accuracy.empty()) h += fmt::format("<p>Accuracy: {}</p>\n", xml_escape(chosen->accuracy));
    h += "<table><tr><th>engine</th><th>launch</th></tr>\n";
    for (const auto& [engine, command] : p.launch)
      h += fmt::format("<tr><td>{}</td><td style=\"text-align:left\"><code>{}</code></td></tr>\n",
                       xml_escape(engine), xml_escape(command));
    h += "</table>\n";
  } else {
    h += "<p>No layout fits these GPUs.</p>\n";
  }
  h += fmt::format("<h3>Frontier ({} points, fastest per user first)</h3>\n<table>{}", p.frontier.size(),
                   head);
  for (const PlanRow& r : p.frontier) h += "<tr>" + row_cells(r) + "</tr>\n";
  h += "</table>\n";
  const std::string svg = svg_line_chart(plan_frontier_chart(p));
  h += fmt::format(
      "<figure>{}<figcaption>plan-frontier.svg</figcaption></figure>\n",
      svg.starts_with("<?xml") ? std::string_view(svg).substr(svg.find("?>") + 2) : std::string_view(svg));
  return h;
}

}  // namespace lp::report
