// `lazyprefill simulate` through the real binary: replaying the tiny model's traces and
// synthetic schedules, what the replay must agree on with the engine, and bad input.
#include <filesystem>
#include <fstream>
#include <map>

#include "tests/cli/cli_harness.h"
#include "tests/costed_gguf.h"

namespace lp {
namespace {

using namespace cli_test;

// The replayed Aux Cache holds what the engine's holds: one entry per token, whatever the
// decoding steps overwrote (the sum of every write was reported), and a decoding step
// attends over its recorded active set.
TEST_F(CliSim, ReplayedAuxCacheAndDecodeKeysAreTheEngines) {
  nlohmann::json run;
  std::string prompt;
  for (int i = 0; i < 60; ++i) prompt += "b a ";
  const std::string t = dir_.file("revive.jsonl");
  CliResult r = run_cli(dir_, {"run", "--model", tiny_, "--prompt", prompt, "--max-new-tokens", "8",
                               "--prune", "lazyllm", "--schedule", "0:0.6", "--trace", t, "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  run = nlohmann::json::parse(r.out);
  const trace::Trace tr = trace::read_trace(t);
  int64_t writes = 0, decode_writes = 0;
  for (const trace::Step& s : tr.steps)
    for (int64_t w : s.aux_writes) (s.kind == "prefill" ? writes : decode_writes) += w;
  ASSERT_GT(run["revivals"].get<int64_t>(), 0) << "the case must revive for the check to mean anything";
  r = run_cli(dir_, {"simulate", "--trace", t, "--hw", "cpu-local", "--compute", "f32", "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto sim = nlohmann::json::parse(r.out)["results"][0];
  const int64_t D = tr.header.model["n_embd"].get<int64_t>();
  // The engine stores f32 states and an 8-byte index entry per token; the simulator the states.
  const int64_t engine_entries = run["aux_cache_bytes"].get<int64_t>() / (4 * D + 8);
  EXPECT_EQ(engine_entries, writes);
  EXPECT_DOUBLE_EQ(sim["memory_bytes"]["aux_cache"].get<double>(), double(engine_entries) * double(D) * 4);
  // Every decoding step recorded the keys it attended: its active set, never more than held.
  for (const trace::Step& s : tr.steps) {
    ASSERT_EQ(s.attended.size(), s.keys.size());
    for (size_t l = 0; l < s.keys.size(); ++l) EXPECT_LE(s.attended[l], s.keys[l]);
  }
  // (The 2-layer model's revived rows meet no later pruning layer, so its decoding writes nothing;
  // SimReplay.AuxCacheCountsEachTokenOnce covers the overwrites.)
  EXPECT_EQ(decode_writes, 0);
}

// the simulator streams decoding steps, so its memory does not grow with them
// (60,000 steps of an 80-layer model held 0.5 GB of trace before; the JSON lists the first 4,096
// step times, --step-times N asks for more or fewer).
TEST_F(CliSim, SimulateMemoryDoesNotGrowWithDecodingSteps) {
  // Under AddressSanitizer (LP_SANITIZE) freed memory waits in a quarantine of up to 256 MiB,
  // which would count as growth: the children run without one (ignored by a normal build).
  const char* old_asan = std::getenv("ASAN_OPTIONS");
  const std::string saved = old_asan ? old_asan : "";
  ::setenv(
      "ASAN_OPTIONS",
      (saved + (saved.empty() ? "" : ":") + "quarantine_size_mb=0:thread_local_quarantine_size_kb=0").c_str(),
      1);
  const auto sim = [&](const char* steps) {
    return run_cli(
        dir_, {"simulate", "--model-config", "llama-3.1-70b", "--prune", "lazyllm", "--prompt-tokens", "72",
               "--new-tokens", steps, "--hw", "h100-sxm", "--json", "--step-times", "100"});
  };
  const CliResult small = sim("3"), big = sim("60000");
  if (old_asan)
    ::setenv("ASAN_OPTIONS", saved.c_str(), 1);
  else
    ::unsetenv("ASAN_OPTIONS");
  ASSERT_TRUE(small.exited && small.code == 0) << describe(small);
  ASSERT_TRUE(big.exited && big.code == 0) << describe(big);
  EXPECT_LT(big.max_rss_kib - small.max_rss_kib, 64 * 1024)
      << "peak RSS " << small.max_rss_kib << " KiB with 2 decoding steps, " << big.max_rss_kib
      << " with 59,999";
  const auto j = nlohmann::json::parse(big.out);
  EXPECT_EQ(j["decode_steps"].get<int64_t>(), 59999);
  EXPECT_EQ(j["results"][0]["decode_step_ms"].size(), 100u);
  EXPECT_GT(j["results"][0]["decode_step_mean_ms"].get<double>(), 0);
}

// Through the CLI: a trace cut short is refused, not summarised or replayed.
TEST_F(CliSim, TruncatedTraceIsRefused) {
  const std::string t = make_trace("t.jsonl", 40);
  std::string text;
  {
    std::ifstream in(t);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t last = text.rfind('\n', text.size() - 2);  // drop the last step line
  const std::string cut = write_text(text.substr(0, last + 1), "cut.jsonl");
  expect_one_line_error(run_cli(dir_, {"inspect", "--trace", cut}), {"cut.jsonl", "the header says"});
  expect_one_line_error(run_cli(dir_, {"simulate", "--trace", cut, "--hw", "l4"}),
                        {"cut.jsonl", "the header says"});
  expect_one_line_error(run_cli(dir_, {"report", "--trace", cut, "--model-config", "llama-2-7b", "--hw", "l4",
                                       "--prompt-lengths", "512", "--out", dir_.file("r")}),
                        {"cut.jsonl", "the header says"});
}

TEST_F(CliSim, SimulateATraceAndASchedule) {
  const std::string t = make_trace("t.jsonl", 40);
  CliResult r = run_cli(dir_, {"simulate", "--trace", t, "--hw", "h100-sxm,cpu-local", "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["decode_steps"], 2);
  for (const auto& x : j["results"]) {
    EXPECT_GT(x["ttft_ms"].get<double>(), 0);
    EXPECT_EQ(x["decode_step_ms"].size(), 2u);
    EXPECT_TRUE(x["prefill_ops"].contains("qkv"));
  }
  r = run_cli(dir_, {"simulate", "--prune", "lazyllm", "--prompt-tokens", "4096", "--new-tokens", "4",
                     "--model-config", "llama-3.1-8b", "--hw", "a100-80gb", "--json", "--per-layer"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  j = nlohmann::json::parse(r.out);
  const auto& x = j["results"][0];
  EXPECT_GT(x["ttft_speedup"].get<double>(), 1.2);
  EXPECT_LT(x["ttft_speedup"].get<double>(), 2.0);
  EXPECT_EQ(x["prefill_layers"].size(), 32u);
  EXPECT_LT(x["memory_bytes"]["kv"].get<double>(), x["baseline_memory_bytes"]["kv"].get<double>());
  // Without --prune a synthetic run is the unpruned one: the same figures as --prune none.
  const auto ttft = [&](std::vector<std::string> args) {
    const CliResult res = run_cli(dir_, args);
    EXPECT_TRUE(res.exited && res.code == 0) << describe(res);
    return nlohmann::json::parse(res.out)["results"][0];
  };
  const auto plain = ttft({"simulate", "--prompt-tokens", "3000", "--new-tokens", "3", "--model-config",
                           "llama-2-7b", "--hw", "l4", "--json"});
  const auto none = ttft({"simulate", "--prune", "none", "--prompt-tokens", "3000", "--new-tokens", "3",
                          "--model-config", "llama-2-7b", "--hw", "l4", "--json"});
  EXPECT_EQ(plain["ttft_ms"], none["ttft_ms"]);
  EXPECT_EQ(plain["decode_step_ms"], none["decode_step_ms"]);
  EXPECT_DOUBLE_EQ(plain["ttft_speedup"].get<double>(), 1.0);
}

// A synthetic random-drop run costs the unpruned prefill of the tokens left, against the unpruned
// prefill of the prompt as given; static-paper and frozen run; the old names are refused.
TEST_F(CliSim, SimulateThePapersBaselines) {
  const auto sim = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"simulate", "--model-config", "llama-3.1-8b",
                                     "--hw",     "h100-sxm",       "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = run_cli(dir_, args);
    EXPECT_TRUE(r.exited && r.code == 0) << describe(r);
    return nlohmann::json::parse(r.out);
  };
  const auto drop = sim({"--prune", "random-drop", "--schedule", "0.3", "--prompt-tokens", "1000"});
  const auto short_plain = sim({"--prune", "none", "--prompt-tokens", "700"});
  const auto plain = sim({"--prune", "none", "--prompt-tokens", "1000"});
  EXPECT_EQ(drop["prompt_tokens"], 1000);
  EXPECT_EQ(drop["prompt_tokens_dropped"], 300);
  EXPECT_DOUBLE_EQ(drop["results"][0]["ttft_ms"].get<double>(),
                   short_plain["results"][0]["ttft_ms"].get<double>());
  EXPECT_DOUBLE_EQ(drop["results"][0]["baseline_ttft_ms"].get<double>(),
                   plain["results"][0]["ttft_ms"].get<double>());
  const auto sp = sim({"--prune", "static-paper", "--prompt-tokens", "1000"});
  EXPECT_EQ(sp["schedule"], "0.1:0.35");
  EXPECT_GT(sp["results"][0]["ttft_speedup"].get<double>(), 1.0);
  expect_one_line_error(
      run_cli(dir_, {"simulate", "--model-config", "llama-3.1-8b", "--hw", "h100-sxm", "--prune", "static"}),
      {"'static' was renamed"});
  expect_one_line_error(
      run_cli(dir_, {"simulate", "--model-config", "llama-3.1-8b", "--hw", "h100-sxm", "--prune",
                     "static-paper", "--schedule", "40:0.5", "--prompt-tokens", "100"}),
      {"layer 40", "32-layer model can prune after layers 0 to 30"});
}

TEST_F(CliSim, SimulateBadInput) {
  const std::string t = make_trace("t.jsonl", 40);
  expect_one_line_error(run_cli(dir_, {"simulate", "--trace", t, "--hw", "h1000"}),
                        {"unknown hardware 'h1000'", "h100-sxm", "cpu-local"});
  expect_one_line_error(run_cli(dir_, {"simulate", "--trace", t, "--hw", "l4", "--model-config", "llama-9b"}),
                        {"unknown model configuration 'llama-9b'", "llama-3.1-8b"});
  expect_one_line_error(
      run_cli(dir_, {"simulate", "--trace", t, "--hw", "l4", "--model-config", "llama-2-7b"}),
      {"2 layers", "32 layers", "--map"});
  const std::string full = slurp_text(t);
  const std::string half =
      write_text(full.substr(0, full.find('\n') + 60), "half.jsonl");  // a step cut short
  expect_one_line_error(run_cli(dir_, {"simulate", "--trace", half, "--hw", "l4"}), {"half.jsonl", "line 2"});
  expect_one_line_error(run_cli(dir_, {"simulate", "--trace", tiny_, "--hw", "l4"}),
                        {"not a lazyprefill trace"});
  expect_one_line_error(
      run_cli(dir_, {"simulate", "--prune", "lazyllm", "--model-config", "llama-2-7b", "--hw", "l4"}),
      {"--prompt-tokens"});
  expect_one_line_error(run_cli(dir_, {"simulate", "--prune", "lazyllm", "--prompt-tokens", "9000",
                                       "--model-config", "llama-2-7b", "--hw", "l4"}),
                        {"context of 4096"});
  expect_one_line_error(run_cli(dir_, {"simulate", "--prune", "lazyllm", "--prompt-tokens", "100",
                                       "--schedule", "40:0.3", "--model-config", "llama-2-7b", "--hw", "l4"}),
                        {"layer"});
  expect_one_line_error(run_cli(dir_, {"simulate", "--trace", t, "--hw", "l4", "--kv", "q3"}), {"'q3'"});
  const std::string prof = write_text(R"({"lazyprefill_hw": 1, "name": "x"})", "x.json");
  expect_one_line_error(run_cli(dir_, {"simulate", "--trace", t, "--hw", prof}), {"x.json", "missing field"});
}

// --model PATH of an architecture the engine cannot run (DeepSeek's deepseek2, gpt-oss): costed from
// its metadata and tensor shapes exactly as the same model written out as a configuration file is,
// in simulate and simulate-serving; `run` refuses it in one line.
TEST_F(CliSim, SimulateDeepSeekAndGptOssFilesFromTheirMetadata) {
  const std::string ds = dir_.file("ds.gguf"), oss = dir_.file("oss.gguf");
  testing::CostedSpec spec;
  spec.n_layer = 8;  // deep enough for LazyLLM's default schedule
  testing::deepseek2_writer(spec).write(ds);
  testing::gpt_oss_writer(spec).write(oss);
  // The two models as tests/costed_gguf.h describes them, by hand.
  const std::string ds_json = write_text(
      R"({"arch": "deepseek2", "n_layer": 8, "n_embd": 64, "n_head": 4, "n_head_kv": 4, "head_dim": 24,
          "v_head_dim": 16, "rope_dim": 8, "q_lora_rank": 32, "kv_lora_rank": 16, "n_ff": 96,
          "n_vocab": 64, "n_ctx_train": 4096, "n_expert": 8, "n_expert_used": 2, "n_ff_exp": 16,
          "n_expert_shared": 1, "n_ff_shexp": 16, "n_layer_dense_lead": 1, "router_bias": true})",
      "ds.json");
  const std::string oss_json = write_text(
      R"({"arch": "gpt-oss", "n_layer": 8, "n_embd": 64, "n_head": 4, "n_head_kv": 2, "head_dim": 16,
          "n_ff": 16, "n_vocab": 64, "n_ctx_train": 4096, "n_expert": 8, "n_expert_used": 2, "n_ff_exp": 16,
          "layer_window": [8, 0, 8, 0, 8, 0, 8, 0], "attention_bias": true, "out_bias": true, "attn_sinks": true,
          "router_bias": true, "expert_bias": true})",
      "oss.json");
  const auto results = [&](const std::vector<std::string>& model) {
    std::vector<std::string> args = {"simulate", "--hw",    "h100-sxm", "--prompt-tokens",
                                     "2048",     "--prune", "lazyllm",  "--new-tokens",
                                     "4",        "--json"};
    args.insert(args.end(), model.begin(), model.end());
    CliResult r = run_cli(dir_, args);
    EXPECT_TRUE(r.exited && r.code == 0) << describe(r);
    return nlohmann::json::parse(r.out)["results"][0];
  };
  for (const auto& [file, json] : {std::pair{ds, ds_json}, std::pair{oss, oss_json}}) {
    SCOPED_TRACE(file);
    const auto a = results({"--model", file}), b = results({"--model-config", json});
    EXPECT_GT(a["ttft_ms"].get<double>(), 0);
    EXPECT_DOUBLE_EQ(a["ttft_ms"].get<double>(), b["ttft_ms"].get<double>());
    EXPECT_DOUBLE_EQ(a["memory_bytes"]["kv"].get<double>(), b["memory_bytes"]["kv"].get<double>());
    EXPECT_DOUBLE_EQ(a["memory_bytes"]["weights"].get<double>(), b["memory_bytes"]["weights"].get<double>());
    CliResult r = run_cli(dir_, {"simulate-serving", "--model", file, "--hw", "h100-sxm", "--rate", "4",
                                 "--requests", "20", "--prompt-tokens", "512", "--output-tokens", "8"});
    EXPECT_TRUE(r.exited && r.code == 0) << describe(r);
  }
  expect_one_line_error(run_cli(dir_, {"run", "--model", ds, "--prompt", "hi", "--max-new-tokens", "1"}),
                        {"ds.gguf", "'deepseek2' is not supported"});
}

// --model-config FILE: a configuration as a report's provenance.model.config writes it (a 4-layer
// Qwen3-30B-A3B here: a tenth of the 48-layer preset's work), costed as a preset is; an
// inconsistent or incomplete one gets one line naming the file and the field; parallel degrees
// that do not fit the model get one line naming the option.
TEST_F(CliSim, SimulateAConfigurationFile) {
  const std::string four = write_text(
      R"({"arch": "qwen3moe", "name": "qwen3-30b-a3b-4l", "n_layer": 4, "n_embd": 2048, "n_head": 32,
          "n_head_kv": 4, "head_dim": 128, "n_ff": 6144, "n_vocab": 151936, "n_ctx_train": 40960,
          "qk_norm": true, "n_expert": 128, "n_expert_used": 8, "n_ff_exp": 768})",
      "q4l.json");
  const auto ttft = [&](const std::string& model) {
    CliResult r = run_cli(
        dir_, {"simulate", "--model-config", model, "--hw", "h200", "--prompt-tokens", "4096", "--json"});
    EXPECT_TRUE(r.exited && r.code == 0) << describe(r);
    return nlohmann::json::parse(r.out)["results"][0]["ttft_ms"].get<double>();
  };
  const double small = ttft(four), whole = ttft("qwen3-30b-a3b");
  EXPECT_GT(small, whole * 4 / 48 * 0.8);  // the layers' share, less what the head and embedding add
  EXPECT_LT(small, whole * 4 / 48 * 1.5);
  const auto bad = [&](const std::string& text, const std::string& want) {
    const std::string f = write_text(text, "bad.json");
    expect_one_line_error(
        run_cli(dir_, {"simulate", "--model-config", f, "--hw", "h200", "--prompt-tokens", "16"}),
        {"bad.json", want});
  };
  std::string text = slurp_text(four);
  bad(text.replace(text.find("\"n_expert_used\": 8"), 18, "\"n_expert_used\": 200"), "n_expert_used 200");
  bad(R"({"name": "x", "n_layer": 2})", "missing field 'arch'");
  bad("{", "not valid JSON");
  expect_one_line_error(run_cli(dir_, {"simulate", "--model-config", "deepseek-v3", "--hw", "h200", "--tp",
                                       "7", "--ep", "7", "--prompt-tokens", "16"}),
                        {"--ep 7 does not divide the model's 256 experts"});
  expect_one_line_error(run_cli(dir_, {"simulate", "--model-config", "qwen3-8b", "--hw", "h200", "--pp", "40",
                                       "--prompt-tokens", "16"}),
                        {"--pp 40", "36 layers"});
  expect_one_line_error(run_cli(dir_, {"simulate", "--model-config", "qwen3-8b", "--hw", "h200",
                                       "--pp-microbatches", "4", "--prompt-tokens", "16"}),
                        {"--pp-microbatches 4 needs --pp of 2 or more"});
  {  // four stages, the prompt in 8 chunks: faster than the stages in turn, the busy time reported
    const auto ttft = [&](const std::string& m) {
      CliResult r = run_cli(dir_, {"simulate", "--model-config", "qwen3-8b", "--hw", "h200", "--pp", "4",
                                   "--pp-microbatches", m, "--prompt-tokens", "8192", "--json"});
      EXPECT_TRUE(r.exited && r.code == 0) << describe(r);
      const auto j = nlohmann::json::parse(r.out)["results"][0];
      EXPECT_EQ(j["pp_microbatches"].get<int>(), std::stoi(m));
      return std::pair{j["ttft_ms"].get<double>(), j["prefill_busy_ms"].get<double>()};
    };
    const auto [serial, serial_busy] = ttft("1");
    const auto [chunked, busy] = ttft("8");
    EXPECT_DOUBLE_EQ(serial, serial_busy);
    EXPECT_LT(chunked, 0.5 * serial);
    EXPECT_GT(busy, serial);
  }
  expect_one_line_error(run_cli(dir_, {"simulate", "--model-config", "qwen3-8b", "--hw", "h200", "--dp", "2",
                                       "--prompt-tokens", "16"}),
                        {"--dp 2", "no experts"});
}

// simulate --runahead: the balanced partition sums to the prompt and beats the even one, which
// beats one device; tensor parallelism over the same GPUs is set beside it; a rank that cannot
// hold the weights is said so; bad partitions get one line.
TEST_F(CliSim, RunaheadPredictsRanksAgainstOneDeviceAndTensorParallelism) {
  const std::vector<std::string> base = {
      "simulate",       "--runahead",   "4",    "--prompt-tokens", "32768",
      "--model-config", "llama-3.1-8b", "--hw", "h100-sxm",        "--json"};
  const CliResult r = run_cli(dir_, base);
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out)["results"][0];
  int64_t sum = 0;
  for (const auto& k : j["ranks_detail"]) sum += k["tokens"].get<int64_t>();
  EXPECT_EQ(sum, 32768);
  EXPECT_GT(j["speedup_vs_single_device"].get<double>(), 1);
  EXPECT_TRUE(j["tp_ttft_ms"].is_number());
  EXPECT_TRUE(j["fits_in_memory"].get<bool>());
  std::vector<std::string> even = base;
  even.insert(even.end(), {"--partition", "even"});
  const CliResult e = run_cli(dir_, even);
  ASSERT_TRUE(e.exited && e.code == 0) << describe(e);
  EXPECT_LT(j["ttft_ms"].get<double>(), nlohmann::json::parse(e.out)["results"][0]["ttft_ms"].get<double>());
  const CliResult big = run_cli(dir_, {"simulate", "--runahead", "8", "--prompt-tokens", "8192",
                                       "--model-config", "llama-3.1-70b", "--hw", "h100-sxm"});
  ASSERT_TRUE(big.exited && big.code == 0) << describe(big);
  EXPECT_NE(big.out.find("does not fit"), std::string::npos) << big.out;
  const auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = {"simulate",       "--runahead",   "2",    "--prompt-tokens", "100",
                                  "--model-config", "smollm2-135m", "--hw", "cpu-local"};
    a.insert(a.end(), more.begin(), more.end());
    return run_cli(dir_, a);
  };
  expect_one_line_error(with({"--partition", "60,30"}),
                        {"--partition: the chunks sum to 90 tokens, the prompt has 100"});
  expect_one_line_error(with({"--partition", "100,0"}), {"'0' is not a chunk"});
  expect_one_line_error(with({"--partition", "50,25,25"}), {"--partition: 3 chunks for 2 ranks"});
  expect_one_line_error(run_cli(dir_, {"simulate", "--runahead", "200", "--prompt-tokens", "100",
                                       "--model-config", "smollm2-135m", "--hw", "cpu-local"}),
                        {"--runahead 200", "fewer than the ranks"});
  expect_one_line_error(with({"--prune", "frozen"}), {"--prune lazyllm"});
  // LazyLLM on the last rank: faster than unpruned KV-Runahead, and the last rank gets more tokens.
  std::vector<std::string> lazy = base;
  lazy.insert(lazy.end(), {"--prune", "lazyllm"});
  const CliResult l = run_cli(dir_, lazy);
  ASSERT_TRUE(l.exited && l.code == 0) << describe(l);
  const auto lj = nlohmann::json::parse(l.out)["results"][0];
  EXPECT_LT(lj["ttft_ms"].get<double>(), lj["unpruned_runahead_ttft_ms"].get<double>());
  EXPECT_DOUBLE_EQ(lj["unpruned_runahead_ttft_ms"].get<double>(), j["ttft_ms"].get<double>());
  EXPECT_GT(lj["partition"][3].get<int64_t>(), j["partition"][3].get<int64_t>());
}

// The KV-Runahead timeline against the measured runs kept as fixtures (tests/fixtures/runahead:
// mpirun -n 2 run --runahead, one thread per rank, at 2k, 4k and 8k tokens, balanced and even
// partitions), with the profile calibrated on single-process runs of the same machine: issue 23's
// target, every TTFT within 10%, and the balanced / even ratios within 0.05. A folder without
// either kind of run gets one line.
TEST_F(CliSim, RunaheadValidationAgainstTheMeasuredRuns) {
  const std::string fixtures = std::string(LP_SOURCE_DIR) + "/tests/fixtures/runahead";
  const std::string prof = dir_.file("fitted.json");
  const CliResult r = run_cli(dir_, {"validate", "--runahead", fixtures, "--json", "--profile-out", prof});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["runahead"].size(), 6u);
  for (const auto& g : j["runahead"]) EXPECT_LE(std::fabs(g["error"].get<double>()), 0.10) << g.dump();
  ASSERT_EQ(j["auto_over_even"].size(), 3u);
  for (const auto& q : j["auto_over_even"]) {
    EXPECT_LT(q["measured_auto_over_even"].get<double>(), 1) << q.dump();
    EXPECT_NEAR(q["predicted_auto_over_even"].get<double>(), q["measured_auto_over_even"].get<double>(), 0.05)
        << q.dump();
  }
  EXPECT_TRUE(j["within_target"].get<bool>());
  // The fitted profile is a profile simulate takes.
  const CliResult s = run_cli(dir_, {"simulate", "--runahead", "2", "--prompt-tokens", "4096",
                                     "--model-config", "smollm2-135m", "--hw", prof, "--rank-share", "0.5"});
  EXPECT_TRUE(s.exited && s.code == 0) << describe(s);
  // Only single-process runs, or only KV-Runahead runs: nothing to validate, or nothing to fit.
  const std::string singles = dir_.file("singles"), ranks = dir_.file("ranks");
  std::filesystem::create_directories(singles);
  std::filesystem::create_directories(ranks);
  for (const auto& e : std::filesystem::directory_iterator(fixtures)) {
    const std::string name = e.path().filename().string();
    std::filesystem::copy_file(e.path(), (name.starts_with("single") ? singles : ranks) + "/" + name);
  }
  expect_one_line_error(run_cli(dir_, {"validate", "--runahead", singles}),
                        {"no `run --runahead --json` outputs"});
  expect_one_line_error(run_cli(dir_, {"validate", "--runahead", ranks}), {"no single-process"});
  // A run whose partition does not sum to its prompt.
  std::filesystem::copy_file(fixtures + "/runahead-even-2050-r1.json", singles + "/bad.json");
  {
    std::ifstream f(singles + "/bad.json");
    auto b = nlohmann::json::parse(f);
    b["partition"] = {1000, 1000};
    std::ofstream(singles + "/bad.json") << b.dump();
  }
  expect_one_line_error(run_cli(dir_, {"validate", "--runahead", singles}), {"bad.json", "sums to 2000"});
}

// compare: every method in one table per prompt length, each against the plain prefill; the exact
// ones say so, LazyLLM's accuracy comes from an eval output when given; the chart is one SVG; bad
// input gets one line.
TEST_F(CliSim, CompareSetsEveryMethodSideBySide) {
  // A real `eval --json` output (a six-layer tiny model, LazyLLM at the default schedule): the
  // LazyLLM row's accuracy quotes its NLL change; its kv task is near chance on a random model,
  // so it does not count (it failed at baseline) and is left out.
  TinyModelSpec six;
  six.n_layer = 6;
  const std::string six_model = testing::write_tiny_model(dir_.file("six.gguf"), six);
  const CliResult ev = run_cli(
      dir_, {"eval", "--model", six_model, "--task", "kv,nll", "--lengths", "300", "--samples", "2",
             "--prune", "lazyllm", "--schedule", "0.3:0.3,0.6:0.3,0.9:0.3", "--threads", "1", "--json"});
  ASSERT_TRUE(ev.exited && ev.code == 0) << describe(ev);
  const std::string eval = write_text(ev.out, "eval.json");
  const auto evj = nlohmann::json::parse(ev.out);
  ASSERT_EQ(evj["results"][1]["task"], "nll");
  const double nll_change = evj["results"][1]["methods"][0]["nll_change"].get<double>();
  const bool kv_counts = evj["results"][0].value("counts", true);
  const std::string chart = dir_.file("ttft.svg");
  const std::vector<std::string> base = {
      "compare", "--model-config",  "llama-3.1-70b", "--hw",      "h100-sxm", "--devices",
      "8",       "--weights",       "fp8",           "--compute", "fp8",      "--kv",
      "fp8",     "--prompt-tokens", "32768,131072"};
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--kv-predict", "llama-3.1-8b", "--eval", eval, "--chart", chart, "--json"});
  const CliResult r = run_cli(dir_, args);
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["prompts"].size(), 2u);
  for (const auto& p : j["prompts"]) {
    std::map<std::string, nlohmann::json> m;
    for (const auto& row : p["methods"]) m[row["method"].get<std::string>()] = row;
    ASSERT_EQ(m.size(), 7u) << p.dump();
    const auto ttft = [&](const char* k) { return m.at(k)["ttft_ms"].get<double>(); };
    EXPECT_DOUBLE_EQ(m.at("baseline: one device")["speedup"].get<double>(), 1.0);
    EXPECT_LT(ttft("LazyLLM 0.3:0.3,0.6:0.3,0.9:0.3"), ttft("baseline: one device"));
    EXPECT_LT(ttft("LazyLLM + TP 8"), ttft("tensor parallelism (TP) 8"));
    EXPECT_LT(ttft("LazyLLM + KV-Runahead 8"), ttft("KV-Runahead 8"));
    EXPECT_LT(ttft("KV-Runahead 8"), ttft("baseline: one device"));
    EXPECT_EQ(m.at("KV-Runahead 8")["devices"].get<int>(), 8);
    EXPECT_NE(m.at("KV-Runahead 8")["accuracy"].get<std::string>().find("exact"), std::string::npos);
    const std::string acc = m.at("LazyLLM 0.3:0.3,0.6:0.3,0.9:0.3")["accuracy"].get<std::string>();
    EXPECT_NE(acc.find(fmt::format("worst NLL change {:+.3f} over 1", nll_change)), std::string::npos) << acc;
    EXPECT_EQ(acc.find("QA accuracy") != std::string::npos, kv_counts) << acc;
    EXPECT_NE(m.at("KV Prediction from llama-3.1-8b")["accuracy"].get<std::string>().find("not modelled"),
              std::string::npos);
    // Tensor parallelism holds an eighth of the weights; every KV-Runahead rank all of them.
    EXPECT_LT(m.at("tensor parallelism (TP) 8")["memory_per_device_gib"].get<double>(),
              m.at("KV-Runahead 8")["memory_per_device_gib"].get<double>() / 4);
  }
  EXPECT_FALSE(j["prompts"][1]["methods"][0]["fits_in_memory"].get<bool>());  // 70B at 128k on one H100
  std::ifstream svg(chart);
  const std::string text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("<svg"), std::string::npos);
  EXPECT_NE(text.find("KV-Runahead"), std::string::npos);
  // Bad input.
  const auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = base;
    a.insert(a.end(), more.begin(), more.end());
    return run_cli(dir_, a);
  };
  expect_one_line_error(with({"--kv-predict", "smollm2-135m"}), {"smollm2-135m", "vocabulary"});
  expect_one_line_error(with({"--eval", write_text("[1, 2]", "not-eval.json")}), {"not-eval.json"});
  expect_one_line_error(with({"--eval", write_text("{\"results\": 3}", "bad-eval.json")}), {"bad-eval.json"});
  expect_one_line_error(with({"--devices", "1"}), {"--devices"});
  expect_one_line_error(run_cli(dir_, {"compare", "--model-config", "llama-3.1-8b", "--hw", "h100-sxm,l4"}),
                        {"one profile"});
  expect_one_line_error(run_cli(dir_, {"compare", "--model-config", "llama-3.1-8b", "--hw", "h100-sxm",
                                       "--prompt-tokens", "4,x"}),
                        {"--prompt-tokens"});
}

