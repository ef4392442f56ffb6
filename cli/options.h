// The command line's grammar: every subcommand's options (add_X, registering them on the app into
// its XArgs, commands.h) and the validators and options several share. Only the units that register
// options include CLI11 (main.cpp, options*.cpp): CLI11 2.1 is header-only, and its header alone
// put about 100 KB of code into every unit that included it (5 s of GCC and 6.6 s of clang under
// ASan a unit, docs/testing.md), so the subcommands' own units (cmd_X) see only the typed XArgs.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include "cli/commands.h"
#include "pruning/policy.h"

namespace lp::cli {

// An option that must not be given as "": a path ("" silently meant the default model) or a
// schedule ("" meant the default in run and simulate but no pruning in report; "none" says no
// pruning). `message` is the error.
inline CLI::Validator non_empty(std::string message, std::string name) {
  return CLI::Validator([message](const std::string& s) { return s.empty() ? message : std::string(); },
                        std::move(name));
}
inline CLI::Validator non_empty_path() {
  return non_empty("an empty path", "PATH");
}
inline CLI::Validator non_empty_schedule() {
  return non_empty("an empty schedule; give one, or none for no pruning", "SCHEDULE");
}

// A finite number: CLI::Range lets NaN through (every comparison with it is false).
inline CLI::Validator finite_number() {
  return CLI::Validator(
      [](const std::string& s) {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        return std::isfinite(v) && end && *end == '\0' ? std::string() : "not a finite number: " + s;
      },
      "NUMBER");
}

// An unsigned integer written as digits: CLI11 reads "-1" into an unsigned option as 2^64 - 1.
inline CLI::Validator digits_only() {
  return CLI::Validator(
      [](const std::string& s) {
        const bool ok = !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
        return ok ? std::string() : "not a non-negative whole number: " + s;
      },
      "UINT");
}

// A pruning policy's name (pruning/policy.h), or with `list` a comma-separated list of them; the
// old names "static" and "random" get a line naming what they became.
inline CLI::Validator policy_names(bool list = false) {
  return CLI::Validator(
      [list](const std::string& s) {
        if (!list) return check_policy_arg(s);
        for (const std::string& item : split_list(s))
          if (std::string why = check_policy_arg(item); !why.empty()) return why;
        return std::string();
      },
      list ? "POLICY,..." : "POLICY");
}

// Options several subcommands share, declared once (cli/options.cpp).
// --model FILE: the GGUF the engine runs (absent: the default model in the cache).
CLI::Option* add_gguf_model(CLI::App& sub, std::string& gguf);
// --model FILE or --model-config PRESET, not both: the model a subcommand costs; `what` ends the
// help ("cost", "report on").
void add_model_choice(CLI::App& sub, std::string& gguf, std::string& preset, const char* what);
// --ep and --moe-imbalance (sim::expert_parallel) on a subcommand that has --tp.
void add_expert_parallel(CLI::App& sub, int& ep, double& imbalance, int& dp);
// --help-models on `app`: the presets listed (preset_summaries), exit 0.
void add_help_models(CLI::App& app);
// --hw (required) and --engine: the hardware profiles a subcommand costs on.
void add_hardware(CLI::App& sub, std::string& hw, std::string& engine);
// --weights, --compute, --kv: the precision a prediction assumes; `of` qualifies the help
// (" of the comparison", or ""); the defaults shown are p's.
void add_precision(CLI::App& sub, sim::Precision& p, const char* of = "");

// The --engine option's help, listing the presets.
inline constexpr const char* kEngineHelp =
    "Serving engine whose elementwise costing to use: lazyprefill, llamacpp (f32, nothing fused), vllm "
    "(compute dtype, add+RMSNorm fused), trtllm (also RoPE and SwiGLU fused); default: the profile's (vllm "
    "on "
    "GPUs, lazyprefill on CPUs)";

// Each subcommand's options, in main's order of --help, grouped by the unit that registers them:
// options_run.cpp (run, inspect, eval, serve, sweep), options_simulate.cpp (simulate,
// simulate-serving, plan, compare, report), options_calibrate.cpp (calibrate, calibrate-revivals,
// calibrate-serving, validate).
CLI::App* add_run(CLI::App& app, RunArgs& a);
CLI::App* add_inspect(CLI::App& app, InspectArgs& a);
CLI::App* add_simulate(CLI::App& app, SimulateArgs& a);
// simulate-serving's and calibrate-serving's scheduler limits (options.cpp).
void add_scheduler_options(CLI::App& sub, SchedulerArgs& a);
CLI::App* add_simulate_serving(CLI::App& app, SimulateServingArgs& a);
CLI::App* add_calibrate(CLI::App& app, CalibrateArgs& a);
CLI::App* add_plan(CLI::App& app, PlanArgs& a);
CLI::App* add_calibrate_serving(CLI::App& app, CalibrateServingArgs& a);
CLI::App* add_calibrate_revivals(CLI::App& app, CalibrateRevivalsArgs& a);
CLI::App* add_validate(CLI::App& app, ValidateArgs& a);
CLI::App* add_report(CLI::App& app, ReportArgs& a);
CLI::App* add_compare(CLI::App& app, CompareArgs& a);
CLI::App* add_sweep(CLI::App& app, SweepArgs& a);
CLI::App* add_eval(CLI::App& app, EvalArgs& a);
CLI::App* add_serve(CLI::App& app, ServeArgs& a);

}  // namespace lp::cli
