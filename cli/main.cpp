// lazyprefill: command-line entry point. The subcommands live one per file (cli/README.md); here
// the app is assembled and errors become one line: library errors (lp::Error) exit 1, usage errors
// exit 2 (CLI11's parse errors and lp::UsageError alike).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <new>

#include "cli/commands.h"
#include "cli/options.h"
#include "git_commit.h"  // generated: LP_GIT_COMMIT
#include "model/error.h"
#include "model/io.h"

namespace {

// A subcommand: its arguments, registered on the app, and what runs when it is selected.
struct Subcommand {
  CLI::App* sub;
  std::function<int()> run;
};

template <class Args>
Subcommand subcommand(CLI::App& app, CLI::App* (*add)(CLI::App&, Args&), int (*cmd)(const Args&)) {
  auto args = std::make_shared<Args>();
  CLI::App* sub = add(app, *args);
  return {sub, [args, cmd] { return cmd(*args); }};
}

}  // namespace

int main(int argc, char** argv) {
  lp::remove_temp_files_on_signal();  // an interrupted command leaves no half-written temporary file
  CLI::App app{"lazyprefill: LazyLLM dynamic token pruning, run for real and simulated"};
  app.set_version_flag("--version", std::string(LP_VERSION) + " (" + LP_GIT_COMMIT + ")");
  app.require_subcommand(1);
  lp::cli::add_help_models(app);
  // One line, like every other error (CLI11's default adds "Run with --help ..." on a second).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("lazyprefill: error: {} (see --help)\n", lp::escape_text(e.what()));
  });

  // In the order --help lists them.
  using namespace lp::cli;
  const Subcommand commands[] = {
      subcommand(app, add_run, cmd_run),
      subcommand(app, add_inspect, cmd_inspect),
      subcommand(app, add_simulate, cmd_simulate),
      subcommand(app, add_simulate_serving, cmd_simulate_serving),
      subcommand(app, add_plan, cmd_plan),
      subcommand(app, add_calibrate, cmd_calibrate),
      subcommand(app, add_calibrate_revivals, cmd_calibrate_revivals),
      subcommand(app, add_calibrate_serving, cmd_calibrate_serving),
      subcommand(app, add_validate, cmd_validate),
      subcommand(app, add_report, cmd_report),
      subcommand(app, add_compare, cmd_compare),
      subcommand(app, add_sweep, cmd_sweep),
      subcommand(app, add_eval, cmd_eval),
      subcommand(app, add_serve, cmd_serve),
  };

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every other command-line problem is a usage error (2).
    return app.exit(e) == 0 ? 0 : 2;
  }
  const auto dispatch = [&]() -> int {
    try {
      for (const Subcommand& c : commands)
        if (*c.sub) return c.run();
    } catch (const lp::InternalError& e) {
      fmt::print(stderr,
                 "lazyprefill: {} (a bug in lazyprefill: please report it with the command that met it)\n",
                 lp::escape_text(e.what()));
      return 70;  // EX_SOFTWARE
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
