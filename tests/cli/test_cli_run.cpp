// `lazyprefill run` and `inspect` through the real binary on generated tiny models: the happy
// paths, every kind of broken model file (each refused by both), prompts, options, pruning
// options, traces, and --backend cuda without a GPU.
#include <sys/stat.h>

#include "tests/cli/cli_harness.h"
#include "tests/test_util.h"
#include "tests/tiny_arch.h"
#include "traces/trace.h"

namespace lp {
namespace {

using namespace cli_test;

TEST_F(CliErrors, RunJsonHappyPath) {
  const CliResult r =
      run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--max-new-tokens", "3", "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << "stdout is not JSON:\n" << r.out;
  for (const char* k : {"text", "prompt_tokens", "generated_tokens", "ttft_ms", "prefill_tokens_per_s",
                        "decode_tokens_per_s", "peak_rss_mib"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_TRUE(j["text"].is_string());
  // "the cat" is "the" + "Ġcat" with the tiny vocabulary's merges; add_bos_token is false.
  EXPECT_EQ(j["prompt_tokens"], 2);
  EXPECT_EQ(j["generated_tokens"], 3);
  EXPECT_GT(j["ttft_ms"].get<double>(), 0.0);
  EXPECT_GT(j["prefill_tokens_per_s"].get<double>(), 0.0);
  EXPECT_GE(j["decode_tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["peak_rss_mib"].get<double>(), 0.0);
}

TEST_F(CliErrors, RunChatWithBf16Weights) {
  TinyModelSpec s;
  s.weight_type = GgmlType::BF16;
  s.tied = false;
  const std::string m = testing::write_tiny_model(dir_.file("bf16.gguf"), s);
  const CliResult r = run_cli(dir_, {"run", "--model", m, "--prompt", "the cat", "--max-new-tokens", "2",
                                     "--chat", "--dtype", "f32"});
  EXPECT_TRUE(r.exited && r.code == 0) << describe(r);
}

TEST_F(CliErrors, InspectHappyPath) {
  const CliResult r = run_cli(dir_, {"inspect", "--model", tiny_});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_NE(r.out.find("blk.1.ffn_down.weight"), std::string::npos) << r.out;
  const CliResult rj = run_cli(dir_, {"inspect", "--model", tiny_, "--json"});
  ASSERT_TRUE(rj.exited && rj.code == 0) << describe(rj);
  const auto j = nlohmann::json::parse(rj.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << rj.out;
  EXPECT_EQ(j["config"]["n_layer"], 2);
  EXPECT_EQ(j["tokenizer"]["n_tokens"], 299);
}

// inspect names what each later architecture adds and, for Gemma 3, each layer's kind; run runs the
// file with LazyLLM (the logits are tests/engine/test_arch_logits.cpp's business).
TEST_F(CliErrors, InspectAndRunAGemma3File) {
  const std::string m = dir_.file("gemma3.gguf");
  testing::tiny_arch_writer("gemma3", false).write(m);
  const CliResult r = run_cli(dir_, {"inspect", "--model", m});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_NE(
      r.out.find("per-head q/k norms, norms after attention and FFN, GeGLU (tanh GELU), embeddings x 8"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("layers: 5 local (window 6, rope theta 10000), 1 global  [LLLLLG]"), std::string::npos)
      << r.out;
  const CliResult rj = run_cli(dir_, {"inspect", "--model", m, "--json"});
  ASSERT_TRUE(rj.exited && rj.code == 0) << describe(rj);
  const auto j = nlohmann::json::parse(rj.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << rj.out;
  EXPECT_EQ(j["config"]["layer_window"], nlohmann::json({6, 6, 6, 6, 6, 0}));
  EXPECT_EQ(j["config"]["ffn_activation"], "geglu");
  const CliResult rr = run_cli(dir_, {"run", "--model", m, "--prompt", "hello there", "--max-new-tokens", "4",
                                      "--prune", "lazyllm", "--json"});
  ASSERT_TRUE(rr.exited && rr.code == 0) << describe(rr);
  const auto jr = nlohmann::json::parse(rr.out, nullptr, false);
  ASSERT_FALSE(jr.is_discarded()) << rr.out;
  EXPECT_TRUE(jr.dump().find("post_norm") != std::string::npos) << "the per-op times name the post norms";
  // Every third layer global ([LLGLLG]): the engine prunes a depth at the nearest global layer a prune
  // can follow (0.3 of 6 layers is layer 1, moved to 2), an absolute layer where it is written.
  GgufWriter w = testing::tiny_arch_writer("gemma3", false);
  w.set("gemma3.attention.sliding_window_pattern", testing::GgufWriterValue::u32(3));
  const std::string m3 = dir_.file("gemma3-period3.gguf");
  w.write(m3);
  for (const auto& [sched, layer] : {std::pair{"0.3:0.5", 2}, std::pair{"1:0.5", 1}}) {
    const CliResult rs =
        run_cli(dir_, {"run", "--model", m3, "--prompt", "hello there, how are you", "--max-new-tokens", "1",
                       "--prune", "lazyllm", "--schedule", sched, "--json"});
    ASSERT_TRUE(rs.exited && rs.code == 0) << describe(rs);
    const auto js = nlohmann::json::parse(rs.out, nullptr, false);
    ASSERT_FALSE(js.is_discarded()) << rs.out;
    EXPECT_EQ(js["schedule_layers"],
              nlohmann::json::parse(fmt::format("[{{\"layer\": {}, \"share\": 0.5}}]", layer)))
        << sched;
  }
}

// A mixture-of-experts file end to end: inspect says how many experts and how many a token uses,
// run's per-op times name the router and the experts, and --trace-detail keeps each layer's routes.
TEST_F(CliErrors, InspectAndRunAMixtureOfExperts) {
  const std::string m = dir_.file("qwen3moe.gguf");
  testing::tiny_arch_writer("qwen3moe", false).write(m);
  const CliResult r = run_cli(dir_, {"inspect", "--model", m});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_NE(r.out.find("mixture of experts in every layer: 8 experts of width 32, 3 a token"),
            std::string::npos)
      << r.out;
  const CliResult rj = run_cli(dir_, {"inspect", "--model", m, "--json"});
  ASSERT_TRUE(rj.exited && rj.code == 0) << describe(rj);
  const auto j = nlohmann::json::parse(rj.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << rj.out;
  EXPECT_EQ(j["config"]["ffn"], "moe");
  EXPECT_EQ(j["config"]["n_expert"], 8);
  EXPECT_EQ(j["config"]["n_expert_used"], 3);
  // 5 of 8 experts a layer unused by a token: 5 x 3 x 64 x 32 weights a layer, 2 layers.
  EXPECT_EQ(j["config"]["n_params"].get<int64_t>() - j["config"]["n_active_params"].get<int64_t>(),
            2 * 5 * 3 * 64 * 32);
  const std::string trace = dir_.file("moe.trace.jsonl");
  const CliResult rr =
      run_cli(dir_, {"run", "--model", m, "--prompt", "hello there", "--max-new-tokens", "4", "--prune",
                     "lazyllm", "--schedule", "0:0.5", "--json", "--trace", trace, "--trace-detail"});
  ASSERT_TRUE(rr.exited && rr.code == 0) << describe(rr);
  const auto jr = nlohmann::json::parse(rr.out, nullptr, false);
  ASSERT_FALSE(jr.is_discarded()) << rr.out;
  EXPECT_TRUE(jr.dump().find("\"router\"") != std::string::npos) << "the per-op times name the router";
  EXPECT_TRUE(jr.dump().find("\"experts\"") != std::string::npos) << "the per-op times name the experts";
  const trace::Trace t = trace::read_trace(trace);
  ASSERT_FALSE(t.steps.empty());
  for (const trace::Step& st : t.steps) {
    ASSERT_TRUE(st.routes) << "a step without routes";
    EXPECT_EQ(int64_t((*st.routes)[0].positions.size()), st.queries[0]);
  }
}

TEST_F(CliErrors, MissingModelFile) {
  expect_model_error(dir_.file("no_such_model.gguf"), {"no_such_model.gguf", "cannot open model file"});
}

TEST_F(CliErrors, ModelPathIsADirectory) {
  expect_model_error(dir_.path(), {"not a regular file"});
}

TEST_F(CliErrors, EmptyModelFile) {
  expect_model_error(write_text("", "empty.gguf"), {"not a GGUF file"});
}

TEST_F(CliErrors, TruncatedModel) {
  GgufLayout lay;
  GgufWriter w = testing::tiny_model_writer();
  const Bytes full = w.bytes(&lay);
  // In the metadata (inside the token list), in the tensor infos, in the tensor data.
  size_t tokens_kv = 0;
  while (w.kvs.at(tokens_kv).key != "tokenizer.ggml.tokens") ++tokens_kv;
  // Near the end of the token strings, so the array's count still passes the size check.
  expect_model_error(
      write_bytes(Bytes(full.begin(), full.begin() + lay.kv_starts[tokens_kv + 1] - 5), "t1.gguf"),
      {"t1.gguf", "truncated"});
  expect_model_error(
      write_bytes(Bytes(full.begin(), full.begin() + lay.tensor_info_starts[5] + 20), "t2.gguf"),
      {"t2.gguf", "truncated"});
  expect_model_error(write_bytes(Bytes(full.begin(), full.begin() + lay.size / 2), "t3.gguf"),
                     {"t3.gguf", "extends beyond the end of the file"});
}

TEST_F(CliErrors, WrongMagic) {
  Bytes b = testing::read_file(tiny_);
  b[0] = 'P';
  b[1] = 'K';
  expect_model_error(write_bytes(b, "zip.gguf"), {"not a GGUF file"});
}

TEST_F(CliErrors, UnsupportedVersion) {
  GgufWriter w = testing::tiny_model_writer();
  w.version = 4;
  expect_model_error(write(w, "v4.gguf"), {"unsupported GGUF version 4"});
  w.version = 1;
  expect_model_error(write(w, "v1.gguf"), {"GGUF version 1 is not supported"});
}

TEST_F(CliErrors, BigEndianModel) {
  Bytes b = testing::read_file(tiny_);
  b[4] = 0, b[5] = 0, b[6] = 0, b[7] = 3;
  expect_model_error(write_bytes(b, "be.gguf"), {"big-endian"});
}

TEST_F(CliErrors, UnsupportedArchitecture) {
  TinyModelSpec s;
  s.arch = "gpt2";
  expect_model_error(testing::write_tiny_model(dir_.file("gpt2.gguf"), s),
                     {"general.architecture 'gpt2' is not supported (supported: llama (Mixtral included), "
                      "mistral, qwen2, qwen3, gemma3, qwen3moe)"});
}

// --dtype int8 (weights in GGUF blocks, integer GEMMs): runs on the tiny model (its accuracy is
// measured on the real one, RealModel.Int8*); refuses rows that do not hold whole blocks of 32, NaN block
// scales (a Q8_0 tensor kept as stored, and one requantized beside f32 tensors), and the CUDA backend; one
// line each.
TEST_F(CliErrors, Int8ModeRunsAndRefusesWhatItCannotHold) {
  const CliResult ok = run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat sat", "--max-new-tokens",
                                      "3", "--dtype", "int8", "--json"});
  ASSERT_TRUE(ok.exited && ok.code == 0) << describe(ok);
  EXPECT_EQ(nlohmann::json::parse(ok.out)["dtype"], "int8");

  TinyModelSpec s48;
  s48.n_embd = 48;  // rows of 48 values: one and a half blocks
  expect_one_line_error(
      run_cli(dir_, {"run", "--model", testing::write_tiny_model(dir_.file("d48.gguf"), s48), "--prompt",
                     "the cat", "--dtype", "int8"}),
      {"d48.gguf", "not a multiple of 32", "--dtype f32"});

  // ffn_down [F = 96][D = 64] as Q8_0: 64 rows of 3 blocks of 34 bytes, zero but one NaN scale.
  const auto nan_q8 = [](testing::GgufWriterTensor* t, int64_t blocks) {
    t->type = uint32_t(GgmlType::Q8_0);
    t->data.assign(size_t(blocks * 34), 0);
    t->data[34 * 4] = 0x00;  // block 4: f16 0x7E00, a NaN
    t->data[34 * 4 + 1] = 0x7E;
  };
  GgufWriter w = testing::tiny_model_writer();
  nan_q8(w.find_tensor("blk.1.ffn_down.weight"), 64 * 3);
  expect_one_line_error(
      run_cli(dir_, {"run", "--model", write(w, "nan-down.gguf"), "--prompt", "the cat", "--dtype", "int8"}),
      {"nan-down.gguf", "blk.1.ffn_down.weight", "block scale that is NaN", "row 1, block 1"});
  // attn_q as Q8_0 beside f32 attn_k/attn_v: the fused matrix is requantized, the NaN found there.
  GgufWriter w2 = testing::tiny_model_writer();
  nan_q8(w2.find_tensor("blk.0.attn_q.weight"), 64 * 2);
  expect_one_line_error(
      run_cli(dir_, {"run", "--model", write(w2, "nan-q.gguf"), "--prompt", "the cat", "--dtype", "int8"}),
      {"nan-q.gguf", "blk.0.attn_q.weight", "NaN"});
  // On the GPU the blocks stay blocks (docs/cuda.md); without one, the device's one line.
  const CliResult g =
      run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--dtype", "int8", "--backend", "cuda"});
  if (!(g.exited && g.code == 0)) expect_one_line_error(g, {"CUDA"});
}

// A model whose attn_q is Q3_K (a real ggml type with a known size that lp does not dequantize).
// D = 256 so rows hold whole Q3_K blocks (256 elements, 110 bytes). `inspect` only lists types,
// so only `run` must refuse it.
TEST_F(CliErrors, UnsupportedTensorType) {
  TinyModelSpec s;
  s.n_embd = 256;
  s.n_ff = 64;
  s.n_layer = 1;
  GgufWriter w = testing::tiny_model_writer(s);
  auto* q = w.find_tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  q->type = uint32_t(GgmlType::Q3_K);
  q->data.assign(256 * 110, 0);
  std::mt19937 rng(3);
  for (auto& x : q->data) x = uint8_t(rng());
  const std::string m = write(w, "q3k.gguf");
  expect_model_error(m, {"blk.0.attn_q.weight", "unsupported", "Q3_K"}, /*also_inspect=*/false);
  const CliResult r = run_cli(dir_, {"inspect", "--model", m});
  EXPECT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_NE(r.out.find("Q3_K"), std::string::npos) << r.out;
}

TEST_F(CliErrors, UnknownTensorType) {
  GgufWriter w = testing::tiny_model_writer();
  w.find_tensor("blk.1.attn_v.weight")->type = 4;  // retired Q4_2
  expect_model_error(write(w, "type4.gguf"), {"blk.1.attn_v.weight", "unknown type id 4"});
}

TEST_F(CliErrors, TensorDataBeyondEndOfFile) {
  GgufWriter w = testing::tiny_model_writer();
  w.pad_after_last_tensor = false;
  Bytes b = w.bytes();
  b.resize(b.size() - 100);  // the last tensor loses its tail
  expect_model_error(write_bytes(b, "short.gguf"),
                     {"blk.1.ffn_down.weight", "extends beyond the end of the file"});
  w = testing::tiny_model_writer();
  w.find_tensor("output_norm.weight")->offset = 1ull << 36;
  expect_model_error(write(w, "far.gguf"), {"output_norm.weight", "extends beyond the end of the file"});
}

TEST_F(CliErrors, AbsurdDimensions) {
  GgufWriter w = testing::tiny_model_writer();
  w.set("llama.embedding_length", GgufWriterValue::u64(1ull << 40));
  expect_model_error(write(w, "wide.gguf"), {"embedding_length", "1099511627776"});
  w = testing::tiny_model_writer();
  w.find_tensor("blk.0.ffn_up.weight")->ne = {64, 1ull << 40};
  expect_model_error(write(w, "dim40.gguf"), {"blk.0.ffn_up.weight"});
  w = testing::tiny_model_writer();
  w.find_tensor("blk.0.ffn_up.weight")->ne = {64, 1ull << 62};
  expect_model_error(write(w, "dim62.gguf"), {"blk.0.ffn_up.weight", "absurd dimension"});
  w = testing::tiny_model_writer();
  w.set("llama.block_count", GgufWriterValue::u32(4000000000u));
  expect_model_error(write(w, "layers.gguf"), {"block_count", "plausible range"});
}

TEST_F(CliErrors, InconsistentModel) {
  GgufWriter w = testing::tiny_model_writer();
  w.remove_tensor("blk.1.ffn_gate.weight");
  expect_model_error(write(w, "missing.gguf"), {"missing tensor 'blk.1.ffn_gate.weight'"});
  w = testing::tiny_model_writer();
  w.set("llama.attention.head_count_kv", GgufWriterValue::u32(3));
  expect_model_error(write(w, "heads.gguf"), {"head_count_kv 3"});
  w = testing::tiny_model_writer();
  w.add_u32("llama.block_count", 2);
  expect_model_error(write(w, "dup.gguf"), {"duplicate metadata key 'llama.block_count'"});
}

// These once loaded and ran on garbage (overlapping tensor data), tokenised
// "Hi" as two bytes (BPE without merges), or accepted an infinite RoPE base.
TEST_F(CliErrors, OverlappingTensorsMergelessBpeAndInfiniteRopeBase) {
  GgufWriter w = testing::tiny_model_writer();
  w.find_tensor("blk.1.attn_norm.weight")->offset = 0;
  expect_model_error(write(w, "overlap.gguf"), {"overlap"});
  w = testing::tiny_model_writer();
  ASSERT_TRUE(w.remove("tokenizer.ggml.merges"));
  expect_model_error(write(w, "nomerges.gguf"), {"without tokenizer.ggml.merges"});
  w = testing::tiny_model_writer();
  w.set("llama.rope.freq_base", GgufWriterValue::f32(std::numeric_limits<float>::infinity()));
  expect_model_error(write(w, "inf.gguf"), {"rope.freq_base inf"});
}

TEST_F(CliErrors, PromptLongerThanContext) {
  TinyModelSpec s;
  s.n_ctx = 64;
  const std::string m = testing::write_tiny_model(dir_.file("ctx64.gguf"), s);
  std::string prompt;
  for (int i = 0; i < 100; ++i) prompt += "the cat ";
  expect_one_line_error(run_cli(dir_, {"run", "--model", m, "--prompt", prompt, "--max-new-tokens", "3"}),
                        {"context", "64"});
  // Fits alone, not with the tokens to generate.
  expect_one_line_error(run_cli(dir_, {"run", "--model", m, "--prompt", "the cat", "--max-new-tokens", "63"}),
                        {"context", "64"});
}

TEST_F(CliErrors, EmptyPrompt) {
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt", ""}), {"prompt", "empty"});
}

TEST_F(CliErrors, EmptyPromptFile) {
  const std::string p = write_text("", "empty.txt");
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt-file", p}), {"prompt", "empty"});
}

TEST_F(CliErrors, InvalidUtf8PromptFile) {
  const std::string p = write_bytes({0xFF, 0xFE, 'h', 'i'}, "bad_utf8.txt");
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt-file", p}),
                        {"bad_utf8.txt", "not valid UTF-8"});
  // Invalid bytes after valid text, and a truncated sequence at the end.
  const std::string p2 = write_text("the cat \xE2\x82", "cut_utf8.txt");
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt-file", p2}), {"not valid UTF-8"});
}

TEST_F(CliErrors, MissingPromptFile) {
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt-file", dir_.file("nope.txt")}),
                        {"nope.txt", "prompt file"});
}

TEST_F(CliErrors, PromptAndPromptFileBothOrNeither) {
  const std::string p = write_text("the cat", "prompt.txt");
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--prompt-file", p}),
                        {"--prompt", "--prompt-file"});
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_}), {"--prompt", "--prompt-file"});
}

// Every command that loads a model reads --dtype one way (dtype_option): serve once took any
// unknown name for int8 and served.
TEST_F(CliErrors, BadDtype) {
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--dtype", "f16"}),
                        {"--dtype", "f16"});
  expect_one_line_error(run_cli(dir_, {"serve", "--model", tiny_, "--port", "0", "--dtype", "f16"}),
                        {"--dtype", "f16"});
}

// serve refuses to start on a key file anyone can read, an empty one or a missing one, and on a
// malformed --allowed-origin: one line, before the model loads.
TEST_F(CliErrors, ServeAccessOptions) {
  const auto keys = [&](const std::string& name, const std::string& text, mode_t mode) {
    const std::string p = dir_.file(name);
    std::ofstream(p) << text;
    ::chmod(p.c_str(), mode);
    return p;
  };
  const auto serve = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"serve", "--model", tiny_, "--port", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(dir_, args);
  };
  expect_one_line_error(serve({"--api-key-file", keys("open.keys", "k1\n", 0644)}),
                        {"--api-key-file", "open.keys", "every user"});
  expect_one_line_error(serve({"--api-key-file", keys("none.keys", "# nothing\n", 0600)}),
                        {"none.keys", "holds no key"});
  expect_one_line_error(serve({"--api-key-file", dir_.file("missing.keys")}), {"missing.keys"});
  expect_one_line_error(serve({"--allowed-origin", "app.example"}), {"--allowed-origin", "app.example"});
}

