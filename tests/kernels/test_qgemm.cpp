// The integer GEMM over GGUF blocks (kernels/cpu/qgemm.h): every kernel this CPU runs against the
// scalar twin (bitwise), against the math (weights dequantized by model/quant's dequantizer,
// activations as d * q, summed in double), and the quantization error against the bound it
// implies.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/context.h"
#include "kernels/cpu/qgemm.h"
#include "kernels/weights.h"
#include "model/config.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "tests/gguf_writer.h"
#include "tests/random_blocks.h"
#include "tests/test_util.h"

namespace lp {
namespace {

using testing::kQuantTypes;
using testing::random_q_rows;

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = g(rng);
  return v;
}

TEST(QGemm, ActivationQuantizationByHand) {
  std::vector<float> x(64, 0.f);
  for (int j = 0; j < 32; ++j) x[size_t(j)] = float(j - 16) / 16.f;  // max |x| = 1 (at j = 0)
  QActBlock q[2];
  quantize_activations(x.data(), 64, q);
  EXPECT_FLOAT_EQ(q[0].d, 1.f / 127.f);
  int32_t sum = 0;
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(q[0].q[j], int(std::nearbyint(float(j - 16) / 16.f * 127.f))) << j;
    sum += q[0].q[j];
  }
  EXPECT_FLOAT_EQ(q[0].s, q[0].d * float(sum));
  // A zero block: scale 0, every q 0.
  EXPECT_EQ(q[1].d, 0.f);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q[1].q[j], 0);
  EXPECT_THROW(quantize_activations(x.data(), 40, q), Error);
}

// Against the rule written out here per value (d = max|v| / 127, q = v * (127 / max|v|) rounded
// half to even, clamped to +-127, s = d * sum q; NaN scales and zero bytes for a block with a NaN
// or an infinity), bit for bit, on random blocks and on blocks of exact ties, zeros, subnormals,
// huge values and non-finite ones.
TEST(QGemm, ActivationQuantizationIsTheRuleBitForBit) {
  std::vector<float> x = random_floats(32 * 64, 5);
  // Exact ties: max 127 makes the factor 1 and v = k + 0.5; max 254 makes it 0.5 and v odd.
  for (int j = 0; j < 32; ++j) x[size_t(32 + j)] = j == 0 ? 127.f : float(j) - 15.5f;
  for (int j = 0; j < 32; ++j) x[size_t(64 + j)] = j == 0 ? -254.f : float(2 * j - 31);
  for (int j = 0; j < 32; ++j) x[size_t(96 + j)] = 0.f;
  for (int j = 0; j < 32; ++j) x[size_t(128 + j)] = 1e-42f * float(j);  // subnormals
  for (int j = 0; j < 32; ++j) x[size_t(160 + j)] = 3e38f * (j % 3 == 0 ? -1.f : 0.5f);
  x[200] = std::numeric_limits<float>::quiet_NaN();
  x[250] = std::numeric_limits<float>::infinity();
  x[290] = -std::numeric_limits<float>::infinity();
  for (int64_t b = 12; b < 64; b += 7) x[size_t(b * 32 + 3)] *= 1000.f;  // one outlier a block
  const int64_t nb = int64_t(x.size()) / kQBlock;
  std::vector<QActBlock> q(static_cast<size_t>(nb));
  quantize_activations(x.data(), int64_t(x.size()), q.data());
  const auto bits = [](float f) { return std::bit_cast<uint32_t>(f); };
  for (int64_t b = 0; b < nb; ++b) {
    const float* v = x.data() + b * kQBlock;
    float amax = 0;
    bool finite = true;
    for (int j = 0; j < kQBlock; ++j) {
      finite = finite && std::isfinite(v[j]);
      amax = std::max(amax, std::fabs(v[j]));
    }
    if (!finite) {
      EXPECT_TRUE(std::isnan(q[size_t(b)].d) && std::isnan(q[size_t(b)].s)) << "block " << b;
      for (int j = 0; j < kQBlock; ++j) EXPECT_EQ(q[size_t(b)].q[j], 0) << "block " << b;
      continue;
    }
    // The factor 127 / amax, 0 where it is not finite: an all-zero block, and the subnormal one
    // (1e-42 x j), whose values all become 0 (the factor would be infinite and 0 x inf NaN).
    const float inv = 127.f / amax;
    const float d = amax / 127.f, id = std::isfinite(inv) ? inv : 0.f;
    int32_t sum = 0;
    for (int j = 0; j < kQBlock; ++j) {
      const float r = v[j] * id;
      float rounded = std::floor(r);
      const float frac = r - rounded;
      if (frac > 0.5f || (frac == 0.5f && std::fmod(rounded, 2.f) != 0.f)) rounded += 1.f;
      const int want = std::clamp(int(rounded), -127, 127);
      ASSERT_EQ(q[size_t(b)].q[j], want) << "block " << b << " value " << j << " = " << v[j];
      sum += want;
    }
    EXPECT_EQ(bits(q[size_t(b)].d), bits(d)) << "block " << b;
    EXPECT_EQ(bits(q[size_t(b)].s), bits(d * float(sum))) << "block " << b;
  }
}

