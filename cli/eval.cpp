// `lazyprefill eval`: accuracy under pruning on long-context tasks made from public-domain text,
// with the measured TTFT speedup of each method, as a table, JSON and speed-accuracy charts.
#include "evals/eval.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "engine/session.h"
#include "evals/prefix_eval.h"
#include "git_commit.h"  // generated: LP_GIT_COMMIT
#include "kernels/context.h"
#include "kernels/weights.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/io.h"
#include "model/ops.h"
#include "model/paths.h"
#include "reports/plot.h"

namespace lp::cli {
namespace {

using json = nlohmann::ordered_json;

// The schedules a policy runs in an eval: the given ones that fit it, else its ladder.
std::vector<Schedule> eval_schedules(PolicyKind k, const std::vector<Schedule>& given) {
  std::vector<Schedule> ladder;
  const auto add = [&](const auto& names) {
    for (const char* s : names) ladder.push_back(parse_schedule(s));
  };
  if (k == PolicyKind::StaticPaper)
    add(kStaticPaperLadder);
  else if (k == PolicyKind::RandomDrop)
    add(kRandomDropLadder);
  else
    add(kDefaultLadder);
  return schedules_fitting(k, given, std::move(ladder));
}

// `layers`: the pruning steps the schedule resolved to on this model (on a sliding-window model a
// depth moves to a global layer, pruning/schedule.h), [[layer, share], ...].
json cell_json(const eval::Cell& c, bool qa, const ModelConfig& cfg) {
  json layers = json::array();
  for (const PruneStep& st :
       resolve_method(c.method.policy, c.method.schedule, cfg.n_layer, cfg.global_layers()))
    layers.push_back({st.layer, st.share});
  json j = {{"method", c.method.label()},
            {"policy", policy_name(c.method.policy)},
            {"schedule", c.method.policy == PolicyKind::None ? "none" : c.method.schedule.to_string()},
            {"layers", layers},
            {"samples", c.n},
            {"prompt_tokens_computed_fraction", c.share},
            {"prompt_tokens_computed_fraction_after_generation", c.share_after},
            {"ttft_ms_mean", c.ttft_s * 1e3},
            {"ttft_speedup", c.speedup}};
  if (qa) {
    j["accuracy"] = c.accuracy;
    j["accuracy_ci95"] = {c.accuracy_lo, c.accuracy_hi};
    j["accuracy_change"] = c.accuracy_change;
    j["samples_gained"] = c.gained;
    j["samples_lost"] = c.lost;
    j["first_k_agreement"] = c.agreement;
  } else {
    j["nll_mean"] = c.nll;
    j["nll_change"] = c.nll_change;
    j["top1_agreement"] = c.agreement;
  }
  return j;
}

json run_json(const eval::RunResult& r, bool qa) {
  json j = {{"ttft_ms", r.ttft_s * 1e3}, {"share", r.share}};
  if (qa) {
    j["generated"] = r.generated;
    j["correct"] = r.correct;
    j["score"] = r.score;  // random-drop: the share of its seeds right
  } else {
    j["nll"] = r.nll;
  }
  j["agreement"] = r.agreement;
  return j;
}

json result_json(const eval::TaskResult& r, const ModelConfig& cfg) {
  const eval::TaskInfo& info = eval::task_info(r.task);
  const bool qa = eval::is_qa(r.task);
  json j = {
      {"task", info.name}, {"description", info.description}, {"metric", info.metric}, {"length", r.length}};
  if (qa) j["chance_accuracy"] = r.chance;
  j["counts"] = r.counts;
  if (!r.counts)
    j["note"] =
        "the unpruned model is not clearly above chance (accuracy < chance + 0.2): failed at baseline";
  j["baseline"] = cell_json(r.baseline, qa, cfg);
  json cells = json::array();
  for (const auto& c : r.cells) cells.push_back(cell_json(c, qa, cfg));
  j["methods"] = cells;
  json samples = json::array();
  for (const auto& s : r.samples) {
    json sj = {{"index", s.index}, {"tokens", s.tokens}, {"depth", s.depth}};
    if (qa) sj["answer"] = s.answer;
    if (!s.prompt.empty()) sj["prompt"] = s.prompt;
    sj["none"] = run_json(s.baseline, qa);
    json runs = json::array();
    for (const auto& m : s.methods) runs.push_back(run_json(m, qa));
    sj["methods"] = runs;
    samples.push_back(sj);
  }
  j["samples"] = samples;
  return j;
}

std::string chart(const eval::TaskResult& r, const std::string& model_name) {
  const eval::TaskInfo& info = eval::task_info(r.task);
  const bool qa = eval::is_qa(r.task);
  report::LineChart c;
  c.title = fmt::format("{}: {} vs measured TTFT speedup, {} tokens", info.name,
                        qa ? "accuracy" : "NLL change", r.length);
  c.subtitle = fmt::format("{}, {} samples; each point a schedule (mild to aggressive){}", model_name,
                           r.baseline.n, qa && !r.counts ? "; FAILED AT BASELINE (near chance)" : "");
  c.x = {"TTFT speedup over unpruned (x, measured)"};
  c.y = {qa ? "accuracy (%)" : "NLL change (nats/token)"};
  if (qa) {
    c.y.min = 0;
    c.y.max = 100;
  }
  const auto value = [&](const eval::Cell& cell) { return qa ? 100 * cell.accuracy : cell.nll_change; };
  for (const PolicyKind p : {PolicyKind::LazyLLM, PolicyKind::StaticPaper, PolicyKind::RandomDrop,
                             PolicyKind::Frozen, PolicyKind::RandomLayers}) {
    report::Series s;
    s.name = policy_name(p);
    std::vector<const eval::Cell*> cells;
    for (const auto& cell : r.cells)
      if (cell.method.policy == p) cells.push_back(&cell);
    if (cells.empty()) continue;
    std::sort(cells.begin(), cells.end(), [](auto* a, auto* b) { return a->speedup < b->speedup; });
    for (const auto* cell : cells) {
      s.x.push_back(cell->speedup);
      s.y.push_back(value(*cell));
    }
    c.series.push_back(s);
  }
  c.series.push_back({"none (unpruned)", {1.0}, {value(r.baseline)}, false, true});
  if (qa) {
    double hi = 1;
    for (const auto& cell : r.cells) hi = std::max(hi, cell.speedup);
    c.series.push_back({"chance", {1.0, hi}, {100 * r.chance, 100 * r.chance}, true, false, true});
  }
  return report::svg_line_chart(c);
}

// The LazyLLM paper's Figure 6 grid: one pruning layer at each depth, keeping each share of the
// tokens there (the schedule "DEPTH:1-KEEP").
constexpr double kGridDepths[] = {0.1, 0.3, 0.5, 0.7, 0.9};
constexpr double kGridKeeps[] = {0.1, 0.3, 0.5, 0.7, 0.9};

Schedule grid_schedule(double depth, double keep) {
  return parse_schedule(fmt::format("{}:{}", depth, std::round((1 - keep) * 10) / 10));
}

// Accuracy (or NLL change) against the share kept, one line per depth: the grid's cells of one
// task and length for `policy`.
std::string grid_chart(const eval::TaskResult& r, const std::string& model_name, PolicyKind policy) {
  const eval::TaskInfo& info = eval::task_info(r.task);
  const bool qa = eval::is_qa(r.task);
  report::LineChart c;
  c.title = fmt::format("{}: one pruning layer at each depth, {} tokens ({})", info.name, r.length,
                        policy_name(policy));
  c.subtitle = fmt::format("{}, {} samples; the LazyLLM paper's Figure 6 grid{}", model_name, r.baseline.n,
                           qa && !r.counts ? "; FAILED AT BASELINE (near chance)" : "");
  c.x = {"tokens kept at the pruning layer (%)", false, 0.0, 100.0};
  c.y = {qa ? "accuracy (%)" : "NLL change (nats/token)"};
  if (qa) c.y.min = 0, c.y.max = 100;
  for (const double d : kGridDepths) {
    report::Series s;
    s.name = fmt::format("pruned after {:.0f}% of the layers", 100 * d);
    for (const double k : kGridKeeps) {
      const std::string want = grid_schedule(d, k).to_string();
      for (const auto& cell : r.cells)
        if (cell.method.policy == policy && cell.method.schedule.to_string() == want) {
          s.x.push_back(100 * k);
          s.y.push_back(qa ? 100 * cell.accuracy : cell.nll_change);
        }
    }
    if (!s.x.empty()) c.series.push_back(s);
  }
  const double base = qa ? 100 * r.baseline.accuracy : 0.0;
  c.series.push_back({"none (unpruned)", {0.0, 100.0}, {base, base}, true, false, true});
  return report::svg_line_chart(c);
}

void print_table(const std::vector<eval::TaskResult>& results, const std::vector<eval::TargetCheck>& targets,
                 const ModelConfig& cfg) {
  // A sliding-window model: where each schedule's depths went (pruning/schedule.h), when any moved.
  if (!cfg.global_layers().empty() && !results.empty()) {
    std::string lines;
    bool any_moved = false;
    for (const auto& c : results.front().cells) {
      if (c.method.policy == PolicyKind::None || c.method.policy == PolicyKind::RandomDrop) continue;
      const auto steps = resolve_method(c.method.policy, c.method.schedule, cfg.n_layer, cfg.global_layers());
      std::string text;
      for (const PruneStep& st : steps)
        text += fmt::format("{}{}:{:.4g}", text.empty() ? "" : ",", st.layer, st.share);
      lines += fmt::format("  {:<38} -> {}\n", c.method.label(), text);
      try {
        any_moved = any_moved || steps != resolve_method(c.method.policy, c.method.schedule, cfg.n_layer);
      } catch (const Error&) {
        any_moved = true;  // fits only with its depths moved
      }
    }
    if (any_moved)
      fmt::print("\n{} has sliding-window layers; depth fractions prune after the nearest global layer:\n{}",
                 cfg.name, lines);
  }
  for (const auto& r : results) {
    const eval::TaskInfo& info = eval::task_info(r.task);
    const bool qa = eval::is_qa(r.task);
    if (qa)
      fmt::print(
          "\n{} at {} tokens, {} samples: unpruned accuracy {:.0f}% [{:.0f}-{:.0f}], chance {:.3g}%{}\n",
          info.name, r.length, r.baseline.n, 100 * r.baseline.accuracy, 100 * r.baseline.accuracy_lo,
          100 * r.baseline.accuracy_hi, 100 * r.chance,
          r.counts ? "" : "  -> FAILED AT BASELINE: says nothing about pruning");
    else
      fmt::print("\n{} at {} tokens, {} samples: unpruned NLL {:.3f} nats/token over {} tokens\n", info.name,
                 r.length, r.baseline.n, r.baseline.nll, info.max_new_tokens);
    fmt::print("  {:<38} {:>7} {:>8} {:>9}  {}\n", "method", "share", "speedup", "TTFT ms",
               qa ? "accuracy [95% CI]   change (+gained/-lost)  first-k agree" : "NLL change  top-1 agree");
    for (const auto& c : r.cells) {
      fmt::print("  {:<38} {:>6.1f}% {:>7.2f}x {:>9.0f}  ", c.method.label(), 100 * c.share, c.speedup,
                 c.ttft_s * 1e3);
      if (qa)
        fmt::print("{:>4.0f}% [{:.0f}-{:.0f}]   {:>+5.1f} pt (+{}/-{})  {:>12.0f}%\n", 100 * c.accuracy,
                   100 * c.accuracy_lo, 100 * c.accuracy_hi, 100 * c.accuracy_change, c.gained, c.lost,
                   100 * c.agreement);
      else
        fmt::print("{:>+10.4f}  {:>10.1f}%\n", c.nll_change, 100 * c.agreement);
    }
  }
  fmt::print(
      "\nTargets (LazyLLM >= 1.8x measured TTFT speedup with <= 1 point accuracy loss on the QA tasks the\n"
      "unpruned model solves; LazyLLM at or above frozen/random-layers at the same schedule, and at or "
      "above\n"
      "every baseline at matched measured TTFT):\n");
  for (const auto& t : targets) {
    if (t.counted_tasks == 0)
      fmt::print("  {} tokens: no QA task the unpruned model solves was evaluated at this length\n",
                 t.length);
    else if (t.found)
      fmt::print("  {} tokens: fastest LazyLLM within 1 point: {} at {:.2f}x ({}), worst change {:+.1f} pt\n",
                 t.length, t.best.schedule.to_string(), t.best_speedup, t.speedup_met ? "met" : "below 1.8x",
                 100 * t.best_worst_change);
    else
      fmt::print("  {} tokens: no LazyLLM schedule within 1 point on the {} counted QA task(s)\n", t.length,
                 t.counted_tasks);
    if (t.matched_comparisons > 0)
      fmt::print(
          "  {} tokens: LazyLLM at or above frozen/random-layers in {} of {} same-schedule comparisons\n",
          t.length, t.lazyllm_at_or_above, t.matched_comparisons);
    if (!t.ttft_matched.empty()) {
      fmt::print(
          "  {} tokens, at matched measured TTFT (the best LazyLLM cell at least as fast): LazyLLM at or "
          "above in "
          "{} of {}\n",
          t.length, t.lazyllm_at_or_above_ttft, t.ttft_matched.size());
      for (const auto& m : t.ttft_matched)
        fmt::print("    {:<8} {:<26} at {:.2f}x: {:5.1f}% vs {:<34} at {:.2f}x: {:5.1f}%\n",
                   eval::task_info(m.task).name, m.baseline.label(), m.speedup, 100 * m.baseline_accuracy,
                   m.lazyllm.label(), m.lazyllm_speedup, 100 * m.lazyllm_accuracy);
    }
  }
}

// The run's options from the command line; `prune` gets the policies run (the grid's default
// lazyllm where --prune is left out).
eval::EvalOptions eval_options(const EvalArgs& a, std::string& prune) {
  eval::EvalOptions opt;
  for (const std::string& t : split_list(a.tasks)) opt.tasks.push_back(eval::task_info(t).task);
  if (opt.tasks.empty()) usage_fail("--task is empty (known: passkey, kv, mdqa, nll)");
  opt.lengths = parse_distinct_lengths(a.lengths, "--lengths");
  opt.samples = a.samples;
  opt.seed = a.seed;
  opt.agreement_tokens = a.agreement_tokens;
  opt.keep_prompts = a.with_prompts;
  opt.drop_seeds = a.drop_seeds;
  std::vector<Schedule> schedules;
  for (const std::string& s : a.schedules) schedules.push_back(schedule_from_arg(s));
  const bool grid = !a.grid.empty();
  if (grid)
    for (const double d : kGridDepths)
      for (const double k : kGridKeeps) schedules.push_back(grid_schedule(d, k));
  // The grid is the paper's LazyLLM figure: lazyllm alone unless --prune says otherwise.
  prune = grid && !a.prune_given ? std::string("lazyllm") : a.prune;
  for (const std::string& p : split_list(prune)) {
    const PolicyKind k = parse_policy(p);
    if (k == PolicyKind::None) continue;  // the baseline always runs
    for (const Schedule& s : eval_schedules(k, schedules)) opt.methods.push_back({k, s});
  }
  return opt;
}

json target_json(const eval::TargetCheck& t) {
  json tj = {
      {"length", t.length}, {"counted_qa_tasks", t.counted_tasks}, {"lazyllm_within_1pt_found", t.found}};
  if (t.found) {
    tj["fastest_lazyllm_within_1pt"] = t.best.schedule.to_string();
    tj["its_speedup"] = t.best_speedup;
    tj["its_worst_accuracy_change"] = t.best_worst_change;
    tj["speedup_target_met"] = t.speedup_met;
  }
  tj["matched_comparisons"] = t.matched_comparisons;
  tj["lazyllm_at_or_above"] = t.lazyllm_at_or_above;
  json tm = json::array();
  for (const auto& m : t.ttft_matched)
    tm.push_back({{"task", eval::task_info(m.task).name},
                  {"baseline", m.baseline.label()},
                  {"measured_speedup", m.speedup},
                  {"baseline_accuracy", m.baseline_accuracy},
                  {"lazyllm_accuracy_at_that_speedup", m.lazyllm_accuracy},
                  {"lazyllm_method", m.lazyllm.label()},
                  {"lazyllm_measured_speedup", m.lazyllm_speedup}});
  tj["ttft_matched_comparisons"] = tm;
  tj["lazyllm_at_or_above_at_matched_ttft"] = t.lazyllm_at_or_above_ttft;
  return tj;
}

// --out DIR: eval.json, a speed-accuracy chart per task and length, and with --grid a
// single-layer grid chart per policy.
void write_outputs(const std::string& out, const json& j, const std::vector<eval::TaskResult>& results,
                   const std::string& model_name, bool grid, const std::string& prune) {
  const std::filesystem::path dir(out);
  write_file_atomic((dir / "eval.json").string(), j.dump(2) + "\n", "evaluation");
  for (const auto& r : results)
    write_file_atomic(
        (dir / fmt::format("speed-accuracy-{}-{}.svg", eval::task_info(r.task).name, r.length)).string(),
        chart(r, model_name), "chart");
  if (!grid) return;
  for (const auto& r : results)
    for (const std::string& p : split_list(prune))
      if (parse_policy(p) != PolicyKind::None)
        write_file_atomic(
            (dir / fmt::format("grid-single-layer-{}-{}-{}.svg", eval::task_info(r.task).name, r.length, p))
                .string(),
            grid_chart(r, model_name, parse_policy(p)), "chart");
}

}  // namespace

// eval --prefix-cache: the cached-against-cold table (or JSON) of evals/prefix_eval.h.
int cmd_eval_prefix_cache(const EvalArgs& a, const eval::EvalOptions& opt) {
  eval::PrefixEvalOptions po;
  po.tasks = a.task_given ? opt.tasks : std::vector<eval::Task>{eval::Task::KeyValue, eval::Task::MultiDocQA};
  po.lengths = opt.lengths;
  po.samples = opt.samples;
  po.seed = opt.seed;
  po.methods.push_back({PolicyKind::None, {}});
  for (const Method& m : opt.methods)
    if (m.policy != PolicyKind::RandomDrop) po.methods.push_back(m);
  const std::string corpus_path = a.corpus.empty() ? eval::default_corpus_path() : a.corpus;
  const eval::Corpus corpus = eval::load_corpus(corpus_path);
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  const int threads = a.threads > 0 ? a.threads : default_thread_count();
  CpuContext ctx(threads);
  const auto model = Model::load_auto(path, ctx);
  po.progress = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
  const auto results = eval::run_prefix_cache_eval(ctx, *model, corpus, po);
  json rs = json::array();
  for (const auto& r : results)
    for (const auto& c : r.cells)
      rs.push_back({{"task", eval::task_info(r.task).name},
                    {"length", r.length},
                    {"documents", r.documents},
                    {"method", c.method.label()},
                    {"questions", c.n},
                    {"cold_accuracy", c.cold_accuracy},
                    {"cached_accuracy", c.cached_accuracy},
                    {"gained", c.gained},
                    {"lost", c.lost},
                    {"same_answer", c.same_answer},
                    {"cached_share", c.cached_share},
                    {"cold_computed", c.cold_computed},
                    {"cached_computed", c.cached_computed},
                    {"cold_ttft_s", c.cold_ttft_s},
                    {"cached_ttft_s", c.cached_ttft_s}});
  if (a.json_out) {
    const json j = {{"version", LP_VERSION}, {"git_commit", LP_GIT_COMMIT},
                    {"model", path},         {"dtype", dtype_name(model->weights().dtype)},
                    {"threads", threads},    {"seed", a.seed},
                    {"corpus", corpus_path}, {"prefix_cache", rs}};
    std::puts(j.dump(2).c_str());
    return 0;
  }
  fmt::print("{:<5} {:>6} {:<40} {:>4} {:>12} {:>12} {:>6} {:>6} {:>7} {:>8} {:>9}\n", "task", "tokens",
             "method", "n", "acc cold", "acc cached", "same", "cached", "comp.", "TTFT ms", "cached ms");
  for (const json& c : rs)
    fmt::print(
        "{:<5} {:>6} {:<40} {:>4} {:>11.1f}% {:>11.1f}% {:>5.0f}% {:>5.0f}% {:>6.0f}% {:>8.1f} {:>9.1f}\n",
        c["task"].get<std::string>(), c["length"].get<int64_t>(), c["method"].get<std::string>(),
        c["questions"].get<int>(), 100 * c["cold_accuracy"].get<double>(),
        100 * c["cached_accuracy"].get<double>(), 100 * c["same_answer"].get<double>(),
        100 * c["cached_share"].get<double>(), 100 * c["cached_computed"].get<double>(),
        1e3 * c["cold_ttft_s"].get<double>(), 1e3 * c["cached_ttft_s"].get<double>());
  return 0;
}

int cmd_eval(const EvalArgs& a) {
  std::string prune;
  eval::EvalOptions opt = eval_options(a, prune);
  if (a.prefix_cache) return cmd_eval_prefix_cache(a, opt);
  if (!a.out.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a.out, ec);
    if (ec || ::access(a.out.c_str(), W_OK) != 0) fail("cannot write to the output folder '{}'", a.out);
  }