TEST_F(CliErrors, ZeroThreads) {
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--threads", "0"}),
                        {"--threads", "0"});
}

TEST_F(CliErrors, RunWithLazyLLMReportsTheComputedShare) {
  // 40 tokens on the 2-layer tiny model, pruning half after layer 0: layer 0 computes 40, layer
  // 1 computes 20, so 60 of 80 (token, layer) pairs.
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += "a ";
  prompt.pop_back();
  const CliResult r = run_cli(dir_, {"run", "--model", tiny_, "--prompt", prompt, "--max-new-tokens", "2",
                                     "--prune", "lazyllm", "--schedule", "0:0.5", "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  const int64_t T = j["prompt_tokens"].get<int64_t>();
  ASSERT_EQ(j["prefill_tokens_computed_per_layer"], (std::vector<int64_t>{T, T - T / 2}));
  EXPECT_DOUBLE_EQ(j["prompt_tokens_computed_fraction"].get<double>(), double(2 * T - T / 2) / double(2 * T));
  EXPECT_EQ(j["prune"], "lazyllm");
  EXPECT_GT(j["aux_cache_bytes"].get<int64_t>(), 0);
}

// The paper's baselines through run: random-drop's JSON counts the dropped tokens, static-paper
// prunes once; a schedule that does not fit the policy, a share of 1, a depth past the model and
// the renamed policies each get one line.
TEST_F(CliErrors, RunWithThePapersBaselines) {
  std::string prompt;
  for (int i = 0; i < 40; ++i) prompt += "a ";
  prompt.pop_back();
  const auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"run", "--model", tiny_, "--prompt", prompt, "--max-new-tokens", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(dir_, args);
  };
  CliResult r = run({"--prune", "random-drop", "--schedule", "25%", "--seed", "3", "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  auto j = nlohmann::json::parse(r.out);
  const int64_t T = j["prompt_tokens"].get<int64_t>();
  EXPECT_EQ(j["prune"], "random-drop");
  EXPECT_EQ(j["schedule"], "0.25");
  EXPECT_EQ(j["prompt_tokens_dropped"], T / 4);
  EXPECT_DOUBLE_EQ(j["prompt_tokens_computed_fraction"].get<double>(), double(T - T / 4) / double(T));
  r = run({"--prune", "static-paper", "--schedule", "0:0.5", "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prune"], "static-paper");
  EXPECT_DOUBLE_EQ(j["prompt_tokens_computed_fraction"].get<double>(), double(2 * T - T / 2) / double(2 * T));
  r = run({"--prune", "static-paper", "--json"});  // its default, 0.1:0.35, on 2 layers: after layer 0
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_EQ(nlohmann::json::parse(r.out)["schedule"], "0.1:0.35");

  expect_one_line_error(run({"--prune", "static-paper", "--schedule", "0.3:0.3,0.6:0.3"}),
                        {"static-paper prunes once", "one step"});
  expect_one_line_error(run({"--prune", "static-paper", "--schedule", "5:0.3"}), {"layer", "2-layer model"});
  expect_one_line_error(run({"--prune", "random-drop", "--schedule", "1"}),
                        {"drop share 1 must be in [0, 1)"});
  expect_one_line_error(run({"--prune", "random-drop", "--schedule", "0:0.3"}),
                        {"random-drop", "share dropped alone"});
  expect_one_line_error(run({"--prune", "lazyllm", "--schedule", "0.3"}), {"only random-drop"});
  expect_one_line_error(run({"--prune", "static"}), {"'static' was renamed", "frozen", "static-paper"});
  expect_one_line_error(run({"--prune", "random"}), {"'random' was renamed", "random-layers", "random-drop"});
}

TEST_F(CliErrors, UnknownPrunePolicy) {
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--prune", "fastest"}),
                        {"--prune", "fastest"});
}

TEST_F(CliErrors, MalformedSchedule) {
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--prune", "lazyllm",
                                       "--schedule", "0:1.5"}),
                        {"share"});
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--prune", "lazyllm",
                                       "--schedule", "7:0.3"}),
                        {"layer"});
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--prune", "lazyllm",
                                       "--schedule", "/no/such/schedule.json"}),
                        {"no such schedule file"});
}