// simulate --kv-predict: the three parts, the speedup over the base's prefill, the statement that
// accuracy is not modelled; an auxiliary model that cannot pair gets one line.
TEST_F(CliSim, KvPredictionPricesTheAuxiliaryPrefillAndStatesAccuracyIsNotModelled) {
  const CliResult r =
      run_cli(dir_, {"simulate", "--kv-predict", "openelm-1.1b", "--model-config", "openelm-3b",
                     "--prompt-tokens", "4096", "--hw", "h100-sxm,m2-pro-cpu", "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["accuracy"].get<std::string>().find("not modelled"), std::string::npos);
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& x : j["results"]) {
    EXPECT_NEAR(x["ttft_ms"].get<double>(),
                x["aux_prefill_ms"].get<double>() + x["predictor_ms"].get<double>() +
                    x["base_first_token_ms"].get<double>(),
                1e-6 * x["ttft_ms"].get<double>());
    EXPECT_GT(x["speedup"].get<double>(), 1);
    EXPECT_EQ(x["layer_map"].size(), 36u);
  }
  expect_one_line_error(run_cli(dir_, {"simulate", "--kv-predict", "smollm2-135m", "--model-config",
                                       "llama-3.1-8b", "--prompt-tokens", "4096", "--hw", "h100-sxm"}),
                        {"vocabulary", "tokenizer"});
  expect_one_line_error(run_cli(dir_, {"simulate", "--kv-predict", "openelm-1.1b", "--model-config",
                                       "openelm-3b", "--hw", "h100-sxm"}),
                        {"--kv-predict needs --prompt-tokens"});
}

}  // namespace
}  // namespace lp
