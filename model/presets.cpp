#include "model/presets.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"

namespace lp {

// Generated from model/presets.json by cmake/embed.cmake.
std::vector<std::pair<std::string_view, std::string_view>> builtin_preset_files();

namespace {
using json = nlohmann::json;

const json& presets() {
  static const json all = [] {
    for (const auto& [name, text] : builtin_preset_files())
      if (name == "presets") {
        json j = json::parse(text);
        if (j.value("lazyprefill_model_presets", 0) != 1 || !j.contains("presets") ||
            !j["presets"].is_array())
          fail("model/presets.json: not a version 1 preset file");
        return j["presets"];
      }
    fail("model/presets.json was not compiled in");
  }();
  return all;
}

ModelConfig from_json(const json& p, std::string origin = "") {
  if (origin.empty()) origin = "model preset '" + p.value("name", std::string("?")) + "'";
  ModelConfig c = config_from_json(p, origin);
  if (c.n_ctx_train <= 0) fail("{}: n_ctx_train must be positive", origin);
  return c;
}
}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const json& p : presets()) names.push_back(p.at("name").get<std::string>());
  std::sort(names.begin(), names.end());
  return names;
}

std::string describe_layers(const ModelConfig& c) {
  std::vector<std::string> parts;
  if (c.mla()) parts.push_back(fmt::format("latent attention ({} + {})", c.kv_lora_rank, c.rope_dim));
  if (c.moe()) {
    std::string m = fmt::format("{} experts of {} ({} a token)", c.n_expert, c.n_ff_exp, c.n_expert_used);
    if (c.n_expert_shared > 0) m += fmt::format(" + {} shared", c.n_expert_shared);
    if (c.n_layer_dense_lead > 0) m += fmt::format(", {} dense first", c.n_layer_dense_lead);
    parts.push_back(m);
  }
  int windows = 0, chunks = 0, w = 0, ch = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    if (c.window(l) > 0) ++windows, w = c.window(l);
    if (c.chunk(l) > 0) ++chunks, ch = c.chunk(l);
  }
  if (windows > 0)
    parts.push_back(windows == c.n_layer ? fmt::format("window {} on every layer", w)
                                         : fmt::format("window {} on {} of {}", w, windows, c.n_layer));
  if (chunks > 0) parts.push_back(fmt::format("chunks of {} on {} of {}", ch, chunks, c.n_layer));
  if (c.attn_sinks) parts.push_back("sinks");
  if (parts.empty()) return "dense";
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

std::vector<PresetSummary> preset_summaries() {
  std::vector<PresetSummary> out;
  for (const std::string& name : preset_names()) {
    const ModelConfig c = preset_config(name);
    std::string description;
    for (const json& p : presets())
      if (p.at("name").get<std::string>() == name) description = p.value("description", std::string());
    out.push_back(
        {name, description, c.n_params(), c.n_active_params(), c.n_layer, c.n_ctx_train, describe_layers(c)});
  }
  return out;
}

ModelConfig preset_config(const std::string& name) {
  if (name.find('/') != std::string::npos || (name.size() > 5 && name.ends_with(".json"))) {
    // A configuration file, as config_to_json writes one (a report's provenance.model.config).
    const std::string origin = "model configuration '" + name + "'";
    const std::string text = read_input_file(name, "model configuration", input_cap::kSmallJson);
    json j;
    try {
      j = json_parse<json>(text, origin);
    } catch (const json::exception& e) {
      fail("{} is not valid JSON: {}", origin, e.what());
    }
    ModelConfig c = from_json(j, origin);  // checked as a preset is: a context length too
    if (c.name.empty()) c.name = name;
    return c;
  }
  for (const json& p : presets())
    if (p.at("name").get<std::string>() == name) return from_json(p);
  std::string known;
  for (const std::string& n : preset_names()) {
    if (!known.empty()) known += ", ";
    known += n;
  }
  usage_fail("unknown model configuration '{}' (known: {})", name, known);
}

}  // namespace lp
