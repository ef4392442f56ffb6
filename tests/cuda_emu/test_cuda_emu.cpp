// The CUDA session's logic without a GPU: kernels/cuda/cuda_session.cpp linked over the host
// emulation of its launchers (kernels/cuda/host_emulation.cpp: CPU references), compared with the
// CPU backend exactly as the GPU suite compares the real thing: the same kept tokens, pairs and
// Aux Cache in a pruned prefill, and the same greedy tokens and revivals when decoding with
// LazyLLM and static. What this cannot check, the kernels' own arithmetic on a device, is checked
// by the CudaMath tests (the arithmetic) and the GPU suite (the launches).
#include <gtest/gtest.h>

#include "tests/gpu/compare_backends.h"

namespace lp {
namespace {


TEST(CudaSessionEmulated, PrunedPrefillMatchesTheCpuBackend) {
  testing::TempDir dir;
  const std::string path = write_compare_model(dir);
  compare_forward(path, 150, "none", PolicyKind::None);
  compare_forward(path, 150, "1:0.3,3:0.3,4:0.5", PolicyKind::LazyLLM);
  compare_forward(path, 77, "2:0.4", PolicyKind::Static);
  compare_forward(path, 64, "0:0.5,1:0.5,2:0.5", PolicyKind::Random);
}

TEST(CudaSessionEmulated, GenerationWithRevivalMatchesTheCpuBackend) {
  testing::TempDir dir;
  const std::string path = write_compare_model(dir);
  compare_generate(path, 120, PolicyKind::LazyLLM);
  compare_generate(path, 120, PolicyKind::Static);
  compare_generate(path, 60, PolicyKind::Random);
  compare_generate(path, 120, PolicyKind::None);
}

}  // namespace
}  // namespace lp
