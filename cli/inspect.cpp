// `lazyprefill inspect`: a GGUF model's architecture, tensors and tokenizer, or the summary of a
// trace (streamed: memory is one step), as text (text from the file escaped) or JSON.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "model/config.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "model/paths.h"
#include "model/quant.h"
#include "model/vocab.h"
#include "reports/plot.h"
#include "traces/trace.h"

namespace lp::cli {
namespace {

using json = nlohmann::ordered_json;

// The LazyLLM paper's Figure 7: as decoding proceeds, the share of the prompt's tokens that have
// K/V (were computed) at each layer, averaged over four groups of layers. A decoding step's keys
// at a layer are the prompt tokens computed there so far plus every generated token (each computed
// at every layer as it was made), so the prompt's share is (keys - generated) / prompt tokens.
struct KvGrowth {
  std::vector<std::pair<int, int>> groups;  // [first, last] layers
  std::vector<double> steps;                // decoding step numbers, 0 = after the prefill
  std::vector<std::vector<double>> share;   // [group][step]
};

KvGrowth kv_growth_start(int L) {
  KvGrowth g;
  const int G = std::min(4, L);
  for (int i = 0; i < G; ++i) g.groups.push_back({i * L / G, (i + 1) * L / G - 1});
  g.share.resize(g.groups.size());
  return g;
}

void kv_growth_add(KvGrowth& g, const lp::trace::Step& st, int64_t prompt_tokens, int64_t generated) {
  g.steps.push_back(double(g.steps.size()));
  for (size_t i = 0; i < g.groups.size(); ++i) {
    double sum = 0;
    for (int l = g.groups[i].first; l <= g.groups[i].second; ++l)
      sum += double(st.keys[size_t(l)] - generated) / double(prompt_tokens);
    g.share[i].push_back(sum / double(g.groups[i].second - g.groups[i].first + 1));
  }
}

int inspect_trace(const std::string& path, bool json_out, const std::string& kv_growth_svg) {
  // Streamed: memory is one step, whatever the trace's length (and with --kv-growth, four numbers
  // per step).
  lp::trace::TraceReader reader(path);
  const auto& h = reader.header();
  lp::trace::Summarizer sum(h);
  KvGrowth growth = kv_growth_start(h.n_layer);
  int64_t generated = 0, prompt_tokens = h.prompt_tokens;
  for (lp::trace::Step st; reader.next(st);) {
    if (sum.steps() == 0) {
      prompt_tokens = st.new_tokens > 0 ? st.new_tokens : prompt_tokens;
    } else {
      generated += st.new_tokens;
    }
    if (!kv_growth_svg.empty() && prompt_tokens > 0) kv_growth_add(growth, st, prompt_tokens, generated);
    sum.add(st);
  }
  if (!kv_growth_svg.empty()) {
    if (growth.steps.size() < 2)
      fail("{}: --kv-growth needs a trace with decoding steps (run --max-new-tokens N --trace)", path);
    lp::report::LineChart ch;
    ch.title = "Prompt tokens computed per layer group as decoding proceeds";
    ch.subtitle = fmt::format("{} ({} {}), {} prompt tokens: the LazyLLM paper's Figure 7",
                              lp::escape_text(path), h.policy, h.schedule, prompt_tokens);
    ch.x = {"decoding step", false, 0.0};
    ch.y = {"prompt tokens with K/V (%)", false, 0.0, 100.0};
    for (size_t i = 0; i < growth.groups.size(); ++i) {
      lp::report::Series se;
      se.name = fmt::format("layers {}-{}", growth.groups[i].first, growth.groups[i].second);
      se.x = growth.steps;
      for (double v : growth.share[i]) se.y.push_back(100 * v);
      se.points = growth.steps.size() <= 64;
      ch.series.push_back(se);
    }
    write_file_atomic(kv_growth_svg, lp::report::svg_line_chart(ch), "chart");
  }
  const lp::trace::Summary s = sum.finish();
  const int64_t steps = sum.steps();
  const int64_t kv_per_token_layer = 2LL * h.model.value("n_head_kv", 0) * h.model.value("head_dim", 0) * 4;
  const int64_t D = h.model.value("n_embd", 0);
  if (json_out) {
    json j = {{"trace", path},
              {"version", h.version},
              {"policy", h.policy},
              {"schedule", h.schedule},
              {"prompt_tokens", h.prompt_tokens},
              {"steps", steps},
              {"detail", s.detail},
              {"prompt_share_per_layer", s.prompt_share_per_layer},
              {"prompt_tokens_computed_fraction", s.prompt_tokens_computed_fraction},
              {"prompt_tokens_computed_fraction_after_generation",
               s.prompt_tokens_computed_fraction_after_generation},
              {"all_tokens_computed_fraction", s.all_share},
              {"at_most_once", s.at_most_once},
              {"kv_bytes_final_f32", s.kv_tokens_final * kv_per_token_layer},
              {"aux_cache_bytes_f32", s.aux_writes * D * 4},
              {"aux_writes", s.aux_writes},
              {"revivals", s.revivals}};
    if (!kv_growth_svg.empty()) {
      json groups = json::array();
      for (size_t i = 0; i < growth.groups.size(); ++i)
        groups.push_back({{"layers", {growth.groups[i].first, growth.groups[i].second}},
                          {"prompt_kv_share", growth.share[i]}});
      j["kv_growth"] = {{"chart", kv_growth_svg}, {"groups", groups}};
    }
    std::puts(json_text(j).c_str());
    return 0;
  }
  fmt::print("{}: lazyprefill trace v{}, policy {}, schedule {}, {} prompt tokens, {} steps, {}\n",
             lp::escape_text(path), h.version, h.policy, lp::escape_text(h.schedule), h.prompt_tokens, steps,
             s.detail ? "with detail (kept positions, scores, revived positions)" : "counts only");
  fmt::print(
      "prompt (token, layer) pairs computed: {:.1f}% in the prefill, {:.1f}% by the end (the paper's "
      "\"% of prompt tokens computed\")   all tokens, whole generation: {:.1f}%   at most once: {}\n",
      100 * s.prompt_tokens_computed_fraction, 100 * s.prompt_tokens_computed_fraction_after_generation,
      100 * s.all_share, s.at_most_once ? "yes" : "NO");
  fmt::print("KV at the end: {:.2f} MiB (f32)   Aux Cache: {} states, {:.2f} MiB   revivals: {}\n",
             double(s.kv_tokens_final * kv_per_token_layer) / 1048576.0, s.aux_writes,
             double(s.aux_writes * D * 4) / 1048576.0, s.revivals);
  fmt::print("share of prompt tokens computed per layer:\n");
  for (size_t l = 0; l < s.prompt_share_per_layer.size(); ++l)
    fmt::print("  layer {:>3}: {:>6.1f}%\n", l, 100 * s.prompt_share_per_layer[l]);
  return 0;
}

int inspect_model(const std::string& path_arg, bool json_out) {
  const std::string path = path_arg.empty() ? lp::default_model_path() : path_arg;
  const lp::GgufFile f = lp::GgufFile::open(path);
  const lp::ModelConfig c = lp::config_from_gguf(f);
  const lp::VocabData v = lp::vocab_from_gguf(f);
  std::map<std::string, std::pair<int, int64_t>> by_type;
  int64_t total_bytes = 0;
  for (const auto& t : f.tensors()) {
    auto& e = by_type[std::string(lp::type_info(uint32_t(t.type))->name)];
    e.first += 1;
    e.second += t.n_bytes;
    total_bytes += t.n_bytes;
  }
  json j;
  j["file"] = path;
  j["gguf_version"] = f.version();
  j["architecture"] = c.arch;
  j["name"] = c.name;
  j["config"] = {{"n_layer", c.n_layer},
                 {"n_embd", c.n_embd},
                 {"n_head", c.n_head},
                 {"n_head_kv", c.n_head_kv},
                 {"head_dim", c.head_dim},
                 {"n_ff", c.n_ff},
                 {"n_vocab", c.n_vocab},
                 {"n_ctx_train", c.n_ctx_train},
                 {"rope_theta", c.rope_theta},
                 {"rope_dim", c.rope_dim},
                 {"rms_eps", c.rms_eps},
                 {"tied_embeddings", c.tied_embeddings},
                 {"rope_style", c.rope_neox ? "neox" : "normal"},
                 {"attention_bias", c.attention_bias},
                 {"qk_norm", c.qk_norm},
                 {"post_norms", c.post_norms},
                 {"ffn_activation", c.gelu ? "geglu" : "swiglu"},
                 {"embed_scale", c.embed_scale},
                 {"attention_scale", c.attention_scale()},
                 {"layer_window", c.layer_window},
                 {"rope_theta_local", c.rope_theta_local},
                 {"n_params", c.n_params()},
                 {"n_active_params", c.n_active_params()},
                 {"ffn", c.moe() ? "moe" : "dense"},
                 {"n_expert", c.n_expert},
                 {"n_expert_used", c.n_expert_used},
                 {"n_ff_exp", c.n_ff_exp}};
  j["tokenizer"] = {{"model", v.model},
                    {"pre", v.pre},
                    {"n_tokens", v.tokens.size()},
                    {"n_merges", v.merges.size()},
                    {"bos_id", v.bos_id},
                    {"eos_id", v.eos_id},
                    {"add_bos", v.add_bos},
                    {"has_chat_template", !v.chat_template.empty()}};
  json types = json::object();
  for (const auto& [k, e] : by_type) types[k] = {{"tensors", e.first}, {"bytes", e.second}};
  j["tensor_types"] = types;
  j["tensor_bytes"] = total_bytes;
  json tensors = json::array();
  for (const auto& t : f.tensors())
    tensors.push_back({{"name", t.name},
                       {"type", lp::type_info(uint32_t(t.type))->name},
                       {"shape", t.ne},
                       {"bytes", t.n_bytes}});
  j["tensors"] = tensors;
  if (json_out) {  // JSON escapes control characters; bytes that are not UTF-8 become U+FFFD
    std::puts(json_text(j).c_str());
    return 0;
  }
  // Text from the file is escaped: a name cannot forge lines or send terminal escapes.
  const auto esc = [](const std::string& x) { return lp::escape_text(x); };
  fmt::print("{}  (GGUF v{}, {:.1f} MiB of tensors)\n", esc(path), f.version(), total_bytes / 1048576.0);
  fmt::print("architecture {}  \"{}\"\n", esc(c.arch), esc(c.name));
  fmt::print("  layers {}  width {}  heads {} (kv {})  head dim {}  ffn {}  vocab {}  context {}\n",
             c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab, c.n_ctx_train);
  fmt::print("  rope theta {}  rope dims {} ({})  rms eps {}  tied embeddings {}  params {:.1f} M\n",
             c.rope_theta, c.rope_dim, c.rope_neox ? "neox" : "normal", c.rms_eps,
             c.tied_embeddings ? "yes" : "no", c.n_params() / 1e6);
  std::vector<std::string> parts;
  if (c.attention_bias) parts.push_back("q/k/v biases");
  if (c.qk_norm) parts.push_back("per-head q/k norms");
  if (c.post_norms) parts.push_back("norms after attention and FFN");
  if (c.gelu) parts.push_back("GeGLU (tanh GELU)");
  if (c.embed_scale != 1.0f) parts.push_back(fmt::format("embeddings x {:.4g}", c.embed_scale));
  if (!parts.empty()) fmt::print("  {}\n", fmt::join(parts, ", "));
  if (c.moe())
    fmt::print(
        "  mixture of experts in every layer: {} experts of width {}, {} a token (router softmax, top-{} "
        "renormalized)  active params {:.1f} M\n",
        c.n_expert, c.n_ff_exp, c.n_expert_used, c.n_expert_used, c.n_active_params() / 1e6);
  if (!c.layer_window.empty()) {
    std::string kinds;  // a letter a layer: L local (sliding window), G global
    int local = 0, window = 0;
    for (int l = 0; l < c.n_layer; ++l) {
      kinds += c.window(l) > 0 ? 'L' : 'G';
      local += c.window(l) > 0;
      window = std::max(window, c.window(l));
    }
    fmt::print("  layers: {} local (window {}, rope theta {}), {} global  [{}]\n", local, window,
               c.rope_theta_local, c.n_layer - local, kinds);
  }
  fmt::print("tokenizer {} (pre '{}')  {} tokens  {} merges  bos {}  eos {}  add_bos {}  chat template {}\n",
             esc(v.model), esc(v.pre), v.tokens.size(), v.merges.size(), v.bos_id, v.eos_id, v.add_bos,
             v.chat_template.empty() ? "no" : "yes");
  fmt::print("tensor types:\n");
  for (const auto& [k, e] : by_type)
    fmt::print("  {:<6} {:>4} tensors {:>10.2f} MiB\n", k, e.first, e.second / 1048576.0);
  fmt::print("tensors:\n");
  for (const auto& t : f.tensors())
    fmt::print("  {:<28} {:<5} [{}] {} bytes\n", esc(t.name), lp::type_info(uint32_t(t.type))->name,
               fmt::join(t.ne, ", "), t.n_bytes);
  return 0;
}

}  // namespace

int cmd_inspect(const InspectArgs& a) {
  return a.trace.empty() ? inspect_model(a.model, a.json_out)
                         : inspect_trace(a.trace, a.json_out, a.kv_growth);
}

}  // namespace lp::cli
