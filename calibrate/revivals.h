// Fitting the revival model (sim/revival.h) to recorded LazyLLM traces: one decay per pruning
// stage by least squares (BOBYQA), and the survival and key shares counted from the traces.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "sim/cost.h"
#include "sim/revival.h"
#include "traces/trace.h"

namespace lp::calib {

// Fits one stage per pruning layer of the traces' schedule. Every trace must be a LazyLLM (or
// random) run of the same model and schedule with at least one decoding step and the per-layer
// `attended` counts (traces from before it existed are refused); `names` label them in errors and
// provenance. Throws lp::Error naming the trace and the problem.
sim::RevivalModel fit_revival_model(const std::vector<trace::Trace>& traces,
                                    const std::vector<std::string>& names,
                                    const std::vector<std::string>& sha256s);

// The shares one recorded trace shows: [stage][step - 1], NaN where a stage had no candidates.
std::vector<std::vector<double>> observed_revival_shares(const trace::Trace& t);

// A revival model judged on a held-out pruned trace: the trace replayed, its synthetic twin (the
// same model, policy, schedule, prompt and steps) drawing revivals from the model, and the twin
// with no revivals (share 0, the optimistic bound), each on `hw`.
struct RevivalCheck {
  std::string trace;
  int64_t prompt_tokens = 0, decode_steps = 0;
  struct Figures {
    double kv_bytes = 0, aux_bytes = 0;  // at the end
    double rows_per_step = 0;            // rows computed per decoding step, over the layers
    double decode_step_mean_s = 0;
  };
  Figures replayed, model, share_0;
  double worst_step_error = 0;  // the largest |relative error| of one decoding step, model vs replayed
  // (x - replayed) / replayed for a figure of the model's or share 0's.
  static double rel(double x, double replayed) { return replayed != 0 ? (x - replayed) / replayed : 0.0; }
};
// Throws lp::UsageError naming `name` for an unpruned trace or one without decoding steps.
RevivalCheck check_revival_model(const sim::RevivalModel& m, const trace::Trace& t, const std::string& name,
                                 const hw::Profile& hw, const sim::Precision& p, bool map);

}  // namespace lp::calib
