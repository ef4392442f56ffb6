// Runs the real `lazyprefill` binary on bad inputs. Each must end with a non-zero exit code
// (never a signal), and exactly one line on stderr that names the problem (errors, tier two:
// STYLE.md). Models are built by tests/gguf_writer, small enough that each run takes
// milliseconds.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "model/io.h"
#include "tests/gguf_writer.h"
#include "traces/trace.h"

extern char** environ;

namespace lp {
namespace {

using testing::Bytes;
using testing::GgufLayout;
using testing::GgufWriter;
using testing::GgufWriterValue;
using testing::TempDir;
using testing::TinyModelSpec;

// LP_TEST_CLI overrides the binary under test (e.g. to try a patched build).
std::string cli_path() {
  const char* p = std::getenv("LP_TEST_CLI");
  return p && *p ? p : LP_CLI_PATH;
}

struct CliResult {
  bool exited = false;   // false: killed by a signal
  int code = -1;         // exit status, or the signal number
  long max_rss_kib = 0;  // the child's peak resident memory
  std::string out, err;
};

// Runs the CLI with `args` (no shell: empty arguments pass through as they are), stdin from
// /dev/null, stdout and stderr into files under `dir`.
CliResult run_cli(const TempDir& dir, const std::vector<std::string>& args) {
  const std::string out_path = dir.file("stdout.txt"), err_path = dir.file("stderr.txt");
  const std::string exe = cli_path();
  std::vector<std::string> argv_s = {exe};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  // One thread keeps the shared test machine calm, unless the test sets --threads itself.
  if (!args.empty() && args[0] == "run" && std::find(args.begin(), args.end(), "--threads") == args.end()) {
    argv_s.push_back("--threads");
    argv_s.push_back("1");
  }
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  CliResult r;
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn " << exe << ": " << std::strerror(rc);
    return r;
  }
  int status = 0;
  struct rusage ru {};
  while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  r.max_rss_kib = ru.ru_maxrss;
  r.exited = WIFEXITED(status);
  r.code = r.exited ? WEXITSTATUS(status) : WTERMSIG(status);
  auto slurp = [](const std::string& p) {
    const Bytes b = testing::read_file(p);
    return std::string(b.begin(), b.end());
  };
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  return r;
}

std::string describe(const CliResult& r) {
  return fmt::format("exited {} code {}\n--- stderr ---\n{}--- stdout (first 500) ---\n{}", r.exited, r.code,
                     r.err, r.out.substr(0, 500));
}

// A clean failure: exit code 1-127 (128+N is how shells report a signal; 134 abort, 139
// segfault), one line on stderr containing every one of `needles`.
// LP_TEST_SHOW_ERRORS=1 prints every message, for reviewing their wording.
void expect_one_line_error(const CliResult& r, std::initializer_list<std::string> needles) {
  if (std::getenv("LP_TEST_SHOW_ERRORS")) std::fprintf(stderr, "    stderr: %s", r.err.c_str());
  EXPECT_TRUE(r.exited) << "killed by signal " << r.code << "\n" << describe(r);
  EXPECT_GT(r.code, 0) << describe(r);
  EXPECT_LT(r.code, 128) << describe(r);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "stderr must be exactly one line\n"
                                                             << describe(r);
  EXPECT_TRUE(!r.err.empty() && r.err.back() == '\n') << describe(r);
  for (const auto& n : needles)
    EXPECT_NE(r.err.find(n), std::string::npos) << "missing '" << n << "'\n" << describe(r);
}

class CliErrors : public ::testing::Test {
 protected:
  void SetUp() override { tiny_ = testing::write_tiny_model(dir_.file("tiny.gguf")); }

  // `run` with a valid prompt on `model`, and `inspect` on it when `also_inspect`: both must fail
  // the same clean way.
  void expect_model_error(const std::string& model, std::initializer_list<std::string> needles,
                          bool also_inspect = true) {
    {
      SCOPED_TRACE("run");
      expect_one_line_error(
          run_cli(dir_, {"run", "--model", model, "--prompt", "the cat", "--max-new-tokens", "2"}), needles);
    }
    if (also_inspect) {
      SCOPED_TRACE("inspect");
      expect_one_line_error(run_cli(dir_, {"inspect", "--model", model}), needles);
    }
  }
  std::string write(const GgufWriter& w, const std::string& name) {
    const std::string p = dir_.file(name);
    w.write(p);
    return p;
  }
  std::string write_bytes(const Bytes& b, const std::string& name) {
    const std::string p = dir_.file(name);
    testing::write_file(p, b);
    return p;
  }
  std::string write_text(const std::string& text, const std::string& name) {
    return write_bytes(Bytes(text.begin(), text.end()), name);
  }

  TempDir dir_;
  std::string tiny_;
};

// ---- happy path ------------------------------------------------------------------------------

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

// ---- the model file ------------------------------------------------------------------------

TEST_F(CliErrors, MissingModelFile) {
  expect_model_error(dir_.file("no_such_model.gguf"), {"no_such_model.gguf", "cannot open model file"});
}

TEST_F(CliErrors, ModelPathIsADirectory) {
  expect_model_error(dir_.path(), {"not a regular file"});
}

// (An unreadable-by-permission model is not tested: CI runs as root, where chmod 000 does not
// stop reads. The directory-as-model case covers "cannot read".)

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
                     {"unsupported architecture 'gpt2'"});
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

// Issue 18, defect 11: these loaded and ran on garbage (overlapping tensor data), tokenised
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

// ---- the prompt ------------------------------------------------------------------------------

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

// ---- options ---------------------------------------------------------------------------------

TEST_F(CliErrors, BadDtype) {
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--dtype", "f16"}),
                        {"--dtype", "f16"});
}

TEST_F(CliErrors, ZeroThreads) {
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--threads", "0"}),
                        {"--threads", "0"});
}

