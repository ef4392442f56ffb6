// `lazyprefill simulate`: replay a trace (or a synthetic one made from a schedule) on hardware
// profiles and print TTFT, decode latency, speedup over the same work unpruned, and memory.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "hwmodels/profile.h"
#include "model/config.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/presets.h"
#include "sim/replay.h"
#include "traces/schedule.h"
#include "traces/synthetic.h"
#include "traces/trace.h"

namespace lp::cli {
namespace {
using json = nlohmann::ordered_json;

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

// The model a trace was recorded on, from its header (enough to cost it).
ModelConfig config_from_trace(const trace::Trace& t, const std::string& path) {
  const auto& m = t.header.model;
  try {
    ModelConfig c;
    c.arch = m.at("arch").get<std::string>();
    c.name = m.value("name", std::string());
    c.n_layer = m.at("n_layer").get<int>();
    c.n_embd = m.at("n_embd").get<int>();
    c.n_head = m.at("n_head").get<int>();
    c.n_head_kv = m.at("n_head_kv").get<int>();
    c.head_dim = m.at("head_dim").get<int>();
    c.n_ff = m.at("n_ff").get<int>();
    c.n_vocab = m.at("n_vocab").get<int>();
    c.n_ctx_train = m.value("n_ctx_train", std::max<int>(1, int(t.header.prompt_tokens + t.steps.size())));
    c.tied_embeddings = m.value("tied_embeddings", false);
    c.rope_dim = c.head_dim;
    validate_config(c, path + ": header model");
    return c;
  } catch (const nlohmann::json::exception& e) {
    fail("{}: header model: {}", path, e.what());
  }
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

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}
}  // namespace

CLI::App* add_simulate(CLI::App& app, SimulateArgs& a) {
  auto* s = app.add_subcommand(
      "simulate",
      "Predict TTFT, decode latency, speedup and memory of a pruning run on hardware profiles.\n"
      "  lazyprefill simulate --trace run.jsonl --model-config llama-3.1-8b --map --hw h100-sxm,l4\n"
      "  lazyprefill simulate --prune lazyllm --prompt-tokens 8192 --new-tokens 64 "
      "--model-config llama-2-7b --hw a100-80gb --json");
  auto* trace = s->add_option("--trace", a.trace, "Replay this trace (written by run --trace)");
  auto* prune = s->add_option("--prune", a.prune, "Without a trace: the policy of a synthetic trace")
                    ->check(CLI::IsMember({"none", "lazyllm", "static", "random"}));
  trace->excludes(prune);
  s->add_option("--schedule", a.schedule, "Pruning schedule for --prune (default 0.3:0.3,0.6:0.3,0.9:0.3)")
      ->needs(prune);
  s->add_option("--prompt-tokens", a.prompt_tokens,
                "Prompt length (synthetic traces; with --trace and --map, rescales the trace)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  s->add_option("--new-tokens", a.new_tokens, "Decoding steps of a synthetic trace (default 0)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 20))
      ->needs(prune);
  s->add_option("--revival-share", a.revival_share,
                "Synthetic decoding: share of the active tokens revived after each pruning layer (default 0)")
      ->check(CLI::Range(0.0, 1.0))
      ->needs(prune);
  auto* model = s->add_option("--model", a.model, "GGUF file whose configuration to cost");
  auto* preset = s->add_option("--model-config", a.model_config, "A preset model configuration (see --help-models)");
  model->excludes(preset);
  s->add_option("--hw", a.hw, "Hardware profiles, comma-separated names or .json files")->required();
  s->add_option("--weights", a.weights, "Weight dtype: bf16, f16, f32, int8, q4 (default bf16)");
  s->add_option("--compute", a.compute, "GEMM/attention compute dtype: bf16, f16, f32, tf32, int8 (default bf16)");
  s->add_option("--kv", a.kv, "KV cache dtype: bf16, f16, f32, int8 (default bf16)");
  s->add_flag("--map", a.map,
              "Allow a trace recorded on another model or prompt length: layers map by relative depth, "
              "token counts by share of the prompt");
  s->add_flag("--per-layer", a.per_layer, "With --json: also the prefill's per-op costs per layer");
  s->add_flag("--json", a.json_out, "Print one JSON object");
  return s;
}

