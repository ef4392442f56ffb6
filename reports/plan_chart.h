// The deployment search's chart (`plan --chart`): every point as output tokens/s a GPU against
// tokens/s a user, one series a method, and the Pareto frontier drawn through them.
#pragma once

#include <string>
#include <vector>

#include "reports/plot.h"
#include "sim/plan.h"

namespace lp::report {

// `methods` names each PlanOptions method (by index); `subtitle` says the model, GPUs and workload.
LineChart plan_chart(const sim::PlanResult& r, const std::vector<std::string>& methods,
                     const std::string& subtitle);

}  // namespace lp::report
