// Where lazyprefill keeps its cache (models, downloaded wheels): $LAZYPREFILL_HOME, default
// ~/.cache/lazyprefill. scripts/setup fetches the default model there.
#pragma once

#include <string>

namespace lp {

inline constexpr const char* kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

std::string lazyprefill_home();
std::string default_model_path();  // <home>/models/SmolLM2-135M-Instruct.Q4_1.gguf

}  // namespace lp
