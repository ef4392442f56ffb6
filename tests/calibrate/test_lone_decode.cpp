// Decoding over listed keys and the pruning stages' cost, fitted on single runs measured op by op
// (calibrate/lone_decode.h). The "measured" op times are made by replaying traces on a profile
// with known parameters, so the truth is known exactly: the fit must find it from a profile that
// lacks them. And the loader's refusals of files it cannot use.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "calibrate/fit_measurements.h"
#include "calibrate/lone_decode.h"
#include "model/error.h"
#include "model/presets.h"
#include "pruning/schedule.h"
#include "sim/replay.h"
#include "sim/revival.h"
#include "tests/gguf_writer.h"
#include "traces/synthetic.h"

namespace lp {
namespace {

struct LoneSetup {
  ModelConfig c = preset_config("smollm2-135m");
  sim::Precision prec{"5bpw", "int8", "f16"};
  hw::Profile base = hw::load_profile("cpu-local");
  testing::TempDir dir;

  // A lone LazyLLM run of `prompt` tokens: its trace and `run --json`-shaped op times after 1, 5 and
  // 11 decoding steps, made by replaying the trace on `truth`.
  void write_run(const std::string& name, int64_t prompt, const hw::Profile& truth) const {
    const auto steps = resolve_schedule(default_schedule(), c.n_layer);
    const trace::Trace t =
        trace::synthetic_trace(c, "lazyllm", steps, prompt, 12, sim::constant_revival_share(0.02));
    trace::write_trace(t, dir.file(name + ".trace.jsonl"));
    for (const int64_t n : {2, 6, 12}) {
      sim::Replayer rp(t.header, c, truth, prec);
      for (size_t i = 0; i < size_t(n); ++i) rp.add(t.steps[i]);  // the prefill and n - 1 steps
      const sim::Prediction pr = std::move(rp).finish();
      nlohmann::json j;
      for (const Op o : {Op::Attention, Op::Score, Op::Select})
        j["ops"]["decode"]["total"][op_name(o)]["ms"] = pr.decode_ops[size_t(o)].time_s * 1e3;
      j["ops"]["decode"]["total"]["qkv"]["ms"] = 1.0;  // other ops are read past
      std::ofstream(dir.file(name + "-n" + std::to_string(n) + "-r1.json")) << j.dump();
    }
  }
};

TEST(LoneDecode, FindsPlantedSharesAndStageCosts) {
  LoneSetup s;
  hw::Profile truth = s.base;
  calib::set_param(truth, "attention.listed_compute", 0.6);
  calib::set_param(truth, "attention.listed_memory", 0.5);
  calib::set_param(truth, "pruning.stage_us", 30);
  calib::set_param(truth, "pruning.key_ns", 150);
  s.write_run("short", 700, truth);
  s.write_run("long", 1900, truth);
  const std::vector<calib::LoneDecodeRun> runs = calib::load_lone_decodes(s.dir.path());
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].name, "long.trace.jsonl");
  EXPECT_EQ(runs[0].steps, (std::vector<int64_t>{1, 5, 11}));
  // The synthetic steps do attend listed sets (fewer keys than held) after the first pruning layer.
  bool listed = false;
  for (const trace::Step& st : runs[0].trace.steps)
    for (size_t l = 0; l < st.attended.size(); ++l)
      listed |= st.kind == "decode" && st.attended[l] < st.keys[l];
  ASSERT_TRUE(listed);

  hw::Profile hw = s.base;
  const calib::LoneDecodeFit f = calib::fit_lone_decodes(hw, s.c, s.prec, runs);
  EXPECT_EQ(f.spans, 6u);
  EXPECT_NEAR(f.listed_compute, 0.6, 1e-6);
  EXPECT_NEAR(f.listed_memory, 0.5, 1e-6);
  EXPECT_NEAR(f.stage_us, 30, 1e-4);
  EXPECT_NEAR(f.key_ns, 150, 1e-4);
  EXPECT_GT(f.attention_rms_before, 0.05);
  EXPECT_LT(f.attention_rms_after, 1e-6);
  EXPECT_LT(f.pruning_rms_after, 1e-6);
  EXPECT_NEAR(calib::get_param(hw, "attention.listed_memory"), 0.5, 1e-6);
  EXPECT_NEAR(hw.pruning_key_s, 150e-9, 1e-13);

  // A time scale divides the shares and multiplies the stage costs; one that would put the compute
  // share above 1 is refused.
  calib::set_lone_decodes(hw, f, 2);
  EXPECT_NEAR(calib::get_param(hw, "attention.listed_compute"), 0.3, 1e-6);
  EXPECT_NEAR(calib::get_param(hw, "pruning.stage_us"), 60, 1e-4);
  EXPECT_NEAR(calib::lone_decode_scale_range(f).first, 0.6, 1e-6);
  EXPECT_THROW(calib::set_lone_decodes(hw, f, 0.5), Error);
}

std::string error_of(const std::string& dir) {
  try {
    calib::load_lone_decodes(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LoneDecode, RefusesWhatItCannotUse) {
  LoneSetup s;
  EXPECT_NE(error_of(s.dir.file("nope")).find("not a folder"), std::string::npos);
  EXPECT_NE(error_of(s.dir.path()).find("no <name>.trace.jsonl"), std::string::npos);
  s.write_run("a", 500, s.base);
  EXPECT_EQ(error_of(s.dir.path()), "");
  // A run past the trace's steps.
  std::ofstream(s.dir.file("a-n40-r1.json")) << R"({"ops":{"decode":{"total":{}}}})";
  std::string e = error_of(s.dir.path());
  EXPECT_NE(e.find("a-n40-r1.json: 40 new tokens make 39 decoding steps"), std::string::npos) << e;
  std::filesystem::remove(s.dir.file("a-n40-r1.json"));
  // No ops, or a time that is not a number.
  std::ofstream(s.dir.file("a-n3-r1.json")) << R"({"prefill_ms": 3})";
  e = error_of(s.dir.path());
  EXPECT_NE(e.find("a-n3-r1.json: no ops.decode.total"), std::string::npos) << e;
  std::ofstream(s.dir.file("a-n3-r1.json")) << R"({"ops":{"decode":{"total":{"attention":{"ms":"x"}}}}})";
  e = error_of(s.dir.path());
  EXPECT_NE(e.find("a-n3-r1.json: ops.decode.total.attention.ms must be a number"), std::string::npos) << e;
  std::ofstream(s.dir.file("a-n3-r1.json")) << "[1, 2";
  e = error_of(s.dir.path());
  EXPECT_NE(e.find("a-n3-r1.json: not a JSON object"), std::string::npos) << e;
  std::filesystem::remove(s.dir.file("a-n3-r1.json"));
  // An unpruned trace.
  std::filesystem::remove(s.dir.file("a.trace.jsonl"));
  trace::write_trace(trace::synthetic_trace(s.c, "none", {}, 300, 4), s.dir.file("a.trace.jsonl"));
  e = error_of(s.dir.path());
  EXPECT_NE(e.find("a lazyllm trace is needed"), std::string::npos) << e;
}

}  // namespace
}  // namespace lp
