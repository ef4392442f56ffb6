// The lazyprefill command as a whole, through the real binary: what every subcommand does with
// bad input and with its outputs (bounded regular-file inputs, atomic outputs that never replace
// what is not a regular file, temporary files removed on signals, escaped text in error lines),
// usage errors, and exit codes.
#include <sstream>

#include "tests/cli/cli_harness.h"

namespace lp {
namespace {

using namespace cli_test;

// Every input is read by read_input_file: regular files only, refused from fstat before any read
// (a FIFO cannot hang the open), and capped in size from the file's length: before, /dev/zero as a prompt
// grew by 0.8 GB/s until killed and a FIFO blocked open().
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

// A temporary output being written is removed when the process is interrupted (a
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

// Outputs never replace what is not a regular file (the rename once turned a
// symlink, and as root /dev/null, into a regular file), and a failed write to standard output
// is an error (simulate --json > /dev/full once exited 0).
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

// --schedule "" meant the default in run and simulate and no pruning in report: it is a usage error in every
// command.
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

// Text from files and arguments is escaped in error lines (raw newlines once
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

// --model '' once silently meant the default model, --seed -1 was recorded as
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

TEST_F(CliErrors, NoSubcommand) {
  expect_one_line_error(run_cli(dir_, {}), {"subcommand"});
}

TEST_F(CliErrors, UnknownOption) {
  expect_one_line_error(run_cli(dir_, {"run", "--model", tiny_, "--prompt", "the cat", "--bogus"}),
                        {"--bogus"});
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

// The examples the help shows for the simulator run as a stranger would paste them: every one of
// simulate, simulate-serving and compare whose inputs are built in (presets, profiles; an
// example's continuation lines joined). Until issue 51 three of them failed: the first
// simulate-serving example asked for more K/V than the default 1 GiB budget, the first simulate
// example asked a 4k-context model for 8k tokens, and compare's --kv-predict named a model that is
// not a preset. About 2 s: the capacity example searches rates (0.8 s).
TEST_F(CliErrors, TheHelpsSimulatorExamplesRun) {
  std::vector<std::string> examples;
  for (const char* sub : {"", "compare"}) {
    const CliResult help =
        run_cli(dir_, *sub ? std::vector<std::string>{sub, "--help"} : std::vector<std::string>{"--help"});
    ASSERT_EQ(help.code, 0);
    std::istringstream lines(help.out);
    std::string joined;
    for (std::string line; std::getline(lines, line);) {
      const bool more = !line.empty() && line.back() == '\\';
      joined += more ? line.substr(0, line.size() - 1) : line;
      if (more) continue;
      examples.push_back(joined);
      joined.clear();
    }
  }
  int ran = 0;
  for (const std::string& example : examples) {
    std::istringstream words(example);
    std::vector<std::string> args;
    for (std::string w; words >> w;) args.push_back(w);
    if (args.size() < 2 || args[0] != "lazyprefill") continue;
    if (args[1] != "simulate" && args[1] != "simulate-serving" && args[1] != "compare") continue;
    if (example.find(".json") != std::string::npos || example.find(".gguf") != std::string::npos) continue;
    args.erase(args.begin());
    for (std::string& a : args)
      if (a.ends_with(".svg")) a = dir_.file(a);  // compare's chart, written here
    const CliResult r = run_cli(dir_, args);
    EXPECT_EQ(r.code, 0) << example << "\n" << r.err;
    ++ran;
  }
  EXPECT_GE(ran, 6);  // two of each
}

}  // namespace
}  // namespace lp
