#include "sim/compare.h"

#include <fmt/format.h>

#include <algorithm>

#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "model/presets.h"
#include "sim/kv_predict.h"
#include "sim/replay.h"
#include "sim/runahead.h"
#include "sim/simulate.h"
#include "traces/synthetic.h"

namespace lp::sim {

Comparison compare_methods(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                           const CompareOptions& o) {
  if (o.schedules.empty()) fail("compare: no LazyLLM schedule to compare");
  const int P = o.devices;
  std::vector<std::vector<PruneStep>> steps;
  for (const Schedule& s : o.schedules) steps.push_back(resolve_schedule(s, c.n_layer, c.global_layers()));
  Comparison out;
  // Tensor parallelism over P of these devices, where the profile joins P and the model splits.
  try {
    check_tp(c, hw, P);
  } catch (const UsageError& e) {
    out.tp_refused = e.what();
  }
  const RunaheadLink link = default_link(hw);
  const auto most = [](const RunaheadPrediction& r) {
    double m = 0;
    for (const auto& k : r.ranks) m = std::max(m, k.memory_bytes);
    return m;
  };
  for (const int64_t N : o.prompt_tokens) {
    CompareTable t{N, {}};
    const auto add = [&](std::string method, std::string family, int devices, double ttft_s, double memory,
                         CompareAccuracy accuracy, size_t schedule = 0, std::string note = "") {
      t.rows.push_back({std::move(method), std::move(family), devices, ttft_s, memory, 0, true, accuracy,
                        schedule, std::move(note), false, ""});  // accuracy_note: compare() fills it
    };
    const Prediction plain = replay(trace::synthetic_trace(c, "none", {}, N, 0), c, hw, p);
    add("baseline: one device", "baseline", 1, plain.ttft_s, plain.memory.total(), CompareAccuracy::Exact);
    for (size_t i = 0; i < o.schedules.size(); ++i) {
      const Prediction lazy = replay(trace::synthetic_trace(c, "lazyllm", steps[i], N, 0), c, hw, p);
      add(fmt::format("LazyLLM {}", o.schedules[i].to_string()), "LazyLLM " + o.schedules[i].to_string(), 1,
          lazy.ttft_s, lazy.memory.total(), CompareAccuracy::Schedule, i);
    }
    if (out.tp_refused.empty()) {
      const Prediction tp = replay(trace::synthetic_trace(c, "none", {}, N, 0), c, hw, p, 1, P);
      add(fmt::format("tensor parallelism (TP) {}", P), "tensor parallelism", P, tp.ttft_s, tp.memory.total(),
          CompareAccuracy::Exact);
      const Prediction tpl = replay(trace::synthetic_trace(c, "lazyllm", steps[0], N, 0), c, hw, p, 1, P);
      add(fmt::format("LazyLLM + TP {}", P), "LazyLLM + tensor parallelism", P, tpl.ttft_s,
          tpl.memory.total(), CompareAccuracy::Schedule, 0);
    } else {
      add(fmt::format("tensor parallelism (TP) {}", P), "tensor parallelism", P, 0, 0, CompareAccuracy::Exact,
          0, out.tp_refused);
      t.rows.back().refused = true;
    }
    if (N >= P) {
      const std::vector<int64_t> chunks = optimise_partition(c, hw, p, N, P, link);
      const RunaheadPrediction ra = predict_runahead(c, hw, p, chunks, link);
      const std::vector<int64_t> lchunks = optimise_partition(c, hw, p, N, P, link, 1, steps[0]);
      const RunaheadPrediction rl = predict_runahead(c, hw, p, lchunks, link, 1, steps[0]);
      add(fmt::format("KV-Runahead {}", P), "KV-Runahead", P, ra.ttft_s, most(ra), CompareAccuracy::Exact, 0,
          fmt::format("chunks {} to {} tokens", chunks.front(), chunks.back()));
      add(fmt::format("LazyLLM + KV-Runahead {}", P), "LazyLLM + KV-Runahead", P, rl.ttft_s, most(rl),
          CompareAccuracy::RunaheadLastRank, 0,
          fmt::format("chunks {} to {} tokens", lchunks.front(), lchunks.back()));
    }
    if (o.kv_predict) {
      const KvPredictPrediction kp = predict_kv_prediction(c, *o.kv_predict, hw, p, N);
      add(fmt::format("KV Prediction from {}", o.kv_predict_name), "KV Prediction", 1, kp.ttft_s,
          kp.memory.total(), CompareAccuracy::KvPrediction);
    }
    for (CompareRow& r : t.rows)
      if (!r.refused) {
        r.speedup = plain.ttft_s / r.ttft_s;
        r.fits = r.memory_bytes <= hw.memory_capacity;
      }
    out.tables.push_back(std::move(t));
  }
  return out;
}

}  // namespace lp::sim

