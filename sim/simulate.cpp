#include "sim/simulate.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "model/error.h"
#include "model/gguf.h"
#include "model/presets.h"
#include "pruning/method.h"
#include "pruning/schedule.h"
#include "sim/layer_cost.h"
#include "sim/revival.h"
#include "traces/synthetic.h"
#include "traces/trace.h"

namespace lp::sim {
namespace {
using json = nlohmann::ordered_json;

json cost_json(const hw::Profile& hw, Op op, const OpCost& o, const Precision& p) {
  return {{"time_ms", o.time_s * 1e3},
          {"flop", o.flops},
          {"bytes", o.bytes},
          {"intensity_flop_per_byte", o.intensity()},
          {"compute_ms", o.compute_s * 1e3},
          {"memory_ms", o.memory_s * 1e3},
          {"overhead_ms", o.overhead_s * 1e3},
          {"bound", o.memory_bound() ? "memory" : "compute"},
          {"utilisation", utilisation(hw, op, o, p)},
          {"calls", o.calls}};
}

json ops_json(const hw::Profile& hw, const OpCosts& ops, const Precision& p) {
  json j = json::object();
  for (int i = 0; i < kNumOps; ++i)
    if (ops[size_t(i)].calls > 0) j[std::string(op_name(Op(i)))] = cost_json(hw, Op(i), ops[size_t(i)], p);
  return j;
}

// The target's configuration (model_to_cost), or `fallback` (the trace's own model) when the
// request names none.
ModelConfig target_config(const SimulateRequest& r, const std::optional<ModelConfig>& fallback) {
  if (!r.config && r.model.empty() && r.model_config.empty() && fallback) return *fallback;
  std::string name;
  return request_target(r.model, r.model_config, r.config, &name);
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

// A trace file: the target from the request or the trace itself; a trace of another shape mapped
// onto it with `map`.
void trace_source(const SimulateRequest& r, StepSource& s) {
  s.reader.emplace(r.trace);
  s.src = s.reader->header();
  s.origin = r.trace;
  s.c = target_config(r, config_from_json(s.src.model, r.trace + ": header model"));
  const int64_t N = r.prompt_tokens > 0 ? r.prompt_tokens : s.src.prompt_tokens;
  if (s.c.n_layer != s.src.n_layer || N != s.src.prompt_tokens) {
    if (!r.map)
      usage_fail(
          "{}: the trace has {} layers and {} prompt tokens but the target has {} layers and {}; pass "
          "--map to map it (layers by relative depth, tokens by share)",
          r.trace, s.src.n_layer, s.src.prompt_tokens, s.c.n_layer, N);
    s.map_steps = true;
  }
  s.header = map_header(s.src, s.c.n_layer, N);
  if (s.reader->declared_steps() > 0) s.known_steps = s.reader->declared_steps() - 1;
}

// Synthetic steps of the request's policy on the target, revivals from the revival model.
void synthetic_source(const SimulateRequest& r, StepSource& s) {
  s.c = target_config(r, std::nullopt);
  const PolicyKind kind = parse_policy(r.prune);
  const Schedule sched = r.schedule.empty() ? default_schedule(kind) : schedule_from_arg(r.schedule);
  const std::vector<PruneStep> steps = resolve_method(kind, sched, s.c.n_layer, s.c.global_layers());
  const RevivalChoice rv = choose_revivals(load_revivals(r.revival_model, r.revival_share), r.revival_share,
                                           r.prune, s.c.n_layer, steps, r.map);
  s.revivals = rv.description;
  // M new tokens take M - 1 decoding steps, as in run: the prefill produces the first.
  s.known_steps = std::max<int64_t>(0, r.new_tokens - 1);
  s.gen.emplace(s.c, r.prune, steps, r.prompt_tokens, s.known_steps, rv.share, drop_share(sched).value_or(0));
  s.src = s.header = s.gen->header();
  s.header.schedule = r.prune == "none" ? "none" : sched.to_string();
  s.origin = "synthetic";
}

}  // namespace

json SimulateResult::to_json(const Precision& prec, bool per_layer) const {
  const Prediction &p = pruned, &b = unpruned;
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
            {"fits_in_memory", fits_in_memory()},
            {"prefill_ops", ops_json(hw, p.prefill_ops, prec)},
            {"decode_ops", ops_json(hw, p.decode_ops, prec)}};
  for (double x : p.decode_step_s) r["decode_step_ms"].push_back(x * 1e3);
  if (per_layer) {
    json layers = json::array();
    for (const OpCosts& l : p.prefill_layers) layers.push_back(ops_json(hw, l, prec));
    r["prefill_layers"] = layers;
  }
  return r;
}

json SimulateReport::to_json() const {
  json out = {
      {"model", model},
      {"n_layer", costed.n_layer},
      {"n_params", costed.n_params()},
      {"config", config_to_json(config)},
      {"trace", trace},
      {"policy", policy},
      {"schedule", schedule},
      {"prompt_tokens", prompt_tokens},
      {"decode_steps", decode_steps},
      {"revivals", revivals},
      {"precision", {{"weights", precision.weights}, {"compute", precision.compute}, {"kv", precision.kv}}},
      {"tp", tp},
      {"ep", costed.ep},
      {"dp", dp},
      {"pp", pp},
      {"pp_microbatches", pp_microbatches},
      {"results", json::array()}};
  if (prompt_tokens_dropped > 0) out["prompt_tokens_dropped"] = prompt_tokens_dropped;
  for (const SimulateResult& r : results) out["results"].push_back(r.to_json(precision, per_layer));
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

ModelConfig request_target(const std::string& model, const std::string& model_config,
                           const std::optional<ModelConfig>& config, std::string* name) {
  if (!config) return model_to_cost(model, model_config, name);
  if (!model.empty() || !model_config.empty())
    usage_fail("give one target: a model configuration, --model or --model-config");
  *name = config->name.empty() ? "custom" : config->name;
  return *config;
}

SimulateReport simulate(const SimulateRequest& r) {
  if (r.hws.empty()) usage_fail("--hw names no hardware profile");
  check_range("--prompt-tokens", r.prompt_tokens, int64_t(0), int64_t(1) << 24);
  check_range("--new-tokens", r.new_tokens, int64_t(0), int64_t(1) << 20);
  if (r.revival_share != -1) check_range("--revival-share", r.revival_share, 0.0, 1.0);
  if (r.revival_share != -1 && !r.revival_model.empty())
    usage_fail("--revival-share and --revival-model exclude each other");
  check_range("--tp", r.tp, 1, 4096);
  check_range("--pp", r.pp, 1, 1024);
  check_range("--pp-microbatches", r.pp_microbatches, 1, 4096);
  check_range("--step-times", r.step_times, int64_t(0), int64_t(1) << 20);
  check_positive("--pp-link-gbs", r.pp_link_gbs);
  if (r.pp_microbatches > 1 && r.pp < 2)
    usage_fail("--pp-microbatches {} needs --pp of 2 or more", r.pp_microbatches);
  if (r.trace.empty() && r.prompt_tokens <= 0)
    usage_fail(
        "give --trace FILE, or --prompt-tokens N (and --prune POLICY to prune; without it the run is "
        "unpruned)");
  if (!r.trace.empty() && r.new_tokens > 0)
    usage_fail("--new-tokens applies to synthetic traces, not to --trace");
  if (!r.trace.empty() && (r.revival_share != -1 || !r.revival_model.empty()))
    usage_fail("--revival-share and --revival-model apply to synthetic traces, not to --trace");
  if (!r.trace.empty() && r.prune != "none")
    usage_fail("--prune applies to synthetic traces, not to --trace");
  if (r.step_times < 0) usage_fail("--step-times must be 0 or more, got {}", r.step_times);
  validate(r.precision);
  StepSource s;
  if (!r.trace.empty())
    trace_source(r, s);
  else
    synthetic_source(r, s);
  const ModelConfig c = expert_parallel(s.c, r.ep, r.moe_imbalance, r.dp, r.tp);
  for (const hw::Profile& hw : r.hws) for_option("--tp", [&] { check_tp(c, hw, r.tp); });
  const Pipeline pipeline{r.pp, r.pp_link_gbs * 1e9, 5e-6, r.pp_microbatches};
  pipeline_starts(c.n_layer, r.pp);
  const PairedReplay replayed =
      replay_beside_unpruned([&](trace::Step& st) { return s.next(st); }, s.src, s.header, s.map_steps, c,
                             r.hws, r.precision, r.tp, size_t(r.step_times), s.known_steps, pipeline);

  SimulateReport out;
  out.model = c.name.empty() ? (r.model_config.empty() ? r.model : r.model_config) : c.name;
  out.config = s.c;
  out.costed = c;
  out.trace = s.origin;
  out.policy = s.header.policy;
  out.schedule = s.header.schedule;
  out.revivals = s.revivals;
  out.prompt_tokens = s.header.prompt_tokens + s.header.prompt_tokens_dropped;
  out.prompt_tokens_dropped = s.header.prompt_tokens_dropped;
  out.decode_steps = replayed.decode_steps;
  out.precision = r.precision;
  out.tp = r.tp;
  out.dp = r.dp;
  out.pp = r.pp;
  out.pp_microbatches = r.pp_microbatches;
  out.per_layer = r.per_layer;
  for (size_t i = 0; i < r.hws.size(); ++i)
    out.results.push_back({r.hws[i], replayed.per_hw[i].pruned, replayed.per_hw[i].unpruned});
  return out;
}

}  // namespace lp::sim
