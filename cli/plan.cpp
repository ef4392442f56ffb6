// `lazyprefill plan`: the deployment search (sim/plan.h): layouts of a model over N GPUs, the
// Pareto frontier of tokens/s per GPU against tokens/s per user, the best layout within the
// objectives with its launch commands, and each pruned row's accuracy evidence.
#include "sim/plan.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "engine/mpi/slices.h"
#include "model/error.h"
#include "model/io.h"
#include "pruning/method.h"
#include "reports/accuracy.h"
#include "reports/plan_chart.h"
#include "sim/replay.h"
#include "sim/simulate.h"

namespace lp::cli {
namespace {
using json = nlohmann::ordered_json;

json point_json(const sim::PlanResult& r, size_t i, const std::vector<sim::ServingMethod>& methods) {
  const sim::PlanPoint& pt = r.points[i];
  const sim::Layout& l = r.layouts[pt.layout];
  return {{"layout", l.describe()},
          {"disaggregated", l.disaggregated()},
          {"tp", l.tp},
          {"instances", l.replicas},
          {"decode_tp", l.decode_tp},
          {"decode_instances", l.decode_instances},
          {"pp", l.pp},
          {"expert_parallel", l.ep},
          {"gpus", l.gpus()},
          {"max_batch_tokens", l.max_batch_tokens},
          {"max_seqs", l.max_seqs},
          {"method", methods[l.method].name},
          {"rate_per_s", pt.rate},
          {"output_tokens_per_s_per_gpu", pt.tokens_per_s_per_gpu},
          {"output_tokens_per_s_per_user", pt.tokens_per_s_per_user},
          {"ttft_p90_ms", pt.metrics.ttft.p90 * 1e3},
          {"itl_p90_ms", pt.metrics.itl.p90 * 1e3},
          {"meets_objectives", pt.meets}};
}

// A rank waits this long for the others' shares: mpirun stops the job when a rank exits, so the
// bound only catches one that hangs; a share of a large grid may take hours.
constexpr double kRankTimeoutS = 24 * 3600;

// The search here, or (world given: `mpirun -n P lazyprefill plan`) this rank's share of the
// layouts, gathered on rank 0, which alone prints and writes.
int plan_here(const PlanArgs& a, const mpi::World* world) {
  std::string model_name;
  const ModelConfig c = sim::model_to_cost(a.model, a.model_config, &model_name);
  sim::Precision prec = a.precision;
  sim::validate(prec);
  const hw::Profile hw = load_profiles(a.hw, a.engine).at(0);
  if (!a.out.empty()) refuse_output_over_input(a.out, "--out", {a.model, a.hw, a.eval});
  if (!a.chart.empty()) refuse_output_over_input(a.chart, "--chart", {a.model, a.hw, a.eval, a.out});
  const json eval = a.eval.empty() ? json() : json(report::read_eval(a.eval));

  sim::PlanOptions o;
  o.gpus = a.gpus;
  o.prompt = sim::LengthDist::parse(a.prompt_tokens, "--prompt-tokens", "prompt_tokens");
  o.output = sim::LengthDist::parse(a.output_tokens, "--output-tokens", "output_tokens");
  o.objectives = {a.slo_ttft_ms * 1e-3, a.slo_itl_ms * 1e-3};
  o.batch_tokens = a.batch_tokens;
  o.max_seqs = a.max_seqs;
  o.load_shares = a.loads;
  o.disaggregated = !a.aggregated_only;
  o.pp = a.pp;
  o.expert_parallel = a.expert_parallel != "off";
  o.expert_only = a.expert_parallel == "on";
  o.requests = a.requests;
  o.max_layouts = a.max_layouts;
  o.memory_fraction = a.memory_fraction;
  o.seed = a.seed;
  std::vector<Schedule> given;
  for (const std::string& sch : a.schedules) given.push_back(schedule_from_arg(sch));
  const auto revival_model = sim::load_revivals("", -1);
  std::vector<std::pair<std::string, std::string>> policy_schedule;  // for the accuracy evidence
  for (const std::string& name : split_list(a.prune)) {
    const PolicyKind kind = parse_policy(name);
    for (const Schedule& sched : kind == PolicyKind::None ? std::vector<Schedule>{default_schedule()}
                                                          : schedules_fitting(kind, given)) {
      const std::vector<PruneStep> steps = resolve_method(kind, sched, c.n_layer, c.global_layers());
      trace::Revivals rv;
      if (kind != PolicyKind::None)
        rv = sim::choose_revivals(revival_model, -1, name, c.n_layer, steps, true).share;
      const std::string label = kind == PolicyKind::None ? name : name + " " + sched.to_string();
      o.methods.push_back(sim::serving_method({kind, sched}, c, std::move(rv), label));
      policy_schedule.push_back(
          {std::string(policy_name(kind)), kind == PolicyKind::None ? "none" : sched.to_string()});
    }
  }
  const sim::ServingConfig base = sim::scheduler_config({}, hw);
  const std::vector<sim::Layout> all = sim::plan_layouts(hw, o, c.moe());
  const int rank = world ? world->rank() : 0, ranks = world ? world->size() : 1;
  std::vector<sim::LayoutRun> runs;
  if (!world) {
    runs = sim::simulate_layouts(c, hw, prec, base, o, all);
  } else {
    // Every rank must search the same grid: its model, hardware and layouts against rank 0's.
    mpi::check_same(
        *world,
        fmt::format("searches {} on {} ({}), {} layouts", model_name, hw.name, hw.engine.name, all.size()),
        "every rank must be given the same model, hardware and options", kRankTimeoutS);
    mpi::or_abort(*world, [&] {
      runs = sim::simulate_layouts(c, hw, prec, base, o, all, rank, ranks);
      const std::vector<std::string> shares =
          mpi::gather_to_first(*world, sim::pack_layout_runs(runs, rank, ranks), kRankTimeoutS);
      for (int k = 1; k < ranks && rank == 0; ++k) sim::unpack_layout_runs(shares[size_t(k)], k, ranks, runs);
    });
    if (rank != 0) return 0;
  }
  const sim::PlanResult r = sim::plan_result(all, runs, o.objectives);

  json out;
  out["tool"] = "lazyprefill plan";
  out["model"] = model_name;
  out["hw"] = hw.name;
  out["engine"] = hw.engine.name;
  out["gpus"] = a.gpus;
  out["workload"] = {{"prompt_tokens", o.prompt.describe()},
                     {"output_tokens", o.output.describe()},
                     {"requests_per_simulation", a.requests},
                     {"loads", a.loads}};
  out["objectives"] = {{"ttft_p90_ms", a.slo_ttft_ms > 0 ? json(a.slo_ttft_ms) : json(nullptr)},
                       {"itl_p90_ms", a.slo_itl_ms > 0 ? json(a.slo_itl_ms) : json(nullptr)}};
  out["layouts_searched"] = r.layouts.size();
  out["layouts_refused"] = r.layouts_refused;
  out["simulations"] = r.simulations;
  // Each method's accuracy evidence, or that none was measured.
  json evidence = json::object();
  for (size_t m = 0; m < o.methods.size(); ++m) {
    if (o.methods[m].method.policy == PolicyKind::None) continue;
    evidence[o.methods[m].name] =
        json(report::accuracy_json(eval.is_null() ? std::vector<report::AccuracyEvidence>{}
                                                  : report::accuracy_evidence(eval, policy_schedule[m].first,
                                                                              policy_schedule[m].second)));
  }
  out["accuracy"] = evidence;
  const auto with_accuracy = [&](json j, size_t i) {
    const sim::Layout& l = r.layouts[r.points[i].layout];
    if (o.methods[l.method].method.policy != PolicyKind::None)
      j["accuracy"] = evidence[o.methods[l.method].name];
    return j;
  };
  json frontier = json::array();
  for (const size_t i : r.frontier) frontier.push_back(with_accuracy(point_json(r, i, o.methods), i));
  out["frontier"] = frontier;
  std::string text =
      fmt::format("{} on {} x {} ({}): {} layouts searched, {} do not fit; {} simulations\n", model_name,
                  a.gpus, hw.name, hw.engine.name, r.layouts.size(), r.layouts_refused, r.simulations);
  const std::optional<size_t> chosen = r.best ? r.best : r.best_reachable;
  if (chosen) {
    const sim::Layout& l = r.layouts[r.points[*chosen].layout];
    json best = with_accuracy(point_json(r, *chosen, o.methods), *chosen);
    json launch = json::array();
    for (const sim::LaunchConfig& lc : sim::launch_configs(l, model_name))
      launch.push_back({{"engine", lc.engine}, {"command", lc.command}});
    if (o.methods[l.method].method.policy != PolicyKind::None)
      launch.push_back(
          {{"engine", "lazyprefill"},
           {"command",
            fmt::format("lazyprefill serve --prune {} --schedule {} (vLLM, SGLang and TensorRT-LLM "
                        "do not prune)",
                        policy_schedule[l.method].first, policy_schedule[l.method].second)}});
    best["launch"] = launch;
    out[r.best ? "best" : "best_reachable"] = best;
    const sim::PlanPoint& pt = r.points[*chosen];
    text += fmt::format(
        "{}: {} ({}), budget {} tokens, {} requests at most, at {:.3g} requests/s: {:.1f} tokens/s a GPU, "
        "{:.1f} a user, p90 TTFT {:.0f} ms, p90 ITL {:.1f} ms\n",
        r.best ? "best within the objectives" : "no layout meets the objectives; the closest", l.describe(),
        o.methods[l.method].name, l.max_batch_tokens, l.max_seqs, pt.rate, pt.tokens_per_s_per_gpu,
        pt.tokens_per_s_per_user, pt.metrics.ttft.p90 * 1e3, pt.metrics.itl.p90 * 1e3);
    for (const auto& lc : launch)
      text += fmt::format("  {}: {}\n", lc["engine"].get<std::string>(), lc["command"].get<std::string>());
    if (best.contains("accuracy") && best["accuracy"].is_string())
      text += fmt::format("  accuracy: {}\n", best["accuracy"].get<std::string>());
  }
  text += fmt::format("\nfrontier (tokens/s a GPU against tokens/s a user), {} of {} points:\n",
                      std::min<size_t>(r.frontier.size(), size_t(a.frontier_rows)), r.frontier.size());
  text += fmt::format("{:<40} {:<28} {:>7} {:>6} {:>10} {:>10} {:>10} {:>9}\n", "layout", "method", "budget",
                      "seqs", "tok/s/GPU", "tok/s/user", "TTFT p90", "ITL p90");
  for (size_t k = 0; k < r.frontier.size() && k < size_t(a.frontier_rows); ++k) {
    const sim::PlanPoint& pt = r.points[r.frontier[k]];
    const sim::Layout& l = r.layouts[pt.layout];
    text += fmt::format("{:<40} {:<28} {:>7} {:>6} {:>10.1f} {:>10.1f} {:>10.0f} {:>9.1f}{}\n", l.describe(),
                        o.methods[l.method].name, l.max_batch_tokens, l.max_seqs, pt.tokens_per_s_per_gpu,
                        pt.tokens_per_s_per_user, pt.metrics.ttft.p90 * 1e3, pt.metrics.itl.p90 * 1e3,
                        pt.meets ? "" : "  (misses)");
  }
  const std::string dumped = out.dump(2) + "\n";
  if (!a.out.empty()) write_file_atomic(a.out, dumped, "plan");
  if (!a.chart.empty()) {
    std::vector<std::string> names;
    for (const sim::ServingMethod& m : o.methods) names.push_back(m.name);
    write_file_atomic(a.chart,
                      report::svg_line_chart(
                          report::plan_chart(r, names,
                                             fmt::format("{} on {} x {}, {} + {} tokens", model_name, a.gpus,
                                                         hw.name, o.prompt.describe(), o.output.describe()))),
                      "chart");
  }
  if (a.json_out)
    fmt::print("{}", dumped);
  else
    fmt::print("{}", text);
  return 0;
}

}  // namespace

int cmd_plan(const PlanArgs& a) {
  return mpi::alone_or_ranks([&](const mpi::World* world) { return plan_here(a, world); });
}

}  // namespace lp::cli
