// The memory check before a model's weights are copied (engine/memory_budget.h): the budget from
// typed sources, the weights' need against the tensors' own sizes, and the refusal's words.
#include <gtest/gtest.h>

#include "engine/memory_budget.h"
#include "model/error.h"
#include "model/gguf.h"
#include "tests/gguf_writer.h"
#include "tests/test_util.h"

namespace lp {
namespace {

constexpr int64_t kMiB = int64_t(1) << 20;

TEST(MemoryBudget, TheLeastRoomOfEverySourceWins) {
  EXPECT_EQ(memory_budget({}).bytes, INT64_MAX);  // nothing known: nothing refused
  MemorySources s;
  s.mem_available = 800 * kMiB;
  EXPECT_EQ(memory_budget(s).bytes, 800 * kMiB);
  EXPECT_EQ(memory_budget(s).source, "MemAvailable");
  s.cgroup_max = 1000 * kMiB, s.cgroup_current = 300 * kMiB;  // 700 of room
  EXPECT_EQ(memory_budget(s).bytes, 700 * kMiB);
  EXPECT_EQ(memory_budget(s).source, "the cgroup's memory.max");
  s.rlimit_as = 4000 * kMiB, s.address_space = 3500 * kMiB;  // 500
  EXPECT_EQ(memory_budget(s).bytes, 500 * kMiB);
  EXPECT_EQ(memory_budget(s).source, "RLIMIT_AS");
  s.rlimit_data = 600 * kMiB, s.data = 700 * kMiB;  // already over: no room at all
  EXPECT_EQ(memory_budget(s).bytes, 0);
  EXPECT_EQ(memory_budget(s).source, "RLIMIT_DATA");
}

TEST(MemoryBudget, ThisProcessReadsItsOwnFigures) {
  const MemorySources s = read_memory_sources();
  ASSERT_TRUE(s.mem_available.has_value());  // every Linux since 3.14
  EXPECT_GT(*s.mem_available, 0);
  EXPECT_EQ(s.cgroup_current.has_value(), s.cgroup_max.has_value());
}

// The tiny model's tensors in F16: every dtype's bytes from the spec's shapes (weights.h's layout).
TEST(MemoryBudget, WeightsNeedWhatEachDtypeHolds) {
  testing::TinyModelSpec spec;
  spec.weight_type = GgmlType::F16;
  spec.tied = false;
  testing::TempDir dir;
  const std::string path = testing::write_tiny_model(dir.file("m.gguf"), spec);
  const GgufFile f = GgufFile::open(path);
  const int64_t D = spec.n_embd, F = spec.n_ff, L = spec.n_layer, V = testing::tiny_vocab_size();
  const int64_t Dh = D / spec.n_head, kv = spec.n_head_kv * Dh;
  const int64_t layer = D * D + 2 * D * kv + D * D + 3 * D * F;  // q, k, v, output; gate, up, down
  const int64_t matrices = L * layer + 2 * V * D;                // token_embd and output
  const int64_t vectors = L * 2 * D + D;                         // attn_norm, ffn_norm; output_norm
  EXPECT_EQ(resident_weight_bytes(f, DType::F32), 4 * (matrices + vectors));
  EXPECT_EQ(resident_weight_bytes(f, DType::BF16), 2 * matrices + 4 * vectors);
  // F16 is not a type the integer GEMM multiplies: requantized to Q8_0, 34 bytes per 32.
  EXPECT_EQ(resident_weight_bytes(f, DType::Int8), matrices / 32 * 34 + 4 * vectors);

  // An untied embedding table in a type the integer GEMM reads (Q8_0 here) stays in the file's
  // mapping in int8, its rows paged in as they are looked up: it holds nothing resident.
  {
    testing::GgufWriter w = testing::tiny_model_writer(spec);
    testing::GgufWriterTensor* e = w.find_tensor("token_embd.weight");
    ASSERT_NE(e, nullptr);
    e->type = uint32_t(GgmlType::Q8_0);
    e->data.assign(size_t(V * D / 32 * 34), 0);  // zero blocks: scale 0, every weight 0
    w.write(dir.file("q8embd.gguf"));
    const GgufFile q = GgufFile::open(dir.file("q8embd.gguf"));
    EXPECT_EQ(resident_weight_bytes(q, DType::Int8), (matrices - V * D) / 32 * 34 + 4 * vectors);
    EXPECT_EQ(resident_weight_bytes(q, DType::F32), 4 * (matrices + vectors));
  }

  check_weights_fit(f, DType::F32, {4 * (matrices + vectors), "MemAvailable"});  // exactly fits
  try {
    check_weights_fit(f, DType::F32, {4 * (matrices + vectors) - 1, "RLIMIT_DATA"});
    FAIL() << "not refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("as f32"), std::string::npos) << m;
    EXPECT_NE(m.find("(RLIMIT_DATA)"), std::string::npos) << m;
    EXPECT_NE(m.find("--dtype int8"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace lp
