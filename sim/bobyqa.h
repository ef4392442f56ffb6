// Bound-constrained minimisation without derivatives (NLopt's BOBYQA), as both fits use it:
// calibrate --runs (per op family, sim/calibrate.cpp) and calibrate --measurements
// (sim/fit_measurements.cpp).
#pragma once

namespace lp::sim {

// The objective: f(n, x, grad, data); grad is always null (BOBYQA uses no gradient).
using Objective = double (*)(unsigned n, const double* x, double* grad, void* data);

// Minimises f over the box [lo, hi] (n dimensions) from x, which receives the minimum. Stops after
// max_eval evaluations or when a step changes x by less than xtol_rel relatively. Throws lp::Error
// naming `what` and NLopt's code when NLopt fails.
void minimize_bobyqa(unsigned n, double* x, const double* lo, const double* hi, Objective f, void* data,
                     int max_eval, double xtol_rel, const char* what);

}  // namespace lp::sim
