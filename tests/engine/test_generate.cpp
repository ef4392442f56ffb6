// generate()'s warm-up (GenerateOptions::warmup): the same prefill and one decoding step run untimed
// first, then Session::reset; the timed run must not see any of it.

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "engine/generate.h"
#include "kernels/context.h"
#include "model/gguf.h"
#include "pruning/schedule.h"
#include "tests/gguf_writer.h"
#include "tests/test_util.h"

namespace lp {
namespace {

TEST(Generate, AWarmUpLeavesTheTimedRunUnchanged) {
  testing::TempDir dir;
  testing::TinyModelSpec spec;
  spec.n_layer = 6;
  const auto path = testing::write_tiny_model(dir.path() + "/tiny.gguf", spec);
  CpuContext ctx(2);
  const auto m = Model::load(path, DType::F32, ctx);
  const std::vector<int32_t> ids = testing::random_ids(90, m->config().n_vocab, 7);
  for (const PolicyKind kind : {PolicyKind::None, PolicyKind::LazyLLM, PolicyKind::RandomLayers}) {
    GenerateOptions opt;
    opt.max_new_tokens = 8;
    opt.stop_at_end_of_generation = false;
    opt.policy = kind;
    opt.schedule = parse_schedule("1:0.4,3:0.4");
    opt.prune_seed = 3;
    opt.record_steps = true;
    const GenerateResult cold = generate(ctx, *m, ids, opt);
    opt.warmup = true;
    const GenerateResult warm = generate(ctx, *m, ids, opt);
    EXPECT_EQ(cold.warmup_s, 0);
    EXPECT_GT(warm.warmup_s, 0);
    EXPECT_EQ(warm.generated_ids, cold.generated_ids) << policy_name(kind);
    EXPECT_EQ(warm.last_prefill_logits, cold.last_prefill_logits) << policy_name(kind);
    EXPECT_EQ(warm.revivals, cold.revivals) << policy_name(kind);
    EXPECT_EQ(warm.kv_bytes_used, cold.kv_bytes_used) << policy_name(kind);
    EXPECT_EQ(warm.aux_cache_bytes, cold.aux_cache_bytes) << policy_name(kind);
    EXPECT_EQ(warm.prefill_stats.queries, cold.prefill_stats.queries) << policy_name(kind);
    ASSERT_EQ(warm.decode_stats.size(), cold.decode_stats.size());
    for (size_t i = 0; i < cold.decode_stats.size(); ++i) {
      EXPECT_EQ(warm.decode_stats[i].queries, cold.decode_stats[i].queries)
          << policy_name(kind) << " step " << i;
      EXPECT_EQ(warm.decode_stats[i].revived, cold.decode_stats[i].revived)
          << policy_name(kind) << " step " << i;
    }
  }
}

}  // namespace
}  // namespace lp
