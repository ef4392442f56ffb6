// `lazyprefill compare`: every way this tool knows to cut time to first token, side by side, for
// one model on one kind of device at several prompt lengths: the plain prefill on one device,
// LazyLLM (each schedule), tensor parallelism over P devices with and without LazyLLM, KV-Runahead
// over P devices with and without LazyLLM on its last rank (sim/runahead.h), and KV Prediction with
// an auxiliary model (sim/kv_predict.h). Per method: TTFT, speedup over the plain prefill, devices
// used, memory per device and whether it fits, and what it costs in accuracy where that is known
// (LazyLLM: from an `eval --json` output when given; the exact methods: exact; the rest: not
// measured). One table (or --json) and one chart (--chart FILE.svg: TTFT against prompt length).
#include "sim/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/calibration_output.h"
#include "cli/commands.h"
#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "model/presets.h"
#include "pruning/schedule.h"
#include "reports/plot.h"
#include "sim/kv_predict.h"
#include "sim/simulate.h"

namespace lp::cli {
namespace {
using json = nlohmann::ordered_json;

// What one LazyLLM schedule did in an `eval --json` output, over its tasks and lengths.
struct EvalFigures {
  std::string model;
  int qa_tasks = 0, nll_tasks = 0;
  double worst_accuracy_change = 0, worst_nll_change = 0;  // points (QA), nats (NLL)
};

std::optional<EvalFigures> eval_figures(const nlohmann::json& e, const std::string& schedule,
                                        const std::string& origin) {
  EvalFigures f;
  f.model = e.value("model_name", std::string("?"));
  try {
    for (const auto& r : e.at("results")) {
      if (!r.value("counts", true)) continue;  // failed at baseline: says nothing about pruning
      for (const auto& c : r.at("methods")) {
        if (c.at("policy").get<std::string>() != "lazyllm" || c.at("schedule").get<std::string>() != schedule)
          continue;
        if (c.contains("accuracy_change")) {
          const double d = 100 * c.at("accuracy_change").get<double>();
          f.worst_accuracy_change = f.qa_tasks++ ? std::min(f.worst_accuracy_change, d) : d;
        } else if (c.contains("nll_change")) {
          const double d = c.at("nll_change").get<double>();
          f.worst_nll_change = f.nll_tasks++ ? std::max(f.worst_nll_change, d) : d;
        }
      }
    }
  } catch (const nlohmann::json::exception& ex) {
    fail("{}: not an `eval --json` output ({})", origin, ex.what());
  }
  if (f.qa_tasks + f.nll_tasks == 0) return std::nullopt;
  return f;
}

std::string eval_text(const std::optional<EvalFigures>& f) {
  if (!f) return "not measured (lazyprefill eval --json, then --eval FILE)";
  std::string s = fmt::format("eval on {}:", f->model);
  if (f->qa_tasks)
    s += fmt::format(" worst QA accuracy change {:+.1f} pt over {}", f->worst_accuracy_change, f->qa_tasks);
  if (f->nll_tasks)
    s += fmt::format("{} worst NLL change {:+.3f} over {}", f->qa_tasks ? ";" : "", f->worst_nll_change,
                     f->nll_tasks);
  return s;
}

// The schedules to compare (the first is the one combined with the parallel methods).
std::vector<Schedule> schedules_from(const CompareArgs& a) {
  std::vector<Schedule> schedules;
  for (const std::string& s : a.schedules) schedules.push_back(schedule_from_arg(s));
  if (schedules.empty()) schedules.push_back(default_schedule());
  return schedules;
}

// Each schedule's accuracy from --eval's file, where it has the schedule.
std::vector<std::optional<EvalFigures>> evals_from(const std::string& path,
                                                   const std::vector<Schedule>& schedules) {
  std::vector<std::optional<EvalFigures>> evals(schedules.size());
  if (path.empty()) return evals;
  const nlohmann::json e =
      json_parse(read_input_file(path, "eval --json file", input_cap::kResults), path, true);
  if (e.is_discarded() || !e.is_object()) fail("{}: not a JSON object", path);
  for (size_t i = 0; i < schedules.size(); ++i) evals[i] = eval_figures(e, schedules[i].to_string(), path);
  return evals;
}

std::string accuracy_text(const sim::CompareRow& r, const std::vector<std::optional<EvalFigures>>& evals) {
  switch (r.accuracy) {
    case sim::CompareAccuracy::Exact:
      return "exact (the same computation)";
    case sim::CompareAccuracy::Schedule:
      return eval_text(evals[r.schedule]);
    case sim::CompareAccuracy::RunaheadLastRank:
      return "not measured (the last rank prunes; docs/runahead.md)";
    case sim::CompareAccuracy::KvPrediction:
      return "not modelled (the trained predictor's; the paper's figures below)";
  }
  return "";
}

// The comparison's tables as JSON and text, and TTFT against prompt length per method family (the
// chart's series, in the order the families first appear).
struct RenderedTables {
  json prompts = json::array();
  std::string text;
  std::vector<report::Series> series;
};
RenderedTables render_tables(const sim::Comparison& cmp,
                             const std::vector<std::optional<EvalFigures>>& evals) {
  RenderedTables out;
  std::map<std::string, size_t> family;  // index in out.series
  for (const sim::CompareTable& t : cmp.tables) {
    json tj = json::array();
    out.text += fmt::format("\nprompt {} tokens\n  {:<34} {:>7} {:>11} {:>8} {:>10}  {}\n", t.prompt_tokens,
                            "method", "devices", "TTFT ms", "speedup", "GiB/device", "accuracy");
    for (const sim::CompareRow& r : t.rows) {
      json rj = {{"method", r.method}, {"devices", r.devices}};
      const std::string accuracy = accuracy_text(r, evals);
      if (r.refused) {
        rj["refused"] = r.note;
        out.text += fmt::format("  {:<34} {:>7} {:>11}  {}\n", r.method, r.devices, "-", r.note);
      } else {
        rj["ttft_ms"] = r.ttft_s * 1e3;
        rj["speedup"] = r.speedup;
        rj["memory_per_device_gib"] = r.memory_bytes / (1 << 30);
        rj["fits_in_memory"] = r.fits;
        if (!r.note.empty()) rj["note"] = r.note;
        out.text +=
            fmt::format("  {:<34} {:>7} {:>11.1f} {:>7.2f}x {:>9.1f}{}  {}\n", r.method, r.devices,
                        r.ttft_s * 1e3, r.speedup, r.memory_bytes / (1 << 30), r.fits ? " " : "!", accuracy);
        auto [it, added] = family.try_emplace(r.family, out.series.size());
        if (added) out.series.push_back({.name = r.family, .x = {}, .y = {}});
        out.series[it->second].x.push_back(double(t.prompt_tokens));
        out.series[it->second].y.push_back(r.ttft_s * 1e3);
      }
      rj["accuracy"] = accuracy;
      tj.push_back(rj);
    }
    out.prompts.push_back({{"prompt_tokens", t.prompt_tokens}, {"methods", tj}});
  }
  return out;
}

}  // namespace

int cmd_compare(const CompareArgs& a) {
  std::string model_name;
  const ModelConfig c = sim::model_to_cost(a.model, a.model_config, &model_name);
  sim::Precision prec = a.precision;
  sim::validate(prec);
  const std::vector<hw::Profile> hws = load_profiles(a.hw, a.engine);
  if (hws.size() != 1) usage_fail("--hw names one profile for compare, got {}", hws.size());
  const hw::Profile& hw = hws[0];
  sim::CompareOptions opt;
  opt.devices = a.devices;
  opt.prompt_tokens = parse_lengths(a.prompt_tokens, "--prompt-tokens");
  opt.schedules = schedules_from(a);
  if (!a.kv_predict.empty()) {
    opt.kv_predict = preset_config(a.kv_predict);
    opt.kv_predict_name = a.kv_predict;
    for_option("--kv-predict",
               [&] { sim::check_kv_predict_pair(c, model_name, *opt.kv_predict, a.kv_predict); });
  }
  const std::vector<std::optional<EvalFigures>> evals = evals_from(a.eval, opt.schedules);
  const sim::Comparison cmp = sim::compare_methods(c, hw, prec, opt);
  const std::string first = opt.schedules[0].to_string();
  RenderedTables tables = render_tables(cmp, evals);

  json out;
  out["tool"] = "lazyprefill compare";
  out["model"] = model_name;
  out["hw"] = hw.name;
  out["devices"] = a.devices;
  out["combined_schedule"] = first;
  out["precision"] = {{"weights", prec.weights}, {"compute", prec.compute}, {"kv", prec.kv}};
  out["memory_per_device_gib"] = hw.memory_capacity / (1 << 30);
  if (!cmp.tp_refused.empty()) out["tp_refused"] = cmp.tp_refused;
  if (opt.kv_predict) out["kv_prediction_accuracy"] = sim::kv_predict_accuracy_note();
  std::string text =
      fmt::format("{} on {} ({} {}/{}/{}; {} devices for the parallel methods, {:.0f} GiB each)\n",
                  model_name, hw.name, hw.kind == "gpu" ? "GPU" : "CPU", prec.weights, prec.compute, prec.kv,
                  a.devices, hw.memory_capacity / (1 << 30)) +
      tables.text;
  text += fmt::format("\nThe combinations use LazyLLM {}. ! : needs more memory than a device has.\n", first);
  if (opt.kv_predict) text += fmt::format("KV Prediction's accuracy: {}\n", sim::kv_predict_accuracy_note());
  out["prompts"] = std::move(tables.prompts);
  if (!a.chart.empty()) {
    report::LineChart ch;
    ch.title = fmt::format("Time to first token: {} on {}", model_name, hw.name);
    ch.subtitle =
        fmt::format("one device, or {} for tensor parallelism and KV-Runahead; predicted", a.devices);
    ch.x = {"prompt (tokens)", true};
    ch.y = {"TTFT (ms)", true};
    ch.series = std::move(tables.series);
    write_file_atomic(a.chart, report::svg_line_chart(ch), "chart");
    out["chart"] = a.chart;
  }
  print_result(a.json_out, out, text);
  return 0;
}

}  // namespace lp::cli