TEST(QGemm, DotIsTheMathOfTheDequantizedBlocks) {
  const int64_t K = 256, nb = K / kQBlock;
  for (GgmlType t : kQuantTypes) {
    const std::vector<uint8_t> w = random_q_rows(t, 1, K, 7);
    std::vector<float> wd(static_cast<size_t>(K));
    dequantize(t, w.data(), wd.data(), K);
    const std::vector<float> x = random_floats(K, 11);
    std::vector<QActBlock> a(static_cast<size_t>(nb));
    quantize_activations_for(t, x.data(), K, a.data());
    double exact = 0, mag = 0, bound = 0, wabs = 0;
    for (int64_t b = 0; b < nb; ++b) {
      double wb = 0;
      for (int j = 0; j < kQBlock; ++j) {
        const double wj = wd[size_t(b * kQBlock + j)];
        exact += wj * double(a[size_t(b)].d) * a[size_t(b)].q[j];
        mag += std::fabs(wj * double(a[size_t(b)].d) * a[size_t(b)].q[j]);
        wb += std::fabs(wj);
      }
      // Rounding each activation moves it by at most d / 2.
      bound += wb * double(a[size_t(b)].d) / 2;
      wabs += wb;
    }
    double f32_dot = 0;
    for (int64_t j = 0; j < K; ++j) f32_dot += double(wd[size_t(j)]) * x[size_t(j)];
    for (QKernel k : supported_qkernels()) {
      const float got = qdot(k, t, w.data(), a.data(), nb);
      EXPECT_NEAR(got, exact, 1e-5 * mag + 1e-7) << type_info(uint32_t(t))->name << " " << qkernel_name(k);
      // Against the f32 activations: within the activation quantization's own bound.
      EXPECT_LE(std::fabs(got - f32_dot), bound + 1e-5 * mag) << type_info(uint32_t(t))->name;
    }
    EXPECT_GT(bound, 0) << wabs;
  }
}

// Every kernel this CPU runs gives the scalar twin's bits, over M and N that are not multiples of
// the tiles, the 32-output panels or the 64 x 64 chunks, with row strides wider than the rows, on 1
// and 2 threads; 37 rows take the panels of the 512-bit and AVX2 kernels, 13, 8, 7, 2 and 1 their
// decoding tiles (row groups of 8 and 5 on AVX-512, 4 and 1 on AVX2, ..., 1) and the 256-bit
// kernel's tiles.
TEST(QGemm, EveryKernelMatchesTheScalarTwinBitForBit) {
  const int64_t N = 70, K = 512, lda = K + 5, ldc = N + 3, nb = K / kQBlock;
  CpuContext one(1), two(2);
  for (int64_t M : {37, 13, 8, 7, 2, 1}) {
    const std::vector<float> A = random_floats(M * lda, 3);
    for (GgmlType t : kQuantTypes) {
      const std::vector<uint8_t> W = random_q_rows(t, N, K, 5);
      std::vector<float> ref(size_t(M * ldc), -1.f);
      qgemm(one, QKernel::Scalar, t, A.data(), M, lda, W.data(), N, K, ref.data(), ldc);
      // The scalar GEMM is the scalar dot of each row pair.
      for (int64_t m = 0; m < M; m += 3) {
        std::vector<QActBlock> a(static_cast<size_t>(nb));
        quantize_activations_for(t, A.data() + m * lda, K, a.data());
        for (int64_t n = 0; n < N; n += 7)
          EXPECT_EQ(ref[size_t(m * ldc + n)],
                    qdot(QKernel::Scalar, t, W.data() + n * *type_bytes(t, K), a.data(), nb));
      }
      for (QKernel k : supported_qkernels())
        for (CpuContext* ctx : {&one, &two}) {
          std::vector<float> got(size_t(M * ldc), -1.f);
          qgemm(*ctx, k, t, A.data(), M, lda, W.data(), N, K, got.data(), ldc);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < ldc; ++n)
              ASSERT_EQ(got[size_t(m * ldc + n)], ref[size_t(m * ldc + n)])
                  << type_info(uint32_t(t))->name << " " << qkernel_name(k) << " threads " << ctx->threads()
                  << " M " << M << " m " << m << " n " << n;
        }
    }
  }
}

