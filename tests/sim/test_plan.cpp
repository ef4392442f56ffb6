// The deployment search (sim/plan.h): every layout of the GPUs enumerated once, the frontier and
// the best as their definitions say, each point the simulation of its deployment, bad options
// refused.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "hwmodels/profile.h"
#include "model/error.h"
#include "model/presets.h"
#include "sim/plan.h"

namespace lp {
namespace {

struct World {
  ModelConfig c = preset_config("llama-3.1-8b");
  hw::Profile hw = hw::load_profile("h100-sxm");
  sim::Precision p;
  sim::ServingConfig base = sim::serving_config(hw::scheduling_for(hw));
  sim::PlanOptions o;
  World() {
    o.gpus = 4;
    o.methods = {sim::ServingMethod{}};
    o.prompt = sim::LengthDist::parse("1024:4096", "p", "prompt_tokens");
    o.output = sim::LengthDist::parse("64:256", "o", "output_tokens");
    o.batch_tokens = {2048, 8192};
    o.max_seqs = {256};
    o.requests = 64;
  }
};

// A point is its layout's deployment (least-outstanding routing over the layout's replicas, each
// under `cfg`) simulated at the point's rate.
void expect_point_is_its_deployment(const World& s, const sim::PlanPoint& pt, const sim::Layout& l,
                                    const sim::ServingConfig& cfg) {
  sim::Deployment d;
  d.serve = {s.hw, cfg, l.replicas};
  d.router = sim::Router::LeastOutstanding;
  const auto unit = sim::make_workload(s.o.requests, {1, 1}, s.o.prompt, s.o.output, s.o.seed);
  const sim::ServingMetrics m =
      sim::serving_metrics(sim::simulate_deployment(s.c, s.p, {}, d, sim::at_rate(unit, pt.rate)), {});
  EXPECT_DOUBLE_EQ(m.output_tokens_per_s / l.gpus(), pt.tokens_per_s_per_gpu);
  EXPECT_DOUBLE_EQ(m.ttft.p90, pt.metrics.ttft.p90);
}

// Aggregated replicas of TP 1, 2, 4, 8 x PP 1, 2, 4 GPUs dividing 8, and every prefill/decode split
// of 8 GPUs into groups of those TP sizes, each once, times budgets, limits and methods.
TEST(Plan, EveryLayoutOfTheGpusOnce) {
  World s;
  s.o.gpus = 8;
  s.o.methods = {sim::ServingMethod{}, sim::ServingMethod{}};
  const std::vector<sim::Layout> ls = sim::plan_layouts(s.hw, s.o);
  std::set<std::tuple<int, int, int, int, int>> shapes;
  for (const sim::Layout& l : ls) {
    EXPECT_EQ(l.gpus(), 8) << l.describe();
    EXPECT_FALSE(l.ep) << "a dense model has no experts to spread";
    EXPECT_TRUE(l.pp == 1 || !l.disaggregated());
    shapes.insert({l.tp, l.pp, l.replicas, l.decode_tp, l.decode_instances});
  }
  int expected = 0;
  for (int t : {1, 2, 4, 8})
    for (int pp : {1, 2, 4}) expected += 8 % (t * pp) == 0;
  for (int tp : {1, 2, 4, 8})
    for (int P = 1; P * tp < 8; ++P)
      for (int td : {1, 2, 4, 8})
        if ((8 - P * tp) % td == 0) ++expected;
  EXPECT_EQ(int(shapes.size()), expected);
  EXPECT_EQ(ls.size(), shapes.size() * 2 * 1 * 2);
  s.o.max_layouts = int64_t(ls.size()) - 1;
  try {
    sim::plan_layouts(s.hw, s.o);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(ls.size()) + " layouts"), std::string::npos)
        << e.what();
  }
}

