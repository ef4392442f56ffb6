// `lazyprefill plan`: the deployment search (report::plan, reports/plan_study.h): layouts of a model
// over N GPUs, the Pareto frontier of tokens/s per GPU against tokens/s per user, the best layout
// within the objectives with its launch commands, and each pruned row's accuracy evidence. Under
// `mpirun -n P` the ranks share the layouts, rank 0 alone reports. The files (--out, --chart) are
// the CLI's.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "engine/mpi/slices.h"
#include "model/error.h"
#include "model/io.h"
#include "reports/plan_chart.h"
#include "reports/plan_study.h"

namespace lp::cli {
namespace {

// A rank waits this long for the others' shares: mpirun stops the job when a rank exits, so the
// bound only catches one that hangs; a share of a large grid may take hours.
constexpr double kRankTimeoutS = 24 * 3600;

report::PlanRequest to_request(const PlanArgs& a) {
  report::PlanRequest r;
  r.model = a.model;
  r.model_config = a.model_config;
  r.hws = load_profiles(a.hw, a.engine);
  r.precision = a.precision;
  r.gpus = a.gpus;
  r.prune = a.prune;
  r.schedules = a.schedules;
  r.prompt_tokens = a.prompt_tokens;
  r.output_tokens = a.output_tokens;
  r.batch_tokens = a.batch_tokens;
  r.max_seqs = a.max_seqs;
  r.pp = a.pp;
  r.expert_parallel = a.expert_parallel;
  r.loads = a.loads;
  r.slo_ttft_ms = a.slo_ttft_ms, r.slo_itl_ms = a.slo_itl_ms;
  r.memory_fraction = a.memory_fraction;
  r.requests = a.requests;
  r.max_layouts = a.max_layouts;
  r.aggregated_only = a.aggregated_only;
  r.seed = a.seed;
  r.eval = a.eval;
  return r;
}

std::string plan_text(const PlanArgs& a, const report::PlanReport& rep) {
  const sim::PlanResult& r = rep.result;
  const auto& methods = rep.options.methods;
  std::string text = fmt::format("{} on {} x {} ({}): {} layouts searched, {} do not fit; {} simulations\n",
                                 rep.model, a.gpus, rep.hw.name, rep.hw.engine.name, r.layouts.size(),
                                 r.layouts_refused, r.simulations);
  if (const std::optional<size_t> chosen = rep.chosen()) {
    const sim::PlanPoint& pt = r.points[*chosen];
    const sim::Layout& l = r.layouts[pt.layout];
    text += fmt::format(
        "{}: {} ({}), budget {} tokens, {} requests at most, at {:.3g} requests/s: {:.1f} tokens/s a GPU, "
        "{:.1f} a user, p90 TTFT {:.0f} ms, p90 ITL {:.1f} ms\n",
        r.best ? "best within the objectives" : "no layout meets the objectives; the closest", l.describe(),
        methods[l.method].name, l.max_batch_tokens, l.max_seqs, pt.rate, pt.tokens_per_s_per_gpu,
        pt.tokens_per_s_per_user, pt.metrics.ttft.p90 * 1e3, pt.metrics.itl.p90 * 1e3);
    for (const sim::LaunchConfig& lc : rep.launch(*chosen))
      text += fmt::format("  {}: {}\n", lc.engine, lc.command);
    // A pruned method's evidence: a list of measurements, or the words that none was measured.
    const std::string& method = methods[l.method].name;
    if (rep.accuracy.contains(method) && rep.accuracy[method].is_string())
      text += fmt::format("  accuracy: {}\n", rep.accuracy[method].get<std::string>());
  }
  text += fmt::format("\nfrontier (tokens/s a GPU against tokens/s a user), {} of {} points:\n",
                      std::min<size_t>(r.frontier.size(), size_t(a.frontier_rows)), r.frontier.size());
  text += fmt::format("{:<40} {:<28} {:>7} {:>6} {:>10} {:>10} {:>10} {:>9}\n", "layout", "method", "budget",
                      "seqs", "tok/s/GPU", "tok/s/user", "TTFT p90", "ITL p90");
  for (size_t k = 0; k < r.frontier.size() && k < size_t(a.frontier_rows); ++k) {
    const sim::PlanPoint& pt = r.points[r.frontier[k]];
    const sim::Layout& l = r.layouts[pt.layout];
    text += fmt::format("{:<40} {:<28} {:>7} {:>6} {:>10.1f} {:>10.1f} {:>10.0f} {:>9.1f}{}\n", l.describe(),
                        methods[l.method].name, l.max_batch_tokens, l.max_seqs, pt.tokens_per_s_per_gpu,
                        pt.tokens_per_s_per_user, pt.metrics.ttft.p90 * 1e3, pt.metrics.itl.p90 * 1e3,
                        pt.meets ? "" : "  (misses)");
  }
  return text;
}

// The search here, or (world given: `mpirun -n P lazyprefill plan`) this rank's share of the
// layouts, gathered on rank 0, which alone prints and writes.
int plan_here(const PlanArgs& a, const mpi::World* world) {
  const report::PlanRequest req = to_request(a);
  if (!a.out.empty()) refuse_output_over_input(a.out, "--out", {a.model, a.hw, a.eval});
  if (!a.chart.empty()) refuse_output_over_input(a.chart, "--chart", {a.model, a.hw, a.eval, a.out});
  report::RunLayouts ranks;
  if (world)
    ranks = [&](const std::string& what, const std::function<std::vector<sim::LayoutRun>(int, int)>& share)
        -> std::optional<std::vector<sim::LayoutRun>> {
      const int rank = world->rank(), n = world->size();
      // Every rank must search the same grid: its model, hardware and layouts against rank 0's.
      mpi::check_same(*world, what, "every rank must be given the same model, hardware and options",
                      kRankTimeoutS);
      std::vector<sim::LayoutRun> runs;
      mpi::or_abort(*world, [&] {
        runs = share(rank, n);
        const std::vector<std::string> shares =
            mpi::gather_to_first(*world, sim::pack_layout_runs(runs, rank, n), kRankTimeoutS);
        for (int k = 1; k < n && rank == 0; ++k) sim::unpack_layout_runs(shares[size_t(k)], k, n, runs);
      });
      if (rank != 0) return std::nullopt;
      return runs;
    };
  const std::optional<report::PlanReport> rep = report::plan(req, ranks);
  if (!rep) return 0;  // another rank reports
  const std::string dumped = rep->to_json().dump(2) + "\n";
  if (!a.out.empty()) write_file_atomic(a.out, dumped, "plan");
  if (!a.chart.empty()) {
    std::vector<std::string> names;
    for (const sim::ServingMethod& m : rep->options.methods) names.push_back(m.name);
    write_file_atomic(a.chart,
                      report::svg_line_chart(report::plan_chart(
                          rep->result, names,
                          fmt::format("{} on {} x {}, {} + {} tokens", rep->model, a.gpus, rep->hw.name,
                                      rep->options.prompt.describe(), rep->options.output.describe()))),
                      "chart");
  }
  if (a.json_out)
    fmt::print("{}", dumped);
  else
    fmt::print("{}", plan_text(a, *rep));
  return 0;
}

}  // namespace

int cmd_plan(const PlanArgs& a) {
  return mpi::alone_or_ranks([&](const mpi::World* world) { return plan_here(a, world); });
}

}  // namespace lp::cli
