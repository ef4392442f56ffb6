// Model configuration presets for models whose weights are not here (model/presets.json,
// compiled in; sources and parameter counts in docs/model-presets.md). The simulator costs them
// exactly like a GGUF's ModelConfig.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace lp {

// The preset's configuration, or with a name that holds a '/' or ends in ".json", the configuration
// in that file (a JSON object as config_to_json writes it, checked as a preset is; named by its
// 'name' or else the path). An unknown name is an error that lists the known ones.
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();

// One line of `--help-models`: a preset's name, description, size and layer kinds.
struct PresetSummary {
  std::string name, description;
  int64_t n_params = 0, n_active_params = 0;
  int n_layer = 0, n_ctx_train = 0;
  std::string layers;  // describe_layers
};
std::vector<PresetSummary> preset_summaries();  // in name order
// The layer kinds of a configuration in words: "dense", or e.g. "latent attention (512 + 64),
// 256 experts of 2048 (8 a token) + 1 shared, 3 dense first; window 128 on 12 of 24".
std::string describe_layers(const ModelConfig& c);

}  // namespace lp
