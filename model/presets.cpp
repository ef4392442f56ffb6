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
        if (j.value("lazyprefill_model_presets", 0) != 1 || !j.contains("presets") ||
            !j["presets"].is_array())
          fail("model/presets.json: not a version 1 preset file");
        return j["presets"];
      }
    fail("model/presets.json was not compiled in");
  }();
  return all;
}

ModelConfig from_json(const json& p) {
  const std::string origin = "model preset '" + p.value("name", std::string("?")) + "'";
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

ModelConfig preset_config(const std::string& name) {
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