  const std::string corpus_path = a.corpus.empty() ? eval::default_corpus_path() : a.corpus;
  const eval::Corpus corpus = eval::load_corpus(corpus_path);
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  const int threads = a.threads > 0 ? a.threads : default_thread_count();
  CpuContext ctx(threads);
  const auto model = Model::load_auto(path, ctx);  // as `run --dtype auto`
  const DType dtype = model->weights().dtype;
  opt.progress = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
  const std::vector<eval::TaskResult> results = eval::run_eval(ctx, *model, corpus, opt);
  const std::vector<eval::TargetCheck> targets = eval::check_targets(results);

  json j = {{"version", LP_VERSION},
            {"git_commit", LP_GIT_COMMIT},
            {"model", path},
            {"model_name", model->config().name},
            {"dtype", dtype_name(dtype)},
            {"threads", threads},
            {"seed", a.seed},
            {"samples", a.samples},
            {"drop_seeds", a.drop_seeds},
            {"agreement_tokens", a.agreement_tokens},
            {"corpus", corpus_path}};
  json rs = json::array();
  for (const auto& r : results) rs.push_back(result_json(r, model->config()));
  j["results"] = rs;
  json ts = json::array();
  for (const auto& t : targets) ts.push_back(target_json(t));
  j["targets"] = ts;
  if (!a.out.empty()) write_outputs(a.out, j, results, model->config().name, !a.grid.empty(), prune);
  if (a.json_out)
    std::puts(j.dump(2).c_str());
  else
    print_table(results, targets, model->config());
  return 0;
}

}  // namespace lp::cli
