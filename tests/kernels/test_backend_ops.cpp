// The op harness (tests/backend_ops.h) on the CPU backend: every case of the table against the
// scalar references.
#include <gtest/gtest-spi.h>

#include "kernels/cpu/backend.h"
#include "tests/backend_ops.h"

namespace lp::testing {
namespace {

class CpuBackendOps : public ::testing::TestWithParam<OpCase> {};

TEST_P(CpuBackendOps, MatchesTheReference) {
  CpuContext ctx(2);
  run_op_case(GetParam(),
              [&](const ModelConfig& c, const Weights& w, int64_t n_ctx) -> std::unique_ptr<Backend> {
                return std::make_unique<CpuBackend>(ctx, c, w, n_ctx);
              });
}

INSTANTIATE_TEST_SUITE_P(Table, CpuBackendOps, ::testing::ValuesIn(op_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& i) { return case_name(i.param); });

}  // namespace
}  // namespace lp::testing

namespace lp::testing {
namespace {

// The harness can fail: a CPU backend whose attention output is off by 2^-9 relative (a bf16
// rounding, the size of error the f32 bound must not let through) or whose GEMM drops the last
// input column fails its cases.
class SkewedBackend : public CpuBackend {
 public:
  using CpuBackend::CpuBackend;
  void attention(int layer, std::span<const int32_t> slots, bool scored) override {
    CpuBackend::attention(layer, slots, scored);
    std::vector<float> a = read(Tensor::Attn);
    for (auto& v : a) v *= 1.0f + 1.0f / 512;
    write(Tensor::Attn, a);
  }
  void matmul(Proj p, int layer) override {
    if (p == Proj::GateUp) {  // the last input column zeroed
      std::vector<float> xn = read(Tensor::XN);
      const size_t D = 96;  // the op model's width
      for (size_t i = D - 1; i < xn.size(); i += D) xn[i] = 0;
      write(Tensor::XN, xn);
    }
    CpuBackend::matmul(p, layer);
  }
};

void run_skewed(OpKind op) {
  CpuContext ctx(1);
  run_op_case({op, 17, 3, DType::F32},
              [&](const ModelConfig& c, const Weights& w, int64_t n_ctx) -> std::unique_ptr<Backend> {
                return std::make_unique<SkewedBackend>(ctx, c, w, n_ctx);
              });
}

TEST(CpuBackendOpsHarness, FailsAWrongBackend) {
  EXPECT_NONFATAL_FAILURE(run_skewed(OpKind::Attention), "nmse");
  EXPECT_NONFATAL_FAILURE(run_skewed(OpKind::AttentionUnordered), "nmse");
  EXPECT_NONFATAL_FAILURE(run_skewed(OpKind::MatmulGateUp), "nmse");
}

}  // namespace
}  // namespace lp::testing
