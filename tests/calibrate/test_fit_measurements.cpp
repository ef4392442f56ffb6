// Calibration from end-to-end measurements (calibrate/fit_measurements.h). The fit is checked on
// figures generated from a profile with known efficiencies (the truth is then known exactly:
// the fit must find it and predict held-out points without error), and its refusals on data
// that cannot identify what is asked.
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <string>
#include <vector>

#include "calibrate/fit_measurements.h"
#include "model/error.h"
#include "model/presets.h"
#include "sim/replay.h"

namespace lp {
namespace {

using calib::Measurement;

TEST(FitMeasurements, MapsFileNamesToPresets) {
  const std::map<std::string, std::string> none;
  EXPECT_EQ(calib::match_preset("meta-llama/Llama-3.1-8B-Instruct", none), "llama-3.1-8b");
  EXPECT_EQ(calib::match_preset("Meta-Llama-3.1-70B-Instruct", none), "llama-3.1-70b");
  EXPECT_EQ(calib::match_preset("Qwen2.5-7B-Instruct-Q4_K_M.gguf", none), "qwen2.5-7b");
  EXPECT_EQ(calib::match_preset("Llama-2-7b-chat-hf", none), "llama-2-7b");  // not llama-2-70b
  EXPECT_EQ(calib::match_preset("Llama-2-70b-hf", none), "llama-2-70b");
  EXPECT_EQ(calib::match_preset("SmolLM2-135M-Instruct.Q4_1.gguf", none), "smollm2-135m");
  EXPECT_EQ(calib::match_preset("smollm2-1.7b", none), "smollm2-1.7b");
  EXPECT_EQ(calib::match_preset("Llama-3.2-3B-Instruct", none), "llama-3.2-3b");
  EXPECT_EQ(calib::match_preset("Qwen3-30B-A3B-Instruct-2507", none), "qwen3-30b-a3b");  // not qwen3-32b
  EXPECT_EQ(calib::match_preset("Mixtral-8x7B-Instruct-v0.1", none), "mixtral-8x7b");
  EXPECT_EQ(calib::match_preset("gemma-3-27b-it", none), "gemma-3-27b");
  EXPECT_FALSE(calib::match_preset("Phi-3-mini-4k-instruct", none));
  EXPECT_FALSE(calib::match_preset("llama-2-7", none));
  EXPECT_EQ(calib::match_preset("Phi-3-mini-4k-instruct", {{"Phi-3-mini-4k-instruct", "llama-3.1-8b"}}),
            "llama-3.1-8b");
}

TEST(FitMeasurements, MapsHardwareNamesToProfiles) {
  const std::map<std::string, std::string> none;
  EXPECT_EQ(calib::match_profile("NVIDIA H100 80GB HBM3", none), "h100-sxm");
  EXPECT_EQ(calib::match_profile("nvidia_a100-sxm4-80gb", none), "a100-80gb");
  EXPECT_EQ(calib::match_profile("NVIDIA GeForce RTX 4090", none), "rtx-4090");
  EXPECT_EQ(calib::match_profile("l4", none), "l4");
  EXPECT_FALSE(calib::match_profile("NVIDIA H100 PCIe", none));  // a different part
  EXPECT_FALSE(calib::match_profile("A100", none));              // 40 or 80 GB: say which
  EXPECT_EQ(calib::match_profile("A100", {{"A100", "a100-40gb"}}), "a100-40gb");
}

TEST(FitMeasurements, PrecisionFromTheFilesDtype) {
  EXPECT_EQ(calib::precision_for_dtype("bfloat16").weights, "bf16");
  EXPECT_EQ(calib::precision_for_dtype("").compute, "bf16");
  EXPECT_EQ(calib::precision_for_dtype("float16").compute, "f16");
  EXPECT_EQ(calib::precision_for_dtype("FP8").compute, "fp8");
  EXPECT_EQ(calib::precision_for_dtype("fp8-e4m3").kv, "fp8");
  EXPECT_EQ(calib::precision_for_dtype("w8a8").compute, "int8");
  // llama.cpp's quantized types run int8 dot products over 8-bit activations, over an f16 KV cache.
  const sim::Precision q4 = calib::precision_for_dtype("Q4_K - Medium");
  EXPECT_EQ(q4.weights, "4.5bpw");
  EXPECT_EQ(q4.compute, "int8");
  EXPECT_EQ(q4.kv, "f16");
  EXPECT_EQ(calib::precision_for_dtype("Q8_0").weights, "8.5bpw");
  EXPECT_EQ(calib::precision_for_dtype("Q8_0").compute, "int8");
  EXPECT_EQ(calib::precision_for_dtype("q4_k_m").compute, "int8");
  EXPECT_EQ(calib::precision_for_dtype("all F32").compute, "f32");
  EXPECT_EQ(calib::precision_for_dtype("F16").compute, "f16");
  // Weight-only 4-bit kernels compute in f16.
  EXPECT_EQ(calib::precision_for_dtype("gptq").weights, "q4");
  EXPECT_EQ(calib::precision_for_dtype("awq").compute, "f16");
  EXPECT_EQ(calib::precision_for_dtype("f32").kv, "f32");
  EXPECT_THROW(calib::precision_for_dtype("nf4-double"), Error);
}

// Every file-type name llama.cpp's llama_ftype_name prints (src/llama-model-loader.cpp at
// 0c1e57098, copied here from that source: the strings are llama.cpp's, not ours), with the bits
// per weight each type stores: stated in the name, or ggml's block size (bytes per block x 8 /
// weights per block).
TEST(FitMeasurements, EveryLlamaCppFileTypeNameMaps) {
  const std::vector<std::pair<std::string, double>> llama = {{"all F32", 32},
                                                             {"F16", 16},
                                                             {"BF16", 16},
                                                             {"Q1_0", 1.5},
                                                             {"Q2_0", 2.5},
                                                             {"Q4_0", 18 * 8 / 32.0},
                                                             {"Q4_1", 20 * 8 / 32.0},
                                                             {"Q5_0", 22 * 8 / 32.0},
                                                             {"Q5_1", 24 * 8 / 32.0},
                                                             {"Q8_0", 34 * 8 / 32.0},
                                                             {"MXFP4 MoE", 17 * 8 / 32.0},
                                                             {"NVFP4", 9 * 8 / 16.0},
                                                             {"Q2_K - Medium", 84 * 8 / 256.0},
                                                             {"Q2_K - Small", 84 * 8 / 256.0},
                                                             {"Q3_K - Small", 110 * 8 / 256.0},
                                                             {"Q3_K - Medium", 110 * 8 / 256.0},
                                                             {"Q3_K - Large", 110 * 8 / 256.0},
                                                             {"Q4_K - Small", 144 * 8 / 256.0},
                                                             {"Q4_K - Medium", 144 * 8 / 256.0},
                                                             {"Q5_K - Small", 176 * 8 / 256.0},
                                                             {"Q5_K - Medium", 176 * 8 / 256.0},
                                                             {"Q6_K", 210 * 8 / 256.0},
                                                             {"TQ1_0 - 1.69 bpw ternary", 1.69},
                                                             {"TQ2_0 - 2.06 bpw ternary", 2.06},
                                                             {"IQ2_XXS - 2.0625 bpw", 2.0625},
                                                             {"IQ2_XS - 2.3125 bpw", 2.3125},
                                                             {"IQ2_S - 2.5 bpw", 2.5},
                                                             {"IQ2_M - 2.7 bpw", 2.7},
                                                             {"IQ3_XS - 3.3 bpw", 3.3},
                                                             {"IQ3_XXS - 3.0625 bpw", 3.0625},
                                                             {"IQ1_S - 1.5625 bpw", 1.5625},
                                                             {"IQ1_M - 1.75 bpw", 1.75},
                                                             {"IQ4_NL - 4.5 bpw", 4.5},
                                                             {"IQ4_XS - 4.25 bpw", 4.25},
                                                             {"IQ3_S - 3.4375 bpw", 3.4375},
                                                             {"IQ3_S mix - 3.66 bpw", 3.66}};
  EXPECT_EQ(calib::llama_ftype_names().size(), llama.size());
  for (const auto& [name, bits] : llama) {
    SCOPED_TRACE(name);
    sim::Precision p;
    ASSERT_NO_THROW(p = calib::precision_for_dtype(name));
    EXPECT_NEAR(sim::dtype_bytes(p.weights, "weight"), bits / 8, 1e-12);
    EXPECT_NO_THROW(sim::validate(p));
    EXPECT_EQ(calib::precision_for_dtype("(guessed) " + name).weights, p.weights);
  }
  EXPECT_EQ(calib::precision_for_dtype("all F32").compute, "f32");
  EXPECT_EQ(calib::precision_for_dtype("BF16").compute, "bf16");
  EXPECT_THROW(calib::precision_for_dtype("unknown, may not work"), Error);
  EXPECT_THROW(sim::dtype_bytes("0bpw", "weight"), Error);
  EXPECT_THROW(sim::dtype_bytes("40bpw", "weight"), Error);
  EXPECT_THROW(sim::dtype_bytes("4.5bpwx", "weight"), Error);
}

// Measurements generated by a profile: TTFTs of Llama-3.1-8B (TP 1) and Llama-3.1-70B (TP 4) over
// prompt lengths, and optionally decode latencies.
struct Synthetic {
  std::deque<Measurement> records;  // stable addresses: points point at them
  std::vector<calib::Point> points;
  void add(const hw::Profile& truth, const std::string& preset, int tp, int64_t prompt, bool decode,
           const std::string& method = "none", const sim::Precision& precision = {}) {
    Measurement m;
    m.method = method;
    m.file = "synthetic";
    m.record = int(records.size()) + 1;
    m.model = preset;
    m.tp = tp;
    if (decode) {
      m.context_tokens = prompt;
      m.decode_tokens = 64;
      m.decode_ms_per_token = 1;
    } else {
      m.prompt_tokens = prompt;
      m.ttft_ms = 1;
    }
    records.push_back(m);
    calib::Point p = calib::make_point(records.back(), preset, preset_config(preset), precision);
    p.measured_s = calib::predict_point(truth, p);
    points.push_back(std::move(p));
  }
};

TEST(FitMeasurements, RecoversTheEfficienciesThatMadeTheData) {
  const hw::Profile base = hw::load_profile("h100-sxm");
  hw::Profile truth = base;
  calib::set_param(truth, "gemm.compute", 0.55);
  calib::set_param(truth, "overhead_us", 9);
  Synthetic s;
  for (int64_t n : {128, 512, 2048, 8192}) {
    s.add(truth, "llama-3.1-8b", 1, n, false);
    s.add(truth, "llama-3.1-70b", 4, n, false);
  }
  calib::MeasurementFit fit;
  const hw::Profile got = calib::fit_measurements(base, s.points, {"gemm.compute", "overhead_us"}, &fit);
  ASSERT_EQ(fit.params, (std::vector<std::string>{"gemm.compute", "overhead_us"}));
  EXPECT_NEAR(calib::get_param(got, "gemm.compute"), 0.55, 0.55e-3);
  EXPECT_NEAR(calib::get_param(got, "overhead_us"), 9, 9e-3);
  EXPECT_FALSE(got.efficiency_default);
  EXPECT_EQ(fit.cv, "leave-one-out");
  EXPECT_EQ(fit.ttft_points, 8);
  EXPECT_EQ(fit.decode_points, 0);
  EXPECT_GT(fit.ttft_mape_base, 0.05);     // the base is off by more than 5%
  EXPECT_LT(fit.ttft_mape_heldout, 1e-3);  // and the data hold no noise
  ASSERT_EQ(fit.heldout_s.size(), 8u);

  // Automatic choice on the same data: the two that matter are among those fitted, and whatever
  // else is fitted lands on the truth's value too.
  const hw::Profile autofit = calib::fit_measurements(base, s.points, {}, &fit);
  EXPECT_NE(std::find(fit.params.begin(), fit.params.end(), "gemm.compute"), fit.params.end());
  EXPECT_NE(std::find(fit.params.begin(), fit.params.end(), "overhead_us"), fit.params.end());
  EXPECT_EQ(std::find(fit.params.begin(), fit.params.end(), "gemm.memory"),
            fit.params.end());  // no decode points
  for (const std::string& p : fit.params)
    EXPECT_NEAR(calib::get_param(autofit, p), calib::get_param(truth, p), 0.01 * calib::get_param(truth, p))
        << p;
  EXPECT_LT(fit.ttft_mape_heldout, 1e-2);
}

TEST(FitMeasurements, DecodeLatenciesIdentifyTheGemmBandwidth) {
  const hw::Profile base = hw::load_profile("a100-80gb");
  hw::Profile truth = base;
  calib::set_param(truth, "gemm.memory", 0.62);
  Synthetic s;
  for (int64_t n : {256, 1024, 4096}) s.add(truth, "llama-3.1-8b", 1, n, true);
  for (int64_t n : {512, 2048}) s.add(truth, "llama-3.1-8b", 1, n, false);
  calib::MeasurementFit fit;
  const hw::Profile got = calib::fit_measurements(base, s.points, {"gemm.memory"}, &fit);
  EXPECT_NEAR(calib::get_param(got, "gemm.memory"), 0.62, 0.62e-3);
  EXPECT_EQ(fit.decode_points, 3);
  EXPECT_LT(fit.decode_mape_heldout, 1e-3);
}

std::string usage_error(const hw::Profile& base, const std::vector<calib::Point>& pts,
                        std::vector<std::string> ask) {
  try {
    calib::fit_measurements(base, pts, ask, nullptr);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no usage error";
}

TEST(FitMeasurements, RefusesWhatTheDataCannotIdentify) {
  const hw::Profile base = hw::load_profile("h100-sxm");
  hw::Profile truth = base;
  calib::set_param(truth, "gemm.compute", 0.55);
  calib::set_param(truth, "overhead_us", 9);
  Synthetic s;
  for (int64_t n : {128, 512, 2048}) s.add(truth, "llama-3.1-8b", 1, n, false);
  // Three points: at most one parameter, although both would be identifiable and either helps.
  EXPECT_NO_THROW(calib::fit_measurements(base, s.points, {"overhead_us"}, nullptr));
  EXPECT_NE(usage_error(base, s.points, {"gemm.compute", "overhead_us"}).find("at most 1"),
            std::string::npos);
  // One GPU: TP's interconnect plays no part; the bandwidth needs decode points.
  EXPECT_NE(usage_error(base, s.points, {"interconnect"}).find("barely depend"), std::string::npos);
  EXPECT_NE(usage_error(base, s.points, {"gemm.memory"}).find("only decode"), std::string::npos);
  EXPECT_NE(usage_error(base, s.points, {"speed"}).find("unknown parameter 'speed'"), std::string::npos);
  // Data the base profile already predicts exactly: no parameter improves the fit.
  Synthetic exact;
  for (int64_t n : {128, 512, 2048, 8192}) exact.add(base, "llama-3.1-8b", 1, n, false);
  EXPECT_NE(usage_error(base, exact.points, {"gemm.compute"}).find("does not improve the fit"),
            std::string::npos);
  EXPECT_THROW(calib::fit_measurements(base, exact.points, {}, nullptr), Error);
  // Two points are not enough for a fit and a held-out check.
  s.points.pop_back();
  EXPECT_THROW(calib::fit_measurements(base, s.points, {}, nullptr), Error);
}

// The experts' own efficiency: MoE TTFTs (Qwen3-30B-A3B and Mixtral 8x7B in fp8) made with expert
// GEMMs at 0.3 of the peak beside dense GEMMs at the base's share recover 0.3; dense models alone
// cannot identify it, and say so.
TEST(FitMeasurements, ExpertsGetTheirOwnEfficiency) {
  nlohmann::ordered_json j = hw::load_profile("h100-sxm").json;  // without its experts family
  j["efficiency"].erase("experts");
  const hw::Profile base = hw::parse_profile(j, "h100 without experts");
  EXPECT_FALSE(base.experts_own);
  EXPECT_DOUBLE_EQ(calib::get_param(base, "experts.compute"), calib::get_param(base, "gemm.compute"));
  hw::Profile truth = base;
  calib::set_param(truth, "experts.compute", 0.3);
  EXPECT_TRUE(truth.experts_own);
  EXPECT_DOUBLE_EQ(truth.eff(hw::Family::Gemm).compute, base.eff(hw::Family::Gemm).compute);
  const sim::Precision fp8{"fp8", "fp8", "fp8"};
  Synthetic s;
  for (int64_t n : {1024, 4096, 16384}) {
    s.add(truth, "qwen3-30b-a3b", 1, n, false, "none", fp8);
    s.add(truth, "mixtral-8x7b", 2, n, false, "none", fp8);
  }
  calib::MeasurementFit fit;
  const hw::Profile got = calib::fit_measurements(base, s.points, {"experts.compute"}, &fit);
  EXPECT_NEAR(calib::get_param(got, "experts.compute"), 0.3, 0.3e-3);
  EXPECT_TRUE(got.experts_own);
  EXPECT_TRUE(hw::efficiency_json(got).contains("experts"));
  EXPECT_FALSE(hw::efficiency_json(base).contains("experts"));
  Synthetic dense;
  for (int64_t n : {128, 512, 2048, 8192}) dense.add(truth, "llama-3.1-8b", 1, n, false);
  EXPECT_NE(usage_error(base, dense.points, {"experts.compute"}).find("only mixture-of-experts"),
            std::string::npos);
}

// The 5% points of Fisher's F from a standard table (e.g. NIST/SEMATECH e-Handbook, table
// 1.3.6.7.3), to the table's three decimals.
// The fit's choices, for failure messages.
std::string describe(const calib::MeasurementFit& f) {
  std::string s;
  for (const calib::ParamCheck& c : f.checks)
    s += c.name + (c.fitted ? " fitted" : ": " + c.reason) + "; F " + std::to_string(c.f_stat) + "\n";
  return s;
}

TEST(FitMeasurements, FToEnterIsFishersQuantile) {
  EXPECT_NEAR(calib::f_to_enter(1, 2), 18.513, 1e-3);
  EXPECT_NEAR(calib::f_to_enter(1, 10), 4.965, 1e-3);
  EXPECT_NEAR(calib::f_to_enter(2, 10), 4.103, 1e-3);
  EXPECT_NEAR(calib::f_to_enter(3, 20), 3.098, 1e-3);
  EXPECT_NEAR(calib::f_to_enter(1, 100), 3.936, 1e-3);
  EXPECT_TRUE(std::isinf(calib::f_to_enter(1, 0)));
}

// The failure this guards against: at the base profile attention is a sliver of the time, so judged there
// its efficiency looks unidentifiable, and GEMM alone is fitted, wrong at both ends. Prompts from
// 512 to 16k tokens show the quadratic term: both are fitted together and recovered.
TEST(FitMeasurements, FitsGemmAndAttentionTogetherOverManyLengths) {
  hw::Profile base = hw::load_profile("h100-sxm");
  calib::set_param(base, "attention.compute", 1.0);  // attention looks nearly free at the base
  hw::Profile truth = base;
  calib::set_param(truth, "gemm.compute", 0.5);
  calib::set_param(truth, "attention.compute", 0.12);
  Synthetic s;
  for (int64_t n : {512, 1024, 2048, 4096, 8192, 16384}) s.add(truth, "llama-3.1-8b", 1, n, false);
  calib::MeasurementFit fit;
  const hw::Profile got = calib::fit_measurements(base, s.points, {}, &fit);
  EXPECT_NE(std::find(fit.params.begin(), fit.params.end(), "gemm.compute"), fit.params.end());
  EXPECT_NE(std::find(fit.params.begin(), fit.params.end(), "attention.compute"), fit.params.end());
  EXPECT_NEAR(calib::get_param(got, "gemm.compute"), 0.5, 0.5 * 0.01);
  EXPECT_NEAR(calib::get_param(got, "attention.compute"), 0.12, 0.12 * 0.01);
  EXPECT_LT(fit.ttft_mape_heldout, 0.01);
  for (size_t i = 0; i < s.points.size(); ++i)
    EXPECT_NEAR(fit.heldout_s[i] / s.points[i].measured_s, 1, 0.02) << s.points[i].m->prompt_tokens;
}

// llama-bench's F32 and Q8_0 files on one CPU: f32 GEMMs and int8 dot products reach different
// shares of the peak. Each dtype's share is fitted (gemm.compute for the one with more points,
// gemm.compute.int8 for the other) beside attention, and recovered; asking for a dtype no point
// computes in is refused.
TEST(FitMeasurements, EachComputeDtypeGetsItsOwnGemmShare) {
  hw::Profile base = hw::load_profile("cpu-local");
  hw::Profile truth = base;
  calib::set_param(truth, "gemm.compute", 0.36);
  calib::set_param(truth, "gemm.compute.int8", 0.5);
  calib::set_param(truth, "attention.compute", 0.15);
  const sim::Precision f32 = calib::precision_for_dtype("all F32"), q8 = calib::precision_for_dtype("Q8_0");
  Synthetic s;
  for (int64_t n : {512, 1024, 2048, 4096, 8192}) {
    s.add(truth, "smollm2-135m", 1, n, false, "none", f32);
    s.add(truth, "smollm2-135m", 1, n, false, "none", q8);
  }
  s.add(truth, "smollm2-135m", 1, 768, false, "none", f32);  // f32 the more frequent: gemm.compute
  EXPECT_EQ(calib::dtype_candidates(base, s.points), (std::vector<std::string>{"gemm.compute.int8"}));
  calib::MeasurementFit fit;
  const hw::Profile got = calib::fit_measurements(base, s.points, {}, &fit);
  for (const char* p : {"gemm.compute", "gemm.compute.int8", "attention.compute"}) {
    EXPECT_NE(std::find(fit.params.begin(), fit.params.end(), p), fit.params.end()) << p;
    EXPECT_NEAR(calib::get_param(got, p), calib::get_param(truth, p), 0.01 * calib::get_param(truth, p)) << p;
  }
  EXPECT_LT(fit.ttft_mape_heldout, 0.01);
  // One dtype alone: gemm.compute stands for it, and gemm.compute.int8 cannot be asked for.
  Synthetic one;
  for (int64_t n : {512, 2048, 8192}) one.add(truth, "smollm2-135m", 1, n, false, "none", f32);
  EXPECT_TRUE(calib::dtype_candidates(base, one.points).empty());
  EXPECT_NE(usage_error(base, one.points, {"gemm.compute.int8"}).find("no point computes in int8"),
            std::string::npos)
      << usage_error(base, one.points, {"gemm.compute.int8"});
}

// Bad input: every prompt of one length cannot tell attention from the GEMMs. Say so, fit what
// can be fitted; asking for attention anyway is refused with that reason.
TEST(FitMeasurements, OnePromptLengthFitsGemmAndSaysWhyNotAttention) {
  const hw::Profile base = hw::load_profile("h100-sxm");
  hw::Profile truth = base;
  calib::set_param(truth, "gemm.compute", 0.5);
  calib::set_param(truth, "attention.compute", 0.2);
  Synthetic s;
  s.add(truth, "llama-3.1-8b", 1, 4096, false);
  s.add(truth, "llama-3.1-70b", 4, 4096, false);
  s.add(truth, "llama-2-7b", 1, 4096, false);
  s.add(truth, "llama-2-70b", 4, 4096, false);
  calib::MeasurementFit fit;
  calib::fit_measurements(base, s.points, {}, &fit);
  EXPECT_EQ(std::find(fit.params.begin(), fit.params.end(), "attention.compute"), fit.params.end())
      << describe(fit);
  const auto att = std::find_if(fit.checks.begin(), fit.checks.end(),
                                [](const calib::ParamCheck& c) { return c.name == "attention.compute"; });
  ASSERT_NE(att, fit.checks.end());
  EXPECT_NE(att->reason.find("same prompt length (4096 tokens)"), std::string::npos) << att->reason;
  EXPECT_NE(usage_error(base, s.points, {"attention.compute"}).find("same prompt length"), std::string::npos)
      << usage_error(base, s.points, {"attention.compute"});
}

// Pruning's own cost: dense runs and one pruned run identify the per-stage cost, and the other
// pruned runs (other schedules, other lengths) are then predicted.
// One pruned run identifies the pruning stage's cost per key (the form that scales with the prompt),
// which then prices other schedules, lengths and models; a fixed cost beside it needs pruned runs
// of two lengths.
TEST(FitMeasurements, OnePrunedRunIdentifiesThePruningStageCost) {
  const hw::Profile base = hw::load_profile("h100-sxm");
  hw::Profile truth = base;
  calib::set_param(truth, "gemm.compute", 0.55);
  calib::set_param(truth, "pruning.key_ns", 4000);
  Synthetic s;
  for (int64_t n : {256, 1024, 4096}) s.add(truth, "llama-3.1-8b", 1, n, false);
  s.add(truth, "llama-3.1-8b", 1, 512, false, "lazyllm 0.3:0.3,0.6:0.3,0.9:0.3");
  calib::MeasurementFit fit;
  const hw::Profile got = calib::fit_measurements(base, s.points, {}, &fit);
  EXPECT_NE(std::find(fit.params.begin(), fit.params.end(), "pruning.key_ns"), fit.params.end())
      << describe(fit);
  EXPECT_NEAR(calib::get_param(got, "pruning.key_ns"), 4000, 40);
  const auto stage = std::find_if(fit.checks.begin(), fit.checks.end(),
                                  [](const calib::ParamCheck& c) { return c.name == "pruning.stage_us"; });
  EXPECT_NE(stage->reason.find("several prompt lengths"), std::string::npos) << stage->reason;
  Synthetic others;
  others.add(truth, "llama-3.1-8b", 1, 1024, false, "lazyllm 0.1:0.5,0.3:0.5,0.5:0.5");
  others.add(truth, "llama-3.1-8b", 1, 8192, false, "lazyllm 0.3:0.3,0.6:0.3,0.9:0.3");
  others.add(truth, "llama-3.1-70b", 4, 512, false, "static 0.3:0.3,0.6:0.3,0.9:0.3");
  for (const calib::Point& p : others.points) {
    EXPECT_NEAR(calib::predict_point(got, p) / p.measured_s, 1, 0.01) << p.m->method;
    // The base profile, with its default stage cost, is further off.
    EXPECT_GT(std::fabs(calib::predict_point(base, p) / p.measured_s - 1), 0.02) << p.m->method;
  }
  // A fixed stage cost shows in pruned runs of two lengths.
  hw::Profile fixed = base;
  calib::set_param(fixed, "gemm.compute", 0.55);
  calib::set_param(fixed, "pruning.stage_us", 4000);
  Synthetic two;
  for (int64_t n : {256, 1024, 4096, 16384}) two.add(fixed, "llama-3.1-8b", 1, n, false);
  for (int64_t n : {512, 8192})
    two.add(fixed, "llama-3.1-8b", 1, n, false, "lazyllm 0.3:0.3,0.6:0.3,0.9:0.3");
  const hw::Profile got2 =
      calib::fit_measurements(base, two.points, {"gemm.compute", "pruning.stage_us"}, &fit);
  EXPECT_NEAR(calib::get_param(got2, "pruning.stage_us"), 4000, 40) << describe(fit);
  // Without a pruned point the stage cost cannot be seen.
  Synthetic dense;
  for (int64_t n : {512, 2048, 8192, 16384}) dense.add(truth, "llama-3.1-8b", 1, n, false);
  EXPECT_NE(usage_error(base, dense.points, {"pruning.stage_us"}).find("only pruned runs"),
            std::string::npos);
  EXPECT_NE(usage_error(base, dense.points, {"pruning.key_ns"}).find("only pruned runs"), std::string::npos);
}

TEST(FitMeasurements, APrunedMeasurementNeedsItsSchedule) {
  Measurement m;
  m.file = "runs.csv";
  m.record = 3;
  m.model = "llama-3.1-8b";
  m.prompt_tokens = 1024;
  m.ttft_ms = 50;
  m.method = "lazyllm";
  try {
    calib::make_point(m, "llama-3.1-8b", preset_config("llama-3.1-8b"), sim::Precision{});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("runs.csv: record 3: method 'lazyllm' names no schedule"),
              std::string::npos)
        << e.what();
  }
}

// A pruning stage's fixed cost is charged once per pruning layer and step, on its select.
TEST(FitMeasurements, ReplayChargesEachPruningStageOnce) {
  hw::Profile hw = hw::load_profile("h100-sxm");
  const ModelConfig c = preset_config("llama-3.1-8b");
  Measurement m;
  m.file = "x";
  m.model = "llama-3.1-8b";
  m.prompt_tokens = 2048;
  m.ttft_ms = 1;
  m.method = "lazyllm 0.3:0.3,0.6:0.3,0.9:0.3";
  const calib::Point p = calib::make_point(m, "llama-3.1-8b", c, sim::Precision{});
  calib::set_param(hw, "pruning.stage_us", 0.01);
  const double t0 = calib::predict_point(hw, p);
  calib::set_param(hw, "pruning.stage_us", 1000.01);
  EXPECT_NEAR(calib::predict_point(hw, p) - t0, 3 * 1000e-6, 1e-9);  // three stages
}

}  // namespace
}  // namespace lp