// Every input is read by read_input_file: regular files only, refused from fstat before any read
// (a FIFO cannot hang the open), and capped in size from the file's length (issue 18, defects 1
// and 5): before, /dev/zero as a prompt grew by 0.8 GB/s until killed and a FIFO blocked open().
TEST_F(CliErrors, InputsMustBeRegularFilesOfBoundedSize) {
  const std::string fifo = dir_.file("fifo.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string sparse = dir_.file("sparse.txt");  // 8 GiB of holes: instant, no disk used
  {
    const int fd = ::open(sparse.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, off_t(8) << 30), 0);
    ::close(fd);
  }
  const std::string out = dir_.file("out.json");
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt-file", "/dev/zero"}),
                        {"/dev/zero", "prompt file must be a regular file"});
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt-file", fifo}),
                        {fifo, "must be a regular file"});
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt-file", sparse}),
                        {sparse, "8192.0 MiB is over the 64 MiB limit for prompt files"});
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt-file", dir_.path()}),
                        {dir_.path(), "is a directory"});
  expect_one_line_error(run_cli(dir_, {"run", "--model", fifo, "--prompt", "hi"}),
                        {fifo, "not a regular file"});
  expect_one_line_error(
      run_cli(dir_, {"run", "--model", tiny_, "--prompt", "hi", "--prune", "lazyllm", "--schedule", fifo}),
      {fifo, "schedule file"});
  expect_one_line_error(run_cli(dir_, {"simulate", "--trace", fifo, "--hw", "cpu-local"}), {fifo, "trace"});
  expect_one_line_error(
      run_cli(dir_, {"simulate", "--model-config", "smollm2-135m", "--prompt-tokens", "64", "--hw", fifo}),
      {fifo, "hardware profile"});
  const std::string big = dir_.file("big.json");  // a 2 MiB "profile": over its 1 MiB cap
  ASSERT_EQ(::truncate(sparse.c_str(), off_t(2) << 20), 0);
  std::filesystem::rename(sparse, big);
  expect_one_line_error(
      run_cli(dir_, {"simulate", "--model-config", "smollm2-135m", "--prompt-tokens", "64", "--hw", big}),
      {big, "2.0 MiB is over the 1 MiB limit for hardware profiles"});
  expect_one_line_error(
      run_cli(dir_, {"calibrate", "--measurements", fifo, "--base", "cpu-local", "--out", out}),
      {fifo, "measurement file must be a regular file"});
  expect_one_line_error(run_cli(dir_, {"calibrate-revivals", fifo, "--out", out}), {fifo, "trace"});
  expect_one_line_error(run_cli(dir_, {"sweep", "--grid", fifo, "--out", out}), {fifo, "sweep grid"});
  {
    const std::string grid = write_text(
        R"({"lazyprefill_sweep": 1, "hardware": ["l4"], "models": ["llama-2-7b"], "prompt_lengths": [512],
            "methods": [{"policy": "none"}]})",
        "g.json");
    expect_one_line_error(run_cli(dir_, {"sweep", "--grid", grid, "--out", fifo}),
                          {fifo, "sweep output must be a regular file"});
    const std::string link = dir_.file("rows-link.jsonl");
    ASSERT_EQ(::symlink(out.c_str(), link.c_str()), 0);
    expect_one_line_error(run_cli(dir_, {"sweep", "--grid", grid, "--out", link}), {link, "symlink"});
    ASSERT_EQ(::unlink(link.c_str()), 0);
  }
  expect_one_line_error(run_cli(dir_, {"eval", "--model", tiny_, "--lengths", "64", "--corpus", "/dev/zero"}),
                        {"/dev/zero", "evaluation text must be a regular file"});
  EXPECT_FALSE(std::filesystem::exists(out));
}

// A temporary output being written is removed when the process is interrupted (issue 18: a
// killed report left a 20 MB *.tmp.PID beside its output). Deterministic: the child registers
// the file, then signals itself.
TEST_F(CliErrors, TemporaryOutputsAreRemovedOnSignals) {
  for (int sig : {SIGINT, SIGTERM}) {
    const std::string tmp = dir_.file("out.json.tmp.test");
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      remove_temp_files_on_signal();
      TempFileGuard guard(tmp);
      const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0 || ::write(fd, "partial", 7) != 7) ::_exit(3);
      ::raise(sig);
      ::_exit(4);  // not reached: the handler re-raises with the default action
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "status " << status;
    EXPECT_FALSE(std::filesystem::exists(tmp)) << "signal " << sig;
  }
}

// Outputs never replace what is not a regular file (issue 18, defect 2: the rename turned a
// symlink, and as root /dev/null, into a regular file), and a failed write to standard output
// is an error (defect 4: simulate --json > /dev/full exited 0).
TEST_F(CliErrors, OutputsReplaceOnlyRegularFilesAndStdoutErrorsCount) {
  const std::string target = dir_.file("target.txt"), link = dir_.file("link.jsonl");
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--max-new-tokens",
                                       "1", "--trace", link}),
                        {link, "not a regular file", "not replacing it"});
  struct stat st {};
  ASSERT_EQ(::lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_FALSE(std::filesystem::exists(target));
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--max-new-tokens",
                                       "1", "--trace", "/dev/null"}),
                        {"/dev/null", "not a regular file"});
  // An output that is one of the command's inputs (by another name too) is refused, untouched.
  const std::string prompt = write_text("the cat sat", "prompt.txt");
  const std::string alias = dir_.file("alias.txt");
  ASSERT_EQ(::link(prompt.c_str(), alias.c_str()), 0);
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt-file", prompt, "--max-new-tokens",
                                       "1", "--trace", alias}),
                        {"--trace", "is the input file", "prompt.txt"});
  const Bytes kept = testing::read_file(prompt);
  EXPECT_EQ(std::string(kept.begin(), kept.end()), "the cat sat");
  ASSERT_EQ(::unlink(alias.c_str()), 0);
  // No leftover temporary files beside the outputs.
  for (const auto& e : std::filesystem::directory_iterator(dir_.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();

  const std::string err = dir_.file("full.err");
  const std::string cmd = "'" + cli_path() +
                          "' simulate --model-config smollm2-135m --prompt-tokens 64 --hw cpu-local --json "
                          ">/dev/full 2>'" +
                          err + "'";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  std::ifstream in(err);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("cannot write standard output"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
}

// --schedule "" meant the default in run and simulate and no pruning in report (issue 18, defect
// 12): it is a usage error in every command.
TEST_F(CliErrors, EmptyScheduleIsAUsageErrorEverywhere) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"run", "--model", tiny_, "--prompt", "the cat", "--schedule", ""},
        {"simulate", "--prune", "lazyllm", "--schedule", "", "--prompt-tokens", "64", "--model-config",
         "smollm2-135m", "--hw", "cpu-local"},
        {"report", "--model-config", "smollm2-135m", "--hw", "cpu-local", "--prompt-lengths", "1024",
         "--schedule", "", "--out", dir_.file("r")},
        {"eval", "--model", tiny_, "--lengths", "64", "--schedule", ""}}) {
    const CliResult r = run_cli(dir_, args);
    expect_one_line_error(r, {"--schedule", "empty schedule"});
    EXPECT_EQ(r.code, 2) << args[0];
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.file("r")));
}

