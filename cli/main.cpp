// lazyprefill: command-line entry point. The subcommands live one per file (cli/README.md); here
// the app is assembled and errors become one line: library errors (lp::Error) exit 1, usage errors
// exit 2 (CLI11's parse errors and lp::UsageError alike).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "cli/commands.h"
#include "git_commit.h"  // generated: LP_GIT_COMMIT
#include "model/error.h"
#include "model/io.h"

int main(int argc, char** argv) {
  lp::remove_temp_files_on_signal();  // an interrupted command leaves no half-written temporary file
  CLI::App app{"lazyprefill: LazyLLM dynamic token pruning, run for real and simulated"};
  app.set_version_flag("--version", std::string(LP_VERSION) + " (" + LP_GIT_COMMIT + ")");
  app.require_subcommand(1);
  // One line, like every other error (CLI11's default adds "Run with --help ..." on a second).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("lazyprefill: error: {} (see --help)\n", lp::escape_text(e.what()));
  });

  lp::cli::RunArgs ra;
  auto* run = lp::cli::add_run(app, ra);

  lp::cli::InspectArgs ia;
  auto* inspect = lp::cli::add_inspect(app, ia);

  lp::cli::SimulateArgs sa;
  auto* simulate = lp::cli::add_simulate(app, sa);
  lp::cli::CalibrateArgs ca;
  auto* calibrate = lp::cli::add_calibrate(app, ca);
  lp::cli::CalibrateRevivalsArgs cra;
  auto* calibrate_revivals = lp::cli::add_calibrate_revivals(app, cra);
  lp::cli::ValidateArgs va;
  auto* validate = lp::cli::add_validate(app, va);
  lp::cli::ReportArgs rpa;
  auto* report = lp::cli::add_report(app, rpa);
  lp::cli::SweepArgs swa;
  auto* sweep = lp::cli::add_sweep(app, swa);
  lp::cli::EvalArgs eva;
  auto* evalc = lp::cli::add_eval(app, eva);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every other command-line problem is a usage error (2).
    return app.exit(e) == 0 ? 0 : 2;
  }
  const auto dispatch = [&]() -> int {
    try {
      if (*run) return lp::cli::cmd_run(ra, *run);
      if (*simulate) return lp::cli::cmd_simulate(sa, *simulate);
      if (*calibrate) return lp::cli::cmd_calibrate(ca);
      if (*calibrate_revivals) return lp::cli::cmd_calibrate_revivals(cra);
      if (*validate) return lp::cli::cmd_validate(va);
      if (*report) return lp::cli::cmd_report(rpa);
      if (*sweep) return lp::cli::cmd_sweep(swa);
      if (*evalc) return lp::cli::cmd_eval(eva);
      if (*inspect) return lp::cli::cmd_inspect(ia);
    } catch (const lp::UsageError& e) {
      fmt::print(stderr, "lazyprefill: error: {} (see --help)\n", lp::escape_text(e.what()));
      return 2;
    } catch (const lp::Error& e) {
      fmt::print(stderr, "lazyprefill: error: {}\n", lp::escape_text(e.what()));
      return 1;
    } catch (const std::bad_alloc&) {
      fmt::print(stderr, "lazyprefill: error: out of memory\n");
      return 1;
    } catch (const std::exception& e) {
      fmt::print(stderr, "lazyprefill: error: {}\n", lp::escape_text(e.what()));
      return 1;
    }
    return 0;
  };
  int rc = dispatch();
  // Standard output is an output like any other: a full disk or a closed pipe must not end in
  // exit 0 with nothing written (simulate --json > /dev/full did).
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    fmt::print(stderr, "lazyprefill: error: cannot write standard output: {}\n",
               errno != 0 ? std::strerror(errno) : "a write failed");
    rc = rc == 0 ? 1 : rc;
  }
  return rc;
}
