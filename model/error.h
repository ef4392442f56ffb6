// Errors, tier one: library code throws lp::Error carrying context (file, field, value);
// the CLI catches it and prints one line. Nothing in the library prints or exits.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace lp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bad command line: a missing or conflicting option, or an option value that names nothing
// known (a hardware profile, a model preset, a policy, an inline schedule). The CLI exits 2 for
// it and 1 for every other Error.
class UsageError : public Error {
 public:
  using Error::Error;
};

// A failure of the GPU or its runtime while running (a CUDA or cuBLAS call's error), not of the
// input: the server answers 503 for the requests it ends. lost(): the device cannot be used again by
// this process (a sticky error: an illegal address, a launch failure, an uncorrectable ECC error),
// so the server ends every request and stops; otherwise (an allocation that does not fit now) it
// goes on serving.
class DeviceError : public Error {
 public:
  DeviceError(const std::string& what, bool lost) : Error(what), lost_(lost) {}
  bool lost() const { return lost_; }

 private:
  bool lost_;
};

// A broken invariant: a bug in lazyprefill, never the user's input. Its message starts
// "internal error: ". The CLI exits 70 (EX_SOFTWARE) for it, the server answers 500.
class InternalError : public Error {
 public:
  using Error::Error;
};

template <class... Args>
[[noreturn]] void usage_fail(fmt::format_string<Args...> f, Args&&... args) {
  throw UsageError(fmt::format(f, std::forward<Args>(args)...));
}

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

template <class... Args>
[[noreturn]] void internal_fail(fmt::format_string<Args...> f, Args&&... args) {
  throw InternalError("internal error: " + fmt::format(f, std::forward<Args>(args)...));
}

// Runs `f`, a library call that judges an option's value by the quantity it is, and puts the flag
// before any lp::Error it throws (the same type): the library says "3 GPUs of tensor parallelism do
// not divide the model's 32 attention heads", the user reads "--tp: 3 GPUs of ...".
template <class F>
decltype(auto) for_option(const char* flag, F&& f) {
  try {
    return f();
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("{}: {}", flag, e.what()));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", flag, e.what()));
  }
}

// An option's value within [lo, hi], which NaN never is: lp::UsageError "<flag> must be between lo
// and hi, got v" otherwise. The library checks its requests' ranges with it, so that the CLI and the
// Python module refuse a value in the same words.
template <class T>
void check_range(const char* flag, T v, T lo, T hi) {
  if (!(v >= lo && v <= hi)) usage_fail("{} must be between {} and {}, got {}", flag, lo, hi, v);
}

// An option's value above 0 and finite: lp::UsageError "<flag> must be positive, got v" otherwise.
template <class T>
void check_positive(const char* flag, T v) {
  if (!(v > 0) || !std::isfinite(double(v))) usage_fail("{} must be positive, got {}", flag, v);
}

}  // namespace lp