// The frontier: fastest per user first, each giving more per GPU than every faster one, and every
// point matched or beaten on both by one of it; the best meets the objectives and no meeting point
// gives more per GPU; every point is its deployment's simulation.
TEST(Plan, FrontierBestAndPointsAreWhatTheySay) {
  World s;
  s.o.objectives = {1.0, 0.05};
  const sim::PlanResult r = sim::plan(s.c, s.hw, s.p, s.base, s.o);
  ASSERT_FALSE(r.points.empty());
  for (size_t k = 1; k < r.frontier.size(); ++k) {
    const sim::PlanPoint &a = r.points[r.frontier[k - 1]], &b = r.points[r.frontier[k]];
    EXPECT_GE(a.tokens_per_s_per_user, b.tokens_per_s_per_user);
    EXPECT_LT(a.tokens_per_s_per_gpu, b.tokens_per_s_per_gpu);
  }
  for (const sim::PlanPoint& pt : r.points) {
    bool covered = false;
    for (const size_t f : r.frontier)
      covered = covered || (r.points[f].tokens_per_s_per_user >= pt.tokens_per_s_per_user &&
                            r.points[f].tokens_per_s_per_gpu >= pt.tokens_per_s_per_gpu);
    EXPECT_TRUE(covered);
    EXPECT_EQ(pt.meets, pt.metrics.ttft.p90 <= 1.0 && pt.metrics.itl.p90 <= 0.05);
  }
  ASSERT_TRUE(r.best.has_value());
  EXPECT_TRUE(r.points[*r.best].meets);
  for (const sim::PlanPoint& pt : r.points)
    if (pt.meets) {
      EXPECT_LE(pt.tokens_per_s_per_gpu, r.points[*r.best].tokens_per_s_per_gpu);
    }
  // A point is its deployment simulated at its rate.
  const sim::PlanPoint& pt = r.points.front();
  const sim::Layout& l = r.layouts[pt.layout];
  ASSERT_FALSE(l.disaggregated());
  sim::ServingConfig cfg = s.base;
  cfg.tp = l.tp, cfg.max_batch_tokens = cfg.chunk_tokens = l.max_batch_tokens, cfg.max_seqs = l.max_seqs;
  const double weights = sim::weight_memory_bytes(s.c, sim::CostContext(s.hw, s.p).dtypes) / l.tp;
  cfg.kv_budget_bytes = sim::group_kv_budget(s.c, l.tp, 0.9 * s.hw.memory_capacity - weights);
  expect_point_is_its_deployment(s, pt, l, cfg);
}

// Objectives no layout meets: no best, the closest one reported instead.
TEST(Plan, UnreachableObjectivesGiveTheClosest) {
  World s;
  s.o.objectives = {1e-6, 0};
  const sim::PlanResult r = sim::plan(s.c, s.hw, s.p, s.base, s.o);
  EXPECT_FALSE(r.best.has_value());
  ASSERT_TRUE(r.best_reachable.has_value());
  for (const sim::PlanPoint& pt : r.points)
    EXPECT_GE(pt.metrics.ttft.p90, r.points[*r.best_reachable].metrics.ttft.p90);
}

// A mixture-of-experts model: every shape with a TP group over 1 GPU also searched with whole
// experts over it; with stages within a node, a pipelined point is its deployment simulated.
TEST(Plan, ExpertAndPipelineParallelLayouts) {
  World s;
  s.o.gpus = 4;
  s.o.disaggregated = false;
  const std::vector<sim::Layout> ls = sim::plan_layouts(s.hw, s.o, true);
  int with_ep = 0, without = 0;
  for (const sim::Layout& l : ls) {
    (l.ep ? with_ep : without) += 1;
    if (l.ep) {
      EXPECT_GT(l.tp, 1) << l.describe();
    }
  }
  // (tp, pp): (1,1) (1,2) (1,4) (2,1) (2,2) (4,1) without; the four with tp > 1 with EP too.
  EXPECT_EQ(without, 6 * 2);
  EXPECT_EQ(with_ep, 3 * 2);
  s.o.pp = {2};
  s.o.batch_tokens = {8192};
  const sim::PlanResult r = sim::plan(s.c, s.hw, s.p, s.base, s.o);
  ASSERT_FALSE(r.points.empty());
  const sim::PlanPoint& pt = r.points.front();
  const sim::Layout& l = r.layouts[pt.layout];
  ASSERT_EQ(l.pp, 2);
  sim::ServingConfig cfg = s.base;
  cfg.tp = l.tp, cfg.max_batch_tokens = cfg.chunk_tokens = l.max_batch_tokens, cfg.max_seqs = l.max_seqs;
  // Each GPU holds half the layers' weights; each virtual engine a TP group's budget of the rest.
  const double weights = sim::weight_memory_bytes(s.c, sim::CostContext(s.hw, s.p).dtypes) / (l.tp * 2);
  cfg.kv_budget_bytes = sim::group_kv_budget(s.c, l.tp, 0.9 * s.hw.memory_capacity - weights);
  cfg.pipeline.stages = 2;
  cfg.pipeline.link_bytes_per_s = s.hw.interconnect_bandwidth * s.hw.interconnect_efficiency;
  cfg.pipeline.latency_s = s.hw.interconnect_latency;
  expect_point_is_its_deployment(s, pt, l, cfg);
}

