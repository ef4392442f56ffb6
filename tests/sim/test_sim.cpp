// The simulator: hardware profiles and model presets load and validate; op costs match
// hand-worked roofline numbers; replay, mapping and synthetic traces agree with the math.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include "calibrate/calibrate.h"
#include "hwmodels/profile.h"
#include "model/error.h"
#include "model/ops.h"
#include "model/presets.h"
#include "pruning/policy.h"
#include "pruning/schedule.h"
#include "sim/cost.h"
#include "sim/replay.h"
#include "traces/synthetic.h"

namespace lp {
namespace {

using json = nlohmann::ordered_json;

// A profile document with round numbers: 1 TFLOP/s bf16, 0.5 f32, 100 GB/s.
json round_profile() {
  json e = {{"compute", 0.5}, {"half_rows", 4}, {"memory", 0.5}, {"overhead_us", 1.0}};
  return {{"lazyprefill_hw", 1},
          {"name", "round"},
          {"description", "round numbers for hand-worked tests"},
          {"kind", "gpu"},
          {"peak_tflops", {{"f32", 0.5}, {"bf16", 1.0}}},
          {"memory_bandwidth_gbs", 100},
          {"memory_capacity_gib", 1},
          {"onchip_cache_mib", 1},
          {"shared_memory_kib_per_unit", 64},
          {"compute_units", 1},
          {"dispatch_overhead_us", 1},
          {"interconnect_bandwidth_gbs", 0},
          {"interconnect_latency_us", 0},
          {"max_tp", 1},
          {"efficiency",
           {{"default", true},
            {"gemm", e},
            {"attention", e},
            {"elementwise", e},
            {"data_movement", e},
            {"interconnect", 1.0}}},
          {"sources",
           {{"peak_tflops", "test"},
            {"memory_bandwidth_gbs", "test"},
            {"memory_capacity_gib", "test"},
            {"onchip_cache_mib", "test"},
            {"shared_memory_kib_per_unit", "test"},
            {"compute_units", "test"},
            {"dispatch_overhead_us", "test"},
            {"interconnect_bandwidth_gbs", "test"},
            {"interconnect_latency_us", "test"},
            {"max_tp", "test"},
            {"efficiency", "test"}}}};
}

std::string error_of(const json& j) {
  try {
    hw::parse_profile(j, "p.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HwProfiles, EveryBuiltInLoadsWithUnitsConverted) {
  const auto names = hw::builtin_profile_names();
  for (const char* n : {"h100-sxm", "h200", "a100-80gb", "a100-40gb", "l4", "rtx-4090", "m2-pro-cpu",
                        "xeon-avx512", "cpu-local"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  for (const std::string& n : names) {
    const hw::Profile p = hw::load_profile(n);
    EXPECT_EQ(p.name, n);
    EXPECT_GT(p.peak("f32"), 1e11) << n;       // every part here does > 100 GFLOP/s f32
    EXPECT_GT(p.memory_bandwidth, 1e10) << n;  // and > 10 GB/s
  }
  // The H100 SXM datasheet: 989.4 dense bf16 TFLOP/s, 3.35 TB/s.
  const hw::Profile h = hw::load_profile("h100-sxm");
  EXPECT_DOUBLE_EQ(h.peak("bf16"), 989.4e12);
  EXPECT_DOUBLE_EQ(h.memory_bandwidth, 3350e9);
  EXPECT_EQ(h.kind, "gpu");
}

TEST(HwProfiles, BadProfilesGetOneLineNamingTheField) {
  EXPECT_EQ(error_of(round_profile()), "");
  json j = round_profile();
  j.erase("memory_bandwidth_gbs");
  EXPECT_NE(error_of(j).find("missing field 'memory_bandwidth_gbs'"), std::string::npos) << error_of(j);
  j = round_profile();
  j["memory_bandwidth_gbs"] = 0;
  EXPECT_NE(error_of(j).find("'memory_bandwidth_gbs' must be greater than 0"), std::string::npos);
  j = round_profile();
  j["peak_tflops"]["bf16"] = -1;
  EXPECT_NE(error_of(j).find("peak_tflops.bf16"), std::string::npos);
  j = round_profile();
  j["efficiency"]["gemm"]["compute"] = 1.5;
  EXPECT_NE(error_of(j).find("efficiency.gemm"), std::string::npos);
  j = round_profile();
  j["memory_capacity_gib"] = 1e300;  // once printed "-9223372036854775808 sequences fit"
  EXPECT_NE(error_of(j).find("'memory_capacity_gib' must be at most"), std::string::npos) << error_of(j);
  // Memory efficiency above 1 is a cache effect and allowed up to kMaxMemoryEfficiency (8).
  j = round_profile();
  j["efficiency"]["elementwise"]["memory"] = 2.5;
  EXPECT_EQ(error_of(j), "");
  j["efficiency"]["elementwise"]["memory"] = 9;
  EXPECT_NE(error_of(j).find("efficiency.elementwise: 'memory'"), std::string::npos) << error_of(j);
  j = round_profile();
  j["sources"].erase("compute_units");
  EXPECT_NE(error_of(j).find("no entry for 'compute_units'"), std::string::npos);
  j = round_profile();
  j["lazyprefill_hw"] = 2;
  EXPECT_NE(error_of(j).find("must be 1"), std::string::npos);
  j["lazyprefill_hw"] = 4294967297ULL;  // 2^32 + 1: read as an int it was 1
  EXPECT_NE(error_of(j).find("must be 1"), std::string::npos);
  j = round_profile();
  j["peak_tflops"]["fp6"] = 1;  // fp4 is known since issue 53 (Blackwell)
  EXPECT_NE(error_of(j).find("unknown dtype 'fp6'"), std::string::npos);
  j = round_profile();
  j["max_tp"] = 2;  // two GPUs but no interconnect
  EXPECT_NE(error_of(j).find("'interconnect_bandwidth_gbs' is 0"), std::string::npos) << error_of(j);
  j = round_profile();
  j["max_tp"] = 2.5;
  EXPECT_NE(error_of(j).find("'max_tp' must be a whole number"), std::string::npos) << error_of(j);
  j = round_profile();
  j["efficiency"]["interconnect"] = 1.5;
  EXPECT_NE(error_of(j).find("efficiency.interconnect"), std::string::npos) << error_of(j);
  j = round_profile();
  j["efficiency"].erase("interconnect");
  EXPECT_NE(error_of(j).find("missing field 'interconnect'"), std::string::npos) << error_of(j);
  j = round_profile();
  j["efficiency"]["gemm"]["compute_by_dtype"] = {{"int8", 0.4}};
  EXPECT_EQ(error_of(j), "");
  j["efficiency"]["gemm"]["compute_by_dtype"] = {{"q8", 0.4}};
  EXPECT_NE(error_of(j).find("'compute_by_dtype' names 'q8'"), std::string::npos) << error_of(j);
  j["efficiency"]["gemm"]["compute_by_dtype"] = {{"int8", 1.2}};
  EXPECT_NE(error_of(j).find("'compute_by_dtype.int8' is a share of peak"), std::string::npos) << error_of(j);
  j["efficiency"]["gemm"]["compute_by_dtype"] = {{"int8", -1}};
  EXPECT_NE(error_of(j).find("'int8' must be greater than 0"), std::string::npos) << error_of(j);
  j["efficiency"]["gemm"]["compute_by_dtype"] = 0.4;
  EXPECT_NE(error_of(j).find("'compute_by_dtype' must be an object"), std::string::npos) << error_of(j);
  j = round_profile();
  j["efficiency"]["attention"]["decode_compute"] = 0.15;
  EXPECT_EQ(error_of(j), "");
  EXPECT_DOUBLE_EQ(hw::parse_profile(j, "p").eff(hw::Family::Attention).decode_compute, 0.15);
  EXPECT_DOUBLE_EQ(
      hw::efficiency_json(hw::parse_profile(j, "p"))["attention"]["decode_compute"].get<double>(), 0.15);
  j["efficiency"]["attention"]["decode_compute"] = 1.5;
  EXPECT_NE(error_of(j).find("'decode_compute' is a share of peak"), std::string::npos) << error_of(j);
  j["efficiency"]["attention"]["decode_compute"] = 0;
  EXPECT_NE(error_of(j).find("'decode_compute' must be greater than 0"), std::string::npos) << error_of(j);
  j = round_profile();
  j["efficiency"]["gemm"]["decode_compute"] = 0.2;
  EXPECT_NE(error_of(j).find("'decode_compute' is attention's alone"), std::string::npos) << error_of(j);
  EXPECT_FALSE(
      hw::efficiency_json(hw::parse_profile(round_profile(), "p"))["attention"].contains("decode_compute"));
  // Decoding over listed keys: both shares or neither, attention's alone, within their bounds; the
  // stages' cost per key in ns.
  j = round_profile();
  j["efficiency"]["attention"]["listed_compute"] = 0.9;
  j["efficiency"]["attention"]["listed_memory"] = 0.6;
  j["efficiency"]["pruning_key_ns"] = 170;
  EXPECT_EQ(error_of(j), "");
  {
    const hw::Profile lp = hw::parse_profile(j, "p");
    EXPECT_DOUBLE_EQ(lp.eff(hw::Family::Attention).listed_compute, 0.9);
    EXPECT_DOUBLE_EQ(lp.eff(hw::Family::Attention).listed_memory, 0.6);
    EXPECT_DOUBLE_EQ(lp.pruning_key_s, 170e-9);
    const auto e = hw::efficiency_json(lp);
    EXPECT_DOUBLE_EQ(e["attention"]["listed_memory"].get<double>(), 0.6);
    EXPECT_DOUBLE_EQ(e["pruning_key_ns"].get<double>(), 170);
  }
  j["efficiency"]["attention"].erase("listed_memory");
  EXPECT_NE(error_of(j).find("'listed_compute' and 'listed_memory' come together"), std::string::npos)
      << error_of(j);
  j["efficiency"]["attention"]["listed_memory"] = 9;
  EXPECT_NE(error_of(j).find("'listed_memory' is effective over peak bandwidth"), std::string::npos)
      << error_of(j);
  j["efficiency"]["attention"]["listed_memory"] = 0.6;
  j["efficiency"]["attention"]["listed_compute"] = 1.1;
  EXPECT_NE(error_of(j).find("'listed_compute' is a share of peak"), std::string::npos) << error_of(j);
  j = round_profile();
  j["efficiency"]["gemm"]["listed_compute"] = 0.5;
  j["efficiency"]["gemm"]["listed_memory"] = 0.5;
  EXPECT_NE(error_of(j).find("are attention's alone"), std::string::npos) << error_of(j);
  j = round_profile();
  j["efficiency"]["pruning_key_ns"] = -1;
  EXPECT_NE(error_of(j).find("pruning_key_ns"), std::string::npos) << error_of(j);
  EXPECT_FALSE(hw::efficiency_json(hw::parse_profile(round_profile(), "p")).contains("pruning_key_ns"));
  j = round_profile();
  j["aliases"] = "H100";
  EXPECT_NE(error_of(j).find("'aliases' must be an array"), std::string::npos) << error_of(j);
  try {
    hw::load_profile("h1000");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("known: a100-40gb, a100-80gb"), std::string::npos) << e.what();
  }
}

TEST(ModelPresets, ParameterCountsMatchThePublishedTotals) {
  // Totals published with the weights (safetensors metadata on the model pages).
  EXPECT_EQ(preset_config("llama-2-7b").n_params(), 6738415616);
  EXPECT_EQ(preset_config("llama-3.1-8b").n_params(), 8030261248);
  EXPECT_EQ(preset_config("mistral-7b").n_params(), 7241732096);
  EXPECT_EQ(preset_config("qwen2.5-7b").n_params(), 7615616512);
  EXPECT_EQ(preset_config("smollm2-135m").n_params(), 134515008);
  for (const std::string& n : preset_names()) EXPECT_NO_THROW(preset_config(n)) << n;
  const ModelConfig elm = preset_config("openelm-1.1b");
  ASSERT_FALSE(elm.uniform());
  EXPECT_EQ(int(elm.layer_n_head.size()), elm.n_layer);
  EXPECT_LT(elm.layer(0).n_ff, elm.layer(elm.n_layer - 1).n_ff);  // layer-wise scaling widens the MLP
  EXPECT_NEAR(double(elm.n_params()), 1.08e9, 0.01e9);
  EXPECT_THROW(preset_config("llama-9"), Error);
}

ModelConfig tiny() {
  ModelConfig c;
  c.arch = "llama";
  c.n_layer = 2;
  c.n_embd = 8;
  c.n_head = 2;
  c.n_head_kv = 1;
  c.head_dim = 4;
  c.rope_dim = 4;
  c.n_ff = 16;
  c.n_vocab = 32;
  c.n_ctx_train = 64;
  return c;
}

TEST(SimCost, RooflineByHand) {
  json j = round_profile();
  j["engine"] = "lazyprefill";  // f32 between ops, nothing fused (the engine of this repository)
  const hw::Profile hw = hw::parse_profile(j, "round");
  const ModelConfig c = tiny();
  const sim::Precision p{"bf16", "bf16", "bf16"};
  // QKV over 4 rows: [4][8] x [8][16]: 2*4*8*16 = 1024 FLOPs. Bytes: weights 8*16*2 = 256, input
  // 4*8*2 = 64, output 4*16*4 = 256: 576. Compute efficiency 0.5 * 4/(4+4) = 0.25 of 1e12.
  const sim::OpCost q = sim::op_cost(hw, c, Op::QKV, {4, 0, 0}, p);
  EXPECT_DOUBLE_EQ(q.flops, 1024);
  EXPECT_DOUBLE_EQ(q.bytes, 576);
  EXPECT_DOUBLE_EQ(q.compute_s, 1024 / 0.25e12);
  EXPECT_DOUBLE_EQ(q.memory_s, 576 / 50e9);
  EXPECT_TRUE(q.memory_bound());
  EXPECT_DOUBLE_EQ(q.time_s, 576 / 50e9 + 1e-6);
  // Attention over 10 causal pairs (4 queries, 4 keys): 10 * 2 heads * (4*4 + 5) = 420 FLOPs;
  // bytes: q and out 4*8*4*2 = 256, 4 new K/V rows + 4 keys read, 2*(4+4)*4*2 = 128: 384.
  const sim::OpCost a = sim::op_cost(hw, c, Op::Attention, {4, 10, 4}, p);
  EXPECT_DOUBLE_EQ(a.flops, 420);
  EXPECT_DOUBLE_EQ(a.bytes, 384);
  // RMSNorm runs on the f32 units: 4*4*8 = 128 FLOPs at 0.5e12 * 0.25.
  const sim::OpCost n = sim::op_cost(hw, c, Op::AttnNorm, {4, 0, 0}, p);
  EXPECT_DOUBLE_EQ(n.compute_s, 128 / (0.5e12 * 0.25));
  EXPECT_THROW(sim::validate({"bf17", "bf16", "bf16"}), Error);
}

// A compute dtype with a GEMM share of its own (llama.cpp's int8 dot products beside its f32
// GEMMs): the GEMMs use that share at that dtype's peak (here none: the f32 peak, 0.5e12);
// attention under int8 compute runs at f16 (no f16 peak: f32) with the family's own share.
TEST(SimCost, ComputeShareByDtypeByHand) {
  json j = round_profile();
  j["efficiency"]["gemm"]["compute_by_dtype"] = {{"int8", 0.25}};
  const hw::Profile hw = hw::parse_profile(j, "round");
  const ModelConfig c = tiny();
  const sim::Precision int8{"int8", "int8", "f16"}, bf16{"bf16", "bf16", "bf16"};
  // QKV over 4 rows: 1024 FLOPs at 0.5e12 * 0.25 * 4/(4+4).
  EXPECT_DOUBLE_EQ(sim::op_cost(hw, c, Op::QKV, {4, 0, 0}, int8).compute_s, 1024 / (0.5e12 * 0.125));
  // bf16 keeps the family's share: 1e12 * 0.5 * 0.5.
  EXPECT_DOUBLE_EQ(sim::op_cost(hw, c, Op::QKV, {4, 0, 0}, bf16).compute_s, 1024 / (1e12 * 0.25));
  // Attention (420 FLOPs over 4 rows) at f16 -> f32 peak, share 0.5 * 4/8.
  EXPECT_DOUBLE_EQ(sim::op_cost(hw, c, Op::Attention, {4, 10, 4}, int8).compute_s, 420 / (0.5e12 * 0.25));
  // The share is written back with the rest of the efficiency block.
  EXPECT_DOUBLE_EQ(hw::efficiency_json(hw)["gemm"]["compute_by_dtype"]["int8"].get<double>(), 0.25);
  EXPECT_FALSE(hw::efficiency_json(hw)["attention"].contains("compute_by_dtype"));
}

// Engines (docs/simulator.md, "Engines"), worked by hand on the tiny layer (D 8, F 16, q 8, kv 4)
// over T = 4 rows in bf16: a GPU serving engine keeps activations at 2 bytes between ops, and
// what it fuses costs no time of its own.
TEST(SimCost, EnginesByHand) {
  const ModelConfig c = tiny();
  const sim::Precision p{"bf16", "bf16", "bf16"};
  json j = round_profile();
  const auto cost = [&](const char* engine, Op op) {
    j["engine"] = engine;
    return sim::op_cost(hw::parse_profile(j, "round"), c, op, {4, 10, 4}, p);
  };
  // f32 engines: residual 3 passes of 4*8 f32 = 384 B; RoPE 2*4*(8+4)*4 = 384 B.
  EXPECT_DOUBLE_EQ(cost("llamacpp", Op::Residual).bytes, 384);
  EXPECT_DOUBLE_EQ(cost("lazyprefill", Op::Rope).bytes, 384);
  // vllm: bf16 between ops; residual fused into the next RMSNorm: 2 passes of 4*8*2 = 128 B and
  // no launch of its own; RoPE its own kernel at 2 bytes: 192 B; SwiGLU reads gate and up (2 B)
  // and writes the GEMM input (2 B): 4*16*6 = 384 B.
  const sim::OpCost r = cost("vllm", Op::Residual);
  EXPECT_DOUBLE_EQ(r.bytes, 128);
  EXPECT_DOUBLE_EQ(r.overhead_s, 0);
  EXPECT_DOUBLE_EQ(r.time_s, 128 / 50e9);
  EXPECT_DOUBLE_EQ(cost("vllm", Op::Rope).bytes, 192);
  EXPECT_DOUBLE_EQ(cost("vllm", Op::SwiGLU).bytes, 384);
  // GEMM output at 2 bytes: gate_up [4][8] x [8][32]: weights 512, input 64, output 4*32*2 = 256.
  EXPECT_DOUBLE_EQ(cost("vllm", Op::GateUp).bytes, 512 + 64 + 256);
  // trtllm: RoPE and SwiGLU fused (no time, FLOPs still counted), gate_up writes F columns.
  const sim::OpCost rope = cost("trtllm", Op::Rope), glu = cost("trtllm", Op::SwiGLU);
  EXPECT_DOUBLE_EQ(rope.time_s, 0);
  EXPECT_DOUBLE_EQ(glu.time_s, 0);
  EXPECT_DOUBLE_EQ(glu.flops, 5.0 * 4 * 16);
  EXPECT_DOUBLE_EQ(cost("trtllm", Op::GateUp).bytes, 512 + 64 + 128);
  // A custom engine from its parts; unknown parts are refused.
  j["engine"] = {{"elementwise", "compute"}, {"fuse", {"rope"}}};
  const hw::Profile custom = hw::parse_profile(j, "round");
  EXPECT_EQ(custom.engine.name, "custom");
  EXPECT_DOUBLE_EQ(sim::op_cost(custom, c, Op::Residual, {4, 0, 0}, p).bytes, 192);
  EXPECT_EQ(custom.engine.own_gemm_rows, 0);
  j["engine"] = {{"own_gemm_rows", 32}};
  EXPECT_EQ(hw::parse_profile(j, "round").engine.own_gemm_rows, 32);
  for (const json& bad : {json(-1), json(0.5), json("64")}) {
    j["engine"] = {{"own_gemm_rows", bad}};
    EXPECT_THROW(hw::parse_profile(j, "round"), Error) << bad;
  }
  j["engine"] = {{"fuse", {"layernorm"}}};
  EXPECT_THROW(hw::parse_profile(j, "round"), Error);
  j["engine"] = "tgi";
  EXPECT_THROW(hw::parse_profile(j, "round"), Error);
  // The defaults: vllm on a GPU, lazyprefill on a CPU.
  EXPECT_EQ(hw::load_profile("h100-sxm").engine.name, "vllm");
  EXPECT_EQ(hw::load_profile("cpu-local").engine.name, "lazyprefill");
}

// FP8 runs at the part's FP8 peak where it has one, and is refused where it has none.
TEST(SimCost, Fp8NeedsAnFp8Peak) {
  const ModelConfig c = preset_config("llama-3.1-8b");
  const sim::Precision fp8{"fp8", "fp8", "fp8"};
  for (const char* name : {"h100-sxm", "h200", "l4", "rtx-4090"}) {
    const hw::Profile hw = hw::load_profile(name);
    ASSERT_TRUE(hw.peak_flops.count("fp8")) << name;
    const sim::OpCost g = sim::op_cost(hw, c, Op::GateUp, {4096, 0, 0}, fp8);
    EXPECT_DOUBLE_EQ(g.compute_s, g.flops / (hw.peak_flops.at("fp8") * hw.eff(hw::Family::Gemm).compute *
                                             4096 / (4096 + hw.eff(hw::Family::Gemm).half_rows)))
        << name;
    // FP8 weights are one byte each, FP8 GEMMs read one-byte activations.
    EXPECT_DOUBLE_EQ(g.bytes, 4096.0 * 2 * 14336 * 1 + 4096.0 * 4096 * 1 + 4096.0 * 2 * 14336 * 2) << name;
  }
  for (const char* name : {"a100-80gb", "cpu-local"}) {
    try {
      sim::op_cost(hw::load_profile(name), c, Op::GateUp, {16, 0, 0}, fp8);
      ADD_FAILURE() << name << ": fp8 accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no FP8 peak"), std::string::npos) << e.what();
    }
  }
}

TEST(SimReplay, DensePrefillFlopsAreTheClosedForm) {
  const ModelConfig c = preset_config("llama-3.1-8b");
  const hw::Profile hw = hw::load_profile("h100-sxm");
  const int64_t T = 4096;
  const sim::Prediction p = sim::replay(trace::synthetic_trace(c, "none", {}, T, 0), c, hw, sim::Precision{});
  // Per token and layer: 2 * (4096*(4096 + 2*1024) + 4096*4096 + 3*4096*14336) GEMM FLOPs;
  // attention 2*128*2 + 5 per pair and head over T(T+1)/2 pairs, 32 heads; norms 2 * 4*4096,
  // RoPE 3 * 40 * 128, SwiGLU 5 * 14336, residuals 2 * 4096 per token; LM head for one row.
  const double gemm = 2.0 * (4096.0 * 6144 + 4096.0 * 4096 + 3.0 * 4096 * 14336);
  const double elementwise = 2 * 4 * 4096.0 + 3 * 40 * 128.0 + 5 * 14336.0 + 2 * 4096.0;
  const double attention = double(T) * (T + 1) / 2 * 32 * (4 * 128 + 5);
  const double head = 4 * 4096.0 + 2.0 * 4096 * 128256;
  EXPECT_NEAR(p.prefill_flops(), 32 * (T * (gemm + elementwise) + attention) + head, 1e3);
  // At 4096 tokens an H100 prefill is compute-bound in the MLP.
  EXPECT_EQ(p.prefill_bound_op(), Op::GateUp);
  EXPECT_TRUE(p.decode_step_s.empty());
  // Memory: bf16 weights, K/V of 4096 tokens x 32 layers x 2 x 1024 x 2 bytes.
  EXPECT_DOUBLE_EQ(p.memory.weights, 8030261248.0 * 2);
  EXPECT_DOUBLE_EQ(p.memory.kv, 4096.0 * 32 * 2 * 1024 * 2);
  EXPECT_EQ(p.memory.aux, 0);
}

TEST(SimReplay, PruningCutsComputeBoundTimeLikeItsFlops) {
  const ModelConfig c = preset_config("llama-2-7b");
  const hw::Profile hw = hw::load_profile("a100-80gb");
  const auto steps = resolve_schedule(default_schedule(), c.n_layer);
  const int64_t T = 8192;
  const sim::Prediction none =
      sim::replay(trace::synthetic_trace(c, "none", {}, T, 4), c, hw, sim::Precision{});
  const sim::Prediction lazy =
      sim::replay(trace::synthetic_trace(c, "lazyllm", steps, T, 4), c, hw, sim::Precision{});
  const double flop_ratio = none.prefill_flops() / lazy.prefill_flops();
  EXPECT_GT(flop_ratio, 1.3);
  // Prefill at 8192 tokens is compute-bound: time falls with FLOPs, within the score/select cost.
  EXPECT_NEAR(none.ttft_s / lazy.ttft_s, flop_ratio, 0.05 * flop_ratio);
  EXPECT_GT(lazy.memory.aux, 0);
  EXPECT_LT(lazy.memory.kv, none.memory.kv);
  ASSERT_EQ(lazy.decode_step_s.size(), 4u);
  // A decode step reads fewer keys when pruned: never slower than unpruned's.
  EXPECT_LE(lazy.decode_step_s[0], none.decode_step_s[0]);
}

TEST(SimReplay, MappingByDepthAndShare) {
  const ModelConfig src = preset_config("smollm2-135m");  // 30 layers
  const auto steps = resolve_schedule(default_schedule(), src.n_layer);
  const trace::Trace t = trace::synthetic_trace(src, "lazyllm", steps, 1000, 2);
  EXPECT_EQ(sim::map_trace(t, 30, 1000).steps[0].queries, t.steps[0].queries);
  // Onto 60 layers and twice the prompt: every source layer covers two target layers, counts
  // double, pairs quadruple, decoding steps keep one new row.
  const trace::Trace m = sim::map_trace(t, 60, 2000);
  ASSERT_EQ(m.header.n_layer, 60);
  for (int l = 0; l < 60; ++l) {
    EXPECT_EQ(m.steps[0].queries[size_t(l)], 2 * t.steps[0].queries[size_t(l / 2)]) << l;
    EXPECT_EQ(m.steps[0].pairs[size_t(l)], 4 * t.steps[0].pairs[size_t(l / 2)]) << l;
    EXPECT_EQ(m.steps[1].queries[size_t(l)], 1);
  }
  // The share of prompt (token, layer) pairs computed is kept.
  const auto share = [](const trace::Trace& x) {
    double q = 0;
    for (int64_t v : x.steps[0].queries) q += double(v);
    return q / (double(x.header.prompt_tokens) * x.header.n_layer);
  };
  EXPECT_NEAR(share(m), share(t), 0.02);
  // Pruning layers land at the same relative depth.
  ASSERT_EQ(m.header.schedule_layers.size(), steps.size());
  for (size_t i = 0; i < steps.size(); ++i)
    EXPECT_EQ(m.header.schedule_layers[i].first, 2 * steps[i].layer + 1);
}

TEST(SimReplay, SyntheticPrefillMatchesTheEngineCounting) {
  const ModelConfig c = preset_config("smollm2-135m");
  const auto steps = resolve_schedule(parse_schedule("8:0.3,17:0.3,26:0.3"), c.n_layer);
  const trace::Trace t = trace::synthetic_trace(c, "lazyllm", steps, 174, 0);
  // The engine's counts on the 174-token demo prompt: 174 through layer 8, then 122,
  // 86, 61 (each keeps 174 - floor(0.3 * 174) = 122, ...).
  EXPECT_EQ(t.steps[0].queries[8], 174);
  EXPECT_EQ(t.steps[0].queries[9], 122);
  EXPECT_EQ(t.steps[0].queries[18], 86);
  EXPECT_EQ(t.steps[0].queries[27], 61);
  EXPECT_EQ(t.steps[0].pairs[27], 61 * 62 / 2);
  EXPECT_EQ(t.steps[0].aux_writes[8], 52);
  EXPECT_THROW(trace::synthetic_trace(c, "fastest", steps, 10, 0), Error);
}

// Steps `all` (every layer) and `runs` (made at the run starts `starts` only) side by side: at each
// decoding step every run start holds what the every-layer step holds there, and the run's other
// layers do its first's work and move nothing to or from the Aux Cache (what the serving
// simulation, which prices a run's gathers once, relies on). `each` sees every decoding step of
// `all`; returns how many there were.
int expect_run_starts_match(trace::SyntheticSteps& all, trace::SyntheticSteps& runs,
                            const std::vector<int>& starts, int n_layer,
                            const std::function<void(const trace::Step&)>& each) {
  trace::Step a, r;
  int decoding = 0;
  while (all.next(a)) {
    if (!runs.next(r)) {
      ADD_FAILURE() << "the run-start steps ended first";
      break;
    }
    if (a.kind != "decode") continue;
    ++decoding;
    for (size_t k = 0; k < starts.size(); ++k) {
      const int l = starts[k], end = k + 1 < starts.size() ? starts[k + 1] : n_layer;
      SCOPED_TRACE(fmt::format("step {} layer {}", decoding, l));
      EXPECT_EQ(r.queries[size_t(l)], a.queries[size_t(l)]);
      EXPECT_EQ(r.keys[size_t(l)], a.keys[size_t(l)]);
      EXPECT_EQ(r.pairs[size_t(l)], a.pairs[size_t(l)]);
      EXPECT_EQ(r.attended[size_t(l)], a.attended[size_t(l)]);
      EXPECT_EQ(r.revived[size_t(l)], a.revived[size_t(l)]);
      EXPECT_EQ(r.aux_reads[size_t(l)], a.aux_reads[size_t(l)]);
      EXPECT_EQ(r.aux_writes[size_t(l)], a.aux_writes[size_t(l)]);
      for (int j = l + 1; j < end; ++j) {  // the run's other layers: its first's work, nothing moved
        EXPECT_EQ(a.queries[size_t(j)], a.queries[size_t(l)]);
        EXPECT_EQ(a.keys[size_t(j)], a.keys[size_t(l)]);
        EXPECT_EQ(a.pairs[size_t(j)], a.pairs[size_t(l)]);
        EXPECT_EQ(a.aux_reads[size_t(j)], 0);
        EXPECT_EQ(a.aux_writes[size_t(j)], 0);
      }
    }
    each(a);
  }
  return decoding;
}

// Decoding steps made only at the first layer of each run of layers hold, there, what every-layer
// steps hold at that layer (every layer of a run the same), revivals carried between stages
// included; runs that would split a stage's layers unevenly are refused.
TEST(SimReplay, SyntheticRunStartsMatchEveryLayer) {
  const ModelConfig c = preset_config("smollm2-135m");
  const auto steps = resolve_schedule(parse_schedule("8:0.3,17:0.3,26:0.3"), c.n_layer);
  const trace::Revivals rv = [](size_t stage, int64_t step) {
    return trace::StageRevival{0.02 + 0.01 * double(stage) + 0.001 * double(step % 5), 0.6, 0.4};
  };
  const std::vector<int> starts = {0, 8, 9, 10, 17, 18, 19, 26, 27, 28};
  trace::SyntheticSteps all(c, "lazyllm", steps, 3000, 12, rv), runs(c, "lazyllm", steps, 3000, 12, rv);
  runs.only_run_starts(starts);
  const int decoding = expect_run_starts_match(all, runs, starts, c.n_layer,
                                               [](const trace::Step& a) { EXPECT_GT(a.revived[9], 0); });
  EXPECT_EQ(decoding, 12);
  trace::SyntheticSteps bad(c, "lazyllm", steps, 3000, 12, rv);
  EXPECT_THROW(bad.only_run_starts({0, 8, 10, 17, 18, 19, 26, 27, 28}), Error);  // 9 is not a start
  EXPECT_THROW(bad.only_run_starts({1, 8, 9, 17, 18, 26, 27}), Error);           // nor is 0
}

// The serving simulation's steps: run starts at each pruning layer and the one after it alone
// (the rest of a stage runs with the layer after the pruning layer, so rows moved to and from
// the Aux Cache must come at a run's first layer only), revivals read from a RevivalTable shorter
// than the request (the steps past it ask the function), survival left to the stage's kept share.
TEST(SimReplay, SyntheticStepsFromARevivalTableMatchTheFunction) {
  const ModelConfig c = preset_config("smollm2-135m");
  const auto steps = resolve_schedule(parse_schedule("8:0.3,17:0.3,26:0.3"), c.n_layer);
  const trace::Revivals rv = [](size_t stage, int64_t step) {
    return trace::StageRevival{0.03 + 0.01 * double(stage) + 0.002 * double(step % 3), -1, 0.3};
  };
  const auto table = std::make_shared<const trace::RevivalTable>(rv, steps.size(), 8);
  for (size_t st = 0; st < 4; ++st)  // stage 3: past the table's stages
    for (int64_t s = 0; s <= 12; ++s) {
      const trace::StageRevival want = rv(st, s), got = (*table)(st, s);
      EXPECT_EQ(got.share, want.share);
      EXPECT_EQ(got.survival, want.survival);
      EXPECT_EQ(got.key_share, want.key_share);
    }
  const std::vector<int> starts = {0, 8, 9, 17, 18, 26, 27};
  trace::SyntheticSteps all(c, "lazyllm", steps, 2500, 12, rv), tab(c, "lazyllm", steps, 2500, 12);
  tab.only_run_starts(starts);
  tab.use_table(table);
  const int decoding = expect_run_starts_match(all, tab, starts, c.n_layer, [](const trace::Step& a) {
    EXPECT_GT(a.revived[9], 0);
    EXPECT_GT(a.revived[18], 0);
  });
  EXPECT_EQ(decoding, 12);
}

}  // namespace
}  // namespace lp

namespace lp {
namespace {

// Measurements made from a known profile (the cost model's own formula, so the truth is known):
// calibrating the round profile back from them recovers the efficiencies, ignores an outlier,
// and is deterministic.
std::vector<calib::RunMeasurement> synthetic_runs(const hw::Profile& truth) {
  const ModelConfig c = preset_config("smollm2-135m");
  const OpDtypes dt{4, 4, 4};
  std::vector<calib::RunMeasurement> runs;
  for (int64_t T : {32, 64, 128, 256, 512, 1024, 2048}) {
    calib::RunMeasurement m;
    m.origin = fmt::format("T{}", T);
    m.compute = "f32";
    m.prompt_tokens = T;
    for (int l = 0; l < 4; ++l)
      for (Op op : {Op::AttnNorm, Op::QKV, Op::Rope, Op::Attention, Op::OProj, Op::FfnNorm, Op::GateUp,
                    Op::SwiGLU, Op::Down, Op::Gather, Op::Select}) {
        const OpShape s{T, T * (T + 1) / 2, T};
        calib::OpSample x{op, l, double(T), op_flops(c, op, s), op_bytes(c, op, s, dt), 0, 1};
        x.seconds = calib::predict_sample(truth, x, "f32");
        m.ops.push_back(x);
        m.prefill_s += x.seconds;
      }
    runs.push_back(m);
  }
  return runs;
}

TEST(SimCalibrate, RecoversKnownEfficienciesAndIgnoresAnOutlier) {
  hw::Profile truth = hw::parse_profile(round_profile(), "round");
  truth.efficiency[size_t(hw::Family::Gemm)] = {0.3, 40, 0.6, 20e-6, {}};
  truth.efficiency[size_t(hw::Family::Attention)] = {0.2, 8, 0.5, 5e-6, {}};
  // Gathers served from the cache at 2.5x the DRAM figure (kMaxMemoryEfficiency).
  truth.efficiency[size_t(hw::Family::DataMovement)] = {0.5, 1, 2.5, 1e-6, {}};
  std::vector<calib::RunMeasurement> runs = synthetic_runs(truth);
  runs[3].ops[1].seconds *= 5;  // one QKV sample 5x slow (a preempted thread)
  const hw::Profile start = hw::parse_profile(round_profile(), "round");
  calib::CalibrationReport rep;
  const hw::Profile fit = calib::calibrate(start, runs, &rep);
  EXPECT_FALSE(fit.efficiency_default);
  const hw::Efficiency& g = fit.eff(hw::Family::Gemm);
  EXPECT_NEAR(g.compute, 0.3, 0.03);
  EXPECT_NEAR(g.half_rows, 40, 8);
  const hw::Efficiency& a = fit.eff(hw::Family::Attention);
  EXPECT_NEAR(a.compute, 0.2, 0.02);
  EXPECT_NEAR(fit.eff(hw::Family::DataMovement).memory, 2.5, 0.1) << hw::efficiency_json(fit).dump();
  // GEMMs here are compute-bound: their memory efficiency is not identified and stays a share
  // of DRAM bandwidth (weights stream from memory), so decode predictions keep their bound.
  EXPECT_LE(g.memory, 1.0);
  // Every run's prefill is predicted within 2% (the outlier moves one run by its own excess).
  for (size_t i = 0; i < rep.runs.size(); ++i) {
    if (i != 3) {
      EXPECT_NEAR(rep.runs[i].second / rep.runs[i].first, 1.0, 0.02) << i;
    }
  }
  // Deterministic: the same input gives the same profile, bit for bit.
  const hw::Profile again = calib::calibrate(start, runs, nullptr);
  EXPECT_EQ(hw::efficiency_json(again).dump(), hw::efficiency_json(fit).dump());
}

// Each run's one-row LM head streams its weights at 1.4x the profile's (triad) bandwidth, as this
// machine's reads do: those samples identify the GEMM memory efficiency above 1, and the
// compute-bound GEMMs keep theirs.
TEST(SimCalibrate, OneRowGemmsIdentifyTheGemmBandwidth) {
  json j = round_profile();
  j["memory_bandwidth_gbs"] = 20;  // a CPU's bandwidth: the one-row product memory-bound
  hw::Profile truth = hw::parse_profile(j, "round");
  truth.efficiency[size_t(hw::Family::Gemm)] = {0.6, 4, 1.4, 20e-6, {}};
  std::vector<calib::RunMeasurement> runs = synthetic_runs(truth);
  const ModelConfig c = preset_config("smollm2-135m");
  for (calib::RunMeasurement& m : runs) {
    const OpShape s{1, 0, 0};
    calib::OpSample x{Op::LmHead, -1, 1.0, op_flops(c, Op::LmHead, s), op_bytes(c, Op::LmHead, s, {4, 4, 4}),
                      0,          1};
    x.seconds = calib::predict_sample(truth, x, "f32");
    ASSERT_GT(x.seconds, 2 * x.flops / (truth.peak("f32") * 0.6 / 5));  // memory-bound, by far
    m.ops.push_back(x);
    m.prefill_s += x.seconds;
  }
  const hw::Profile fit = calib::calibrate(hw::parse_profile(j, "round"), runs, nullptr);
  EXPECT_NEAR(fit.eff(hw::Family::Gemm).memory, 1.4, 0.03) << hw::efficiency_json(fit).dump();
  EXPECT_NEAR(fit.eff(hw::Family::Gemm).compute, 0.6, 0.03);
}

TEST(SimCalibrate, BadRunFilesNameTheProblem) {
  const auto err = [](const nlohmann::json& j) {
    try {
      calib::measurement_from_run_json(j, "r.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(err(nlohmann::json::object()).find("r.json: not a `run --json` output"), std::string::npos);
  nlohmann::json j = {
      {"dtype", "f32"},
      {"prompt_tokens", 4},
      {"prefill_ms", 1.0},
      {"ops",
       {{"prefill",
         {{"layers", {{{"qkv", {{"ms", 1.0}, {"flop", 1.0}, {"bytes", 1.0}, {"rows", 4}, {"calls", 1}}}}}},
          {"outside_layers", nlohmann::json::object()}}}}}};
  EXPECT_EQ(err(j), "");
  j["ops"]["prefill"]["layers"][0]["warp"] = j["ops"]["prefill"]["layers"][0]["qkv"];
  EXPECT_NE(err(j).find("unknown op 'warp'"), std::string::npos) << err(j);
  EXPECT_THROW(calib::calibrate(hw::parse_profile(round_profile(), "round"), {}, nullptr), Error);
}

}  // namespace
}  // namespace lp

namespace lp {
namespace {

// Tensor parallelism: a 4-GPU round-numbers part (10 GB/s links at efficiency 0.5, 2 us hops).
hw::Profile tp_profile() {
  json j = round_profile();
  j["max_tp"] = 4;
  j["interconnect_bandwidth_gbs"] = 10;
  j["interconnect_latency_us"] = 2;
  j["efficiency"]["interconnect"] = 0.5;
  return hw::parse_profile(j, "tp.json");
}

TEST(TensorParallel, CollectivesFollowTheRingFormulas) {
  const hw::Profile hw = tp_profile();
  // All-reduce of 8 MB on 4 GPUs: 2 * 3/4 * 8e6 / (10e9 * 0.5) = 2.4 ms, plus 2 * 3 * 2 us.
  EXPECT_NEAR(sim::allreduce_cost(hw, 4, 8e6).time_s, 2.4e-3 + 12e-6, 1e-12);
  // All-gather of 8 MB in total: 3/4 * 8e6 / 5e9 = 1.2 ms, plus 3 * 2 us.
  EXPECT_NEAR(sim::allgather_cost(hw, 4, 8e6).time_s, 1.2e-3 + 6e-6, 1e-12);
  EXPECT_EQ(sim::allreduce_cost(hw, 1, 8e6).time_s, 0);
}

TEST(TensorParallel, ShardsHeadsFfnAndVocabulary) {
  const ModelConfig c = preset_config("llama-3.1-70b");  // 64 heads, 8 KV heads, F 28672
  const ModelConfig s = sim::tp_shard(c, 4);
  EXPECT_EQ(s.n_head, 16);
  EXPECT_EQ(s.n_head_kv, 2);
  EXPECT_EQ(s.n_ff, 7168);
  EXPECT_EQ(s.n_vocab, (c.n_vocab + 3) / 4);
  EXPECT_EQ(s.n_embd, c.n_embd);
  // 16 GPUs: 8 KV heads are replicated, one per GPU.
  EXPECT_EQ(sim::tp_shard(c, 16).n_head_kv, 1);
  // Per-GPU parameters: all the matrices split, only the norms (2D per layer + D) repeat.
  const double norms = double(c.n_layer) * 2 * c.n_embd + c.n_embd;
  EXPECT_NEAR(double(s.n_params()), (double(c.n_params()) - norms) / 4 + norms, double(c.n_embd) * 4);
  EXPECT_THROW(sim::tp_shard(c, 3), UsageError);
  EXPECT_THROW(sim::tp_shard(preset_config("smollm2-135m"), 2), UsageError);  // 9 heads
  EXPECT_THROW(sim::tp_shard(c, 0), UsageError);
}

TEST(TensorParallel, OneGpuIsUnchangedAndMoreGpusShareTheWork) {
  const hw::Profile h100 = hw::load_profile("h100-sxm");
  const ModelConfig c = preset_config("llama-3.1-70b");
  const sim::Precision p;
  const trace::Trace t =
      trace::synthetic_trace(c, "lazyllm", resolve_schedule(default_schedule(), c.n_layer), 8192, 3);
  const sim::Prediction one = sim::replay(t, c, h100, p);
  const sim::Prediction one_tp = sim::replay(t, c, h100, p, 1, 1);
  EXPECT_EQ(one.ttft_s, one_tp.ttft_s);
  EXPECT_EQ(one.prefill_comm.time_s, 0);
  double prev_compute = one.ttft_s;
  for (int tp : {2, 4, 8}) {
    SCOPED_TRACE(tp);
    const sim::Prediction r = sim::replay(t, c, h100, p, 1, tp);
    const double compute = r.ttft_s - r.prefill_comm.time_s;
    // GEMM and attention FLOPs split tp ways; norms and residuals do not, so the compute part
    // falls by a little less than tp.
    EXPECT_LT(compute, prev_compute * 0.6);
    EXPECT_GT(compute, one.ttft_s / tp);
    // Two all-reduces per layer plus the embedding's and the LazyLLM scores', one all-gather.
    EXPECT_EQ(r.prefill_comm.calls, 2 * c.n_layer + 1 + 3 + 1);
    EXPECT_NEAR(r.memory.weights, double(sim::tp_shard(c, tp).n_params()) * 2, 1);
    EXPECT_NEAR(r.memory.kv, one.memory.kv / tp, one.memory.kv * 1e-12);
    EXPECT_EQ(r.memory.aux, one.memory.aux);
    prev_compute = compute;
  }
  EXPECT_THROW(sim::replay(t, c, h100, p, 1, 16), UsageError);  // max_tp 8
  EXPECT_THROW(sim::replay(t, c, hw::load_profile("cpu-local"), p, 1, 2), UsageError);
}

// Golden values from an independent implementation: tests/fixtures/sim_reference.py computes
// them from the documentation alone (docs/simulator.md, hwmodels/README.md, the presets and
// profiles), without reading sim/ or model/ops.cpp. Regenerate with
// `python3 tests/fixtures/sim_reference.py` after a documented change to the model.
TEST(SimGolden, AgreesWithTheIndependentPythonReference) {
  std::ifstream in(std::string(LP_SOURCE_DIR) + "/tests/fixtures/sim_golden.json");
  ASSERT_TRUE(in) << "tests/fixtures/sim_golden.json";
  const nlohmann::json g = nlohmann::json::parse(in);
  ASSERT_GE(g["cases"].size(), 5u);
  const auto near = [](double got, double want, const std::string& what) {
    EXPECT_NEAR(got, want, 1e-9 * std::max(1.0, std::fabs(want))) << what;
  };
  for (const auto& cs : g["cases"]) {
    const auto& in_ = cs["inputs"];
    const auto& out = cs["outputs"];
    const std::string label = in_.dump();
    SCOPED_TRACE(label);
    const ModelConfig c = preset_config(in_["model"].get<std::string>());
    hw::Profile hw = hw::load_profile(in_["hw"].get<std::string>());
    if (in_.contains("engine")) hw.engine = hw::engine_preset(in_["engine"].get<std::string>());
    if (in_.contains("attention_decode_compute"))
      hw.efficiency[size_t(hw::Family::Attention)].decode_compute =
          in_["attention_decode_compute"].get<double>();
    // The reference names the ablations as they were called when it was written (static, random).
    const std::string policy = policy_name(*policy_in_file(in_["policy"].get<std::string>()));
    const auto steps = resolve_schedule(parse_schedule(in_["schedule"].get<std::string>()), c.n_layer);
    const int64_t N = in_["prompt_tokens"].get<int64_t>();
    const int64_t decode = std::max<int64_t>(0, in_["new_tokens"].get<int64_t>() - 1);
    const sim::Precision p{in_["weights"].get<std::string>(), in_["compute"].get<std::string>(),
                           in_["kv"].get<std::string>()};
    const trace::Trace t =
        trace::synthetic_trace(c, policy, policy == "none" ? std::vector<PruneStep>{} : steps, N, decode);
    EXPECT_EQ(t.steps[0].queries, out["prefill_queries"].get<std::vector<int64_t>>());
    const int tp = in_.value("tp", 1);
    const sim::Prediction pr = sim::replay(t, c, hw, p, 1, tp);
    const sim::Prediction b = sim::replay(trace::synthetic_trace(c, "none", {}, N, decode), c, hw, p, 1, tp);
    if (tp > 1) {
      near(pr.prefill_comm.time_s * 1e3, out["comm_ms"].get<double>(), "comm_ms");
      near(b.prefill_comm.time_s * 1e3, out["baseline_comm_ms"].get<double>(), "baseline_comm_ms");
      EXPECT_EQ(pr.prefill_comm.calls, out["comm_calls"].get<int64_t>());
      near(pr.prefill_comm.bytes, out["comm_bytes"].get<double>(), "comm_bytes");
    }
    near(pr.ttft_s * 1e3, out["ttft_ms"].get<double>(), "ttft_ms");
    near(b.ttft_s * 1e3, out["baseline_ttft_ms"].get<double>(), "baseline_ttft_ms");
    near(pr.total_s * 1e3, out["total_ms"].get<double>(), "total_ms");
    const auto dec = out["decode_step_ms"].get<std::vector<double>>();
    ASSERT_EQ(pr.decode_step_s.size(), dec.size());
    for (size_t i = 0; i < dec.size(); ++i) near(pr.decode_step_s[i] * 1e3, dec[i], "decode step");
    near(pr.prefill_flops(), out["prefill_flop"].get<double>(), "prefill_flop");
    near(pr.memory.weights, out["memory_bytes"]["weights"].get<double>(), "weights");
    near(pr.memory.kv, out["memory_bytes"]["kv"].get<double>(), "kv");
    near(pr.memory.aux, out["memory_bytes"]["aux_cache"].get<double>(), "aux");
    near(pr.memory.activations, out["memory_bytes"]["activations"].get<double>(), "activations");
    EXPECT_EQ(std::string(op_name(pr.prefill_bound_op())), out["prefill_bound_op"]["op"].get<std::string>());
    for (const auto& [name, ms] : out["prefill_op_ms"].items())
      for (int i = 0; i < kNumOps; ++i)
        if (op_name(Op(i)) == name) near(pr.prefill_ops[size_t(i)].time_s * 1e3, ms.get<double>(), name);
  }
}

// Llama-2-7B cut to 3 layers, and a LazyLLM trace of it: a 100-token prefill halved after layers
// 0 and 1 (Aux Cache writes 50 and 25), then the decoding step `d`.
ModelConfig three_layers() {
  ModelConfig c = preset_config("llama-2-7b");
  c.n_layer = 3;
  return c;
}
trace::Trace three_layer_trace(const trace::Step& d) {
  trace::Trace t;
  t.header.n_layer = 3;
  t.header.policy = "lazyllm";
  t.header.prompt_tokens = 100;
  t.header.schedule_layers = {{0, 0.5}, {1, 0.5}};
  trace::Step p{"prefill",
                100,
                {100, 50, 25},
                {100, 50, 25},
                {5050, 1275, 325},
                {0, 0, 0},
                {0, 0, 0},
                {50, 25, 0},
                {},
                {},
                {},
                {}};
  t.steps = {p, d};
  return t;
}

// The Aux Cache holds one entry per token: a decoding step's writes (revived rows pruned again)
// overwrite entries the prefill made. And a decoding step attends over its recorded active set,
// not min(keys held, pairs), which revived rows' pairs inflate.
TEST(SimReplay, AuxCacheCountsEachTokenOnceAndDecodeAttendsItsActiveSet) {
  const ModelConfig c = three_layers();
  // Revives 10 rows at layer 1, 6 of which are pruned again after it (overwrites).
  trace::Step d{"decode",      1,          {1, 11, 5}, {101, 61, 30},
                {51, 300, 26}, {0, 10, 0}, {0, 10, 0}, {0, 6, 0},
                {51, 26, 26},  {},         {},         {}};
  const trace::Trace t = three_layer_trace(d);
  const hw::Profile hw = hw::load_profile("h100-sxm");
  const sim::Precision prec{"bf16", "bf16", "bf16"};
  const sim::Prediction r = sim::replay(t, c, hw, prec);
  EXPECT_DOUBLE_EQ(r.memory.aux, 75.0 * c.n_embd * 2);  // 50 + 25 tokens, not 81
  // Layer 1's attention in the decoding step costs 26 keys (its active set), not min(61, 300).
  trace::Trace at = t;
  const sim::Prediction with_keys = sim::replay(at, c, hw, prec);
  at.steps[1].attended.clear();  // an old trace without the field: the former bound
  const sim::Prediction without = sim::replay(at, c, hw, prec);
  const sim::OpCost want = sim::op_cost(hw, c, Op::Attention, OpShape{11, 300, 26}, prec);
  const sim::OpCost old = sim::op_cost(hw, c, Op::Attention, OpShape{11, 300, 61}, prec);
  EXPECT_GT(old.bytes, want.bytes);
  EXPECT_NEAR(
      without.decode_ops[size_t(Op::Attention)].bytes - with_keys.decode_ops[size_t(Op::Attention)].bytes,
      old.bytes - want.bytes, 1e-6 * old.bytes);
}

// A profile with listed shares prices a decoding step over a listed key set (fewer attended keys
// than the layer holds) as the CPU engine computes it: every row against every held key at
// listed_compute of peak, plus Q, O and the held K/V read once at listed_memory of the bandwidth,
// summed; and each pruning stage pays pruning_key_ns per key it selects from. By hand.
TEST(SimReplay, ListedDecodingAttentionReadsEveryHeldKey) {
  const ModelConfig c = three_layers();
  // Layer 0 attends all it holds (a prefix: priced as before); layers 1 and 2 listed sets.
  trace::Step d{"decode",       1,          {1, 11, 5}, {101, 61, 30},
                {101, 300, 26}, {0, 10, 0}, {0, 10, 0}, {0, 6, 0},
                {101, 26, 26},  {},         {},         {}};
  const trace::Trace t = three_layer_trace(d);
  const sim::Precision prec{"bf16", "bf16", "bf16"};
  const hw::Profile plain = hw::load_profile("h100-sxm");
  hw::Profile hw = plain;
  hw.efficiency[size_t(hw::Family::Attention)].listed_compute = 0.5;
  hw.efficiency[size_t(hw::Family::Attention)].listed_memory = 0.4;
  hw.pruning_key_s = 100e-9;
  const sim::Prediction a = sim::replay(t, c, plain, prec), b = sim::replay(t, c, hw, prec);
  // Per listed layer: rows R over held keys K, F = R K H (4 Dh + 5), B = 2 R q_dim el + 2 (R + K) kv_dim kv.
  const double H = c.n_head, Dh = c.head_dim, q_dim = H * Dh, kv_dim = double(c.n_head_kv) * Dh;
  const double el = sim::CostContext(hw, prec).dtypes.elem_bytes, kv = 2;
  const double peak = hw.peak("bf16"), bw = hw.memory_bandwidth;
  const double over = hw.eff(hw::Family::Attention).overhead_s;
  double want = 0;
  for (const auto& [R, K] : {std::pair{11.0, 61.0}, std::pair{5.0, 30.0}})
    want += R * K * H * (4 * Dh + 5) / (peak * 0.5) +
            (2 * R * q_dim * el + 2 * (R + K) * kv_dim * kv) / (bw * 0.4) + over;
  // Layer 0 as before: the same op_cost call both ways.
  const sim::OpCost l0 = sim::op_cost(plain, c, Op::Attention, OpShape{1, 101, 101}, prec);
  EXPECT_NEAR(b.decode_ops[size_t(Op::Attention)].time_s, want + l0.time_s, 1e-9 * want);
  EXPECT_GT(b.decode_ops[size_t(Op::Attention)].time_s, a.decode_ops[size_t(Op::Attention)].time_s);
  // Selection at layers 0 and 1 of 101 and 26 keys; the prefill's at 100 and 50.
  EXPECT_NEAR(b.decode_ops[size_t(Op::Select)].time_s - a.decode_ops[size_t(Op::Select)].time_s, 127 * 100e-9,
              1e-12);
  EXPECT_NEAR(b.prefill_ops[size_t(Op::Select)].time_s - a.prefill_ops[size_t(Op::Select)].time_s,
              150 * 100e-9, 1e-12);
  // GEMMs and the rest do not change.
  EXPECT_DOUBLE_EQ(b.decode_ops[size_t(Op::GateUp)].time_s, a.decode_ops[size_t(Op::GateUp)].time_s);
}

}  // namespace
}  // namespace lp
