#include "reports/plan_study.h"

#include <fmt/format.h>

#include "model/error.h"
#include "model/io.h"
#include "pruning/method.h"
#include "pruning/schedule.h"
#include "reports/accuracy.h"
#include "sim/replay.h"
#include "sim/revival.h"
#include "sim/serving_study.h"
#include "sim/simulate.h"

namespace lp::report {
namespace {
using json = nlohmann::ordered_json;

void check_request(const PlanRequest& r) {
  if (r.hws.size() != 1) usage_fail("--hw names one profile for plan, got {}", r.hws.size());
  check_range("--gpus", r.gpus, 1, 4096);
  if (r.slo_ttft_ms != 0) check_range("--slo-ttft-p90-ms", r.slo_ttft_ms, 1e-3, 1e9);
  if (r.slo_itl_ms != 0) check_range("--slo-itl-p90-ms", r.slo_itl_ms, 1e-3, 1e9);
  for (const int64_t v : r.batch_tokens) check_range("--batch-tokens", v, int64_t(1), int64_t(1) << 24);
  for (const int64_t v : r.max_seqs) check_range("--max-seqs", v, int64_t(1), int64_t(1) << 24);
  for (const int v : r.pp) check_range("--pp", v, 1, 64);
  for (const double v : r.loads) check_range("--loads", v, 1e-3, 1.0);
  if (r.expert_parallel != "both" && r.expert_parallel != "on" && r.expert_parallel != "off")
    usage_fail("--expert-parallel must be both, on or off, got '{}'", escape_text(r.expert_parallel));
  check_range("--requests", r.requests, int64_t(8), int64_t(1) << 20);
  check_range("--max-layouts", r.max_layouts, int64_t(1), int64_t(1) << 30);
  check_range("--memory-fraction", r.memory_fraction, 0.05, 1.0);
}

}  // namespace

json PlanReport::point_json(size_t i) const {
  const sim::PlanPoint& pt = result.points[i];
  const sim::Layout& l = result.layouts[pt.layout];
  const sim::ServingMethod& m = options.methods[l.method];
  json j = {{"layout", l.describe()},
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
            {"method", m.name},
            {"rate_per_s", pt.rate},
            {"output_tokens_per_s_per_gpu", pt.tokens_per_s_per_gpu},
            {"output_tokens_per_s_per_user", pt.tokens_per_s_per_user},
            {"ttft_p90_ms", pt.metrics.ttft.p90 * 1e3},
            {"itl_p90_ms", pt.metrics.itl.p90 * 1e3},
            {"meets_objectives", pt.meets}};
  if (m.method.policy != PolicyKind::None) j["accuracy"] = accuracy[m.name];
  return j;
}

std::vector<sim::LaunchConfig> PlanReport::launch(size_t i) const {
  const sim::Layout& l = result.layouts[result.points[i].layout];
  std::vector<sim::LaunchConfig> out = sim::launch_configs(l, model);
  if (options.methods[l.method].method.policy != PolicyKind::None)
    out.push_back({"lazyprefill",
                   fmt::format("lazyprefill serve --prune {} --schedule {} (vLLM, SGLang and TensorRT-LLM "
                               "do not prune)",
                               policy_schedule[l.method].first, policy_schedule[l.method].second)});
  return out;
}

json PlanReport::to_json() const {
  json out;
  out["tool"] = "lazyprefill plan";
  out["model"] = model;
  out["hw"] = hw.name;
  out["engine"] = hw.engine.name;
  out["gpus"] = gpus;
  out["workload"] = {{"prompt_tokens", options.prompt.describe()},
                     {"output_tokens", options.output.describe()},
                     {"requests_per_simulation", options.requests},
                     {"loads", loads}};
  out["objectives"] = {{"ttft_p90_ms", slo_ttft_ms > 0 ? json(slo_ttft_ms) : json(nullptr)},
                       {"itl_p90_ms", slo_itl_ms > 0 ? json(slo_itl_ms) : json(nullptr)}};
  out["layouts_searched"] = result.layouts.size();
  out["layouts_refused"] = result.layouts_refused;
  out["simulations"] = result.simulations;
  out["accuracy"] = accuracy;
  json frontier = json::array();
  for (const size_t i : result.frontier) frontier.push_back(point_json(i));
  out["frontier"] = frontier;
  if (const std::optional<size_t> c = chosen()) {
    json best = point_json(*c);
    json launch_json = json::array();
    for (const sim::LaunchConfig& lc : launch(*c))
      launch_json.push_back({{"engine", lc.engine}, {"command", lc.command}});
    best["launch"] = launch_json;
    out[result.best ? "best" : "best_reachable"] = best;
  }
  return out;
}

std::optional<PlanReport> plan(const PlanRequest& r, const RunLayouts& run) {
  check_request(r);
  PlanReport out;
  const ModelConfig c = sim::request_target(r.model, r.model_config, r.config, &out.model);
  sim::Precision prec = r.precision;
  sim::validate(prec);
  out.hw = r.hws[0];
  out.gpus = r.gpus;
  out.loads = r.loads;
  out.slo_ttft_ms = r.slo_ttft_ms, out.slo_itl_ms = r.slo_itl_ms;
  const json eval = r.eval.empty() ? json() : json(read_eval(r.eval));

  sim::PlanOptions& o = out.options;
  o.gpus = r.gpus;
  o.prompt = sim::LengthDist::parse(r.prompt_tokens, "--prompt-tokens", "prompt_tokens");
  o.output = sim::LengthDist::parse(r.output_tokens, "--output-tokens", "output_tokens");
  o.objectives = {r.slo_ttft_ms * 1e-3, r.slo_itl_ms * 1e-3};
  o.batch_tokens = r.batch_tokens;
  o.max_seqs = r.max_seqs;
  o.load_shares = r.loads;
  o.disaggregated = !r.aggregated_only;
  o.pp = r.pp;
  o.expert_parallel = r.expert_parallel != "off";
  o.expert_only = r.expert_parallel == "on";
  o.requests = r.requests;
  o.max_layouts = r.max_layouts;
  o.memory_fraction = r.memory_fraction;
  o.seed = r.seed;
  std::vector<Schedule> given;
  for (const std::string& sch : r.schedules) given.push_back(schedule_from_arg(sch));
  const auto revival_model = sim::load_revivals("", -1);
  for (const std::string& name : split_list(r.prune)) {
    const PolicyKind kind = parse_policy(name);
    for (const Schedule& sched : kind == PolicyKind::None ? std::vector<Schedule>{default_schedule()}
                                                          : schedules_fitting(kind, given)) {
      const std::vector<PruneStep> steps = resolve_method(kind, sched, c.n_layer, c.global_layers());
      trace::Revivals rv;
      if (kind != PolicyKind::None)
        rv = sim::choose_revivals(revival_model, -1, name, c.n_layer, steps, true).share;
      const std::string label = kind == PolicyKind::None ? name : name + " " + sched.to_string();
      o.methods.push_back(sim::serving_method({kind, sched}, c, std::move(rv), label));
      out.policy_schedule.push_back(
          {std::string(policy_name(kind)), kind == PolicyKind::None ? "none" : sched.to_string()});
    }
  }
  const sim::ServingConfig base = sim::scheduler_config({}, out.hw);
  const std::vector<sim::Layout> all = sim::plan_layouts(out.hw, o, c.moe());
  const auto share = [&](int rank, int ranks) {
    return sim::simulate_layouts(c, out.hw, prec, base, o, all, rank, ranks);
  };
  std::optional<std::vector<sim::LayoutRun>> runs;
  if (run)
    runs = run(fmt::format("searches {} on {} ({}), {} layouts", out.model, out.hw.name, out.hw.engine.name,
                           all.size()),
               share);
  else
    runs = share(0, 1);
  if (!runs) return std::nullopt;
  out.result = sim::plan_result(all, *runs, o.objectives);

  // Each pruned method's accuracy evidence, or that none was measured.
  out.accuracy = json::object();
  for (size_t m = 0; m < o.methods.size(); ++m) {
    if (o.methods[m].method.policy == PolicyKind::None) continue;
    out.accuracy[o.methods[m].name] =
        json(accuracy_json(eval.is_null() ? std::vector<AccuracyEvidence>{}
                                          : accuracy_evidence(eval, out.policy_schedule[m].first,
                                                              out.policy_schedule[m].second)));
  }
  return out;
}

}  // namespace lp::report
