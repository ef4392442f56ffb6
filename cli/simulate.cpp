// `lazyprefill simulate`: replay a trace (or a synthetic one made from a schedule) on hardware
// profiles and print TTFT, decode latency, speedup over the same work unpruned, and memory.
#include "sim/simulate.h"

#include <fmt/format.h>

#include "cli/commands.h"
#include "hwmodels/profile.h"
#include "model/config.h"
#include "model/error.h"

namespace lp::cli {
std::vector<hw::Profile> load_profiles(const std::string& list, const std::string& engine) {
  std::vector<hw::Profile> hws;
  for (const std::string& name : split_list(list)) {
    hws.push_back(hw::load_profile(name));
    if (!engine.empty()) hws.back().engine = hw::engine_preset(engine);
  }
  if (hws.empty()) usage_fail("--hw names no hardware profile");
  return hws;
}

namespace {

// One profile's prediction as text: TTFT and decoding beside the unpruned run, memory and the bound op.
void print_simulate_result(const SimulateArgs& a, const sim::SimulateResult& r) {
  const hw::Profile& hw = r.hw;
  const sim::Prediction &p = r.pruned, &b = r.unpruned;
  const bool fits = r.fits_in_memory();
  fmt::print("  {:<12} TTFT {:>10.2f} ms (unpruned {:>10.2f}, {:.2f}x)", hw.name, p.ttft_s * 1e3,
             b.ttft_s * 1e3, b.ttft_s / p.ttft_s);
  if (p.decode_steps > 0)
    fmt::print("  decode step {:.2f} ms (unpruned {:.2f})  total {:.1f} ms ({:.2f}x)",
               p.decode_step_mean_s() * 1e3, b.decode_step_mean_s() * 1e3, p.total_s * 1e3,
               b.total_s / p.total_s);
  if (a.dp > 1)
    fmt::print(
        "\n  {:<12} {} attention groups of {} GPUs, each as loaded as this one: collectives and "
        "all-to-alls {:.2f} ms of the TTFT; memory per GPU",
        "", a.dp, a.tp, p.prefill_comm.time_s * 1e3);
  else if (a.tp > 1)
    fmt::print("\n  {:<12} tensor parallel over {} GPUs: all-reduces {:.2f} ms of the TTFT; memory per GPU",
               "", a.tp, p.prefill_comm.time_s * 1e3);
  if (a.pp > 1 && p.pp_microbatches > 1)
    fmt::print(
        "\n  {:<12} pipeline of {} stages, the prompt in {} chunks: the stages busy {:.2f} ms (hand-offs "
        "{:.2f}) overlapped into the TTFT; memory of the fullest stage's GPU",
        "", a.pp, p.pp_microbatches, p.prefill_busy_s * 1e3, p.prefill_pp.time_s * 1e3);
  else if (a.pp > 1)
    fmt::print(
        "\n  {:<12} pipeline of {} stages: hand-offs {:.2f} ms of the TTFT; memory of the fullest stage's "
        "GPU",
        "", a.pp, p.prefill_pp.time_s * 1e3);
  fmt::print(
      "\n  {:<12} memory {:.2f} GiB = weights {:.2f} + KV {:.3f} + Aux {:.3f} + activations {:.3f}{}; "
      "bound by {}\n",
      "", p.memory.total() / 1073741824.0, p.memory.weights / 1073741824.0, p.memory.kv / 1073741824.0,
      p.memory.aux / 1073741824.0, p.memory.activations / 1073741824.0,
      fits ? "" : fmt::format(" (does not fit {:.0f} GiB)", hw.memory_capacity / 1073741824.0),
      op_name(p.prefill_bound_op()));
}

}  // namespace

int cmd_simulate(const SimulateArgs& a) {
  // Without --trace the work is synthetic: --prune POLICY, or the unpruned run when it is left out.
  if ((a.ep > 1 || a.dp > 1 || a.moe_imbalance != 0 || a.pp > 1) && (a.runahead > 0 || !a.kv_predict.empty()))
    usage_fail(
        "--ep, --dp, --moe-imbalance and --pp apply to a replayed run, not to --runahead or --kv-predict");
  if (a.pp_microbatches > 1 && (a.runahead > 0 || !a.kv_predict.empty()))
    usage_fail("--pp-microbatches applies to a replayed run, not to --runahead or --kv-predict");
  if (a.runahead > 0 || !a.kv_predict.empty()) {  // the ranges sim::simulate checks for a replayed run
    check_range("--prompt-tokens", a.prompt_tokens, int64_t(0), int64_t(1) << 24);
    check_range("--tp", a.tp, 1, 4096);
  }
  if (a.runahead > 0) return cmd_simulate_runahead(a);
  if (!a.kv_predict.empty()) return cmd_simulate_kv_predict(a);
  sim::SimulateRequest r;
  r.trace = a.trace;
  r.model = a.model;
  r.model_config = a.model_config;
  r.prune = a.prune.empty() ? "none" : a.prune;
  r.schedule = a.schedule;
  r.prompt_tokens = a.prompt_tokens;
  r.new_tokens = a.new_tokens;
  r.revival_model = a.revival_model;
  r.revival_share = a.revival_share;
  r.map = a.map;
  r.precision = a.precision;
  r.tp = a.tp, r.ep = a.ep, r.dp = a.dp, r.pp = a.pp, r.pp_microbatches = a.pp_microbatches;
  r.moe_imbalance = a.moe_imbalance;
  r.pp_link_gbs = a.pp_link_gbs;
  r.step_times = a.json_out ? a.step_times : 0;
  r.per_layer = a.per_layer;
  r.hws = load_profiles(a.hw, a.engine);
  const sim::SimulateReport rep = sim::simulate(r);
  if (a.json_out) {
    std::puts(rep.to_json().dump(2).c_str());
    return 0;
  }
  const ModelConfig& c = rep.costed;
  fmt::print(
      "{} ({} layers, {:.2f} B params), {} {}, {} prompt tokens{}, {} decoding steps, weights {} compute {} "
      "kv "
      "{}{}\n",
      rep.model, c.n_layer, c.n_params() / 1e9, rep.policy, rep.schedule, rep.prompt_tokens,
      rep.prompt_tokens_dropped > 0 ? fmt::format(" ({} dropped before the model)", rep.prompt_tokens_dropped)
                                    : "",
      rep.decode_steps, rep.precision.weights, rep.precision.compute, rep.precision.kv,
      a.tp > 1 || c.dp > 1
          ? fmt::format("{}, tensor parallel {}{}",
                        c.dp > 1 ? fmt::format(", {} data-parallel attention groups", c.dp) : "", a.tp,
                        c.ep > 1 ? fmt::format(", experts over {}", c.ep) : "")
          : "");
  if (rep.decode_steps > 0) fmt::print("revivals: {}\n", rep.revivals);
  for (const sim::SimulateResult& res : rep.results) print_simulate_result(a, res);
  return 0;
}

}  // namespace lp::cli