// Text from files and arguments is escaped in error lines (issue 18, defect 10: raw newlines
// forged extra lines and escape sequences reached the terminal).
TEST(EscapeText, WritesOutControlCharactersOnly) {
  EXPECT_EQ(lp::escape_text("a\nb\tc\rd"), "a\\nb\\tc\\rd");
  EXPECT_EQ(lp::escape_text(std::string("\x1b[31m\x7f\0z", 8)), "\\x1b[31m\\x7f\\x00z");
  EXPECT_EQ(lp::escape_text("\xc2\x9b"
                            "1m"),
            "\\u009b1m");  // C1 CSI in UTF-8
  EXPECT_EQ(lp::escape_text("caf\xc3\xa9 \xe2\x80\x94 ok"), "caf\xc3\xa9 \xe2\x80\x94 ok");  // é, em dash
}

TEST_F(CliErrors, ControlCharactersInPathsAreEscaped) {
  const std::string path = dir_.file("a\nlazyprefill: forged\x1b[31m");
  const CliResult r = run_cli(dir_, {"run", "--model", tiny_, "--prompt-file", path});
  expect_one_line_error(r, {"a\\nlazyprefill: forged\\x1b[31m", "cannot read prompt file"});
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos);
}

// Issue 18, low defects: --model '' silently meant the default model, --seed -1 was recorded as
// 2^64 - 1, --temperature nan failed only after loading the model (exit 1): each is a usage
// error up front.
TEST_F(CliErrors, EmptyPathsNanAndNegativeSeedsAreUsageErrors) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"run", "--model", "", "--prompt", "hi"}, "--model: an empty path"},
      {{"inspect", "--model", ""}, "--model: an empty path"},
      {{"simulate", "--model", "", "--prompt-tokens", "64", "--hw", "cpu-local"}, "--model: an empty path"},
      {{"run", "--model", tiny_, "--prompt", "hi", "--temperature", "nan"},
       "--temperature: not a finite number"},
      {{"run", "--model", tiny_, "--prompt", "hi", "--top-p", "nan"}, "--top-p: not a finite number"},
      {{"run", "--model", tiny_, "--prompt", "hi", "--seed", "-1"},
       "--seed: not a non-negative whole number"},
      {{"eval", "--model", tiny_, "--lengths", "64", "--seed", "-1"},
       "--seed: not a non-negative whole number"},
  };
  for (const auto& [args, needle] : cases) {
    SCOPED_TRACE(args[0] + " " + needle);
    const CliResult r = run_cli(dir_, args);
    expect_one_line_error(r, {needle});
    EXPECT_EQ(r.code, 2);
  }
}

TEST_F(CliErrors, ValidateRoundsOutOfRange) {
  expect_one_line_error(run_cli(dir_, {"validate", "--model", tiny_, "--rounds", "0"}), {"--rounds", "0"});
  expect_one_line_error(run_cli(dir_, {"validate", "--model", tiny_, "--rounds", "21"}), {"--rounds", "21"});
}

TEST_F(CliErrors, NoSubcommand) {
  expect_one_line_error(run_cli(dir_, {}), {"subcommand"});
}

TEST_F(CliErrors, UnknownOption) {
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--bogus"}),
                        {"--bogus"});
}

// ---- pruning options ----------------------------------------------------------------------

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
  expect_one_line_error(run_cli(dir_, {"inspect", "--trace", tiny_}), {"not a lazyprefill trace"});
}

}  // namespace
}  // namespace lp

namespace lp {
namespace {

// ---- simulate, calibrate ---------------------------------------------------------------------

std::string slurp_text(const std::string& path) {
  const Bytes b = testing::read_file(path);
  return std::string(b.begin(), b.end());
}

class CliSim : public CliErrors {
 protected:
  // A lazyllm trace of the tiny model (2 layers) and its run --json output.
  std::string make_trace(const std::string& name, int words, nlohmann::json* run = nullptr) {
    std::string prompt;
    for (int i = 0; i < words; ++i) prompt += "a ";
    const std::string t = dir_.file(name);
    const CliResult r = run_cli(dir_, {"run", "--model", tiny_, "--prompt", prompt, "--max-new-tokens", "3",
                                       "--prune", "lazyllm", "--schedule", "0:0.5", "--trace", t, "--json"});
    EXPECT_TRUE(r.exited && r.code == 0) << describe(r);
    if (run) *run = nlohmann::json::parse(r.out);
    return t;
  }
};

// The replayed Aux Cache holds what the engine's holds: one entry per token, whatever the
// decoding steps overwrote (issue 17: the sum of every write was reported), and a decoding step
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

// Issue 18 defect 3: the simulator streams decoding steps, so its memory does not grow with them
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

// Issue 18 defect 9, through the CLI: a trace cut short is refused, not summarised or replayed.
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

// Issue 18 (low): a given 0 (or NaN) budget or objective is refused, not taken for "none".
TEST_F(CliSim, ReportRefusesAZeroBudgetOrObjective) {
  for (const char* opt : {"--mem-budget-gib", "--slo-ttft-ms"})
    for (const char* v : {"0", "-1", "nan"})
      expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4",
                                           "--prompt-lengths", "512", "--out", dir_.file("r"), opt, v}),
                            {opt});
}

// Issue 18 defect 6: a report holds what a reader can use; more is refused before it is computed.
TEST_F(CliSim, ReportRefusesMoreResultsThanItHolds) {
  std::vector<int> ns(1025);
  std::iota(ns.begin(), ns.end(), 1);
  const std::string lengths = fmt::format("{}", fmt::join(ns, ","));
  expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4",
                                       "--prompt-lengths", lengths, "--out", dir_.file("r")}),
                        {"1025 lengths", "use sweep"});
}

