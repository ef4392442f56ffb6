// A sweep grid (`lazyprefill sweep --grid`, docs/simulator.md): hardware x models x methods x
// prompt lengths, read strictly (unknown keys, fractional or out-of-range numbers, a version that
// is not 1 are refused), every name resolved (profiles, presets, schedules) before any work.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "pruning/method.h"
#include "sim/cost.h"

namespace lp::report {

// A deployment layout of a grid (simulate's --tp, --dp, --ep, --pp, --moe-imbalance).
struct SweepLayout {
  int tp = 1, dp = 1, ep = 1, pp = 1;
  double moe_imbalance = 0;
  // "tp1", "tp8 pp2", "dp8 ep8": the degrees above 1 (tp always), the row's `layout`.
  std::string name() const;
};

struct SweepGrid {
  std::vector<hw::Profile> hws;
  // Layouts (default: tp 1 alone); one a model cannot split or a profile cannot host gives rows
  // that say why ("error"), and the other configurations still run.
  std::vector<SweepLayout> layouts{SweepLayout{}};
  std::vector<std::string> model_names;
  std::vector<ModelConfig> models;
  std::vector<Method> methods;  // the none policy always with no schedule
  std::vector<int64_t> lengths;
  int64_t new_tokens = 0, batch = 1;
  sim::Precision precision;
  std::string revival_model;  // "" or a file, "builtin"
  double revival_share = -1;  // >= 0: a constant share
  bool map = false;
};

// Reads and checks a grid file. Throws lp::Error naming the file and the key.
SweepGrid read_sweep_grid(const std::string& path);

}  // namespace lp::report
