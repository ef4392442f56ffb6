// The methods a capacity report compares (report::methods_to_report), on typed inputs: which
// policies at which schedules, in which order, with a recorded trace or without.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/presets.h"
#include "reports/capacity.h"
#include "traces/synthetic.h"

namespace lp::report {
namespace {

std::vector<std::string> names(const std::vector<ReportedMethod>& ms) {
  std::vector<std::string> out;
  for (const ReportedMethod& m : ms) out.push_back(m.name);
  return out;
}

TEST(ReportMethods, EachPolicyAtTheSchedulesThatFitIt) {
  const ModelConfig c = preset_config("llama-3.1-8b");
  const std::vector<std::string> all = {"lazyllm", "frozen", "random-layers", "static-paper", "random-drop"};
  EXPECT_EQ(names(methods_to_report(c, all, {}, nullptr)),
            (std::vector<std::string>{
                "none", "lazyllm 0.3:0.3,0.6:0.3,0.9:0.3", "frozen 0.3:0.3,0.6:0.3,0.9:0.3",
                "random-layers 0.3:0.3,0.6:0.3,0.9:0.3", "static-paper 0.1:0.35", "random-drop 0.3"}));
  // A schedule given for LazyLLM and one for random-drop: each policy takes those that fit it.
  const std::vector<ReportedMethod> ms = methods_to_report(
      c, {"lazyllm", "random-drop"}, {parse_schedule("0.5:0.5"), parse_schedule("0.2")}, nullptr);
  EXPECT_EQ(names(ms), (std::vector<std::string>{"none", "lazyllm 0.5:0.5", "random-drop 0.2"}));
  ASSERT_EQ(ms[1].steps.size(), 1u);
  EXPECT_EQ(ms[1].steps[0].layer, 15);  // half of 32 layers, as resolve_schedule places it
  EXPECT_TRUE(ms[2].steps.empty());     // random-drop prunes inside no layer
  EXPECT_EQ(ms[2].method.policy, PolicyKind::RandomDrop);
}

TEST(ReportMethods, ARecordedTraceComesSecondAndSetsTheAblationsSchedule) {
  const ModelConfig c = preset_config("smollm2-135m");
  trace::Trace t =
      trace::synthetic_trace(c, "lazyllm", resolve_schedule(parse_schedule("0.5:0.4"), c.n_layer), 256, 2);
  t.header.schedule = "0.5:0.4";  // as `run --trace` records it
  const std::vector<ReportedMethod> ms = methods_to_report(c, {"lazyllm", "frozen"}, {}, &t);
  // No LazyLLM schedule asked for: with a trace, none is added; frozen prunes at the trace's.
  EXPECT_EQ(names(ms), (std::vector<std::string>{"none", "trace lazyllm 0.5:0.4", "frozen 0.5:0.4"}));
  EXPECT_EQ(ms[1].trace, &t);
  EXPECT_TRUE(ms[1].steps.empty());  // a trace's pattern is mapped per length, not resolved
}

}  // namespace
}  // namespace lp::report