// Issue 18 defect 8: a second sweep on a locked output is refused, and a write that fails (the
// file-size limit standing in for a full disk) leaves whole rows only, which a resume completes.
TEST_F(CliSim, SweepOutputIsLockedAndNeverTorn) {
  const std::string grid = write_text(
      R"({"lazyprefill_sweep": 1, "hardware": ["h100-sxm", "l4"], "models": ["llama-2-7b"],
          "methods": [{"policy": "none"}, {"policy": "lazyllm"}], "prompt_lengths": [512, 1024, 2048, 4096]})",
      "grid.json");
  const std::string out = dir_.file("rows.jsonl");
  {
    const int fd = ::open(out.c_str(), O_RDWR | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX), 0);
    expect_one_line_error(run_cli(dir_, {"sweep", "--grid", grid, "--out", out}), {"rows.jsonl", "locked"});
    ::close(fd);
  }
  // Four rows written, then the whole grid under a 2.5 KiB file-size limit: its rows cannot be
  // written, and the four already there stay whole, with nothing torn after them.
  const std::string small = write_text(
      R"({"lazyprefill_sweep": 1, "hardware": ["l4"], "models": ["llama-2-7b"],
          "methods": [{"policy": "none"}, {"policy": "lazyllm"}], "prompt_lengths": [512, 1024]})",
      "small.json");
  CliResult r = run_cli(dir_, {"sweep", "--grid", small, "--out", out});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const Bytes before = testing::read_file(out);
  ASSERT_EQ(std::count(before.begin(), before.end(), '\n'), 4);
  ASSERT_LT(before.size(), 2560u);
  const std::string cmd =
      fmt::format("ulimit -f 5; trap '' XFSZ; exec '{}' sweep --grid '{}' --out '{}'", cli_path(), grid, out);
  const std::string err = dir_.file("limited.err");
  const int rc = std::system(("/bin/sh -c \"" + cmd + "\" > /dev/null 2> '" + err + "'").c_str());
  EXPECT_NE(rc, 0) << "the sweep must fail when its rows cannot be written";
  const Bytes eb = testing::read_file(err);
  const std::string msg(eb.begin(), eb.end());
  EXPECT_NE(msg.find("rows.jsonl"), std::string::npos) << msg;
  EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 1) << msg;
  EXPECT_TRUE(testing::read_file(out) == before);
  r = run_cli(dir_, {"sweep", "--grid", grid, "--out", out});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const Bytes all = testing::read_file(out);
  EXPECT_EQ(std::count(all.begin(), all.end(), '\n'), 16);
}

// Issue 18 defect 10: names from a model file are escaped in inspect's text and stay valid in
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

