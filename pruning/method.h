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

// The schedule a policy prunes by when none is given: LazyLLM's default (pruning/schedule.h) for
// lazyllm, frozen and random-layers; 0.1:0.35 for static-paper (scores from the first 10% of the
// layers, 35% of the prompt pruned after them) and 0.3 for random-drop (30% of the prompt dropped):
// each computes about the 70% of the (token, layer) pairs LazyLLM's default computes.
Schedule default_schedule(PolicyKind policy);

// Whether a schedule fits a policy: "" if so, else why not, in one line. random-drop takes one
// share alone (0.3: the share of the prompt dropped before the model), static-paper exactly one
// AT:SHARE step (it prunes once), lazyllm, frozen and random-layers AT:SHARE steps only.
std::string method_problem(PolicyKind policy, const Schedule& schedule);
// method_problem as a usage error.
void check_method(PolicyKind policy, const Schedule& schedule);
// For commands that cross a list of policies with schedules: the given schedules that fit
// `policy` (method_problem), or, when none does, `otherwise` (by default the policy's
// default_schedule). So "--prune lazyllm,random-drop --schedule 0.3:0.3,0.6:0.3,0.9:0.3" runs
// random-drop at its default.
std::vector<Schedule> schedules_fitting(PolicyKind policy, const std::vector<Schedule>& given);
std::vector<Schedule> schedules_fitting(PolicyKind policy, const std::vector<Schedule>& given,
                                        std::vector<Schedule> otherwise);

// check_method, then the schedule resolved for an n_layer model (resolve_schedule, with its global
// layers where it has sliding-window ones): none for none and random-drop, which prune inside no layer.
std::vector<PruneStep> resolve_method(PolicyKind policy, const Schedule& schedule, int n_layer,
                                      const std::vector<int>& global_layers = {});

}  // namespace lp
