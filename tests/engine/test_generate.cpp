// generate()'s warm-up (GenerateOptions::warmup): the same prefill and one decoding step run untimed
// first, then Session::reset; the timed run must not see any of it. The decoding loop generate()
// shares with KV-Runahead (decode_tokens).

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "engine/generate.h"
#include "kernels/context.h"
#include "kernels/cpu/backend.h"
#include "model/gguf.h"
#include "pruning/schedule.h"
#include "tests/gguf_writer.h"
#include "tests/test_util.h"

namespace lp {
namespace {

// The generated tiny model of n_layer layers, loaded in f32.
std::unique_ptr<Model> tiny_model(const testing::TempDir& dir, int n_layer, CpuContext& ctx) {
  testing::TinyModelSpec spec;
  spec.n_layer = n_layer;
  return Model::load(testing::write_tiny_model(dir.path() + "/tiny.gguf", spec), DType::F32, ctx);
}

TEST(Generate, AWarmUpLeavesTheTimedRunUnchanged) {
  testing::TempDir dir;
  CpuContext ctx(2);
  const auto m = tiny_model(dir, 6, ctx);
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

// The steady state's timers (run --json's ops.decode.steady) hold exactly the steps after
// kSteadyAfterSteps, each counted once (one timer reused and zeroed per step), and those steps are
// also in the decoding total: each layer's attention is called once a step.
TEST(Generate, SteadyStateTimersHoldTheLateStepsOnce) {
  testing::TempDir dir;
  CpuContext ctx(1);
  const auto m = tiny_model(dir, 2, ctx);
  const int n_layer = m->config().n_layer;
  GenerateOptions opt;
  opt.max_new_tokens = int(kSteadyAfterSteps) + 6;
  opt.stop_at_end_of_generation = false;
  const GenerateResult r = generate(ctx, *m, testing::random_ids(12, m->config().n_vocab, 5), opt);
  const int64_t steps = opt.max_new_tokens - 1;  // the first token comes from the prefill
  EXPECT_EQ(r.decode_ops.total(Op::Attention).calls, steps * n_layer);
  EXPECT_EQ(r.decode_steady_ops.total(Op::Attention).calls, (steps - kSteadyAfterSteps) * n_layer);
  EXPECT_LE(r.decode_steady_ops.total_seconds(), r.decode_ops.total_seconds());
}

// The one decoding loop (decode_tokens, which generate() and KV-Runahead's last rank share): it ends
// at an end-of-generation token, whose text is left out, or at n_new tokens; unless told not to
// stop, it decodes past one. Before it was shared, `run --runahead` printed "<|im_end|>" where
// `run` printed nothing (issue 51).
TEST(Generate, TheDecodingLoopEndsAtEndOfGenerationAndLeavesItsTextOut) {
  testing::TempDir dir;
  testing::TinyModelSpec spec;
  const auto path = testing::write_tiny_model(dir.path() + "/tiny.gguf", spec);
  CpuContext ctx(1);
  const auto m = Model::load(path, DType::F32, ctx);
  const Tokenizer& tok = m->tokenizer();
  const int32_t eos = tok.eos_id(), a = tok.encode("a", false, false).at(0),
                b = tok.encode("b", false, false).at(0);
  const std::vector<int32_t> prompt = testing::random_ids(12, m->config().n_vocab, 3);
  const auto run = [&](int32_t first, std::vector<int32_t> script, int64_t n_new, bool stop) {
    Session s(*m, std::make_unique<CpuBackend>(ctx, m->config(), m->weights(), 64));
    std::vector<float> logits(size_t(m->config().n_vocab));
    std::vector<int32_t> pos(prompt.size());
    std::iota(pos.begin(), pos.end(), 0);
    const int64_t last = int64_t(prompt.size()) - 1;
    s.forward(prompt, pos, {&last, 1}, logits.data());
    DecodeLoop o;
    o.n_new = n_new;
    o.stop_at_end_of_generation = stop;
    return decode_tokens(s, *m, int64_t(prompt.size()), first, logits, o,
                         [&](size_t i, std::span<const float>) { return script.at(i - 1); });
  };
  const Decoded only_eos = run(eos, {}, 5, true);  // the case: the first token ends it
  EXPECT_EQ(only_eos.ids, std::vector<int32_t>{eos});
  EXPECT_EQ(only_eos.text, "");
  EXPECT_EQ(only_eos.steps, 0);
  const Decoded ended = run(a, {b, eos, a}, 5, true);
  EXPECT_EQ(ended.ids, (std::vector<int32_t>{a, b, eos}));
  EXPECT_EQ(ended.text, "ab");
  EXPECT_EQ(ended.steps, 2);
  const Decoded past = run(a, {eos, b, a}, 4, false);
  EXPECT_EQ(past.ids, (std::vector<int32_t>{a, eos, b, a}));
  EXPECT_EQ(past.text, tok.decode(past.ids));  // an end-of-generation token inside stays
  EXPECT_EQ(past.steps, 3);
  EXPECT_EQ(run(a, {b, a}, 2, true).ids, (std::vector<int32_t>{a, b}));  // n_new reached
}

}  // namespace
}  // namespace lp
