// Shared helpers for the test suites.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "model/paths.h"
#include "traces/trace.h"

namespace lp::testing {

// The real default model: $LAZYPREFILL_MODEL, else the cache path scripts/setup fills.
// Real-model tests fail (never skip) when it is absent: set-up always fetches it.
inline std::string real_model_path() {
  if (const char* p = std::getenv("LAZYPREFILL_MODEL"); p && *p) return p;
  return lp::default_model_path();
}

// The second real model, Gemma 3 270M Q4_K_M, where scripts/setup puts it ($LAZYPREFILL_GEMMA3
// overrides). Its tests fail (never skip) when it is absent.
inline std::string gemma3_model_path() {
  if (const char* p = std::getenv("LAZYPREFILL_GEMMA3"); p && *p) return p;
  return lp::lazyprefill_home() + "/models/gemma-3-270m-q4_k_m.gguf";
}

// n normal samples with standard deviation `scale`, reproducible from `seed`.
// x rounded to IEEE half precision (to nearest even) and back: the compiler's _Float16 where it
// has one on x86 (GCC 12), else the F16C instruction (clang 14, the sanitizer build). Either is
// independent of the project's own conversion, which the tests check against it.
#if defined(__FLT16_MAX__) && !defined(__clang__)
inline float f16_round(float x) {
  return float(static_cast<_Float16>(x));
}
#else
__attribute__((target("f16c"))) inline float f16_round(float x) {
  return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}
#endif

inline std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

// n token ids uniform in [0, V), reproducible from `seed`.
inline std::vector<int32_t> random_ids(int64_t n, int32_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& i : ids) i = int32_t(rng() % uint32_t(V));
  return ids;
}

inline std::string fixture_path(const std::string& name) {
  return std::string(LP_SOURCE_DIR) + "/tests/fixtures/" + name;
}

// The positions kept after each pruning step of an engine's trace step, in order (its detail).
inline std::vector<std::vector<int32_t>> kept_of(const trace::Step& s) {
  std::vector<std::vector<int32_t>> out;
  if (s.pruning)
    for (const trace::Pruning& p : *s.pruning) out.push_back(p.kept);
  return out;
}

}  // namespace lp::testing
