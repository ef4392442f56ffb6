#include "sim/bobyqa.h"

#include <nlopt.h>

#include <memory>

#include "model/error.h"

namespace lp::sim {

void minimize_bobyqa(unsigned n, double* x, const double* lo, const double* hi, Objective f, void* data,
                     int max_eval, double xtol_rel, const char* what) {
  const std::unique_ptr<nlopt_opt_s, decltype(&nlopt_destroy)> opt(nlopt_create(NLOPT_LN_BOBYQA, n), nlopt_destroy);
  if (!opt) fail("{}: cannot create the NLopt optimiser", what);
  nlopt_set_lower_bounds(opt.get(), lo);
  nlopt_set_upper_bounds(opt.get(), hi);
  nlopt_set_min_objective(opt.get(), f, data);
  nlopt_set_maxeval(opt.get(), max_eval);
  nlopt_set_xtol_rel(opt.get(), xtol_rel);
  double minf = 0;
  const nlopt_result res = nlopt_optimize(opt.get(), x, &minf);
  if (res < 0) fail("{} did not converge (NLopt code {})", what, int(res));
}

}  // namespace lp::sim
