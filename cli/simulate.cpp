// `lazyprefill simulate`: replay a trace (or a synthetic one made from a schedule) on hardware
// profiles and print TTFT, decode latency, speedup over the same work unpruned, and memory.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "hwmodels/profile.h"
#include "model/config.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/presets.h"
#include "pruning/schedule.h"
#include "sim/replay.h"
#include "sim/revival.h"
#include "traces/synthetic.h"
#include "traces/trace.h"

namespace lp::cli {
namespace {
using json = nlohmann::ordered_json;

// The model a trace was recorded on, from its header (enough to cost it).
ModelConfig config_from_trace(const trace::Header& h, const std::string& path) {
  return config_from_json(h.model, path + ": header model");
}

json cost_json(const hw::Profile& hw, Op op, const sim::OpCost& o, const sim::Precision& p) {
  return {{"time_ms", o.time_s * 1e3},
          {"flop", o.flops},
          {"bytes", o.bytes},
          {"intensity_flop_per_byte", o.intensity()},
          {"compute_ms", o.compute_s * 1e3},
          {"memory_ms", o.memory_s * 1e3},
          {"overhead_ms", o.overhead_s * 1e3},
          {"bound", o.memory_bound() ? "memory" : "compute"},
          {"utilisation", sim::utilisation(hw, op, o, p)},
          {"calls", o.calls}};
}

json ops_json(const hw::Profile& hw, const sim::OpCosts& ops, const sim::Precision& p) {
  json j = json::object();
  for (int i = 0; i < kNumOps; ++i)
    if (ops[size_t(i)].calls > 0) j[std::string(op_name(Op(i)))] = cost_json(hw, Op(i), ops[size_t(i)], p);
  return j;
}

}  // namespace

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

ModelConfig model_to_cost(const std::string& model, const std::string& model_config, std::string* name) {
  if (!model.empty()) {
    *name = model;
    return costing_config_from_gguf(GgufFile::open(model));
  }
  if (!model_config.empty()) {
    *name = model_config;
    return preset_config(model_config);
  }
  usage_fail("give --model PATH or --model-config NAME");
}

std::vector<hw::Profile> load_profiles(const std::string& list, const std::string& engine) {
  std::vector<hw::Profile> hws;
  for (const std::string& name : split_list(list)) {
    hws.push_back(hw::load_profile(name));
    if (!engine.empty()) hws.back().engine = hw::engine_preset(engine);
  }
  if (hws.empty()) usage_fail("--hw names no hardware profile");
  return hws;
}

std::optional<sim::RevivalModel> load_revivals(const std::string& model, double share) {
  if (share >= 0) return std::nullopt;
  return sim::load_revival_model(model);
}

RevivalChoice choose_revivals(const std::optional<sim::RevivalModel>& model, double share,
                              const std::string& policy, int n_layer, const std::vector<PruneStep>& steps,
                              bool map) {
  if (!policy_revives(parse_policy(policy)))
    return {{}, fmt::format("none (the {} policy revives nothing)", policy)};
  if (!model) {
    if (share == 0) return {sim::constant_revival_share(0), "none: --revival-share 0, the optimistic bound"};
    return {sim::constant_revival_share(share),
            fmt::format("a constant share of {} (--revival-share)", share)};
  }
  const sim::RevivalModel& m = *model;
  return {sim::revival_shares(m, n_layer, steps, map),
          fmt::format("revival model {}, fitted on {} {} traces of {} ({} layers, schedule {}){}", m.origin,
                      m.traces.size(), m.policy, m.model.empty() ? "?" : m.model, m.n_layer, m.schedule,
                      m.policy == policy ? "" : fmt::format("; applied to {} as a guess", policy))};
}

namespace {

// One profile's prediction beside the unpruned one, as --json reports it.
json simulate_result_json(const SimulateArgs& a, const hw::Profile& hw, const sim::Prediction& p,
                          const sim::Prediction& b, const sim::Precision& prec) {
  const double fits = p.memory.total() <= hw.memory_capacity;
  json r = {{"hw", hw.name},
            {"hw_description", hw.description},
            {"engine", hw.engine.name},
            {"efficiency_default", hw.efficiency_default},
            {"ttft_ms", p.ttft_s * 1e3},
            {"baseline_ttft_ms", b.ttft_s * 1e3},
            {"ttft_speedup", b.ttft_s / p.ttft_s},
            {"decode_step_ms", json::array()},
            {"decode_step_mean_ms", p.decode_step_mean_s() * 1e3},
            {"baseline_decode_step_mean_ms", b.decode_step_mean_s() * 1e3},
            {"total_ms", p.total_s * 1e3},
            {"baseline_total_ms", b.total_s * 1e3},
            {"total_speedup", b.total_s / p.total_s},
            {"prefill_flop", p.prefill_flops()},
            {"baseline_prefill_flop", b.prefill_flops()},
            {"prefill_bound_op", std::string(op_name(p.prefill_bound_op()))},
            {"prefill_comm_ms", p.prefill_comm.time_s * 1e3},
            {"decode_comm_ms", p.decode_comm.time_s * 1e3},
            {"pp", p.pp},
            {"pp_microbatches", p.pp_microbatches},
            {"prefill_pp_ms", p.prefill_pp.time_s * 1e3},
            {"prefill_busy_ms", p.prefill_busy_s * 1e3},
            {"decode_pp_ms", p.decode_pp.time_s * 1e3},
            {"memory_bytes", p.memory.to_json()},
            {"baseline_memory_bytes", {{"kv", b.memory.kv}, {"total", b.memory.total()}}},
            {"fits_in_memory", bool(fits)},
            {"prefill_ops", ops_json(hw, p.prefill_ops, prec)},
            {"decode_ops", ops_json(hw, p.decode_ops, prec)}};
  for (double x : p.decode_step_s) r["decode_step_ms"].push_back(x * 1e3);
  if (a.per_layer) {
    json layers = json::array();
    for (const sim::OpCosts& l : p.prefill_layers) layers.push_back(ops_json(hw, l, prec));
    r["prefill_layers"] = layers;
  }
  return r;
}

// The same as text: TTFT and decoding beside the unpruned run, memory and the bound op.
void print_simulate_result(const SimulateArgs& a, const hw::Profile& hw, const sim::Prediction& p,
                           const sim::Prediction& b) {
  const bool fits = p.memory.total() <= hw.memory_capacity;
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

// Where the simulated steps come from: a trace file read one step at a time, or synthetic steps
// made as they are costed (memory: O(layers), whatever the decoding steps).
struct StepSource {
  std::optional<trace::TraceReader> reader;
  std::optional<trace::SyntheticSteps> gen;
  trace::Header src;         // the steps' own header
  trace::Header header;      // as costed (mapped onto the target)
  int64_t known_steps = -1;  // decoding steps, when known before reading them
  bool map_steps = false;
  ModelConfig c;
  std::string origin, revivals = "recorded in the trace";
  bool next(trace::Step& st) { return reader ? reader->next(st) : gen->next(st); }
};

// --trace FILE: the target from --model, --model-config or the trace itself; a trace of another
// shape mapped onto it with --map.
void trace_source(const SimulateArgs& a, StepSource& s) {
  s.reader.emplace(a.trace);
  s.src = s.reader->header();
  s.origin = a.trace;
  if (!a.model.empty())
    s.c = costing_config_from_gguf(GgufFile::open(a.model));
  else if (!a.model_config.empty())
    s.c = preset_config(a.model_config);
  else
    s.c = config_from_trace(s.src, a.trace);
  const int64_t N = a.prompt_tokens > 0 ? a.prompt_tokens : s.src.prompt_tokens;
  if (s.c.n_layer != s.src.n_layer || N != s.src.prompt_tokens) {
    if (!a.map)
      usage_fail(
          "{}: the trace has {} layers and {} prompt tokens but the target has {} layers and {}; pass "
          "--map to "
          "map it (layers by relative depth, tokens by share)",
          a.trace, s.src.n_layer, s.src.prompt_tokens, s.c.n_layer, N);
    s.map_steps = true;
  }
  s.header = sim::map_header(s.src, s.c.n_layer, N);
  if (s.reader->declared_steps() > 0) s.known_steps = s.reader->declared_steps() - 1;
}

// --prompt-tokens N: the policy's synthetic steps on the target, revivals from the revival model.
void synthetic_source(const SimulateArgs& a, const std::string& policy, StepSource& s) {
  if (!a.model.empty())
    s.c = costing_config_from_gguf(GgufFile::open(a.model));
  else if (!a.model_config.empty())
    s.c = preset_config(a.model_config);
  else
    usage_fail("give --model PATH or --model-config NAME");
  const PolicyKind kind = parse_policy(policy);
  const Schedule sched = a.schedule.empty() ? default_schedule(kind) : schedule_from_arg(a.schedule);
  const std::vector<PruneStep> steps = resolve_method(kind, sched, s.c.n_layer, s.c.global_layers());
  const RevivalChoice rv = choose_revivals(load_revivals(a.revival_model, a.revival_share), a.revival_share,
                                           policy, s.c.n_layer, steps, a.map);
  s.revivals = rv.description;
  // M new tokens take M - 1 decoding steps, as in run: the prefill produces the first.
  s.known_steps = std::max<int64_t>(0, a.new_tokens - 1);
  s.gen.emplace(s.c, policy, steps, a.prompt_tokens, s.known_steps, rv.share, drop_share(sched).value_or(0));
  s.src = s.header = s.gen->header();
  s.header.schedule = policy == "none" ? "none" : sched.to_string();
  s.origin = "synthetic";
}

}  // namespace

int cmd_simulate(const SimulateArgs& a) {
  // Without --trace the work is synthetic: --prune POLICY, or the unpruned run when it is left out.
  if ((a.ep > 1 || a.dp > 1 || a.moe_imbalance != 0 || a.pp > 1) && (a.runahead > 0 || !a.kv_predict.empty()))
    usage_fail(
        "--ep, --dp, --moe-imbalance and --pp apply to a replayed run, not to --runahead or --kv-predict");
  if (!(a.pp_link_gbs > 0)) usage_fail("--pp-link-gbs must be positive, got {}", a.pp_link_gbs);
  if (a.pp_microbatches > 1 && a.pp < 2)
    usage_fail("--pp-microbatches {} needs --pp of 2 or more", a.pp_microbatches);
  if (a.runahead > 0) return cmd_simulate_runahead(a);
  if (!a.kv_predict.empty()) return cmd_simulate_kv_predict(a);
  const std::string policy = a.prune.empty() ? "none" : a.prune;
  if (a.trace.empty() && a.prompt_tokens <= 0)
    usage_fail(
        "give --trace FILE, or --prompt-tokens N (and --prune POLICY to prune; without it the run is "
        "unpruned)");
  if (!a.trace.empty() && a.new_tokens > 0)
    usage_fail("--new-tokens applies to synthetic traces, not to --trace");
  sim::Precision prec = a.precision;
  sim::validate(prec);
  const std::vector<hw::Profile> hws = load_profiles(a.hw, a.engine);
  StepSource s;
  if (!a.trace.empty())
    trace_source(a, s);
  else
    synthetic_source(a, policy, s);
  const ModelConfig c = sim::expert_parallel(s.c, a.ep, a.moe_imbalance, a.dp, a.tp);
  const trace::Header& header = s.header;
  for (const hw::Profile& hw : hws)
    for_option("--tp", [&] { sim::check_tp(c, hw, a.tp); });  // before any output
  const sim::Pipeline pipeline{a.pp, a.pp_link_gbs * 1e9, 5e-6, a.pp_microbatches};
  sim::pipeline_starts(c.n_layer, a.pp);
  const sim::PairedReplay replayed = sim::replay_beside_unpruned(
      [&](trace::Step& st) { return s.next(st); }, s.src, header, s.map_steps, c, hws, prec, a.tp,
      a.json_out ? size_t(a.step_times) : 0, s.known_steps, pipeline);
  const int64_t decode_steps = replayed.decode_steps;

  json out = {{"model", c.name.empty() ? (a.model_config.empty() ? a.model : a.model_config) : c.name},
              {"n_layer", c.n_layer},
              {"n_params", c.n_params()},
              {"config", config_to_json(s.c)},
              {"trace", s.origin},
              {"policy", header.policy},
              {"schedule", header.schedule},
              {"prompt_tokens", header.prompt_tokens + header.prompt_tokens_dropped},
              {"decode_steps", decode_steps},
              {"revivals", s.revivals},
              {"precision", {{"weights", prec.weights}, {"compute", prec.compute}, {"kv", prec.kv}}},
              {"tp", a.tp},
              {"ep", c.ep},
              {"dp", a.dp},
              {"pp", a.pp},
              {"pp_microbatches", a.pp_microbatches},
              {"results", json::array()}};
  if (header.prompt_tokens_dropped > 0) out["prompt_tokens_dropped"] = header.prompt_tokens_dropped;
  if (!a.json_out)
    fmt::print(
        "{} ({} layers, {:.2f} B params), {} {}, {} prompt tokens{}, {} decoding steps, weights {} compute "
        "{} "
        "kv {}{}\n",
        out["model"].get<std::string>(), c.n_layer, c.n_params() / 1e9, header.policy, header.schedule,
        header.prompt_tokens + header.prompt_tokens_dropped,
        header.prompt_tokens_dropped > 0
            ? fmt::format(" ({} dropped before the model)", header.prompt_tokens_dropped)
            : "",
        decode_steps, prec.weights, prec.compute, prec.kv,
        a.tp > 1 || c.dp > 1
            ? fmt::format("{}, tensor parallel {}{}",
                          c.dp > 1 ? fmt::format(", {} data-parallel attention groups", c.dp) : "", a.tp,
                          c.ep > 1 ? fmt::format(", experts over {}", c.ep) : "")
            : "");
  if (!a.json_out && decode_steps > 0) fmt::print("revivals: {}\n", s.revivals);
  for (size_t i = 0; i < hws.size(); ++i) {
    const sim::PairedPrediction& pp = replayed.per_hw[i];
    out["results"].push_back(simulate_result_json(a, hws[i], pp.pruned, pp.unpruned, prec));
    if (!a.json_out) print_simulate_result(a, hws[i], pp.pruned, pp.unpruned);
  }
  if (a.json_out) std::puts(out.dump(2).c_str());
  return 0;
}

}  // namespace lp::cli