// Weights packed once (qpack) give the scalar twin's bits through the AVX2 kernel, the 512-bit VNNI
// kernel and, where the CPU grants AMX, the tile kernel, for every row count (37: 6 tiles of 6 and
// one of 1, or two AMX row tiles of 32, the second 5 rows and 27 of padding; 32: one whole; 8: 6
// and 2; 1; AVX2: 2-row tiles over each half widened, or 8, 7 and 1 rows read as packed), 70
// outputs (two full panels and one of 6 lanes: AVX2's second half of it empty), strided rows, 1
// and 2 threads. Types without a packed form, and CPUs without AVX2, get none.
TEST(QGemm, PackedWeightsMatchTheScalarTwinBitForBit) {
  const int64_t N = 70, K = 512, lda = K + 5, ldc = N + 3;
  CpuContext one(1), two(2);
  const bool avx2 = qkernel_supported(QKernel::Avx2);
  for (GgmlType t : kQuantTypes) {
    const std::vector<uint8_t> W = random_q_rows(t, N, K, 23);
    const auto packed = qpack(two, t, W.data(), N, K);
    const bool packs = t != GgmlType::Q5_0 && t != GgmlType::Q5_1;
    ASSERT_EQ(packed != nullptr, avx2 && packs) << type_info(uint32_t(t))->name;
    if (!packed) continue;
    // As many bytes as the blocks (f16 scales, nibbles and high bits kept), rounded up to whole
    // panels; Q4_K and Q5_K hold their 12 bytes of 6-bit multipliers a super-block as 16 bytes.
    const int64_t extra = t == GgmlType::Q4_K || t == GgmlType::Q5_K ? 4 * K / 256 : 0;
    EXPECT_EQ(qpacked_bytes(*packed), 3 * 32 * (*type_bytes(t, K) + extra));
    for (int64_t M : {37, 32, 8, 7, 1}) {
      const std::vector<float> A = random_floats(M * lda, 29);
      std::vector<float> ref(size_t(M * ldc), -1.f);
      qgemm(one, QKernel::Scalar, t, A.data(), M, lda, W.data(), N, K, ref.data(), ldc);
      const QPart part{t, N, W.data(), packed.get()};
      for (QKernel k : supported_qkernels())
        for (CpuContext* ctx : {&one, &two}) {
          if (!qkernel_uses_panels(k)) continue;
          std::vector<float> got(size_t(M * ldc), -1.f);
          qgemm(*ctx, k, A.data(), M, lda, {&part, 1}, K, got.data(), ldc);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < ldc; ++n)
              ASSERT_EQ(got[size_t(m * ldc + n)], ref[size_t(m * ldc + n)])
                  << type_info(uint32_t(t))->name << " " << qkernel_name(k) << " threads " << ctx->threads()
                  << " M " << M << " m " << m << " n " << n;
        }
    }
  }
}

// Many panels (19 of 32 outputs, 38 of 16) over more rows than the tiles' multiples, on 2 threads.
TEST(QGemm, ManyPanelsMatchTheScalarTwin) {
  const int64_t M = 101, N = 600, K = 256, nb = K / kQBlock;
  CpuContext two(2);
  const std::vector<float> A = random_floats(M * K, 17);
  for (GgmlType t : kQuantTypes) {
    const std::vector<uint8_t> W = random_q_rows(t, N, K, 19);
    std::vector<QActBlock> a(static_cast<size_t>(M * nb));
    for (int64_t m = 0; m < M; ++m) quantize_activations_for(t, A.data() + m * K, K, a.data() + m * nb);
    for (QKernel k : supported_qkernels()) {
      std::vector<float> got(static_cast<size_t>(M * N));
      qgemm(two, k, t, A.data(), M, K, W.data(), N, K, got.data(), N);
      for (int64_t m = 0; m < M; m += 5)
        for (int64_t n = 0; n < N; n += 3)
          ASSERT_EQ(got[size_t(m * N + n)],
                    qdot(QKernel::Scalar, t, W.data() + n * *type_bytes(t, K), a.data() + m * nb, nb))
              << type_info(uint32_t(t))->name << " " << qkernel_name(k) << " m " << m << " n " << n;
    }
  }
}

