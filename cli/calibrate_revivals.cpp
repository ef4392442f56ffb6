// `lazyprefill calibrate-revivals`: fit the revival model (sim/revival.h) to recorded LazyLLM
// traces, and show on held-out traces how close synthetic decoding with it comes to replaying
// the real run (KV, Aux Cache, rows computed and time per decoding step).
#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

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

using RC = calib::RevivalCheck;

json revival_check_json(const RC& k) {
  const auto three = [&](double RC::Figures::*f) {
    return json{{"replayed", k.replayed.*f}, {"model", k.model.*f}, {"share_0", k.share_0.*f}};
  };
  json r = {{"trace", k.trace},
            {"prompt_tokens", k.prompt_tokens},
            {"decode_steps", k.decode_steps},
            {"kv_bytes", three(&RC::Figures::kv_bytes)},
            {"aux_bytes", three(&RC::Figures::aux_bytes)},
            {"rows_per_step", three(&RC::Figures::rows_per_step)},
            {"decode_step_mean_ms",
             {{"replayed", k.replayed.decode_step_mean_s * 1e3},
              {"model", k.model.decode_step_mean_s * 1e3},
              {"share_0", k.share_0.decode_step_mean_s * 1e3}}}};
  r["error"] = {
      {"kv", RC::rel(k.model.kv_bytes, k.replayed.kv_bytes)},
      {"aux", RC::rel(k.model.aux_bytes, k.replayed.aux_bytes)},
      {"kv_share_0", RC::rel(k.share_0.kv_bytes, k.replayed.kv_bytes)},
      {"decode_step_mean", RC::rel(k.model.decode_step_mean_s, k.replayed.decode_step_mean_s)},
      {"decode_step_mean_share_0", RC::rel(k.share_0.decode_step_mean_s, k.replayed.decode_step_mean_s)},
      {"rows_per_step", RC::rel(k.model.rows_per_step, k.replayed.rows_per_step)},
      {"rows_per_step_share_0", RC::rel(k.share_0.rows_per_step, k.replayed.rows_per_step)},
      {"decode_step_worst", k.worst_step_error}};
  return r;
}

void print_revival_check(const RC& k, const std::string& hw) {
  const RC::Figures &r = k.replayed, &m = k.model, &b = k.share_0;
  fmt::print(
      "held out {} ({} prompt tokens, {} steps) on {}:\n"
      "  KV at the end   replayed {:8.2f} MiB  model {:8.2f} ({:+.1f}%)  share 0 {:8.2f} ({:+.1f}%)\n"
      "  Aux Cache       replayed {:8.2f} MiB  model {:8.2f} ({:+.1f}%)\n"
      "  decode step     replayed {:8.3f} ms   model {:8.3f} ({:+.1f}%, worst step {:.1f}%)  share 0 "
      "{:8.3f} "
      "({:+.1f}%)\n"
      "  rows per step   replayed {:8.1f}      model {:8.1f} ({:+.1f}%)  share 0 {:8.1f} ({:+.1f}%)\n",
      k.trace, k.prompt_tokens, k.decode_steps, hw, r.kv_bytes / 1048576.0, m.kv_bytes / 1048576.0,
      100 * RC::rel(m.kv_bytes, r.kv_bytes), b.kv_bytes / 1048576.0, 100 * RC::rel(b.kv_bytes, r.kv_bytes),
      r.aux_bytes / 1048576.0, m.aux_bytes / 1048576.0, 100 * RC::rel(m.aux_bytes, r.aux_bytes),
      r.decode_step_mean_s * 1e3, m.decode_step_mean_s * 1e3,
      100 * RC::rel(m.decode_step_mean_s, r.decode_step_mean_s), 100 * k.worst_step_error,
      b.decode_step_mean_s * 1e3, 100 * RC::rel(b.decode_step_mean_s, r.decode_step_mean_s), r.rows_per_step,
      m.rows_per_step, 100 * RC::rel(m.rows_per_step, r.rows_per_step), b.rows_per_step,
      100 * RC::rel(b.rows_per_step, r.rows_per_step));
}

}  // namespace

int cmd_calibrate_revivals(const CalibrateRevivalsArgs& a) {
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
    const calib::RevivalCheck k = calib::check_revival_model(m, held[h], a.held_out[h], hw, prec, a.map);
    out["held_out"].push_back(revival_check_json(k));
    worst = std::max({worst, std::abs(RC::rel(k.model.kv_bytes, k.replayed.kv_bytes)),
                      std::abs(RC::rel(k.model.decode_step_mean_s, k.replayed.decode_step_mean_s))});
    if (!a.json_out) print_revival_check(k, hw.name);
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