int cmd_simulate(const SimulateArgs& a, const CLI::App& sub) {
  (void)sub;
  if (a.trace.empty() && a.prune.empty()) fail("give --trace FILE, or --prune POLICY with --prompt-tokens N");
  if (!a.trace.empty() && a.new_tokens > 0) fail("--new-tokens applies to synthetic traces, not to --trace");
  sim::Precision prec{a.weights, a.compute, a.kv};
  sim::validate(prec);
  std::vector<hw::Profile> hws;
  for (const std::string& name : split_list(a.hw)) hws.push_back(hw::load_profile(name));
  if (hws.empty()) fail("--hw names no hardware profile");

  trace::Trace t;
  ModelConfig c;
  std::string origin;
  if (!a.trace.empty()) {
    t = trace::read_trace(a.trace);
    origin = a.trace;
    if (!a.model.empty())
      c = config_from_gguf(GgufFile::open(a.model));
    else if (!a.model_config.empty())
      c = preset_config(a.model_config);
    else
      c = config_from_trace(t, a.trace);
    const int64_t N = a.prompt_tokens > 0 ? a.prompt_tokens : t.header.prompt_tokens;
    if (c.n_layer != t.header.n_layer || N != t.header.prompt_tokens) {
      if (!a.map)
        fail("{}: the trace has {} layers and {} prompt tokens but the target has {} layers and {}; pass --map to "
             "map it (layers by relative depth, tokens by share)",
             a.trace, t.header.n_layer, t.header.prompt_tokens, c.n_layer, N);
      t = sim::map_trace(t, c.n_layer, N);
    }
  } else {
    if (a.prompt_tokens <= 0) fail("--prune needs --prompt-tokens N");
    if (!a.model.empty())
      c = config_from_gguf(GgufFile::open(a.model));
    else if (!a.model_config.empty())
      c = preset_config(a.model_config);
    else
      fail("give --model PATH or --model-config NAME");
    const Schedule sched = a.schedule.empty() ? default_schedule() : schedule_from_arg(a.schedule);
    t = trace::synthetic_trace(c, a.prune, resolve_schedule(sched, c.n_layer), a.prompt_tokens, a.new_tokens,
                               a.revival_share);
    t.header.schedule = a.prune == "none" ? "none" : sched.to_string();
    origin = "synthetic";
  }
  if (t.header.prompt_tokens + int64_t(t.steps.size()) - 1 > c.n_ctx_train && c.n_ctx_train > 0)
    fail("{} prompt tokens + {} decoding steps exceed the model's context of {} tokens", t.header.prompt_tokens,
         t.steps.size() - 1, c.n_ctx_train);
  // The same work without pruning: every token at every layer, same prompt and steps.
  const trace::Trace base = trace::synthetic_trace(c, "none", {}, t.header.prompt_tokens, int64_t(t.steps.size()) - 1);

  json out = {{"model", c.name.empty() ? (a.model_config.empty() ? a.model : a.model_config) : c.name},
              {"n_layer", c.n_layer},
              {"n_params", c.n_params()},
              {"trace", origin},
              {"policy", t.header.policy},
              {"schedule", t.header.schedule},
              {"prompt_tokens", t.header.prompt_tokens},
              {"decode_steps", int64_t(t.steps.size()) - 1},
              {"precision", {{"weights", prec.weights}, {"compute", prec.compute}, {"kv", prec.kv}}},
              {"results", json::array()}};
  if (!a.json_out)
    fmt::print("{} ({} layers, {:.2f} B params), {} {}, {} prompt tokens, {} decoding steps, weights {} compute {} kv {}\n",
               out["model"].get<std::string>(), c.n_layer, c.n_params() / 1e9, t.header.policy, t.header.schedule,
               t.header.prompt_tokens, t.steps.size() - 1, prec.weights, prec.compute, prec.kv);
  for (const hw::Profile& hw : hws) {
    const sim::Prediction p = sim::replay(t, c, hw, prec);
    const sim::Prediction b = sim::replay(base, c, hw, prec);
    const double fits = p.memory.total() <= hw.memory_capacity;
    json r = {{"hw", hw.name},
              {"hw_description", hw.description},
              {"efficiency_default", hw.efficiency_default},
              {"ttft_ms", p.ttft_s * 1e3},
              {"baseline_ttft_ms", b.ttft_s * 1e3},
              {"ttft_speedup", b.ttft_s / p.ttft_s},
              {"decode_step_ms", json::array()},
              {"decode_step_mean_ms", mean(p.decode_step_s) * 1e3},
              {"baseline_decode_step_mean_ms", mean(b.decode_step_s) * 1e3},
              {"total_ms", p.total_s * 1e3},
              {"baseline_total_ms", b.total_s * 1e3},
              {"total_speedup", b.total_s / p.total_s},
              {"prefill_flop", p.prefill_flops()},
              {"baseline_prefill_flop", b.prefill_flops()},
              {"prefill_bound_op", std::string(op_name(p.prefill_bound_op()))},
              {"memory_bytes",
               {{"weights", p.memory.weights},
                {"kv", p.memory.kv},
                {"aux_cache", p.memory.aux},
                {"activations", p.memory.activations},
                {"total", p.memory.total()}}},
              {"baseline_memory_bytes", {{"kv", b.memory.kv}, {"total", b.memory.total()}}},
              {"fits_in_memory", bool(fits)},
              {"prefill_ops", ops_json(hw, p.prefill_ops, prec)},
              {"decode_ops", ops_json(hw, p.decode_ops, prec)}};
    for (double s : p.decode_step_s) r["decode_step_ms"].push_back(s * 1e3);
    if (a.per_layer) {
      json layers = json::array();
      for (const sim::OpCosts& l : p.prefill_layers) layers.push_back(ops_json(hw, l, prec));
      r["prefill_layers"] = layers;
    }
    if (!a.json_out) {
      fmt::print("  {:<12} TTFT {:>10.2f} ms (unpruned {:>10.2f}, {:.2f}x)", hw.name, p.ttft_s * 1e3, b.ttft_s * 1e3,
                 b.ttft_s / p.ttft_s);
      if (!p.decode_step_s.empty())
        fmt::print("  decode step {:.2f} ms (unpruned {:.2f})  total {:.1f} ms ({:.2f}x)", mean(p.decode_step_s) * 1e3,
                   mean(b.decode_step_s) * 1e3, p.total_s * 1e3, b.total_s / p.total_s);
      fmt::print("\n  {:<12} memory {:.2f} GiB = weights {:.2f} + KV {:.3f} + Aux {:.3f} + activations {:.3f}{}; "
                 "bound by {}\n",
                 "", p.memory.total() / 1073741824.0, p.memory.weights / 1073741824.0, p.memory.kv / 1073741824.0,
                 p.memory.aux / 1073741824.0, p.memory.activations / 1073741824.0,
                 fits ? "" : fmt::format(" (does not fit {:.0f} GiB)", hw.memory_capacity / 1073741824.0),
                 op_name(p.prefill_bound_op()));
    }
    out["results"].push_back(std::move(r));
  }
  if (a.json_out) std::puts(out.dump(2).c_str());
  return 0;
}

}  // namespace lp::cli