TEST_F(CliSim, CalibrateFromRunsAndUseTheProfile) {
  std::filesystem::create_directory(dir_.file("runs"));
  for (int words : {20, 60, 120}) {
    nlohmann::json run;
    make_trace("t" + std::to_string(words) + ".jsonl", words, &run);
    write_text(run.dump(), "runs/r" + std::to_string(words) + ".json");
  }
  const std::string out = dir_.file("fit.json");
  CliResult r = run_cli(dir_, {"calibrate", "--runs", dir_.file("runs"), "--base", "cpu-local", "--out", out,
                               "--name", "tiny-local", "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto rep = nlohmann::json::parse(r.out);
  EXPECT_EQ(rep["runs"].size(), 3u);
  const auto prof = nlohmann::json::parse(slurp_text(out));
  EXPECT_EQ(prof["name"], "tiny-local");
  EXPECT_EQ(prof["efficiency"]["default"], false);
  EXPECT_NE(prof["sources"]["efficiency"].get<std::string>().find("lazyprefill calibrate"),
            std::string::npos);
  r = run_cli(dir_, {"simulate", "--trace", dir_.file("t20.jsonl"), "--hw", out, "--compute", "f32"});
  EXPECT_TRUE(r.exited && r.code == 0) << describe(r);

  expect_one_line_error(
      run_cli(dir_, {"calibrate", "--runs", dir_.file("none"), "--base", "l4", "--out", out}),
      {"is not a folder"});
  write_text("{\"hello\": 1}", "runs/zz.json");
  expect_one_line_error(
      run_cli(dir_, {"calibrate", "--runs", dir_.file("runs"), "--base", "l4", "--out", out}),
      {"zz.json", "not a `run --json` output"});
}

// End-to-end measurements (sim/fit_measurements.h): a small CSV whose SHA-256 was computed with
// coreutils' sha256sum, the published TensorRT-LLM table, and the refusals.
TEST_F(CliSim, CalibrateFromMeasurementsRecordsProvenance) {
  const std::string csv = write_text(
      "model,hardware,prompt_tokens,ttft_ms,tp\nllama-2-7b,a100-80gb,512,40.5,1\nllama-2-7b,a100-80gb,1024,"
      "75.25,1\n"
      "llama-2-7b,a100-80gb,2048,150,1\nllama-2-70b,a100-80gb,2048,380,4\n",
      "k.csv");
  const std::string out = dir_.file("a100-fit.json");
  // Four points: the per-op overhead explains the short prompts' gap significantly (judged where
  // its fit ends up); GEMM efficiency beside it falls short of the 5% point of F(1, 2), 18.5, and
  // is left out unless asked for.
  CliResult r =
      run_cli(dir_, {"calibrate", "--measurements", csv, "--base", "a100-80gb", "--out", out, "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const nlohmann::json out_json = nlohmann::json::parse(r.out);  // a named object: the loop reads into it
  for (const auto& c : out_json["parameters"]) {
    if (c["name"] == "overhead_us") {
      EXPECT_TRUE(c["fitted"].get<bool>()) << c.dump();
    }
    if (c["name"] == "gemm.compute") {
      EXPECT_FALSE(c["fitted"].get<bool>()) << c.dump();
      EXPECT_NE(c["reason"].get<std::string>().find("the 5% point of F(1, 2)"), std::string::npos)
          << c.dump();
    }
  }
  r = run_cli(dir_, {"calibrate", "--measurements", csv, "--base", "a100-80gb", "--fit", "gemm.compute",
                     "--out", out, "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto rep = nlohmann::json::parse(r.out);
  ASSERT_EQ(rep["points"].size(), 4u);
  EXPECT_EQ(rep["points"][3]["tp"], 4);
  EXPECT_EQ(rep["points"][3]["preset"], "llama-2-70b");
  const auto prof = nlohmann::json::parse(slurp_text(out));
  EXPECT_EQ(prof["efficiency"]["default"], false);
  const auto& cal = prof["calibration"];
  EXPECT_EQ(cal["files"][0]["sha256"], "3c34f45a2e15d762b5867fbd0025a3b47968f8f5947e7a017b8dd61d77cd9e9b");
  EXPECT_EQ(cal["cross_validation"], "leave-one-out");
  EXPECT_EQ(cal["ttft_points"], 4);
  EXPECT_GE(cal["fitted"].size(), 1u);
  EXPECT_TRUE(cal["ttft_mape_pct"]["held_out"].is_number());
  EXPECT_NE(prof["sources"]["efficiency"].get<std::string>().find("held-out TTFT MAPE"), std::string::npos);
  // The fitted profile is a profile.
  r = run_cli(dir_, {"simulate", "--prune", "none", "--prompt-tokens", "1000", "--model-config", "llama-2-7b",
                     "--hw", out});
  EXPECT_TRUE(r.exited && r.code == 0) << describe(r);

  // The published TensorRT-LLM table: its "A100" must be mapped to a profile.
  const std::string trt =
      std::string(LP_SOURCE_DIR) + "/tests/fixtures/measurements/trtllm-v0.5-first-token.csv";
  r = run_cli(dir_, {"calibrate", "--measurements", trt, "--base", "a100-80gb", "--hw-map", "A100=a100-80gb",
                     "--out", dir_.file("trt.json")});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_NE(r.out.find("skipped: 4 on h100-sxm"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("held out (leave-one-out)"), std::string::npos) << r.out;
}

TEST_F(CliSim, CalibrateFromMeasurementsRefusesBadInput) {
  const std::string out = dir_.file("never.json");
  const auto calibrate = [&](const std::string& text, std::vector<std::string> extra = {}) {
    const std::string f = write_text(text, "m.csv");
    std::vector<std::string> args = {"calibrate", "--measurements", f, "--base", "h100-sxm", "--out", out};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(dir_, args);
  };
  const std::string head = "model,hardware,prompt_tokens,ttft_ms,tp\n";
  // 1.3 times the base profile's predictions: a gemm.compute (or overhead) fit explains them.
  const std::string ok =
      head +
      "llama-2-7b,h100-sxm,512,17.82,1\nllama-2-7b,h100-sxm,1024,33.29,1\nllama-2-7b,h100-sxm,2048,64.77,1\n";
  expect_one_line_error(
      calibrate(ok + "llama-2-7b,NVIDIA H100 PCIe,512,30,1\n"),
      {"m.csv", "record 5", "unknown hardware 'NVIDIA H100 PCIe'", "h100-sxm", "a100-80gb", "--hw-map"});
  expect_one_line_error(calibrate(ok + "Llama-3.2-3B,h100-sxm,512,10,1\n"),
                        {"m.csv", "record 5", "unknown model 'Llama-3.2-3B'", "llama-2-7b", "--model-map"});
  expect_one_line_error(calibrate(ok + "llama-2-7b,h100-sxm,512,20,16\n"),
                        {"m.csv", "record 5", "--tp 16", "max_tp 8"});
  // A pruned record without its schedule, and the same file given twice.
  expect_one_line_error(
      calibrate("model,hardware,prompt_tokens,ttft_ms,method\n" +
                std::string("llama-2-7b,h100-sxm,512,17.82,none\nllama-2-7b,h100-sxm,1024,33.29,none\n") +
                "llama-2-7b,h100-sxm,2048,50,lazyllm\n"),
      {"m.csv", "record 4", "method 'lazyllm' names no schedule"});
  {
    const std::string f = write_text(ok, "twice.csv");
    expect_one_line_error(
        run_cli(dir_, {"calibrate", "--measurements", f, f, "--base", "h100-sxm", "--out", out}),
        {"twice.csv", "same bytes"});
  }
  expect_one_line_error(
      calibrate("model,hardware,prompt_tokens,ttft_ms,ttft_s\nllama-2-7b,h100-sxm,512,20,0.02\n"),
      {"m.csv", "mixed units"});
  expect_one_line_error(calibrate(ok, {"--fit", "gemm.memory"}), {"cannot fit gemm.memory", "decode"});
  expect_one_line_error(calibrate(ok, {"--model-map", "x=llama-9"}), {"llama-9"});
  expect_one_line_error(calibrate(head + "llama-2-7b,h100-sxm,512,20,1\n"), {"at least 3 points"});
  EXPECT_FALSE(std::filesystem::exists(out));  // nothing written by any of them
  // A point measured twice is one point with two repetitions, its time their mean.
  {
    const CliResult rep = calibrate(ok + "llama-2-7b,h100-sxm,512,18.82,1\n", {"--json"});
    ASSERT_TRUE(rep.exited && rep.code == 0) << describe(rep);
    const auto j = nlohmann::json::parse(rep.out);
    EXPECT_EQ(j["repetitions_merged"], 1);
    ASSERT_EQ(j["points"].size(), 3u);
    EXPECT_EQ(j["points"][0]["repetitions"], 2);
    EXPECT_DOUBLE_EQ(j["points"][0]["measured_ms"].get<double>(), (17.82 + 18.82) / 2);
  }
  // A model name the presets know under another spelling is accepted with --model-map.
  const CliResult r =
      calibrate(ok + "Llama-3.2-3B,h100-sxm,4096,133.0,1\n", {"--model-map", "Llama-3.2-3B=llama-2-7b"});
  EXPECT_TRUE(r.exited && r.code == 0) << describe(r);
}

}  // namespace
}  // namespace lp

namespace lp {
namespace {

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

// Documented exit codes: 0 ok, 1 runtime failure, 2 usage error.
TEST_F(CliErrors, ExitCodesSeparateUsageFromRuntimeErrors) {
  EXPECT_EQ(run_cli(dir_, {"run", "--bogus"}).code, 2);
  EXPECT_EQ(run_cli(dir_, {}).code, 2);
  EXPECT_EQ(run_cli(dir_, {"run", "--model", tiny_}).code, 2);  // neither --prompt nor --prompt-file
  EXPECT_EQ(
      run_cli(dir_, {"run", "--model", tiny_, "--prompt", "a", "--prune", "lazyllm", "--schedule", "0:1.5"})
          .code,
      2);
  EXPECT_EQ(run_cli(dir_, {"simulate", "--prune", "none", "--prompt-tokens", "8", "--model-config", "x",
                           "--hw", "l4"})
                .code,
            2);
  EXPECT_EQ(run_cli(dir_, {"simulate", "--prune", "none", "--prompt-tokens", "8", "--model-config",
                           "llama-2-7b", "--hw", "h1000"})
                .code,
            2);
  EXPECT_EQ(run_cli(dir_, {"run", "--model", dir_.file("missing.gguf"), "--prompt", "a"}).code, 1);
  const CliResult help = run_cli(dir_, {"simulate", "--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("lazyprefill simulate --trace"), std::string::npos) << help.out;  // an example
}

}  // namespace
}  // namespace lp

namespace lp {
namespace {

// The capacity report: valid against the shipped schema (checked by python3-jsonschema, an
// independent validator), charts and page written, objectives no length meets said in the
// report, bad input refused with nothing half-written.
TEST_F(CliSim, ReportIsValidAgainstItsSchema) {
  const std::string out = dir_.file("rep");
  CliResult r =
      run_cli(dir_, {"report", "--model-config", "llama-3.1-8b", "--hw", "h100-sxm,l4", "--prompt-lengths",
                     "1024,8192", "--slo-ttft-ms", "0.001", "--mem-budget-gib", "30", "--schedule",
                     "0.3:0.3,0.6:0.3,0.9:0.3", "--schedule", "0.1:0.5,0.3:0.5,0.5:0.5", "--out", out});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_NE(r.out.find("h100-sxm"), std::string::npos);
  const std::string schema = std::string(LP_SOURCE_DIR) + "/reports/capacity-report.schema.json";
  const std::string cmd = fmt::format(
      "python3 -c \"import json,jsonschema,sys; s=json.load(open(sys.argv[1])); "
      "jsonschema.Draft202012Validator.check_schema(s); "
      "jsonschema.validate(json.load(open(sys.argv[2])), s, cls=jsonschema.Draft202012Validator)\" '{}' '{}'",
      schema, out + "/capacity-report.json");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto rep = nlohmann::json::parse(slurp_text(out + "/capacity-report.json"));
  // 2 hardware x (none, 2 lazyllm schedules, static, random) x 2 lengths.
  EXPECT_EQ(rep["results"].size(), 2u * 5 * 2);
  for (const auto& c : rep["capacity"]) {
    EXPECT_TRUE(c["max_prompt_tokens_within_slo"].is_null());
    EXPECT_NE(c["slo_note"].get<std::string>().find("no prompt length meets"), std::string::npos);
  }
  for (const char* f :
       {"report.html", "ttft-vs-prompt-length.svg", "speedup-vs-share-computed.svg", "op-breakdown.svg"})
    EXPECT_TRUE(std::filesystem::exists(out + "/" + f)) << f;
  // The pruned methods are faster than none everywhere in this compute-bound regime.
  for (const auto& x : rep["results"]) {
    if (x["method"] != "none") {
      EXPECT_GT(x["speedup"].get<double>(), 1.0) << x.dump();
    }
  }
}

TEST_F(CliSim, ReportBadInput) {
  const std::string out = dir_.file("rep");
  // A --validation file whose cases lack what the chart draws: one line naming it (a raw
  // library type error before).
  for (const char* v : {R"({"cases": [{"policy": "none"}]})", R"({"cases": [{"measured_ttft_ms": 5,
      "predicted_ttft_ms": "6"}]})",
                        R"({"cases": 3})", R"([1, 2])"}) {
    const std::string f = write_text(v, "validation.json");
    expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4",
                                         "--prompt-lengths", "1024", "--out", out, "--validation", f}),
                          {"validation.json"});
  }
  expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "h1000",
                                       "--prompt-lengths", "1024", "--out", out}),
                        {"unknown hardware 'h1000'", "h100-sxm"});
  expect_one_line_error(run_cli(dir_, {"report", "--model-config", "gpt-5", "--hw", "l4", "--prompt-lengths",
                                       "1024", "--out", out}),
                        {"unknown model configuration 'gpt-5'", "llama-2-7b"});
  expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4",
                                       "--prompt-lengths", "1024,lots", "--out", out}),
                        {"'lots'"});
  expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4",
                                       "--prompt-lengths", ",", "--out", out}),
                        {"--prompt-lengths is empty"});
  expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4",
                                       "--prompt-lengths", "100000", "--out", out}),
                        {"exceeds the model's context of 4096"});
  EXPECT_FALSE(std::filesystem::exists(out + "/capacity-report.json"));
  const std::string bad = dir_.file("no/such/folder");
  expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4",
                                       "--prompt-lengths", "1024", "--out", bad}),
                        {"cannot write the report", "no/such/folder"});
}

}  // namespace
}  // namespace lp

