// sim::simulate, the library call behind `lazyprefill simulate` and the Python module's
// `simulate` (sim/simulate.h): each result is the replay it stands for, the report carries the
// request's shape, and bad requests are refused with the CLI's messages before any work.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>

#include "hwmodels/profile.h"
#include "model/error.h"
#include "model/presets.h"
#include "pruning/method.h"
#include "sim/replay.h"
#include "sim/revival.h"
#include "sim/simulate.h"
#include "tests/test_util.h"

namespace lp {
namespace {

sim::SimulateRequest synthetic(const std::string& prune) {
  sim::SimulateRequest r;
  r.model_config = "llama-3.1-8b";
  r.hws = {hw::load_profile("h100-sxm"), hw::load_profile("l4")};
  r.prune = prune;
  r.prompt_tokens = 2048;
  r.new_tokens = 5;
  r.revival_share = 0.01;
  return r;
}

// The pruned prediction is replay_synthetic's of the same steps; the unpruned one the policy
// "none"'s; the report's counts are the request's (5 new tokens: 4 decoding steps).
TEST(Simulate, EachResultIsTheReplayOfItsSteps) {
  const sim::SimulateRequest r = synthetic("lazyllm");
  const sim::SimulateReport rep = sim::simulate(r);
  ASSERT_EQ(rep.results.size(), 2u);
  EXPECT_EQ(rep.decode_steps, 4);
  EXPECT_EQ(rep.prompt_tokens, 2048);
  EXPECT_EQ(rep.trace, "synthetic");
  EXPECT_EQ(rep.policy, "lazyllm");
  const ModelConfig c = preset_config("llama-3.1-8b");
  const Schedule sched = default_schedule(PolicyKind::LazyLLM);
  const auto steps = resolve_method(PolicyKind::LazyLLM, sched, c.n_layer, c.global_layers());
  for (size_t i = 0; i < r.hws.size(); ++i) {
    const sim::Prediction want = sim::replay_synthetic(
        c, "lazyllm", steps, 2048, 4, sim::constant_revival_share(0.01), r.hws[i], r.precision, 1, 1, 4096);
    const sim::Prediction& got = rep.results[i].pruned;
    EXPECT_EQ(got.ttft_s, want.ttft_s) << r.hws[i].name;
    EXPECT_EQ(got.total_s, want.total_s) << r.hws[i].name;
    EXPECT_EQ(got.decode_step_s, want.decode_step_s) << r.hws[i].name;
    const sim::Prediction none =
        sim::replay_synthetic(c, "none", {}, 2048, 4, {}, r.hws[i], r.precision, 1, 1, 4096);
    EXPECT_EQ(rep.results[i].unpruned.ttft_s, none.ttft_s) << r.hws[i].name;
    EXPECT_LT(got.ttft_s, none.ttft_s) << r.hws[i].name;
  }
}

// Unpruned work against itself: the same prediction twice, speedups exactly 1.
TEST(Simulate, UnprunedIsItsOwnBaseline) {
  const sim::SimulateReport rep = sim::simulate(synthetic("none"));
  for (const sim::SimulateResult& res : rep.results) {
    EXPECT_EQ(res.pruned.ttft_s, res.unpruned.ttft_s);
    const auto j = res.to_json(rep.precision, false);
    EXPECT_EQ(j["ttft_speedup"].get<double>(), 1.0);
    EXPECT_EQ(j["decode_step_ms"].size(), 4u);
    EXPECT_FALSE(j.contains("prefill_layers"));
  }
}

// The document's fields come from the typed report, per-layer costs only when asked, step times
// only as many as kept.
TEST(Simulate, JsonIsTheReport) {
  sim::SimulateRequest r = synthetic("lazyllm");
  r.per_layer = true;
  r.step_times = 2;
  const sim::SimulateReport rep = sim::simulate(r);
  const auto j = rep.to_json();
  EXPECT_EQ(j["model"], rep.model);
  EXPECT_EQ(j["decode_steps"].get<int64_t>(), 4);
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][0]["hw"], "h100-sxm");
  EXPECT_EQ(j["results"][0]["decode_step_ms"].size(), 2u);
  EXPECT_EQ(j["results"][1]["prefill_layers"].size(), size_t(rep.costed.n_layer));
  EXPECT_DOUBLE_EQ(j["results"][1]["ttft_ms"].get<double>(), rep.results[1].pruned.ttft_s * 1e3);
  EXPECT_EQ(j["results"][1]["fits_in_memory"].get<bool>(), rep.results[1].fits_in_memory());
}

// Bad requests: a usage error with the CLI's words, before any replay.
TEST(Simulate, RefusesBadRequests) {
  using Change = void (*)(sim::SimulateRequest&);
  const std::pair<Change, std::string> cases[] = {
      {[](sim::SimulateRequest& r) { r.hws.clear(); }, "--hw names no hardware profile"},
      {[](sim::SimulateRequest& r) { r.prompt_tokens = 0; }, "give --trace FILE, or --prompt-tokens N"},
      {[](sim::SimulateRequest& r) { r.pp_link_gbs = 0; }, "--pp-link-gbs must be positive"},
      {[](sim::SimulateRequest& r) { r.pp_microbatches = 4; }, "--pp-microbatches 4 needs --pp of 2 or more"},
      {[](sim::SimulateRequest& r) { r.step_times = -1; }, "--step-times"},
      {[](sim::SimulateRequest& r) { r.model_config.clear(); }, "give --model PATH or --model-config NAME"},
      {[](sim::SimulateRequest& r) { r.tp = 3; }, "--tp: "},
      {[](sim::SimulateRequest& r) { r.prune = "bogus"; }, "bogus"},
      {[](sim::SimulateRequest& r) { r.trace = "some.jsonl"; }, "--new-tokens applies to synthetic traces"},
      // The ranges the CLI used to check itself (CLI11), now the library's for both front ends.
      {[](sim::SimulateRequest& r) { r.tp = 0; }, "--tp must be between 1 and 4096, got 0"},
      {[](sim::SimulateRequest& r) { r.prompt_tokens = -1; },
       "--prompt-tokens must be between 0 and 16777216"},
      {[](sim::SimulateRequest& r) { r.revival_share = 2; },
       "--revival-share must be between 0 and 1, got 2"},
      {[](sim::SimulateRequest& r) { r.revival_share = std::nan(""); },
       "--revival-share must be between 0 and 1"},
      {[](sim::SimulateRequest& r) { r.ep = 0; }, "--ep must be between 1 and 4096, got 0"},
      {[](sim::SimulateRequest& r) { r.pp = 2000; }, "--pp must be between 1 and 1024, got 2000"},
      {[](sim::SimulateRequest& r) { r.pp_link_gbs = HUGE_VAL; }, "--pp-link-gbs must be positive, got inf"},
      {[](sim::SimulateRequest& r) {
         r.new_tokens = 0;
         r.revival_share = -1;
         r.trace = "some.jsonl";
       },
       "--prune applies to synthetic traces"},
      {[](sim::SimulateRequest& r) { r.config = preset_config("llama-3.1-8b"); }, "give one target"},
  };
  for (const auto& [change, words] : cases) {
    sim::SimulateRequest r = synthetic("lazyllm");
    change(r);
    try {
      sim::simulate(r);
      ADD_FAILURE() << "accepted; wanted " << words;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace lp
