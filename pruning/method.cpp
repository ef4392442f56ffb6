#include "pruning/method.h"

#include <fmt/format.h>

#include "model/error.h"

namespace lp {

std::string Method::schedule_text() const {
  return policy == PolicyKind::None ? "none" : schedule.to_string();
}

std::string Method::label() const {
  if (policy == PolicyKind::None) return "none";
  return fmt::format("{} {}", policy_name(), schedule.to_string());
}

Schedule default_schedule(PolicyKind policy) {
  switch (policy) {
    case PolicyKind::StaticPaper:
      return parse_schedule("0.1:0.35");
    case PolicyKind::RandomDrop:
      return parse_schedule("0.3");
    default:
      return default_schedule();
  }
}

std::string method_problem(PolicyKind policy, const Schedule& schedule) {
  const bool drop = drop_share(schedule).has_value();
  switch (policy) {
    case PolicyKind::None:
      return "";
    case PolicyKind::RandomDrop:
      if (!drop)
        return fmt::format(
            "random-drop drops tokens before the model: its schedule is the share dropped alone (0.3), not "
            "'{}'",
            schedule.to_string());
      return "";
    case PolicyKind::StaticPaper:
      if (schedule.steps.size() != 1 || drop)
        return fmt::format(
            "static-paper prunes once: its schedule is one step L:S (scores from layers 0..L, S of the "
            "prompt pruned after layer L), not '{}'",
            schedule.to_string());
      return "";
    default:
      if (drop)
        return fmt::format("a share alone ({}) drops tokens before the model, which only random-drop does",
                           schedule.to_string());
      return "";
  }
}

void check_method(PolicyKind policy, const Schedule& schedule) {
  const std::string why = method_problem(policy, schedule);
  if (!why.empty()) usage_fail("{}", why);
}

std::vector<Schedule> schedules_fitting(PolicyKind policy, const std::vector<Schedule>& given,
                                        std::vector<Schedule> otherwise) {
  std::vector<Schedule> out;
  for (const Schedule& s : given)
    if (method_problem(policy, s).empty()) out.push_back(s);
  return out.empty() ? otherwise : out;
}

std::vector<Schedule> schedules_fitting(PolicyKind policy, const std::vector<Schedule>& given) {
  return schedules_fitting(policy, given, {default_schedule(policy)});
}

std::vector<PruneStep> resolve_method(PolicyKind policy, const Schedule& schedule, int n_layer,
                                      const std::vector<int>& global_layers) {
  check_method(policy, schedule);
  if (policy == PolicyKind::None || policy == PolicyKind::RandomDrop) return {};
  return resolve_schedule(schedule, n_layer, global_layers);
}

}  // namespace lp