namespace lp {
namespace {

// calibrate-revivals fits the tiny model's LazyLLM traces, writes the model atomically, and the
// model it wrote is what simulate and report use; a model of another layer count needs --map,
// and without it nothing is written (issue 17, item 3).
TEST_F(CliSim, CalibrateRevivalsFitsAndIsUsed) {
  std::vector<std::string> traces;
  for (int k = 0; k < 3; ++k) {
    std::string prompt;
    for (int i = 0; i < 50 + 10 * k; ++i) prompt += i % 3 ? "b a " : "c ";
    const std::string t = dir_.file(fmt::format("r{}.jsonl", k));
    const CliResult r = run_cli(dir_, {"run", "--model", tiny_, "--prompt", prompt, "--max-new-tokens", "6",
                                       "--prune", "lazyllm", "--schedule", "0:0.6", "--trace", t, "--json"});
    ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
    traces.push_back(t);
  }
  const std::string model = dir_.file("rv.json");
  CliResult r = run_cli(dir_, {"calibrate-revivals", traces[0], traces[1], "--held-out", traces[2], "--out",
                               model, "--json", "--compute", "f32"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  const auto m = nlohmann::json::parse(slurp_text(model));
  EXPECT_EQ(m["n_layer"], 2);
  ASSERT_EQ(m["stages"].size(), 1u);
  EXPECT_EQ(m["stages"][0]["points"], 2 * 5);
  ASSERT_EQ(m["traces"].size(), 2u);
  EXPECT_EQ(m["traces"][0]["sha256"].get<std::string>().size(), 64u);
  ASSERT_EQ(j["held_out"].size(), 1u);
  EXPECT_TRUE(j["held_out"][0]["error"].contains("kv"));

  // simulate: the built-in model by default, the file when named, --revival-share 0 as the bound.
  const auto sim = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"simulate",   "--prune",      "lazyllm", "--prompt-tokens",
                                     "2000",       "--new-tokens", "16",      "--model-config",
                                     "llama-2-7b", "--hw",         "l4",      "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult res = run_cli(dir_, args);
    EXPECT_TRUE(res.exited && res.code == 0) << describe(res);
    return nlohmann::json::parse(res.out);
  };
  const auto builtin = sim({}), bound = sim({"--revival-share", "0"}),
             fitted = sim({"--revival-model", model, "--map"});
  EXPECT_NE(builtin["revivals"].get<std::string>().find("built-in"), std::string::npos)
      << builtin["revivals"];
  EXPECT_NE(bound["revivals"].get<std::string>().find("optimistic bound"), std::string::npos)
      << bound["revivals"];
  EXPECT_NE(fitted["revivals"].get<std::string>().find("rv.json"), std::string::npos) << fitted["revivals"];
  // Revivals cost decode time and KV: the bound is the cheapest.
  EXPECT_GT(builtin["results"][0]["decode_step_mean_ms"].get<double>(),
            bound["results"][0]["decode_step_mean_ms"].get<double>());
  EXPECT_GT(builtin["results"][0]["memory_bytes"]["kv"].get<double>(),
            bound["results"][0]["memory_bytes"]["kv"].get<double>());

  // A 2-layer model on a 32-layer target without --map: one line naming the file, nothing written.
  expect_one_line_error(
      run_cli(dir_, {"simulate", "--prune", "lazyllm", "--prompt-tokens", "2000", "--new-tokens", "4",
                     "--model-config", "llama-2-7b", "--hw", "l4", "--revival-model", model}),
      {"rv.json", "2-layer", "32 layers", "--map"});
  const std::string out = dir_.file("rep");
  expect_one_line_error(
      run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4", "--prompt-lengths", "1024",
                     "--new-tokens", "8", "--revival-model", model, "--out", out}),
      {"rv.json", "2-layer", "--map"});
  EXPECT_FALSE(std::filesystem::exists(out));
  r = run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4", "--prompt-lengths", "1024",
                     "--new-tokens", "8", "--prune", "lazyllm", "--out", out, "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto rep = nlohmann::json::parse(r.out);
  EXPECT_NE(rep["provenance"]["methods"][1]["revivals"].get<std::string>().find("built-in"),
            std::string::npos);

