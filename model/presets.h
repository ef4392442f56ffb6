// Model configuration presets for models whose weights are not here (model/presets.json,
// compiled in; sources and parameter counts in docs/model-presets.md). The simulator costs them
// exactly like a GGUF's ModelConfig.
#pragma once

#include <string>
#include <vector>

#include "model/config.h"

namespace lp {

// The preset's configuration. An unknown name is an error that lists the known ones.
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace lp
