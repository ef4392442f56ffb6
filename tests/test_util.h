// Shared helpers for the test suites.
#pragma once

#include <cstdlib>
#include <string>

#include "model/paths.h"

namespace lp::testing {

// The real default model: $LAZYPREFILL_MODEL, else the cache path scripts/setup fills.
// Real-model tests fail (never skip) when it is absent: set-up always fetches it.
inline std::string real_model_path() {
  if (const char* p = std::getenv("LAZYPREFILL_MODEL"); p && *p) return p;
  return lp::default_model_path();
}

inline std::string fixture_path(const std::string& name) {
  return std::string(LP_SOURCE_DIR) + "/tests/fixtures/" + name;
}

}  // namespace lp::testing
