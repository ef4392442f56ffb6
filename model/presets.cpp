#include "model/presets.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>

#include "model/error.h"

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
        if (j.value("lazyprefill_model_presets", 0) != 1 || !j.contains("presets") || !j["presets"].is_array())
          fail("model/presets.json: not a version 1 preset file");
        return j["presets"];
      }
    fail("model/presets.json was not compiled in");
  }();
  return all;
}

ModelConfig from_json(const json& p) {
  const std::string origin = "model preset '" + p.value("name", std::string("?")) + "'";
  try {
    ModelConfig c;
    c.arch = p.at("arch").get<std::string>();
    c.name = p.at("name").get<std::string>();
    c.n_layer = p.at("n_layer").get<int>();
    c.n_embd = p.at("n_embd").get<int>();
    c.n_head = p.at("n_head").get<int>();
    c.n_head_kv = p.at("n_head_kv").get<int>();
    c.head_dim = p.at("head_dim").get<int>();
    c.n_ff = p.at("n_ff").get<int>();
    c.n_vocab = p.at("n_vocab").get<int>();
    c.n_ctx_train = p.at("n_ctx_train").get<int>();
    c.rope_dim = c.head_dim;
    c.rope_theta = p.at("rope_theta").get<float>();
    c.rms_eps = p.at("rms_eps").get<float>();
    c.tied_embeddings = p.at("tied_embeddings").get<bool>();
    c.attention_bias = p.value("attention_bias", false);
    c.layer_n_head = p.value("layer_n_head", std::vector<int>{});
    c.layer_n_head_kv = p.value("layer_n_head_kv", std::vector<int>{});
    c.layer_n_ff = p.value("layer_n_ff", std::vector<int>{});
    validate_config(c, origin);
    return c;
  } catch (const json::exception& e) {
    fail("{}: {}", origin, e.what());
  }
}
}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const json& p : presets()) names.push_back(p.at("name").get<std::string>());
  std::sort(names.begin(), names.end());
  return names;
}

ModelConfig preset_config(const std::string& name) {
  for (const json& p : presets())
    if (p.at("name").get<std::string>() == name) return from_json(p);
  std::string known;
  for (const std::string& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  fail("unknown model configuration '{}' (known: {})", name, known);
}

}  // namespace lp
