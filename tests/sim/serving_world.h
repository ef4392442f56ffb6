// The serving simulation's tests' common setting: Llama-3.1-8B on one H100 SXM, default precision,
// the serve scheduler's configuration with a K/V budget of `kv_gib`.
#pragma once

#include <span>

#include "hwmodels/profile.h"
#include "model/presets.h"
#include "sim/serving.h"

namespace lp::testing {

struct ServingWorld {
  ModelConfig c = preset_config("llama-3.1-8b");
  hw::Profile hw = hw::load_profile("h100-sxm");
  sim::Precision p;
  sim::ServingConfig cfg;
  explicit ServingWorld(double kv_gib = 60) { cfg.kv_budget_bytes = kv_gib * double(1 << 30); }
  // The requests through one engine under cfg, unpruned.
  sim::ServingRun run(std::span<const sim::ServingRequest> reqs) const {
    return sim::simulate_serving(c, hw, p, sim::ServingMethod{}, cfg, reqs);
  }
};

}  // namespace lp::testing