  // Bad input to calibrate-revivals itself.
  const std::string none = dir_.file("none.jsonl");
  r = run_cli(dir_,
              {"run", "--model", tiny_, "--prompt", "a b c a b c", "--max-new-tokens", "3", "--trace", none});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const std::string never = dir_.file("never.json");
  expect_one_line_error(run_cli(dir_, {"calibrate-revivals", none, "--out", never}),
                        {"none.jsonl", "no revivals"});
  expect_one_line_error(run_cli(dir_, {"calibrate-revivals", traces[0], traces[0], "--out", never}),
                        {"same trace"});
  expect_one_line_error(run_cli(dir_, {"calibrate-revivals", traces[0], "--held-out", traces[0]}),
                        {"--held-out", "fitted on"});
  expect_one_line_error(
      run_cli(dir_, {"calibrate-revivals", "--revival-model", tiny_, "--held-out", traces[2]}),
      {"tiny.gguf", "not valid JSON"});
  expect_one_line_error(run_cli(dir_, {"calibrate-revivals"}), {"give traces to fit"});
  EXPECT_FALSE(std::filesystem::exists(never));
}

TEST_F(CliSim, SweepWritesJsonLinesAndResumes) {
  const std::string grid = write_text(
      R"({"lazyprefill_sweep": 1, "hardware": ["h100-sxm", "l4"], "models": ["llama-2-7b", "smollm2-135m"],
          "methods": [{"policy": "none"}, {"policy": "lazyllm", "schedule": "0.3:0.3,0.6:0.3,0.9:0.3"}],
          "prompt_lengths": [512, 2048, 8192]})",
      "grid.json");
  const std::string out = dir_.file("sweep.jsonl");
  CliResult r = run_cli(dir_, {"sweep", "--grid", grid, "--out", out});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_TRUE(r.err.empty()) << "no progress bar when stderr is not a terminal: " << r.err;
  std::string text = slurp_text(out);
  // 2 hw x 2 models x 2 methods x 3 lengths, less llama-2-7b at 8192 (its context is 4096).
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2 * 2 * 2 * 3 - 2 * 2);
  // Cut the file mid-row, as an interrupted run would: the rerun keeps complete rows, redoes the rest.
  write_text(text.substr(0, text.size() - 40), "sweep.jsonl");
  r = run_cli(dir_, {"sweep", "--grid", grid, "--out", out});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_NE(r.out.find("1 configurations simulated, 19 already"), std::string::npos) << r.out;
  const std::string again = slurp_text(out);
  EXPECT_EQ(again.size(), text.size());
  for (size_t a = 0, b; (b = again.find('\n', a)) != std::string::npos; a = b + 1)
    EXPECT_TRUE(nlohmann::json::accept(again.substr(a, b - a))) << again.substr(a, b - a);
  const std::string bad =
      write_text(R"({"lazyprefill_sweep": 1, "hardware": [], "models": ["x"]})", "bad.json");
  expect_one_line_error(run_cli(dir_, {"sweep", "--grid", bad, "--out", out}), {"bad.json", "'hardware'"});
  // Revivals and engines in a grid: rows say how revivals were modelled; bad values are one line.
  const std::string rv = write_text(
      R"({"lazyprefill_sweep": 1, "hardware": ["h100-sxm"], "models": ["llama-2-7b"], "engine": "trtllm",
          "methods": [{"policy": "lazyllm", "schedule": "0.3:0.3"}], "prompt_lengths": [1024], "new_tokens": 8,
          "revival_share": 0})",
      "rv.json");
  const std::string rv_out = dir_.file("rv.jsonl");
  r = run_cli(dir_, {"sweep", "--grid", rv, "--out", rv_out});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_NE(slurp_text(rv_out).find("optimistic bound"), std::string::npos) << slurp_text(rv_out);
  for (const char* g : {R"("engine": "sglang")", R"("revival_share": "lots")", R"("revival_share": 2)",
                        R"("map": "yes")", R"("revival_model": 3)"}) {
    const std::string f = write_text(fmt::format(R"({{"lazyprefill_sweep": 1, "hardware": ["l4"], "models":
        ["llama-2-7b"], "methods": [{{"policy": "lazyllm"}}], "prompt_lengths": [512], {}}})",
                                                 g),
                                     "badrv.json");
    SCOPED_TRACE(g);
    expect_one_line_error(run_cli(dir_, {"sweep", "--grid", f, "--out", dir_.file("never.jsonl")}), {});
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.file("never.jsonl")));
}

// Grids are read strictly (issue 18, defects 8 and 13): a typo'd key, a fractional length, a
// negative new_tokens, a wrongly typed field, a version that wraps to 1 in 32 bits, and --out
// naming the grid itself are each one line naming the file and the field, with nothing written.
TEST_F(CliSim, SweepGridsAreReadStrictly) {
  const std::string base = R"("hardware": ["l4"], "models": ["llama-2-7b"], "prompt_lengths": [512])";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": "lazyllm", "shedule": "0.3:0.3"}])",
       "unknown key 'shedule'"},
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": "none"}], "new_token": 4)",
       "unknown key 'new_token'"},
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": "none"}], "new_tokens": -3)",
       "new_tokens must be in [0"},
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": "none"}], "batch": "4")",
       "batch must be a whole number"},
      {R"("lazyprefill_sweep": 4294967297, "methods": [{"policy": "none"}])", "lazyprefill_sweep must be in"},
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": 3}])", "'policy' must be a string"},
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": "none"}], "batch": 0)", "batch must be in [1"},
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": "lazyllm", "schedule": ""}])", "empty schedule"},
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": "none"}], "precision": {"weight": "fp8"})",
       "unknown key 'weight'"},
  };
  for (const auto& [fields, needle] : cases) {
    SCOPED_TRACE(fields);
    const std::string f = write_text("{" + fields + ", " + base + "}", "strict.json");
    expect_one_line_error(run_cli(dir_, {"sweep", "--grid", f, "--out", dir_.file("never.jsonl")}),
                          {"strict.json", needle});
  }
  const std::string frac =
      write_text(R"({"lazyprefill_sweep": 1, "hardware": ["l4"], "models": ["llama-2-7b"],
      "methods": [{"policy": "none"}], "prompt_lengths": [1.5]})",
                 "frac.json");
  expect_one_line_error(run_cli(dir_, {"sweep", "--grid", frac, "--out", dir_.file("never.jsonl")}),
                        {"frac.json", "prompt_lengths: a length must be a whole number, got 1.5"});
  EXPECT_FALSE(std::filesystem::exists(dir_.file("never.jsonl")));
  const std::string good = write_text(
      R"({"lazyprefill_sweep": 1, "hardware": ["l4"], "models": ["llama-2-7b"], "methods": [{"policy": "none"}],
          "prompt_lengths": [512]})",
      "good.json");
  const std::string before = slurp_text(good);
  const CliResult r = run_cli(dir_, {"sweep", "--grid", good, "--out", good});
  expect_one_line_error(r, {"is the grid itself"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(slurp_text(good), before);
}

}  // namespace
}  // namespace lp

