#include "cli/run_output.h"

#include <span>

#include "engine/session.h"
#include "git_commit.h"  // generated: LP_GIT_COMMIT
#include "pruning/policy.h"
#include "traces/synthetic.h"

namespace lp::cli {
namespace {
using json = nlohmann::json;

// The engine's trace step as the trace keeps it: without `detail`, the kept positions, scores
// revived positions and experts' routes are left out.
trace::Step trace_step(const trace::Step& engine_step, bool detail) {
  trace::Step s = engine_step;
  if (!detail) {
    s.pruning.reset();
    s.revived_positions.reset();
    s.routes.reset();
  }
  return s;
}

json op_stat_json(const OpStat& st) {
  return {{"ms", st.seconds * 1e3},
          {"flop", st.flops},
          {"bytes", st.bytes},
          {"rows", st.calls > 0 ? st.rows / double(st.calls) : 0.0},
          {"calls", st.calls}};
}

// {op name: {ms, flop, bytes, calls}} for the ops of one row of the timers (-1: summed over all).
json op_row_json(const OpTimers& t, int layer) {
  json j = json::object();
  if (t.empty()) return j;
  for (int i = 0; i < kNumOps; ++i) {
    const Op op = Op(i);
    const OpStat st = layer < 0 ? t.total(op) : t.at(layer, op);
    if (st.calls > 0) j[std::string(op_name(op))] = op_stat_json(st);
  }
  return j;
}

// The run's per-op timings: per layer for the prefill, summed for decoding.
json ops_json(const GenerateResult& r) {
  const OpTimers& p = r.prefill_ops;
  json layers = json::array();
  for (int l = 0; l < p.n_layer; ++l) layers.push_back(op_row_json(p, l));
  json step_ms = json::array();
  for (const double s : r.decode_step_s) step_ms.push_back(s * 1e3);
  return {
      {"prefill",
       {{"total", op_row_json(p, -1)}, {"layers", layers}, {"outside_layers", op_row_json(p, p.n_layer)}}},
      {"decode",
       {{"steps", r.decode_steps},
        {"total", op_row_json(r.decode_ops, -1)},
        {"steady",
         {{"after_steps", kSteadyAfterSteps},
          {"steps", std::max<int64_t>(0, r.decode_steps - kSteadyAfterSteps)},
          {"total", op_row_json(r.decode_steady_ops, -1)}}},
        {"step_ms", step_ms}}}};
}

}  // namespace

trace::Trace run_trace(const ModelConfig& c, const GenerateOptions& opt, const GenerateResult& r,
                       const std::string& dtype, uint64_t seed, bool detail) {
  trace::Trace t;
  t.header.model = config_to_json(c);
  t.header.n_layer = c.n_layer;
  t.header.policy = policy_name(opt.policy);
  t.header.schedule = opt.policy == PolicyKind::None ? "none" : opt.schedule.to_string();
  for (const auto& st : r.prune_steps) t.header.schedule_layers.emplace_back(st.layer, st.share);
  t.header.prompt_tokens =
      int64_t(r.prompt_ids.size()) - r.prompt_tokens_dropped;  // the tokens the model saw
  t.header.prompt_tokens_dropped = r.prompt_tokens_dropped;
  t.header.dtype = dtype;
  t.header.tool_version = LP_VERSION;
  t.header.git_commit = LP_GIT_COMMIT;
  t.header.seed = seed;
  t.steps.push_back(trace_step(r.prefill_stats, detail));
  for (const auto& st : r.decode_stats) t.steps.push_back(trace_step(st, detail));
  return t;
}

json run_json(const Model& m, const GenerateOptions& opt, const GenerateResult& r, const std::string& dtype,
              int threads) {
  json j;
  j["text"] = r.text;
  j["prompt_tokens"] = r.prompt_ids.size();
  if (opt.policy == PolicyKind::RandomDrop) j["prompt_tokens_dropped"] = r.prompt_tokens_dropped;
  j["generated_tokens"] = r.generated_ids.size();
  j["generated_ids"] = r.generated_ids;
  j["ttft_ms"] = r.ttft_s * 1e3;
  j["prefill_ms"] = r.prefill_s * 1e3;
  j["warmup_ms"] = r.warmup_s * 1e3;  // 0: no warm-up (run --warmup)
  j["prefill_tokens_per_s"] = double(r.prompt_ids.size()) / r.prefill_s;
  j["prefill_gflops"] = r.prefill_ops.total_flops() / r.prefill_s / 1e9;
  j["decode_tokens_per_s"] = r.decode_steps > 0 ? double(r.decode_steps) / r.decode_s : 0.0;
  j["peak_rss_mib"] = peak_rss_mib();
  j["model"] = m.path();
  j["model_config"] = config_to_json(m.config());
  j["dtype"] = dtype;
  j["threads"] = threads;
  j["version"] = LP_VERSION;
  j["git_commit"] = LP_GIT_COMMIT;
  j["prune"] = policy_name(opt.policy);
  j["schedule"] = opt.policy == PolicyKind::None ? "none" : opt.schedule.to_string();
  json steps = json::array();
  for (const auto& st : r.prune_steps) steps.push_back({{"layer", st.layer}, {"share", st.share}});
  j["schedule_layers"] = steps;
  j["prompt_tokens_computed_fraction"] = r.prompt_tokens_computed_fraction;
  j["prompt_tokens_computed_fraction_after_generation"] = r.prompt_tokens_computed_fraction_after_generation;
  j["all_tokens_computed_fraction"] = r.all_tokens_computed_fraction;
  // The engine throws if any (token, layer) pair is computed twice, so reaching here proves it.
  j["each_token_layer_computed_at_most_once"] = true;
  j["revivals"] = r.revivals;
  j["prefill_tokens_computed_per_layer"] = r.prefill_stats.queries;
  j["kv_bytes_after_prefill"] = r.kv_bytes_used;
  j["kv_dtype"] = r.kv_element_bytes == 2 ? "f16" : "f32";
  j["aux_cache_bytes"] = r.aux_cache_bytes;
  j["ops"] = ops_json(r);
  return j;
}

}  // namespace lp::cli
