#include "calibrate/bobyqa.h"

#include <fmt/format.h>
#include <nlopt.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "model/error.h"

namespace lp::calib {

OptimizerOutcome optimizer_outcome(int code) {
  switch (code) {
    case NLOPT_SUCCESS:
      return {"success", true, true};
    case NLOPT_STOPVAL_REACHED:
      return {"stopval_reached", true, true};
    case NLOPT_FTOL_REACHED:
      return {"ftol_reached", true, true};
    case NLOPT_XTOL_REACHED:
      return {"xtol_reached", true, true};
    case NLOPT_MAXEVAL_REACHED:
      return {"maxeval_reached", true, false};
    case NLOPT_MAXTIME_REACHED:
      return {"maxtime_reached", true, false};
    case NLOPT_ROUNDOFF_LIMITED:
      return {"roundoff_limited", true, false};
    case NLOPT_FORCED_STOP:
      return {"forced_stop", true, false};
    case NLOPT_INVALID_ARGS:
      return {"invalid_args", false, false};
    case NLOPT_OUT_OF_MEMORY:
      return {"out_of_memory", false, false};
    // A generic failure still leaves the best point evaluated so far, which is what we return.
    case NLOPT_FAILURE:
      return {"failure", true, false};
    default:
      return {"unknown", false, false};
  }
}

namespace {
// Wraps the objective to keep the best point evaluated: whatever NLopt leaves in x on a stop that
// is not a convergence, the fit returns the best point it saw.
struct Tracker {
  Objective f;
  void* data;
  unsigned n;
  int evaluations = 0;
  double best = std::numeric_limits<double>::infinity();
  std::vector<double> best_x;
};

double tracked(unsigned n, const double* x, double* grad, void* p) {
  Tracker& t = *static_cast<Tracker*>(p);
  double v = t.f(n, x, grad, t.data);
  ++t.evaluations;
  // BOBYQA's quadratic model cannot use a NaN or an infinity: a large finite value instead.
  if (!std::isfinite(v))
    v = std::numeric_limits<double>::max() / 4;
  else if (v < t.best) {
    t.best = v;
    t.best_x.assign(x, x + n);
  }
  return v;
}
}  // namespace

OptimizerStatus minimize_bobyqa(unsigned n, double* x, const double* lo, const double* hi, Objective f,
                                void* data, int max_eval, double xtol_rel, const char* what) {
  const std::unique_ptr<nlopt_opt_s, decltype(&nlopt_destroy)> opt(nlopt_create(NLOPT_LN_BOBYQA, n),
                                                                   nlopt_destroy);
  if (!opt) fail("{}: cannot create the NLopt optimiser (out of memory?)", what);
  Tracker t{f, data, n, 0, std::numeric_limits<double>::infinity(), {}};
  nlopt_set_lower_bounds(opt.get(), lo);
  nlopt_set_upper_bounds(opt.get(), hi);
  nlopt_set_min_objective(opt.get(), tracked, &t);
  nlopt_set_maxeval(opt.get(), max_eval);
  nlopt_set_xtol_rel(opt.get(), xtol_rel);
  double minf = 0;
  const nlopt_result res = nlopt_optimize(opt.get(), x, &minf);
  const OptimizerOutcome o = optimizer_outcome(int(res));
  if (!o.returns_point)
    fail(
        "{}: the optimiser stopped without a result (NLopt {} {}); this is a bug in the fit's set-up: please "
        "report "
        "it with the command and the measurement files",
        what, int(res), o.name);
  if (t.best_x.empty())
    fail(
        "{}: every prediction was NaN or infinite over {} evaluations: check the measurements for zero or "
        "non-finite times and the profile for zero peaks or bandwidths",
        what, t.evaluations);
  for (unsigned k = 0; k < n; ++k) x[k] = t.best_x[k];
  return {int(res), o.name, o.converged, t.evaluations, t.best};
}

std::string describe_stop(const OptimizerStatus& s) {
  if (s.converged) return "";
  return fmt::format("{} after {} evaluations", s.name, s.evaluations);
}

}  // namespace lp::calib