#include "evals/tasks.h"
#include "model/gguf.h"
#include "model/vocab.h"
#include "tests/test_util.h"

namespace lp {
namespace {

class CliEval : public CliErrors {
 protected:
  std::string six_layers() {
    TinyModelSpec s;
    s.n_layer = 6;
    return testing::write_tiny_model(dir_.file("six.gguf"), s);
  }
};

TEST_F(CliEval, WritesJsonAndChartsOnTheTinyModel) {
  const std::string out = dir_.file("ev");
  CliResult r = run_cli(dir_, {"eval", "--model", six_layers(), "--task", "kv,nll", "--lengths", "300",
                               "--samples", "2", "--prune", "lazyllm,random", "--schedule", "0.3:0.3,0.6:0.3",
                               "--threads", "1", "--out", out, "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j, nlohmann::json::parse(slurp_text(out + "/eval.json")));
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& res : j["results"]) {
    EXPECT_EQ(res["methods"].size(), 2u);
    EXPECT_EQ(res["samples"].size(), 2u);
    EXPECT_DOUBLE_EQ(res["baseline"]["prompt_tokens_computed_fraction"].get<double>(), 1.0);
    EXPECT_LT(res["methods"][0]["prompt_tokens_computed_fraction"].get<double>(), 1.0);
    const std::string svg =
        slurp_text(fmt::format("{}/speed-accuracy-{}-300.svg", out, res["task"].get<std::string>()));
    EXPECT_TRUE(svg.starts_with("<svg") || svg.starts_with("<?xml")) << svg.substr(0, 80);
  }
  EXPECT_EQ(j["results"][0]["task"], "kv");
  EXPECT_DOUBLE_EQ(j["results"][0]["chance_accuracy"].get<double>(), 0.25);
  EXPECT_FALSE(j["results"][0]["samples"][0].contains("prompt"));  // only with --with-prompts
  EXPECT_TRUE(j["results"][1]["baseline"].contains("nll_mean"));
  // One progress line per sample on stderr.
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 4) << r.err;
}

TEST_F(CliEval, BadInput) {
  const std::string six = six_layers(), out = dir_.file("ev");
  const auto eval = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"eval", "--model", six, "--threads", "1", "--out", out};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(dir_, args);
  };
  CliResult r = eval({"--task", "squad", "--lengths", "300"});
  expect_one_line_error(r, {"unknown task 'squad'", "passkey, kv, mdqa, nll"});
  EXPECT_EQ(r.code, 2);
  r = eval({"--lengths", "600"});
  expect_one_line_error(r, {"600 tokens", "context of 512 tokens"});
  EXPECT_EQ(r.code, 2);
  expect_one_line_error(eval({"--lengths", "300", "--samples", "0"}), {"--samples must be at least 1"});
  expect_one_line_error(eval({"--lengths", "300", "--schedule", "9:0.5"}), {"'9:0.5'", "6-layer model"});
  expect_one_line_error(eval({"--lengths", "300,many"}), {"--lengths", "'many'"});
  expect_one_line_error(eval({"--lengths", "300,200,300"}), {"--lengths lists 300 twice"});
  expect_one_line_error(eval({"--lengths", "300", "--agreement-tokens", "9"}), {"--agreement-tokens"});
  expect_one_line_error(eval({"--lengths", "300", "--prune", "lazy"}), {"lazy"});
  expect_one_line_error(eval({"--lengths", "300", "--corpus", "/no/such/text.txt"}), {"/no/such/text.txt"});
  // The default schedules need at least 4 layers; the 2-layer model says so.
  expect_one_line_error(run_cli(dir_, {"eval", "--model", tiny_, "--lengths", "300", "--out", out}),
                        {"does not fit this 2-layer model"});
  EXPECT_FALSE(std::filesystem::exists(out + "/eval.json"));
}

// The eval path with --prune none is the plain `run`: same prompt tokens, same greedy answer.
TEST_F(CliEval, UnprunedEvalAnswersExactlyLikeRunOnTheRealModel) {
  const std::string model = testing::real_model_path();
  CliResult r =
      run_cli(dir_, {"eval", "--model", model, "--task", "passkey,kv,mdqa", "--lengths", "400", "--samples",
                     "2", "--prune", "none", "--seed", "3", "--threads", "1", "--with-prompts", "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  const Tokenizer tok(vocab_from_gguf(GgufFile::open(model)));
  const eval::Corpus corpus = eval::load_corpus(eval::default_corpus_path());
  int compared = 0;
  for (const auto& res : j["results"]) {
    const eval::TaskInfo& info = eval::task_info(res["task"].get<std::string>());
    const auto samples = eval::make_samples(info.task, corpus, tok, 400, 2, 3);
    for (const auto& s : res["samples"]) {
      const eval::Sample& sample = samples[s["index"].get<size_t>()];
      EXPECT_EQ(s["answer"], sample.answer);
      EXPECT_EQ(s["prompt"], sample.prompt);
      const std::string prompt = write_text(sample.prompt, "prompt.txt");
      const CliResult run = run_cli(dir_, {"run", "--model", model, "--prompt-file", prompt,
                                           "--max-new-tokens", "8", "--threads", "1", "--json"});
      ASSERT_TRUE(run.exited && run.code == 0) << describe(run);
      const auto rj = nlohmann::json::parse(run.out);
      EXPECT_EQ(rj["prompt_tokens"].get<int64_t>(), s["tokens"].get<int64_t>());
      EXPECT_EQ(rj["text"], s["none"]["generated"]);
      EXPECT_EQ(eval::answer_correct(info.task, rj["text"].get<std::string>(), sample.answer),
                s["none"]["correct"].get<bool>());
      ++compared;
    }
  }
  EXPECT_EQ(compared, 6);
}

}  // namespace
}  // namespace lp
