// KV-Runahead in the simulator (sim/runahead.h): one rank is the plain prefill, the timeline's
// waits and transfers add up, the load-balanced partition beats the even one the way the paper
// says it should (earlier ranks take more tokens: later ones attend longer prefixes), and bad
// partitions are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "hwmodels/profile.h"
#include "model/error.h"
#include "model/presets.h"
#include "pruning/schedule.h"
#include "sim/replay.h"
#include "sim/runahead.h"
#include "traces/synthetic.h"

namespace lp {
namespace {

const sim::Precision kBf16{"bf16", "bf16", "bf16"};

TEST(SimRunahead, OneRankIsThePlainPrefill) {
  const ModelConfig c = preset_config("llama-3.1-8b");
  const hw::Profile hw = hw::load_profile("h100-sxm");
  const int64_t n = 8192;
  const std::vector<int64_t> one = {n};
  const sim::RunaheadPrediction r = sim::predict_runahead(c, hw, kBf16, one, sim::default_link(hw));
  const sim::Prediction plain = sim::replay(trace::synthetic_trace(c, "none", {}, n, 0), c, hw, kBf16);
  EXPECT_NEAR(r.ttft_s, plain.ttft_s, 1e-9 * plain.ttft_s);
  EXPECT_EQ(r.ranks[0].wait_s, 0);
  EXPECT_EQ(r.ranks[0].sent_bytes, 0);
}

TEST(SimRunahead, TimelineAddsUpAndTransfersBound) {
  const ModelConfig c = preset_config("llama-3.1-8b");
  const hw::Profile hw = hw::load_profile("h100-sxm");
  const int64_t n = 16384;
  const std::vector<int64_t> even = sim::even_partition(n, 4);
  const sim::RunaheadLink fast{1e30, 0, "ideal"};
  const sim::RunaheadPrediction r = sim::predict_runahead(c, hw, kBf16, even, fast);
  ASSERT_EQ(r.ranks.size(), 4u);
  // Every rank's finish is its compute plus its waits (the last rank's with its LM head).
  for (size_t p = 0; p < r.ranks.size(); ++p) {
    const auto& k = r.ranks[p];
    const double end = p + 1 == r.ranks.size() ? r.ttft_s : k.done_s;
    EXPECT_NEAR(end, k.compute_s + k.wait_s, 1e-12 * end) << p;
    EXPECT_EQ(k.start, int64_t(p) * (n / 4));
  }
  // A rank sends each layer the prefix up to its end: L x (start + tokens) x 2 x kv_dim x 2 bytes.
  const double kv_token = 2.0 * c.kv_dim() * 2;
  EXPECT_DOUBLE_EQ(r.ranks[1].sent_bytes, double(c.n_layer) * double(n / 2) * kv_token);
  EXPECT_EQ(r.ranks[3].sent_bytes, 0);
  // The last rank holds the whole prompt's K/V, the first only its chunk's.
  // (Equal chunks: the same weights and activations.)
  EXPECT_NEAR(r.ranks[3].memory_bytes - r.ranks[0].memory_bytes,
              double(c.n_layer) * double(3 * n / 4) * kv_token, 1e-9 * r.ranks[3].memory_bytes);
  // A slow link serialises: rank 0's L messages alone take L x (latency + bytes / bandwidth).
  const sim::RunaheadLink slow{1e9, 1e-3, "slow"};
  const sim::RunaheadPrediction s = sim::predict_runahead(c, hw, kBf16, even, slow);
  const double rank0_msgs = double(c.n_layer) * (1e-3 + double(n / 4) * kv_token / 1e9);
  EXPECT_GT(s.ttft_s, rank0_msgs);
  EXPECT_GT(s.ttft_s, r.ttft_s);
  EXPECT_GT(s.ranks[3].wait_s, r.ranks[3].wait_s);
}

// The paper's context-level load balancing: with causal attention a later chunk attends a longer
// prefix, so the balanced partition gives earlier ranks more tokens, and beats the even split.
TEST(SimRunahead, BalancedPartitionGivesEarlierRanksMoreAndBeatsEven) {
  const ModelConfig c = preset_config("llama-3.1-8b");
  const hw::Profile hw = hw::load_profile("h100-sxm");
  const sim::RunaheadLink link = sim::default_link(hw);
  const int64_t n = 65536;
  for (const int P : {2, 4}) {
    const std::vector<int64_t> opt = sim::optimise_partition(c, hw, kBf16, n, P, link);
    ASSERT_EQ(int(opt.size()), P);
    EXPECT_EQ(std::accumulate(opt.begin(), opt.end(), int64_t(0)), n);
    for (int p = 1; p < P; ++p) EXPECT_GT(opt[size_t(p) - 1], opt[size_t(p)]) << P;
    const double t_opt = sim::predict_runahead(c, hw, kBf16, opt, link).ttft_s;
    const double t_even = sim::predict_runahead(c, hw, kBf16, sim::even_partition(n, P), link).ttft_s;
    const std::vector<int64_t> one = {n};
    const double t_one = sim::predict_runahead(c, hw, kBf16, one, link).ttft_s;
    EXPECT_LT(t_opt, t_even) << P;
    EXPECT_LT(t_even, t_one) << P;
    // No rank can beat the ideal split of the single device's work.
    EXPECT_GT(t_opt, t_one / P) << P;
  }
  // Deterministic.
  EXPECT_EQ(sim::optimise_partition(c, hw, kBf16, n, 4, link),
            sim::optimise_partition(c, hw, kBf16, n, 4, link));
}

TEST(SimRunahead, ARanksShareSlowsItsCompute) {
  const ModelConfig c = preset_config("smollm2-135m");
  const hw::Profile hw = hw::load_profile("cpu-local");
  const sim::Precision p{"f32", "f32", "f32"};
  const std::vector<int64_t> one = {4096};
  const sim::RunaheadLink link = sim::default_link(hw);
  const double whole = sim::predict_runahead(c, hw, p, one, link, 1).ttft_s;
  const double half = sim::predict_runahead(c, hw, p, one, link, 0.5).ttft_s;
  // Compute and bandwidth both halve; only the per-call overheads do not.
  EXPECT_GT(half, 1.8 * whole);
  EXPECT_LE(half, 2.0 * whole);
  EXPECT_THROW(sim::predict_runahead(c, hw, p, one, link, 0), Error);
  EXPECT_THROW(sim::predict_runahead(c, hw, p, one, link, 1.5), Error);
}

// LazyLLM on the last rank (engine/runahead.h): alone, it is the plain LazyLLM prefill; with
// earlier ranks, it makes the last rank cheaper, so the balanced partition hands it more tokens
// and TTFT drops.
TEST(SimRunahead, PruningOnTheLastRank) {
  const ModelConfig c = preset_config("llama-3.1-8b");
  const hw::Profile hw = hw::load_profile("h100-sxm");
  const sim::RunaheadLink link = sim::default_link(hw);
  const int64_t n = 32768;
  const std::vector<PruneStep> steps = resolve_schedule(default_schedule(), c.n_layer);
  const std::vector<int64_t> one = {n};
  const double alone = sim::predict_runahead(c, hw, kBf16, one, link, 1, steps).ttft_s;
  const sim::Prediction lazy = sim::replay(trace::synthetic_trace(c, "lazyllm", steps, n, 0), c, hw, kBf16);
  EXPECT_NEAR(alone, lazy.ttft_s, 0.01 * lazy.ttft_s);
  const std::vector<int64_t> plain = sim::optimise_partition(c, hw, kBf16, n, 4, link);
  const std::vector<int64_t> pruned = sim::optimise_partition(c, hw, kBf16, n, 4, link, 1, steps);
  EXPECT_GT(pruned.back(), plain.back());
  const double t_plain = sim::predict_runahead(c, hw, kBf16, plain, link).ttft_s;
  const double t_same = sim::predict_runahead(c, hw, kBf16, plain, link, 1, steps).ttft_s;
  const double t_pruned = sim::predict_runahead(c, hw, kBf16, pruned, link, 1, steps).ttft_s;
  EXPECT_LT(t_same, t_plain);
  EXPECT_LT(t_pruned, t_same);
  // The earlier ranks do not prune: their compute is the same.
  EXPECT_DOUBLE_EQ(sim::predict_runahead(c, hw, kBf16, plain, link, 1, steps).ranks[0].compute_s,
                   sim::predict_runahead(c, hw, kBf16, plain, link).ranks[0].compute_s);
  const std::vector<PruneStep> outside = {{c.n_layer, 0.5}};
  EXPECT_THROW(sim::predict_runahead(c, hw, kBf16, plain, link, 1, outside), Error);
}

TEST(SimRunahead, BadPartitionsAreRefused) {
  const ModelConfig c = preset_config("smollm2-135m");
  const hw::Profile hw = hw::load_profile("cpu-local");
  const sim::Precision p{"f32", "f32", "f32"};
  const sim::RunaheadLink link = sim::default_link(hw);
  const auto parse = [&](const std::string& a, int64_t n, int ranks) {
    return sim::parse_partition(a, c, hw, p, n, ranks, link);
  };
  EXPECT_EQ(parse("EVEN", 10, 3), (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(parse("6,4", 10, 2), (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(parse("auto", 1000, 2).size(), 2u);
  const auto msg = [&](const std::string& a, int64_t n, int ranks) {
    try {
      parse(a, n, ranks);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg("6,3", 10, 2).find("the chunks sum to 9 tokens, the prompt has 10"), std::string::npos);
  EXPECT_NE(msg("10,0", 10, 2).find("'0' is not a chunk"), std::string::npos);
  EXPECT_NE(msg("5,5", 10, 3).find("2 chunks for 3 ranks"), std::string::npos);
  EXPECT_NE(msg("5,x", 10, 2).find("'x'"), std::string::npos);
  EXPECT_NE(msg("even", 2, 3).find("fewer than the 3 ranks"), std::string::npos);
  const std::vector<int64_t> zero = {5, 0};
  EXPECT_THROW(sim::predict_runahead(c, hw, p, zero, link), Error);
  EXPECT_THROW(sim::predict_runahead(c, hw, p, std::vector<int64_t>{}, link), Error);
}

// simulate --runahead's comparison (sim::compare_runahead): one device is the one-chunk timeline,
// LazyLLM on one device and KV-Runahead unpruned are those timelines, and tensor parallelism over
// the same devices is the TP replay where the model splits, refused with its reason where not.
TEST(SimRunahead, ComparedWithOneDeviceAndTensorParallelism) {
  const ModelConfig c = preset_config("llama-3.1-8b");
  const hw::Profile hw = hw::load_profile("h100-sxm");
  const sim::RunaheadLink link = sim::default_link(hw);
  const std::vector<PruneStep> steps = resolve_schedule(default_schedule(), c.n_layer);
  const std::vector<int64_t> chunks = sim::optimise_partition(c, hw, kBf16, 8192, 4, link, 1, steps);
  const std::vector<int64_t> plain = sim::even_partition(8192, 4), one = {8192};
  const sim::RunaheadComparison r = sim::compare_runahead(c, hw, kBf16, chunks, plain, link, 1, steps);
  EXPECT_EQ(r.runahead.ttft_s, sim::predict_runahead(c, hw, kBf16, chunks, link, 1, steps).ttft_s);
  EXPECT_EQ(r.single_s, sim::predict_runahead(c, hw, kBf16, one, link).ttft_s);
  EXPECT_EQ(r.single_share_s, r.single_s);
  EXPECT_EQ(r.lazy_single_s, sim::predict_runahead(c, hw, kBf16, one, link, 1, steps).ttft_s);
  EXPECT_EQ(r.plain_s, sim::predict_runahead(c, hw, kBf16, plain, link).ttft_s);
  ASSERT_TRUE(r.tp_s.has_value());
  EXPECT_EQ(*r.tp_s, sim::replay(trace::synthetic_trace(c, "none", {}, 8192, 0), c, hw, kBf16, 1, 4).ttft_s);
  double most = 0;
  for (const sim::RunaheadRank& k : r.runahead.ranks) most = std::max(most, k.memory_bytes);
  EXPECT_EQ(r.most_memory_bytes, most);
  const std::vector<int64_t> three = sim::even_partition(8192, 3);
  const sim::RunaheadComparison t = sim::compare_runahead(c, hw, kBf16, three, {}, link, 1, {});
  EXPECT_FALSE(t.tp_s.has_value());
  EXPECT_NE(t.tp_refused.find("3 GPUs of tensor parallelism do not divide the model's 32 attention heads"),
            std::string::npos)
      << t.tp_refused;
  EXPECT_EQ(sim::compare_runahead(c, hw, kBf16, three, {}, link, 0.5, {}).tp_refused,
            "");  // shared devices: not asked
}

}  // namespace
}  // namespace lp
