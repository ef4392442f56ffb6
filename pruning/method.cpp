#include "pruning/method.h"

#include <fmt/format.h>

namespace lp {

std::string Method::schedule_text() const {
  return policy == PolicyKind::None ? "none" : schedule.to_string();
}

std::string Method::label() const {
  if (policy == PolicyKind::None) return "none";
  return fmt::format("{} {}", policy_name(), schedule.to_string());
}

}  // namespace lp
