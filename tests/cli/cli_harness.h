// The CLI end-to-end suites' harness: runs the real `lazyprefill` binary (no shell) on inputs
// written by the tests, and the checks every suite shares. A failure must end with a non-zero exit
// code (never a signal) and exactly one line on stderr that names the problem (errors, tier two:
// STYLE.md). Models are built by tests/gguf_writer, small enough that each run takes
// milliseconds. The suites, one per subcommand, are the test_cli*.cpp files beside this one.
#pragma once

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
#include "tests/test_util.h"
#include "traces/trace.h"

extern char** environ;

namespace lp::cli_test {

using testing::Bytes;
using testing::GgufLayout;
using testing::GgufWriter;
using testing::GgufWriterValue;
using testing::TempDir;
using testing::TinyModelSpec;

// LP_TEST_CLI overrides the binary under test (e.g. to try a patched build).
inline std::string cli_path() {
  const char* p = std::getenv("LP_TEST_CLI");
  return p && *p ? p : LP_CLI_PATH;
}

struct CliResult {
  bool exited = false;   // false: killed by a signal
  int code = -1;         // exit status, or the signal number
  long max_rss_kib = 0;  // the child's peak resident memory
  std::string out, err;
};

// Runs `argv_s` (its first element the program, found on PATH; no shell: empty arguments pass
// through as they are), stdin from /dev/null, stdout and stderr into files under `dir`.
inline CliResult run_program(const TempDir& dir, std::vector<std::string> argv_s) {
  const std::string out_path = dir.file("stdout.txt"), err_path = dir.file("stderr.txt");
  const std::string exe = argv_s.at(0);
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
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

inline std::vector<std::string> cli_argv(const std::vector<std::string>& args) {
  std::vector<std::string> argv_s = {cli_path()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  // One thread keeps the shared test machine calm, unless the test sets --threads itself.
  if (!args.empty() && args[0] == "run" && std::find(args.begin(), args.end(), "--threads") == args.end()) {
    argv_s.push_back("--threads");
    argv_s.push_back("1");
  }
  return argv_s;
}

// Runs the CLI with `args`.
inline CliResult run_cli(const TempDir& dir, const std::vector<std::string>& args) {
  return run_program(dir, cli_argv(args));
}

// The CLI under Open MPI's mpirun with `ranks` processes (allowed to run as root, as CI does, and
// more ranks than cores).
// Under the ASan suite, leak checking is off in the ranks: Open MPI keeps what MPI_Init allocates
// past MPI_Finalize, from components it has dlclose()d by then, so LeakSanitizer's stacks end in
// "<unknown module>" that no suppression can name. Memory errors are still caught.
inline void mpi_env() {
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  const char* asan = std::getenv("ASAN_OPTIONS");
  const std::string opts = std::string(asan ? asan : "") + (asan && *asan ? ":" : "") + "detect_leaks=0";
  setenv("ASAN_OPTIONS", opts.c_str(), 1);
}
inline CliResult run_mpi(const TempDir& dir, int ranks, const std::vector<std::string>& args) {
  mpi_env();
  std::vector<std::string> argv_s = {"mpirun", "-n", std::to_string(ranks), "--oversubscribe"};
  const std::vector<std::string> cli = cli_argv(args);
  argv_s.insert(argv_s.end(), cli.begin(), cli.end());
  return run_program(dir, argv_s);
}

// A plan small enough for a test (Llama-3.1-8B on 2 H100s, 2,048 + 64 tokens, 32 requests a
// simulation, one token budget and request limit): a few layouts in well under a second.
inline std::vector<std::string> small_plan_args() {
  return {"plan",
          "--model-config",
          "llama-3.1-8b",
          "--hw",
          "h100-sxm",
          "--gpus",
          "2",
          "--prompt-tokens",
          "2048",
          "--output-tokens",
          "64",
          "--requests",
          "32",
          "--batch-tokens",
          "8192",
          "--max-seqs",
          "256"};
}

inline std::string describe(const CliResult& r) {
  return fmt::format("exited {} code {}\n--- stderr ---\n{}--- stdout (first 500) ---\n{}", r.exited, r.code,
                     r.err, r.out.substr(0, 500));
}

// A clean failure: exit code 1-127 (128+N is how shells report a signal; 134 abort, 139
// segfault), one line on stderr containing every one of `needles`.
// LP_TEST_SHOW_ERRORS=1 prints every message, for reviewing their wording.
inline void expect_one_line_error(const CliResult& r, std::initializer_list<std::string> needles) {
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

inline std::string slurp_text(const std::string& path) {
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

}  // namespace lp::cli_test
