// Errors, tier one: library code throws lp::Error carrying context (file, field, value);
// the CLI catches it and prints one line. Nothing in the library prints or exits.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace lp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace lp