TEST(Plan, LaunchCommandsCarryTheLayout) {
  const sim::Layout agg{2, 4, 0, 0, 8192, 512, 0};
  const auto a = sim::launch_configs(agg, "meta-llama/Llama-3.1-70B-Instruct");
  ASSERT_EQ(a.size(), 3u);
  EXPECT_NE(a[0].command.find("--tensor-parallel-size 2 --data-parallel-size 4"), std::string::npos)
      << a[0].command;
  EXPECT_NE(a[0].command.find("--max-num-batched-tokens 8192 --max-num-seqs 512"), std::string::npos);
  EXPECT_NE(a[1].command.find("--tp-size 2 --dp-size 4"), std::string::npos) << a[1].command;
  EXPECT_NE(a[2].command.find("--tp_size 2 --max_num_tokens 8192 --max_batch_size 512"), std::string::npos);
  sim::Layout pipe = agg;
  pipe.pp = 2, pipe.ep = true;
  const auto pe = sim::launch_configs(pipe, "m");
  EXPECT_NE(pe[0].command.find("--pipeline-parallel-size 2 --enable-expert-parallel"), std::string::npos)
      << pe[0].command;
  EXPECT_NE(pe[1].command.find("--pp-size 2 --ep-size 2"), std::string::npos) << pe[1].command;
  EXPECT_NE(pe[2].command.find("--pp_size 2 --ep_size 2"), std::string::npos) << pe[2].command;
  const sim::Layout dis{2, 2, 4, 1, 8192, 256, 0};
  const auto d = sim::launch_configs(dis, "m");
  EXPECT_NE(d[1].command.find("--disaggregation-mode prefill"), std::string::npos) << d[1].command;
  EXPECT_NE(d[2].command.find("num_instances: 2, tensor_parallel_size: 2"), std::string::npos)
      << d[2].command;
}

// The search dealt over ranks: each rank's share packed and unpacked into the others' gives the
// result of one process; bytes cut short or with bytes over are refused.
TEST(Plan, SharesOverRanksMergeToTheWholeSearch) {
  World s;
  s.o.objectives = {1.0, 0.05};
  const std::vector<sim::Layout> all = sim::plan_layouts(s.hw, s.o);
  ASSERT_GE(all.size(), 3u);
  const sim::PlanResult whole = sim::plan(s.c, s.hw, s.p, s.base, s.o);
  std::vector<sim::LayoutRun> merged(all.size());
  for (int r = 0; r < 3; ++r) {
    const auto share = sim::simulate_layouts(s.c, s.hw, s.p, s.base, s.o, all, r, 3);
    for (size_t i = 0; i < all.size(); ++i)
      if (int(i % 3) != r) {
        EXPECT_FALSE(share[i].fits || share[i].simulations > 0);
      }
    sim::unpack_layout_runs(sim::pack_layout_runs(share, r, 3), r, 3, merged);
  }
  const sim::PlanResult r = sim::plan_result(all, merged, s.o.objectives);
  ASSERT_EQ(r.points.size(), whole.points.size());
  EXPECT_EQ(r.simulations, whole.simulations);
  EXPECT_EQ(r.frontier, whole.frontier);
  EXPECT_EQ(r.best, whole.best);
  for (size_t i = 0; i < r.points.size(); ++i) {
    EXPECT_EQ(r.points[i].layout, whole.points[i].layout);
    EXPECT_DOUBLE_EQ(r.points[i].metrics.ttft.p90, whole.points[i].metrics.ttft.p90);
  }
  const std::string bytes =
      sim::pack_layout_runs(sim::simulate_layouts(s.c, s.hw, s.p, s.base, s.o, all, 1, 3), 1, 3);
  std::vector<sim::LayoutRun> into(all.size());
  EXPECT_THROW(sim::unpack_layout_runs(bytes.substr(0, bytes.size() - 1), 1, 3, into), Error);
  EXPECT_THROW(sim::unpack_layout_runs(bytes + "x", 1, 3, into), Error);
  EXPECT_THROW(sim::unpack_layout_runs(std::string(5, '\xff'), 1, 3, into), Error);
}

TEST(Plan, RefusesBadOptions) {
  World s;
  s.o.gpus = 0;
  EXPECT_THROW(sim::plan(s.c, s.hw, s.p, s.base, s.o), UsageError);
  s.o.gpus = 2;
  s.o.load_shares = {0};
  EXPECT_THROW(sim::plan(s.c, s.hw, s.p, s.base, s.o), UsageError);
  s.o.load_shares = {0.5};
  s.o.methods.clear();
  EXPECT_THROW(sim::plan(s.c, s.hw, s.p, s.base, s.o), UsageError);
}

}  // namespace
}  // namespace lp
