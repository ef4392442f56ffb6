// Fitting the revival model (sim/revival.h) to recorded LazyLLM traces: one decay per pruning
// stage by least squares (BOBYQA), and the survival and key shares counted from the traces.
#pragma once

#include <string>
#include <vector>

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

}  // namespace lp::calib
