// Bound-constrained minimisation without derivatives (NLopt's BOBYQA), as every fit uses it:
// calibrate --runs (per op family, calibrate/calibrate.cpp) and calibrate --measurements
// (calibrate/fit_measurements.cpp).
//
// A fit always ends with the best point it evaluated. NLopt documents ROUNDOFF_LIMITED ("the
// optimization still typically returns a useful result"), MAXEVAL, MAXTIME and FORCED_STOP as
// stops that leave a point behind, like the tolerance stops; they are reported, not thrown. Only a
// stop with nothing to return (invalid arguments, out of memory, no finite objective value) is an
// error.
#pragma once

#include <string>

namespace lp::calib {

// The objective: f(n, x, grad, data); grad is always null (BOBYQA uses no gradient).
using Objective = double (*)(unsigned n, const double* x, double* grad, void* data);

struct OptimizerStatus {
  int code = 0;            // NLopt's nlopt_result
  std::string name;        // "xtol_reached", "roundoff_limited", "maxeval_reached", ...
  bool converged = false;  // a tolerance (or stopval) stopped it: the point is a local minimum
  int evaluations = 0;
  double best = 0;  // the objective at the point returned
};

// What an NLopt result code means for a fit: its name, whether the optimiser leaves a usable point
// behind, and whether it stopped because it converged.
struct OptimizerOutcome {
  const char* name;
  bool returns_point;
  bool converged;
};
OptimizerOutcome optimizer_outcome(int nlopt_code);

// Minimises f over the box [lo, hi] (n dimensions) from x, which receives the best point
// evaluated (x itself when nothing better was found). Stops after max_eval evaluations or when a
// step changes x by less than xtol_rel relatively. A non-finite objective value counts as worse
// than any finite one. Throws lp::Error naming `what`, NLopt's code and what to do only when no
// point can be returned.
OptimizerStatus minimize_bobyqa(unsigned n, double* x, const double* lo, const double* hi, Objective f,
                                void* data, int max_eval, double xtol_rel, const char* what);

// "roundoff_limited after 37 evaluations" for reports; "" when it converged.
std::string describe_stop(const OptimizerStatus& s);

}  // namespace lp::calib
