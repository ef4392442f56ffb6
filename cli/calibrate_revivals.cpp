// `lazyprefill calibrate-revivals`: fit the revival model (sim/revival.h) to recorded LazyLLM
// traces, and show on held-out traces how close synthetic decoding with it comes to replaying
// the real run (KV, Aux Cache, rows computed and time per decoding step).
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "calibrate/revivals.h"
#include "cli/commands.h"
#include "git_commit.h"  // generated: LP_GIT_COMMIT
#include "model/config.h"
#include "model/digest.h"
#include "model/error.h"
#include "model/io.h"
#include "sim/replay.h"
#include "sim/revival.h"
#include "traces/synthetic.h"
#include "traces/trace.h"

namespace lp::cli {
namespace {
using json = nlohmann::ordered_json;

std::string file_bytes(const std::string& path) {
  return read_input_file(path, "trace", input_cap::kTrace);
}

double rows_per_step(const trace::Trace& t) {
  if (t.steps.size() < 2) return 0;
  double rows = 0;
  for (size_t s = 1; s < t.steps.size(); ++s)
    for (int64_t q : t.steps[s].queries) rows += double(q);
  return rows / double(t.steps.size() - 1);
}

double rel(double predicted, double actual) {
  return actual != 0 ? (predicted - actual) / actual : 0.0;
}

}  // namespace

CLI::App* add_calibrate_revivals(CLI::App& app, CalibrateRevivalsArgs& a) {
  auto* c = app.add_subcommand(
      "calibrate-revivals",
      R"(Fit the revival model (the share of each pruning stage's tokens revived per decoding step) to
recorded LazyLLM traces; with --held-out, compare synthetic decoding with it to replaying other runs.
  lazyprefill calibrate-revivals a.jsonl b.jsonl --out revivals.json
  lazyprefill calibrate-revivals a.jsonl b.jsonl --held-out c.jsonl --hw cpu-local)");
  c->add_option("traces", a.traces, "Traces of run --prune lazyllm --trace to fit, decoding steps included");
  c->add_option("--held-out", a.held_out, "Traces not fitted on: replay them and the model's prediction");
  c->add_option("--revival-model", a.model,
                "With --held-out: judge this model file (or 'builtin') instead of fitting one");
  c->add_option("--hw", a.hw, "Profile the held-out comparison is costed on (default cpu-local)");
  add_precision(*c, a.precision, " of the comparison");
  c->add_flag("--map", a.map,
              "Allow a --revival-model fitted on another layer count (stages by relative depth)");
  c->add_option("--out", a.out, "Write the fitted model here (JSON)");
  c->add_flag("--json", a.json_out, "Print one JSON object");
  return c;
}

int cmd_calibrate_revivals(const CalibrateRevivalsArgs& a, const CLI::App& /*sub*/) {
  if (a.model.empty() && a.traces.empty())
    usage_fail("give traces to fit, or --revival-model FILE with --held-out");
  if (!a.model.empty() && !a.traces.empty())
    usage_fail("give traces to fit or --revival-model to judge, not both");
  {
    std::vector<std::string> inputs = a.traces;
    inputs.insert(inputs.end(), a.held_out.begin(), a.held_out.end());
    inputs.push_back(a.model);
    refuse_output_over_input(a.out, "--out", inputs);
  }
  if (!a.model.empty() && a.held_out.empty())
    usage_fail("--revival-model needs --held-out traces to judge it on");
  if (!a.model.empty() && !a.out.empty())
    usage_fail("--out writes a fitted model; with --revival-model nothing is fitted");
  sim::Precision prec = a.precision;
  sim::validate(prec);
  const hw::Profile hw = hw::load_profile(a.hw);
  std::vector<trace::Trace> traces;
  std::vector<std::string> shas;
  for (const std::string& f : a.traces) {
    traces.push_back(trace::read_trace(f));
    shas.push_back(sha256_hex(file_bytes(f), f));
  }
  for (size_t i = 0; i < shas.size(); ++i)
    for (size_t k = 0; k < i; ++k)
      if (shas[i] == shas[k])
        usage_fail("{} and {} are the same trace (identical bytes)", a.traces[k], a.traces[i]);
  std::vector<trace::Trace> held;
  for (const std::string& f : a.held_out) {
    held.push_back(trace::read_trace(f));
    const std::string sha = sha256_hex(file_bytes(f), f);
    for (size_t k = 0; k < shas.size(); ++k)
      if (sha == shas[k]) usage_fail("--held-out {} is {}, a trace the model is fitted on", f, a.traces[k]);
  }
  sim::RevivalModel m;
  if (!a.model.empty()) {
    m = sim::load_revival_model(a.model);
  } else {
    m = calib::fit_revival_model(traces, a.traces, shas);
    m.tool_version = LP_VERSION;
    m.git_commit = LP_GIT_COMMIT;
    m.origin = a.out.empty() ? "fitted" : a.out;
  }
  json out = {{"revival_model", sim::revival_model_json(m)}, {"held_out", json::array()}};
  if (!a.json_out) {
    fmt::print("revival model: {} on {} ({} layers), schedule {}, {} traces\n", m.policy,
               m.model.empty() ? "?" : m.model, m.n_layer, m.schedule, m.traces.size());
    fmt::print("  share(s) = floor + (start - floor) exp(-(s - 1) / tau)\n");
    for (const sim::RevivalStage& s : m.stages)
      fmt::print(
          "  layer {:>3} (depth {:.2f}, prunes {:.2f}): start {:.3f} floor {:.3f} tau {:6.2f} steps, "
          "rms error {:.3f} over {} points; keeps {} of the rows revived before; revived rows attend "
          "{:.2f} of the keys\n",
          s.layer, s.depth, s.prune_share, s.start, s.floor, s.tau_steps, s.rms_error, s.points,
          s.survival < 0 ? std::string("-") : fmt::format("{:.2f}", s.survival), s.key_share);
  }
  double worst = 0;
  for (size_t h = 0; h < held.size(); ++h) {
    const trace::Trace& t = held[h];
    const std::string& name = a.held_out[h];
    if (t.header.policy == "none" || t.header.schedule_layers.empty())
      usage_fail("{}: an unpruned run; --held-out takes pruned runs", name);
    if (t.steps.size() < 2) usage_fail("{}: no decoding steps to compare", name);
    ModelConfig c = config_from_json(t.header.model, name + ": header model");
    if (c.n_ctx_train <= 0) c.n_ctx_train = int(t.header.prompt_tokens + int64_t(t.steps.size()));
    std::vector<PruneStep> steps;
    for (const auto& [layer, share] : t.header.schedule_layers) steps.push_back({layer, share});
    const int64_t dec = int64_t(t.steps.size()) - 1;
    const trace::Trace modelled =
        trace::synthetic_trace(c, t.header.policy, steps, t.header.prompt_tokens, dec,
                               sim::revival_shares(m, c.n_layer, steps, a.map));
    const trace::Trace bound = trace::synthetic_trace(c, t.header.policy, steps, t.header.prompt_tokens, dec);
    const sim::Prediction pr = sim::replay(t, c, hw, prec);
    const sim::Prediction pm = sim::replay(modelled, c, hw, prec);
    const sim::Prediction pb = sim::replay(bound, c, hw, prec);
    const double rows_r = rows_per_step(t), rows_m = rows_per_step(modelled), rows_b = rows_per_step(bound);
    json r = {
        {"trace", name},
        {"prompt_tokens", t.header.prompt_tokens},
        {"decode_steps", dec},
        {"kv_bytes", {{"replayed", pr.memory.kv}, {"model", pm.memory.kv}, {"share_0", pb.memory.kv}}},
        {"aux_bytes", {{"replayed", pr.memory.aux}, {"model", pm.memory.aux}, {"share_0", pb.memory.aux}}},
        {"rows_per_step", {{"replayed", rows_r}, {"model", rows_m}, {"share_0", rows_b}}},
        {"decode_step_mean_ms",
         {{"replayed", pr.decode_step_mean_s() * 1e3},
          {"model", pm.decode_step_mean_s() * 1e3},
          {"share_0", pb.decode_step_mean_s() * 1e3}}}};
    double step_worst = 0;
    for (size_t s = 0; s < pr.decode_step_s.size(); ++s)
      step_worst = std::max(step_worst, std::abs(rel(pm.decode_step_s[s], pr.decode_step_s[s])));
    const double e_kv = rel(pm.memory.kv, pr.memory.kv), e_kv0 = rel(pb.memory.kv, pr.memory.kv);
    const double e_step = rel(pm.decode_step_mean_s(), pr.decode_step_mean_s());
    const double e_step0 = rel(pb.decode_step_mean_s(), pr.decode_step_mean_s());
    const double e_rows = rel(rows_m, rows_r), e_rows0 = rel(rows_b, rows_r);
    r["error"] = {{"kv", e_kv},
                  {"aux", rel(pm.memory.aux, pr.memory.aux)},
                  {"kv_share_0", e_kv0},
                  {"decode_step_mean", e_step},
                  {"decode_step_mean_share_0", e_step0},
                  {"rows_per_step", e_rows},
                  {"rows_per_step_share_0", e_rows0},
                  {"decode_step_worst", step_worst}};
    worst = std::max({worst, std::abs(e_kv), std::abs(e_step)});
    if (!a.json_out)
      fmt::print(
          "held out {} ({} prompt tokens, {} steps) on {}:\n"
          "  KV at the end   replayed {:8.2f} MiB  model {:8.2f} ({:+.1f}%)  share 0 {:8.2f} ({:+.1f}%)\n"
          "  Aux Cache       replayed {:8.2f} MiB  model {:8.2f} ({:+.1f}%)\n"
          "  decode step     replayed {:8.3f} ms   model {:8.3f} ({:+.1f}%, worst step {:.1f}%)  share 0 "
          "{:8.3f} "
          "({:+.1f}%)\n"
          "  rows per step   replayed {:8.1f}      model {:8.1f} ({:+.1f}%)  share 0 {:8.1f} ({:+.1f}%)\n",
          name, t.header.prompt_tokens, dec, hw.name, pr.memory.kv / 1048576.0, pm.memory.kv / 1048576.0,
          100 * e_kv, pb.memory.kv / 1048576.0, 100 * e_kv0, pr.memory.aux / 1048576.0,
          pm.memory.aux / 1048576.0, 100 * rel(pm.memory.aux, pr.memory.aux), pr.decode_step_mean_s() * 1e3,
          pm.decode_step_mean_s() * 1e3, 100 * e_step, 100 * step_worst, pb.decode_step_mean_s() * 1e3,
          100 * e_step0, rows_r, rows_m, 100 * e_rows, rows_b, 100 * e_rows0);
    out["held_out"].push_back(std::move(r));
  }
  if (!held.empty()) {
    out["worst_abs_error"] = worst;
    if (!a.json_out)
      fmt::print("worst KV / mean decode-step error over held-out traces: {:.1f}%\n", 100 * worst);
  }
  if (!a.out.empty()) {
    write_file_atomic(a.out, sim::revival_model_json(m).dump(2) + "\n", "revival model");
    if (!a.json_out) fmt::print("wrote {}\n", a.out);
  }
  if (a.json_out) std::puts(out.dump(2).c_str());
  return 0;
}

}  // namespace lp::cli
