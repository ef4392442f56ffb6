// Shared by the libFuzzer harnesses (fuzz/README.md): the input as a file the parsers can open,
// and the rule every harness checks: bad input ends in lp::Error (one clear line in the CLI),
// never a crash, a sanitizer report, a hang, or any other exception.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "model/error.h"

namespace lp::fuzz {

// The bytes as a regular file without touching the disk: a memfd, opened by the parsers as
// /proc/self/fd/N (fstat says regular file, mmap works). One per process, rewritten per input.
class MemFile {
 public:
  MemFile() : fd_(::memfd_create("lp-fuzz", 0)) {
    if (fd_ < 0) std::abort();
  }
  const std::string& write(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0 || (size > 0 && ::pwrite(fd_, data, size, 0) != ssize_t(size))) std::abort();
    path_ = "/proc/self/fd/" + std::to_string(fd_);
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

inline MemFile& mem_file() {
  static MemFile f;
  return f;
}

// Runs `f`; lp::Error (the project's one-line refusal) is the only way out besides success.
template <class F>
void refuses_cleanly(F&& f) {
  try {
    f();
  } catch (const lp::Error&) {
  }
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace lp::fuzz