TEST_F(CliErrors, TraceToAnUnwritablePath) {
  const std::string bad = dir_.file("no/such/folder/t.jsonl");
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--trace", bad}),
                        {"cannot write trace", "t.jsonl"});
  EXPECT_FALSE(std::filesystem::exists(bad));
}

TEST_F(CliErrors, TraceIsWrittenAndInspected) {
  std::string prompt;
  for (int i = 0; i < 30; ++i) prompt += "a ";
  const std::string t = dir_.file("run.jsonl");
  const CliResult r = run_cli(dir_, {"run", "--model", tiny_, "--prompt", prompt, "--max-new-tokens", "3",
                                     "--prune", "lazyllm", "--schedule", "0:0.5", "--trace", t, "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto run = nlohmann::json::parse(r.out);
  const CliResult ri = run_cli(dir_, {"inspect", "--trace", t, "--json"});
  ASSERT_TRUE(ri.exited && ri.code == 0) << describe(ri);
  const auto j = nlohmann::json::parse(ri.out);
  EXPECT_DOUBLE_EQ(j["prompt_tokens_computed_fraction"].get<double>(),
                   run["prompt_tokens_computed_fraction"].get<double>());
  EXPECT_EQ(j["steps"], 3);  // the prefill and two decoding steps (the third token needs no step)
  EXPECT_EQ(j["at_most_once"], true);
  EXPECT_DOUBLE_EQ(j["prompt_tokens_computed_fraction_after_generation"].get<double>(),
                   run["prompt_tokens_computed_fraction_after_generation"].get<double>());
  expect_one_line_error(run_cli(dir_, {"inspect", "--trace", tiny_}), {"not a lazyprefill trace"});
  // The paper's Figure 7 from the trace: per layer group (two layers: one each), the share of the
  // prompt with K/V after the prefill and each decoding step. From the steps' keys, it must agree
  // with the run's counts: the prefill's rows per layer, and at the end the paper's figure.
  const std::string svg = dir_.file("growth.svg");
  const CliResult g = run_cli(dir_, {"inspect", "--trace", t, "--kv-growth", svg, "--json"});
  ASSERT_TRUE(g.exited && g.code == 0) << describe(g);
  const auto groups = nlohmann::json::parse(g.out)["kv_growth"]["groups"];
  ASSERT_EQ(groups.size(), 2u);
  const double T = run["prompt_tokens"].get<double>();
  double final_mean = 0;
  for (size_t i = 0; i < 2; ++i) {
    const auto share = groups[i]["prompt_kv_share"].get<std::vector<double>>();
    ASSERT_EQ(share.size(), 3u);
    EXPECT_DOUBLE_EQ(share[0], run["prefill_tokens_computed_per_layer"][i].get<double>() / T);
    for (size_t k = 1; k < share.size(); ++k) EXPECT_GE(share[k], share[k - 1]);  // K/V is never dropped
    final_mean += share.back() / 2;
  }
  EXPECT_DOUBLE_EQ(groups[0]["prompt_kv_share"][0].get<double>(), 1.0);
  EXPECT_NEAR(final_mean, run["prompt_tokens_computed_fraction_after_generation"].get<double>(), 1e-12);
  EXPECT_TRUE(std::filesystem::exists(svg));
  // A trace without decoding steps has nothing to draw; --kv-growth needs --trace.
  const std::string t1 = dir_.file("prefill.jsonl");
  ASSERT_EQ(
      run_cli(dir_, {"run", "--model", tiny_, "--prompt", prompt, "--max-new-tokens", "1", "--trace", t1})
          .code,
      0);
  expect_one_line_error(run_cli(dir_, {"inspect", "--trace", t1, "--kv-growth", dir_.file("x.svg")}),
                        {"prefill.jsonl", "decoding steps"});
  expect_one_line_error(run_cli(dir_, {"inspect", "--kv-growth", dir_.file("x.svg")}), {"--trace"});
}

// names from a model file are escaped in inspect's text and stay valid in
// its JSON, whatever bytes they hold.
TEST_F(CliErrors, InspectEscapesTextFromTheFile) {
  GgufWriter w = testing::tiny_model_writer();
  w.set("general.name", GgufWriterValue::string("evil\n\x1b[2Jforged line\xff"));
  const std::string m = write(w, "evil.gguf");
  CliResult r = run_cli(dir_, {"inspect", "--model", m});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\nforged"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("evil\\n\\x1b[2Jforged line"), std::string::npos) << r.out;
  r = run_cli(dir_, {"inspect", "--model", m, "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_EQ(nlohmann::json::parse(r.out)["name"].get<std::string>().substr(0, 5), "evil\n");
}

// --backend cuda without a GPU (or without a driver, or in a build without CUDA) is one line and
// exit 1. (Where a GPU exists, the gpu suite and `run --backend cuda` itself are the checks.)
TEST_F(CliErrors, CudaBackendWithoutAGpuIsOneClearLine) {
  const CliResult r = run_cli(dir_, {"run", "--backend", "cuda", "--model", tiny_, "--prompt", "a b"});
  if (!(r.exited && r.code == 0)) expect_one_line_error(r, {"CUDA"});  // exit 0 only where a GPU ran it
  // Both backends record traces (one engine); without a GPU the one line is the device's, and no
  // trace is written.
  const CliResult t = run_cli(dir_, {"run", "--backend", "cuda", "--model", tiny_, "--prompt", "a b",
                                     "--trace", dir_.file("t.jsonl")});
  if (!(t.exited && t.code == 0)) {
    expect_one_line_error(t, {"CUDA"});
    EXPECT_FALSE(std::filesystem::exists(dir_.file("t.jsonl")));
  }
  expect_one_line_error(run_cli(dir_, {"run", "--backend", "tpu", "--model", tiny_, "--prompt", "a b"}),
                        {"--backend"});
}

// KV-Runahead under mpirun (cli/run_runahead.cpp): 2 and 3 ranks give the single process's greedy
// text (int8: bitwise the same logits, engine/runahead.h), and prune with LazyLLM on the last rank;
// outside mpirun, with a partition that
// does not fit, with ranks on different model files: non-zero exit and one line saying why.
TEST_F(CliErrors, RunaheadOverMpiGivesTheSingleProcessText) {
  std::string prompt;
  for (int i = 0; i < 20; ++i) prompt += "the cat sat on the mat and the dog ";
  const std::vector<std::string> common = {"--model", tiny_,     "--prompt", prompt,  "--max-new-tokens",
                                           "6",       "--dtype", "int8",     "--json"};
  std::vector<std::string> single = {"run"};
  single.insert(single.end(), common.begin(), common.end());
  const CliResult one = run_cli(dir_, single);
  ASSERT_TRUE(one.exited && one.code == 0) << describe(one);
  const auto want = nlohmann::json::parse(one.out);
  int64_t unpruned_last = 0;
  for (const auto& [ranks, partition] :
       {std::pair{2, std::string("auto")}, std::pair{3, std::string("even")}}) {
    std::vector<std::string> args = {"run", "--runahead", "--partition", partition};
    args.insert(args.end(), common.begin(), common.end());
    const CliResult r = run_mpi(dir_, ranks, args);
    ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
    const auto got = nlohmann::json::parse(r.out);
    EXPECT_EQ(got["text"], want["text"]) << ranks;
    EXPECT_EQ(got["ranks"].get<int>(), ranks);
    int64_t sum = 0;
    for (const auto& c : got["partition"]) sum += c.get<int64_t>();
    EXPECT_EQ(sum, got["prompt_tokens"].get<int64_t>());
    EXPECT_EQ(got["ranks_detail"].size(), size_t(ranks));
    EXPECT_GT(got["ranks_detail"][0]["sent_mib"].get<double>(), 0);
    if (ranks == 2) unpruned_last = got["partition"][1].get<int64_t>();
  }
  // LazyLLM on the last rank: it runs and decodes on with re-selection, and the balanced
  // partition knows the last rank prunes (on this tiny model the pruning stage's fixed cost
  // outweighs the rows it saves, so the last rank gets fewer tokens; sim tests the large-model case).
  {
    std::vector<std::string> args = {"run", "--runahead", "--prune", "lazyllm", "--schedule", "0.5:0.5"};
    args.insert(args.end(), common.begin(), common.end());
    const CliResult r = run_mpi(dir_, 2, args);
    ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
    const auto got = nlohmann::json::parse(r.out);
    EXPECT_EQ(got["prune"], "lazyllm");
    EXPECT_GE(got["generated_tokens"].get<int>(), 1);
    EXPECT_EQ(got["partition"][0].get<int64_t>() + got["partition"][1].get<int64_t>(),
              got["prompt_tokens"].get<int64_t>());
    EXPECT_NE(got["partition"][1].get<int64_t>(), unpruned_last);  // balanced knowing the last rank prunes
  }
  // Outside mpirun: one process.
  std::vector<std::string> alone = {"run", "--runahead"};
  alone.insert(alone.end(), common.begin(), common.end());
  expect_one_line_error(run_cli(dir_, alone), {"mpirun -n P"});
  // A partition that does not sum to the prompt.
  std::vector<std::string> bad = {"run", "--runahead", "--partition", "5,5"};
  bad.insert(bad.end(), common.begin(), common.end());
  const CliResult b = run_mpi(dir_, 2, bad);
  EXPECT_TRUE(b.exited && b.code != 0) << describe(b);
  EXPECT_NE(b.err.find("--partition: the chunks sum to 10 tokens"), std::string::npos) << describe(b);
  // Ranks on different model files (mpirun's MPMD form: one program per rank).
  TinyModelSpec other;
  other.seed = 99;
  const std::string m2 = testing::write_tiny_model(dir_.file("other.gguf"), other);
  mpi_env();
  std::vector<std::string> mpmd = {"mpirun", "--oversubscribe", "-n", "1"};
  for (const std::string& m : {tiny_, m2}) {
    const std::vector<std::string> rank = cli_argv(
        {"run", "--runahead", "--model", m, "--prompt", prompt, "--max-new-tokens", "2", "--dtype", "int8"});
    mpmd.insert(mpmd.end(), rank.begin(), rank.end());
    if (m == tiny_) mpmd.insert(mpmd.end(), {":", "-n", "1"});
  }
  const CliResult d = run_program(dir_, mpmd);
  EXPECT_TRUE(d.exited && d.code != 0) << describe(d);
  EXPECT_NE(d.err.find("rank 1's model file differs from rank 0's"), std::string::npos) << describe(d);
}

}  // namespace
}  // namespace lp

namespace lp {
namespace {

using namespace cli_test;

// A model too large for the memory the process may use is refused before any weight is copied,
// with both sizes, and not killed mid-load; the same limit holds the int8 weights, which run. The
// limit is RLIMIT_DATA (prlimit): SmolLM2's f32 weights take 0.50 GiB and the process holds about
// 0.2 GiB before loading them (2026-11-29). Not in the sanitizer suite: ASan's shadow memory counts
// against the limit. About 1 s: the int8 run loads the real model.
TEST(CliMemory, AModelTooLargeForTheLimitIsRefusedBeforeLoading) {
  testing::TempDir dir;
  const std::string model = testing::real_model_path();
  const std::vector<std::string> limit = {"prlimit", "--data=700000000", cli_path()};
  const auto run = [&](const char* dtype) {
    std::vector<std::string> argv = limit;
    for (const char* a : {"run", "--model", model.c_str(), "--prompt", "hi", "--max-new-tokens", "1",
                          "--threads", "1", "--dtype", dtype})
      argv.push_back(a);
    return run_program(dir, argv);
  };
  const CliResult f32 = run("f32");
  expect_one_line_error(f32, {model, "the weights need 0.50 GiB of memory as f32", "(RLIMIT_DATA)"});
  const CliResult int8 = run("int8");
  EXPECT_TRUE(int8.exited && int8.code == 0) << describe(int8);
}

}  // namespace
}  // namespace lp