// The rows a pass takes: all while M rows' quantized activations fit a third of the cache, else
// whole 48-row tiles, no more passes than the cache needs, and each pass within the third.
TEST(QGemm, PassRowsFitAThirdOfTheCacheInWholeTiles) {
  const int64_t cache = int64_t(32) << 20;
  for (const int64_t K : {256, 4096, 14336})
    for (const int64_t M : {1, 15, 16, 47, 48, 100, 511, 512, 2029, 2048, 8192}) {
      const int64_t row_bytes = K / kQBlock * int64_t(sizeof(QActBlock)), budget = cache / 3;
      const int64_t rows = qgemm_pass_rows(M, K, cache);
      SCOPED_TRACE(::testing::Message() << "M " << M << " K " << K);
      if (M * row_bytes <= budget || M < 16) {
        EXPECT_EQ(rows, M);
        continue;
      }
      EXPECT_EQ(rows % 48, 0);
      EXPECT_LE(rows * row_bytes, budget);
      const int64_t most = budget / row_bytes / 48 * 48;  // the most whole tiles the third holds
      EXPECT_EQ((M + rows - 1) / rows, (M + most - 1) / most);
    }
  // A cache too small for one tile still moves in 48-row passes; none at all leaves one pass.
  EXPECT_EQ(qgemm_pass_rows(1000, 4096, 1024), 48);
  EXPECT_EQ(qgemm_pass_rows(1000, 4096, 0), 1000);
}

// A GEMM in passes (a context whose cache holds 48 rows a pass) gives the bits of one pass, for
// every type and kernel, packed at load or not, rows and passes not multiples of the tiles.
TEST(QGemm, PassesGiveTheBitsOfOnePass) {
  const int64_t M = 101, N = 40, K = 512, nb = K / kQBlock;
  CpuContext whole(2), passes(2);
  passes.set_cache_bytes(3 * 48 * nb * int64_t(sizeof(QActBlock)));
  ASSERT_EQ(qgemm_pass_rows(M, K, passes.cache_bytes()), 48);
  const std::vector<float> A = random_floats(M * K, 31);
  for (GgmlType t : kQuantTypes) {
    const std::vector<uint8_t> W = random_q_rows(t, N, K, 37);
    const auto packed = qpack(whole, t, W.data(), N, K);
    std::vector<QPart> parts{QPart{t, N, W.data()}};
    if (packed) parts.push_back(QPart{t, N, W.data(), packed.get()});
    for (const QPart& part : parts) {
      for (QKernel k : supported_qkernels()) {
        std::vector<float> want(size_t(M * N), -1.f), got(size_t(M * N), -2.f);
        qgemm(whole, k, A.data(), M, K, {&part, 1}, K, want.data(), N);
        qgemm(passes, k, A.data(), M, K, {&part, 1}, K, got.data(), N);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << type_info(uint32_t(t))->name << " " << qkernel_name(k) << (part.packed ? " packed" : "");
      }
    }
  }
}

// Where the quants (high bits included) lie in a block of t, the rest being its scales and minima
// (docs/gguf.md's layouts).
std::pair<int, int> quant_bytes(GgmlType t) {
  const int end = int(type_info(uint32_t(t))->block_bytes);
  switch (t) {
    case GgmlType::Q4_1:
    case GgmlType::Q5_1:
      return {4, end};
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
      return {16, end};
    case GgmlType::Q6_K:
      return {0, 192};  // ql and qh, then the 16 sub-scales and d
    default:
      return {2, end};
  }
}

