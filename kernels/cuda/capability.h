// Whether this build's CUDA kernels can run on a GPU, from its compute capability: plain C++, so that
// the rule is tested without a GPU (tests/kernels/test_cuda_math.cpp) and open_device() refuses a GPU
// it does not cover with one line, before the first launch would fail with "no kernel image".
#pragma once

#include <fmt/format.h>

#include <cctype>
#include <string>
#include <string_view>

namespace lp::cuda {

// The kernels' floor: bf16 tensor-core instructions (mma.sync m16n8k16 bf16) and cp.async are sm_80's.
inline constexpr int kMinCapability = 80;

// Why kernels built for `archs` (CMAKE_CUDA_ARCHITECTURES as CMake takes it, e.g. "80;89;90") cannot
// run on a GPU named `gpu` of compute capability major.minor; empty when they can. An entry "NN" is
// machine code for sm_NN (runs on major N, minor >= its minor) and PTX for compute_NN (the driver
// compiles it for any GPU at NN or later); "NN-real" is the machine code alone, "NN-virtual" the PTX
// alone; an "a" or "f" suffix (arch-specific features) runs only on that exact capability. A list
// that names no numbers ("native", "all", "all-major") is taken as covering the GPU.
inline std::string unsupported_capability(std::string_view gpu, int major, int minor,
                                          std::string_view archs) {
  const int cc = major * 10 + minor;
  if (cc < kMinCapability)
    return fmt::format(
        "the GPU '{}' has compute capability {}.{}, and the CUDA backend's kernels need {}.{} or newer "
        "(bf16 tensor-core instructions: Ampere, Ada, Hopper and later); run on the CPU instead (--backend "
        "cpu)",
        gpu, major, minor, kMinCapability / 10, kMinCapability % 10);
  bool numbered = false;
  std::string listed;
  size_t at = 0;
  while (at <= archs.size()) {
    const size_t end = std::min(archs.find_first_of("; ,", at), archs.size());
    std::string_view e = archs.substr(at, end - at);
    at = end + 1;
    if (e.empty()) continue;
    size_t digits = 0;
    while (digits < e.size() && std::isdigit(static_cast<unsigned char>(e[digits]))) ++digits;
    if (digits == 0) return {};  // native, all, all-major: whatever the build machine chose
    numbered = true;
    const int n = std::stoi(std::string(e.substr(0, digits)));
    std::string_view rest = e.substr(digits);
    const bool exact = !rest.empty() && (rest[0] == 'a' || rest[0] == 'f');
    if (exact) rest.remove_prefix(1);
    const bool sass = rest != "-virtual", ptx = rest != "-real";
    listed += fmt::format("{}{}.{}", listed.empty() ? "" : ", ", n / 10, n % 10);
    if (exact ? cc == n : ((sass && cc / 10 == n / 10 && cc >= n) || (ptx && cc >= n))) return {};
  }
  if (!numbered) return {};
  return fmt::format(
      "this build's CUDA kernels are for compute capability {} and cannot run on the GPU '{}' ({}.{}): "
      "rebuild with -DCMAKE_CUDA_ARCHITECTURES={}{}, or run on the CPU (--backend cpu)",
      listed, gpu, major, minor, major, minor);
}

}  // namespace lp::cuda