// ---- compare(): the request checked, the eval file's accuracy, the report's document

namespace lp::sim {
namespace {

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

// Each schedule's accuracy from the eval file, where it has the schedule.
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

std::string accuracy_text(const CompareRow& r, const std::vector<std::optional<EvalFigures>>& evals) {
  switch (r.accuracy) {
    case CompareAccuracy::Exact:
      return "exact (the same computation)";
    case CompareAccuracy::Schedule:
      return eval_text(evals[r.schedule]);
    case CompareAccuracy::RunaheadLastRank:
      return "not measured (the last rank prunes; docs/runahead.md)";
    case CompareAccuracy::KvPrediction:
      return "not modelled (the trained predictor's; the paper's figures below)";
  }
  return "";
}

}  // namespace

CompareReport compare(const CompareRequest& r) {
  if (r.hws.size() != 1) usage_fail("--hw names one profile for compare, got {}", r.hws.size());
  check_range("--devices", r.devices, 2, 1024);
  if (r.prompt_tokens.empty()) usage_fail("--prompt-tokens is empty (give e.g. 1024,4096,16384)");
  for (const int64_t n : r.prompt_tokens) check_range("--prompt-tokens", n, int64_t(1), int64_t(1) << 24);
  CompareReport out;
  const ModelConfig c = request_target(r.model, r.model_config, r.config, &out.model);
  out.precision = r.precision;
  validate(out.precision);
  out.hw = r.hws[0];
  out.devices = r.devices;
  CompareOptions opt;
  opt.devices = r.devices;
  opt.prompt_tokens = r.prompt_tokens;
  for (const std::string& s : r.schedules) opt.schedules.push_back(schedule_from_arg(s));
  if (opt.schedules.empty()) opt.schedules.push_back(default_schedule());
  if (!r.kv_predict.empty()) {
    opt.kv_predict = preset_config(r.kv_predict);
    opt.kv_predict_name = r.kv_predict;
    for_option("--kv-predict", [&] { check_kv_predict_pair(c, out.model, *opt.kv_predict, r.kv_predict); });
  }
  const std::vector<std::optional<EvalFigures>> evals = evals_from(r.eval, opt.schedules);
  out.comparison = compare_methods(c, out.hw, out.precision, opt);
  for (CompareTable& t : out.comparison.tables)
    for (CompareRow& row : t.rows) row.accuracy_note = accuracy_text(row, evals);
  out.combined_schedule = opt.schedules[0].to_string();
  out.kv_predict = opt.kv_predict.has_value();
  return out;
}

nlohmann::ordered_json CompareReport::to_json(const std::string& chart) const {
  using json = nlohmann::ordered_json;
  json out;
  out["tool"] = "lazyprefill compare";
  out["model"] = model;
  out["hw"] = hw.name;
  out["devices"] = devices;
  out["combined_schedule"] = combined_schedule;
  out["precision"] = {{"weights", precision.weights}, {"compute", precision.compute}, {"kv", precision.kv}};
  out["memory_per_device_gib"] = hw.memory_capacity / (1 << 30);
  if (!comparison.tp_refused.empty()) out["tp_refused"] = comparison.tp_refused;
  if (kv_predict) out["kv_prediction_accuracy"] = kv_predict_accuracy_note();
  json prompts = json::array();
  for (const CompareTable& t : comparison.tables) {
    json tj = json::array();
    for (const CompareRow& r : t.rows) {
      json rj = {{"method", r.method}, {"devices", r.devices}};
      if (r.refused) {
        rj["refused"] = r.note;
      } else {
        rj["ttft_ms"] = r.ttft_s * 1e3;
        rj["speedup"] = r.speedup;
        rj["memory_per_device_gib"] = r.memory_bytes / (1 << 30);
        rj["fits_in_memory"] = r.fits;
        if (!r.note.empty()) rj["note"] = r.note;
      }
      rj["accuracy"] = r.accuracy_note;
      tj.push_back(rj);
    }
    prompts.push_back({{"prompt_tokens", t.prompt_tokens}, {"methods", tj}});
  }
  out["prompts"] = std::move(prompts);
  if (!chart.empty()) out["chart"] = chart;
  return out;
}

}  // namespace lp::sim