// Every weight at the largest magnitude its kernel multiplies (all quant bits set: 15, 31 or 63
// unsigned; Q8_0 -128 in even rows, 127 in odd ones) times activations all at +127 or all at -127:
// the AVX2 kernels add several groups' vpmaddubsw pairs in 16 bits before widening them, and these
// sums are the largest the types allow. Every kernel, as stored and packed, decoding (8, 2, 1
// rows) and panels (37), gives the scalar twin's bits.
TEST(QGemm, LargestWeightsAndActivationsMatchTheScalarTwin) {
  const int64_t N = 40, K = 512;
  CpuContext two(2);
  for (GgmlType t : kQuantTypes) {
    std::vector<uint8_t> W = random_q_rows(t, N, K, 41);
    const TypeInfo info = *type_info(uint32_t(t));
    const auto [lo, hi] = quant_bytes(t);
    for (int64_t n = 0; n < N; ++n) {
      const int fill = t != GgmlType::Q8_0 ? 0xff : n % 2 ? 0x7f : 0x80;
      for (int64_t b = 0; b < K / info.block_elems; ++b)
        std::memset(W.data() + (n * K / info.block_elems + b) * info.block_bytes + lo, fill, size_t(hi - lo));
    }
    const auto packed = qpack(two, t, W.data(), N, K);
    std::vector<QPart> parts{QPart{t, N, W.data()}};
    if (packed) parts.push_back(QPart{t, N, W.data(), packed.get()});
    for (int64_t M : {37, 8, 2, 1}) {
      std::vector<float> A(size_t(M * K));
      for (int64_t m = 0; m < M; ++m) std::fill_n(A.data() + m * K, K, m % 2 ? -1.f : 1.f);
      std::vector<float> ref(size_t(M * N), -1.f);
      qgemm(two, QKernel::Scalar, t, A.data(), M, K, W.data(), N, K, ref.data(), N);
      for (const QPart& part : parts)
        for (QKernel k : supported_qkernels()) {
          std::vector<float> got(size_t(M * N), -2.f);
          qgemm(two, k, A.data(), M, K, {&part, 1}, K, got.data(), N);
          ASSERT_EQ(0, std::memcmp(ref.data(), got.data(), ref.size() * sizeof(float)))
              << type_info(uint32_t(t))->name << " " << qkernel_name(k) << (part.packed ? " packed" : "")
              << " M " << M;
        }
    }
  }
}

// ONEDNN_MAX_CPU_ISA's names (oneDNN's docs, "CPU ISA hints") as the integer GEMM's cap, any case.
TEST(QGemmCap, OneDnnNamesCapTheKernels) {
  EXPECT_EQ(qkernel_cap(nullptr), QKernel::Amx);
  for (const char* v : {"ALL", "DEFAULT", "avx512_core_amx", "AVX512_CORE_AMX_FP16", "no such isa", ""})
    EXPECT_EQ(qkernel_cap(v), QKernel::Amx) << v;
  for (const char* v : {"AVX512_CORE_VNNI", "avx512_core_bf16", "AVX512_CORE_FP16", "AVX10_1_512"})
    EXPECT_EQ(qkernel_cap(v), QKernel::Avx512Vnni512) << v;
  for (const char* v : {"AVX2", "avx2", "Avx2_Vnni", "AVX2_VNNI_2", "AVX512_CORE"})
    EXPECT_EQ(qkernel_cap(v), QKernel::Avx2) << v;
  for (const char* v : {"SSE41", "avx"}) EXPECT_EQ(qkernel_cap(v), QKernel::Scalar) << v;
}

// Under the cap this process was started with, nothing above it runs (ctest qgemm_capped_at_avx2
// runs this with ONEDNN_MAX_CPU_ISA=avx2; the plain run has no cap), and the AVX2 kernel it leaves
// still gets weights packed at load.
TEST(QGemmCap, NothingAboveTheCapRuns) {
  const QKernel cap = qkernel_cap(std::getenv("ONEDNN_MAX_CPU_ISA"));
  if (cap == QKernel::Avx2) {
    EXPECT_FALSE(qkernel_supported(QKernel::Avx512Vnni));
    EXPECT_FALSE(qkernel_supported(QKernel::Avx512Vnni512));
    EXPECT_FALSE(qkernel_supported(QKernel::Amx));
    EXPECT_NE(best_qkernel(), QKernel::Avx512Vnni512);
    CpuContext one(1);
    const std::vector<uint8_t> W = random_q_rows(GgmlType::Q4_K, 32, 256, 3);
    EXPECT_EQ(qpack(one, GgmlType::Q4_K, W.data(), 32, 256) != nullptr, qkernel_supported(QKernel::Avx2));
  }
  for (QKernel k : supported_qkernels()) EXPECT_TRUE(qkernel_supported(k));
  EXPECT_TRUE(qkernel_supported(best_qkernel()));
}

