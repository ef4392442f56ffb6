// A pruning method: a policy and the schedule it prunes by. What `run --prune P --schedule S`
// runs, an eval compares, a capacity report predicts and a sweep costs: one value type for all.
#pragma once

#include <string>

#include "pruning/policy.h"
#include "pruning/schedule.h"

namespace lp {

struct Method {
  PolicyKind policy = PolicyKind::None;
  Schedule schedule;  // no steps for none

  const char* policy_name() const { return lp::policy_name(policy); }
  // The schedule's inline form, "none" for the none policy (whatever its schedule says).
  std::string schedule_text() const;
  // "none", or "<policy> <schedule>": "lazyllm 0.3:0.3,0.6:0.3,0.9:0.3".
  std::string label() const;
};

}  // namespace lp