// Batch members multiplied side by side (CpuContext::side_by_side, as a batched decoding step
// runs them), each a GEMM with its own rows and each thread's scratch shared by the members it
// runs: the same bits as each GEMM alone. Panels (20 rows) and decoding tiles (5 rows), weights
// packed at load where the CPU has AVX2 (the unpacked paths through the scalar and 256-bit VNNI kernels).
TEST(QGemm, MembersSideBySideGiveWhatEachGivesAlone) {
  const int64_t N = 96, K = 256;
  CpuContext two(2), one(1);
  for (GgmlType t : {GgmlType::Q4_1, GgmlType::Q6_K, GgmlType::Q8_0}) {
    const std::vector<uint8_t> W = random_q_rows(t, N, K, 23);
    const auto packed = qpack(two, t, W.data(), N, K);
    const QPart part{t, N, W.data(), packed.get()};
    for (QKernel k : supported_qkernels()) {
      const std::vector<int64_t> rows = {20, 5, 20, 5, 1, 33};
      std::vector<std::vector<float>> A, alone, together;
      for (size_t i = 0; i < rows.size(); ++i) {
        A.push_back(random_floats(rows[i] * K, 29 + uint32_t(i)));
        alone.emplace_back(size_t(rows[i] * N));
        together.emplace_back(size_t(rows[i] * N));
        qgemm(one, k, A[i].data(), rows[i], K, {&part, 1}, K, alone[i].data(), N);
      }
      two.side_by_side(int64_t(rows.size()), [&](int64_t i) {
        qgemm(two, k, A[size_t(i)].data(), rows[size_t(i)], K, {&part, 1}, K, together[size_t(i)].data(), N);
      });
      for (size_t i = 0; i < rows.size(); ++i)
        ASSERT_EQ(together[i], alone[i])
            << type_info(uint32_t(t))->name << " " << qkernel_name(k) << " member " << i;
    }
  }
}

TEST(QGemm, RefusesWhatItCannotMultiply) {
  CpuContext ctx(1);
  std::vector<float> A(64), C(4);
  std::vector<uint8_t> W(1024);
  EXPECT_THROW(qgemm(ctx, QKernel::Scalar, GgmlType::Q4_K, A.data(), 1, 64, W.data(), 1, 64, C.data(), 1),
               Error);
  EXPECT_THROW(qgemm(ctx, QKernel::Scalar, GgmlType::Q8_0, A.data(), 1, 40, W.data(), 1, 40, C.data(), 1),
               Error);
  EXPECT_TRUE(qgemm_supports(GgmlType::Q4_1));
  EXPECT_FALSE(qgemm_supports(GgmlType::F32));
  EXPECT_EQ(supported_qkernels().front(), QKernel::Scalar);
  EXPECT_TRUE(qkernel_supported(best_qkernel()));
}

}  // namespace
}  // namespace lp

namespace lp {
namespace {

// --dtype int8 at load: a Q4_K tensor is kept as stored (read where the file is mapped, not
// copied), a matrix of f32 tensors is requantized to Q8_0 (each row's blocks as quantize_q8_0
// writes them).
// A one-layer model of width D (whole K-quant super-blocks) whose attn_output [D][D] holds random
// blocks of type t; the rest f32.
testing::GgufWriter model_with_wo(GgmlType t, int64_t D, uint32_t seed) {
  testing::TinyModelSpec spec;
  spec.n_embd = D;
  spec.n_ff = 256;
  spec.n_layer = 1;
  testing::GgufWriter w = testing::tiny_model_writer(spec);
  testing::GgufWriterTensor* o = w.find_tensor("blk.0.attn_output.weight");
  o->type = uint32_t(t);
  o->data = random_q_rows(t, D, D, seed);
  return w;
}

// The file at `path`, opened into `f`, loaded in --dtype int8.
Weights load_int8(const std::string& path, std::shared_ptr<const GgufFile>& f, int threads) {
  f = std::make_shared<const GgufFile>(GgufFile::open(path));
  CpuContext ctx(threads);
  return load_weights(f, config_from_gguf(*f), DType::Int8, ctx);
}
// `w` written as `name` in `dir`, then as load_int8 on 2 threads.
Weights write_and_load_int8(const testing::GgufWriter& w, const testing::TempDir& dir,
                            const std::string& name, std::shared_ptr<const GgufFile>& f) {
  const std::string path = dir.file(name);
  w.write(path);
  return load_int8(path, f, 2);
}

TEST(QGemm, Int8LoadKeepsQ4KBlocksAndRequantizesTheRest) {
  testing::GgufWriter w = model_with_wo(GgmlType::Q4_K, 256, 9);
  const testing::GgufWriterTensor* o = w.find_tensor("blk.0.attn_output.weight");
  testing::TempDir dir;
  std::shared_ptr<const GgufFile> f;
  const Weights wt = write_and_load_int8(w, dir, "q4k.gguf", f);
  const Matrix& wo = wt.layers[0].wo;
  EXPECT_EQ(wo.qtype(), GgmlType::Q4_K);
  ASSERT_EQ(wo.bytes(), int64_t(o->data.size()));
  ASSERT_EQ(wo.parts.size(), 1u);
  EXPECT_EQ(wo.parts[0].data, f->tensor("blk.0.attn_output.weight").data);
  EXPECT_EQ(wo.q.size(), 0);
  EXPECT_EQ(std::memcmp(wo.parts[0].data, o->data.data(), o->data.size()), 0);
  const Matrix& down = wt.layers[0].w_down;
  EXPECT_EQ(down.qtype(), GgmlType::Q8_0);
  std::vector<float> row(static_cast<size_t>(down.cols));
  dequantize(GgmlType::F32, f->tensor("blk.0.ffn_down.weight").data, row.data(), down.cols);
  std::vector<uint8_t> q8(static_cast<size_t>(*type_bytes(GgmlType::Q8_0, down.cols)));
  quantize_q8_0(row.data(), down.cols, q8.data());
  ASSERT_EQ(down.parts.size(), 1u);
  EXPECT_EQ(down.parts[0].data, down.q.data());
  EXPECT_EQ(std::memcmp(down.q.data(), q8.data(), q8.size()), 0);
}

// A matrix stacked from tensors of different kept types (Q4_K_M's attn_q and attn_k in Q4_K,
// attn_v in Q6_K) keeps each as stored, one part per tensor read where the file is mapped; its GEMM
// gives each part's own outputs bitwise, and the CUDA upload's contiguous copy requantizes the
// mixed matrix to Q8_0 row by row.
TEST(QGemm, Int8LoadKeepsMixedTypesAsParts) {
  testing::TinyModelSpec spec;
  spec.n_embd = 256;
  spec.n_ff = 256;
  spec.n_layer = 1;
  testing::GgufWriter w = testing::tiny_model_writer(spec);
  uint32_t seed = 21;
  for (const auto& [name, t] : {std::pair<const char*, GgmlType>{"blk.0.attn_q.weight", GgmlType::Q4_K},
                                {"blk.0.attn_k.weight", GgmlType::Q4_K},
                                {"blk.0.attn_v.weight", GgmlType::Q6_K}}) {
    testing::GgufWriterTensor* x = w.find_tensor(name);
    x->type = uint32_t(t);
    x->data = random_q_rows(t, int64_t(x->ne[1]), 256, seed++);
  }
  testing::TempDir dir;
  std::shared_ptr<const GgufFile> f;
  const Weights wt = write_and_load_int8(w, dir, "mixed.gguf", f);
  const Matrix& qkv = wt.layers[0].wqkv;
  ASSERT_EQ(qkv.parts.size(), 3u);
  EXPECT_TRUE(qkv.mixed());
  EXPECT_EQ(qkv.q.size(), 0);
  int64_t bytes = 0;
  for (const auto& [i, name, t] :
       {std::tuple<int, const char*, GgmlType>{0, "blk.0.attn_q.weight", GgmlType::Q4_K},
        {1, "blk.0.attn_k.weight", GgmlType::Q4_K},
        {2, "blk.0.attn_v.weight", GgmlType::Q6_K}}) {
    EXPECT_EQ(qkv.parts[size_t(i)].type, t);
    EXPECT_EQ(qkv.parts[size_t(i)].data, f->tensor(name).data);
    bytes += int64_t(f->tensor(name).n_bytes);
  }
  EXPECT_EQ(qkv.bytes(), bytes);
  // The stacked GEMM is each part's GEMM, side by side.
  const int64_t M = 5, K = qkv.cols, N = qkv.rows;
  const std::vector<float> A = random_floats(M * K, 8);
  CpuContext ctx(2);
  for (QKernel k : supported_qkernels()) {
    std::vector<float> got(static_cast<size_t>(M * N)), want(static_cast<size_t>(M * N));
    qgemm(ctx, k, A.data(), M, K, qkv.parts, K, got.data(), N);
    int64_t n0 = 0;
    for (const QPart& p : qkv.parts) {
      qgemm(ctx, QKernel::Scalar, p.type, A.data(), M, K, p.data, p.rows, K, want.data() + n0, N);
      n0 += p.rows;
    }
    EXPECT_EQ(got, want) << qkernel_name(k);
  }
  GgmlType t = GgmlType::F32;
  const std::vector<uint8_t> joined = qkv.contiguous_blocks(&t);
  EXPECT_EQ(t, GgmlType::Q8_0);
  const int64_t rb = *type_bytes(GgmlType::Q8_0, K);
  ASSERT_EQ(int64_t(joined.size()), N * rb);
  std::vector<float> row(static_cast<size_t>(K));
  std::vector<uint8_t> q8(static_cast<size_t>(rb));
  for (int64_t r : {int64_t(0), qkv.parts[0].rows + 3, N - 1}) {
    qkv.row_f32(r, row.data());
    quantize_q8_0(row.data(), K, q8.data());
    EXPECT_EQ(std::memcmp(joined.data() + r * rb, q8.data(), size_t(rb)), 0) << "row " << r;
  }
}

// The types kept as stored keep their blocks whatever the field order: Q6_K's scale is its last
// two bytes, Q5_1's minimum follows its scale. A NaN or infinite one is refused at load, naming the
// tensor, the row and the block.
TEST(QGemm, Int8LoadChecksEveryScaleFieldOfTheKeptTypes) {
  struct Case {
    GgmlType t;
    int field;  // byte offset of the f16 to spoil in block 1 of row 2
    uint16_t bad;
    const char* what;
  };
  for (const Case c : {Case{GgmlType::Q6_K, 208, 0x7E00, "NaN"}, Case{GgmlType::Q5_1, 2, 0x7C00, "infinite"},
                       Case{GgmlType::Q5_K, 2, 0xFC00, "infinite"}, Case{GgmlType::Q5_0, 0, 0x7E01, "NaN"}}) {
    SCOPED_TRACE(type_info(uint32_t(c.t))->name);
    testing::GgufWriter w = model_with_wo(c.t, 512, 13);  // rows of two K-quant super-blocks
    testing::GgufWriterTensor* o = w.find_tensor("blk.0.attn_output.weight");
    testing::TempDir dir;
    const std::string good = dir.file("good.gguf");
    w.write(good);
    {
      std::shared_ptr<const GgufFile> f;
      const Weights wt = load_int8(good, f, 1);
      EXPECT_EQ(wt.layers[0].wo.qtype(), c.t);
      EXPECT_EQ(wt.layers[0].wo.parts.at(0).data, f->tensor("blk.0.attn_output.weight").data);
    }
    const TypeInfo info = *type_info(uint32_t(c.t));
    const int64_t row_bytes = *type_bytes(c.t, 512);
    uint8_t* f16 = o->data.data() + 2 * row_bytes + info.block_bytes + c.field;
    f16[0] = uint8_t(c.bad & 255);
    f16[1] = uint8_t(c.bad >> 8);
    const std::string bad = dir.file("bad.gguf");
    w.write(bad);
    std::shared_ptr<const GgufFile> f;
    try {
      (void)load_int8(bad, f, 1);
      ADD_FAILURE() << "loaded a " << c.what << " scale";
    } catch (const Error& e) {
      const std::string msg = e.what();
      for (const std::string& part :
           {std::string("blk.0.attn_output.weight"), std::string(c.what), std::string("row 2, block 1")})
        EXPECT_NE(msg.find(part), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace lp
