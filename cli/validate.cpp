// `lazyprefill validate`: run the engine here over a grid of prompt lengths x schedules,
// calibrate the local profile on half of the cases, predict the other half with the simulator,
// and report the held-out TTFT error.
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "calibrate/calibrate.h"
#include "calibrate/local_validation.h"
#include "cli/calibration_output.h"
#include "cli/commands.h"
#include "cli/run_output.h"
#include "engine/generate.h"
#include "kernels/context.h"
#include "model/error.h"
#include "model/io.h"
#include "model/paths.h"
#include "pruning/policy.h"

namespace lp::cli {

namespace {
using json = nlohmann::ordered_json;

json local_validation_json(const calib::LocalValidation& v) {
  json held = json::array();
  for (const calib::HeldOutCase& h : v.held) {
    json ops = json::object();
    for (const calib::OpCheck& o : h.ops)
      ops[std::string(op_name(o.op))] = {
          {"measured_ms", o.measured_ms}, {"predicted_ms", o.predicted_ms}, {"error_pct", o.error_pct}};
    held.push_back({{"case", h.c.label()},
                    {"prompt_tokens", h.c.tokens},
                    {"policy", h.c.policy},
                    {"schedule", h.c.schedule},
                    {"measured_ttft_ms", h.measured_ms},
                    {"predicted_ttft_ms", h.predicted_ms},
                    {"error_pct", h.error_pct},
                    {"base_predicted_ttft_ms", h.base_predicted_ms},
                    {"ops", ops}});
  }
  json speedups = json::array();
  for (const calib::SpeedupCheck& x : v.speedups)
    speedups.push_back({{"case", x.c.label()},
                        {"held_out", x.held_out},
                        {"measured_speedup", x.measured},
                        {"measured_speedup_min", x.measured_min},
                        {"measured_speedup_max", x.measured_max},
                        {"measured_speedup_fastest_runs", x.fastest_runs},
                        {"predicted_speedup", x.predicted},
                        {"predicted_within_measured_range", x.within_range},
                        {"error_points", x.error_points}});
  return {{"cases", held},
          {"ttft_mape", v.mape_pct},
          {"base_ttft_mape", v.base_mape_pct},
          {"speedups", speedups},
          {"speedup_error_max_points", v.worst_points},
          {"speedup_error_max_points_held_out", v.worst_points_held_out},
          {"speedups_predicted_within_measured_range", v.within_range},
          {"calibration", calib::calibration_json(v.fitted, v.report, v.train)}};
}

void print_local_validation(const calib::LocalValidation& v, const std::string& base) {
  fmt::print("calibration on {} cases (profile {}):\n", v.train.size(), base);
  print_calibration(v.fitted, v.report, v.train);
  fmt::print("\nheld-out cases:\n{:<44} {:>12} {:>12} {:>8} {:>14}   worst op\n", "case", "measured ms",
             "predicted ms", "error", "base profile");
  for (const calib::HeldOutCase& h : v.held) {
    const calib::OpCheck* w = h.worst_op();
    fmt::print("{:<44} {:>12.1f} {:>12.1f} {:>+7.1f}% {:>12.1f}ms   {}\n", h.c.label(), h.measured_ms,
               h.predicted_ms, h.error_pct, h.base_predicted_ms,
               w ? fmt::format("{} {:+.0f}%", op_name(w->op), w->error_pct) : "");
  }
  fmt::print("\nheld-out TTFT MAPE {:.1f}% (the base profile before this fit: {:.1f}%)\n", v.mape_pct,
             v.base_mape_pct);
  fmt::print(
      "\nspeedup over the unpruned run at the same length (median of the rounds' paired ratios, "
      "their range):\n{:<44} {:>9} {:>17} {:>10} {:>8}\n",
      "case", "measured", "range", "predicted", "error");
  for (const calib::SpeedupCheck& x : v.speedups)
    fmt::print("{:<44} {:>8.3f}x {:>7.3f}-{:.3f}x {:>9.3f}x {:>+6.1f} pt{}\n", x.c.label(), x.measured,
               x.measured_min, x.measured_max, x.predicted, x.error_points,
               x.held_out ? "" : "   (both runs calibrated on)");
  fmt::print(
      "largest speedup error: {:.1f} points over cases with a held-out run, {:.1f} over all; {} of {} "
      "predictions inside the measured range\n",
      v.worst_points_held_out, v.worst_points, v.within_range, v.speedups.size());
}
}  // namespace

int cmd_validate(const ValidateArgs& a) {
  if (!a.lengths.empty() && (!a.serving.empty() || !a.runahead.empty()))
    usage_fail("--lengths sets the local grid's prompts; --serving and --runahead replay measured runs");
  if (!a.serving.empty()) return cmd_validate_serving(a);
  if (!a.runahead.empty()) return cmd_validate_runahead(a);
  if (!a.profile_out.empty()) usage_fail("--profile-out needs --serving or --runahead");
  if (!a.revival_model.empty()) usage_fail("--revival-model needs --serving");
  if (a.revival_share_from_log) usage_fail("--revival-share-from-log needs --serving");
  const std::vector<int64_t> lengths =
      a.lengths.empty() ? calib::local_lengths(a.quick) : parse_distinct_lengths(a.lengths, "--lengths");
  if (lengths.size() < 2) usage_fail("--lengths '{}': give at least two different lengths", a.lengths);
  if (!a.out_dir.empty() && !std::filesystem::is_directory(a.out_dir))
    usage_fail("--out-dir '{}' is not a folder", a.out_dir);
  const hw::Profile base = hw::load_profile(a.base);
  CpuContext ctx(a.threads > 0 ? a.threads : default_thread_count());
  const bool int8 = a.dtype == "int8";
  const auto model =
      Model::load(a.model.empty() ? default_model_path() : a.model, int8 ? DType::Int8 : DType::F32, ctx);
  const std::vector<int32_t> text = model->tokenizer().encode(builtin_english_text(), true, false);
  for (const int64_t n : lengths)
    if (n > model->config().n_ctx_train)
      usage_fail("--lengths: {} tokens exceed the model's context of {}", n, model->config().n_ctx_train);
  const std::vector<calib::LocalCase> cases = calib::local_cases(lengths);
  std::vector<std::vector<int32_t>> prompts(cases.size());
  std::vector<GenerateOptions> opts(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    prompts[i].resize(static_cast<size_t>(cases[i].tokens));
    for (size_t k = 0; k < prompts[i].size(); ++k) prompts[i][k] = text[k % text.size()];
    opts[i].max_new_tokens = 0;
    opts[i].policy = parse_policy(cases[i].policy);
    opts[i].schedule = parse_schedule(cases[i].schedule);
  }
  const Rounds rounds = generate_rounds(
      ctx, *model, prompts, opts, a.rounds, [&](int round, size_t i, const GenerateResult& fastest) {
        if (round == a.rounds - 1)
          fmt::print(stderr, "validate: case {:>2}/{} {:<44} {:>9.1f} ms ({})\n", i + 1, cases.size(),
                     cases[i].label(), fastest.prefill_s * 1e3, cases[i].train ? "calibration" : "held out");
        else
          fmt::print(stderr, "validate: round {}/{}, case {:>2}/{}\r", round + 1, a.rounds, i + 1,
                     cases.size());
      });
  // Each case's fastest run as `run --json` writes it (the measurement format calibrate reads).
  std::vector<calib::MeasuredCase> measured;
  for (size_t i = 0; i < cases.size(); ++i) {
    const json run = run_json(*model, opts[i], rounds.fastest[i], a.dtype, ctx.threads());
    if (!a.out_dir.empty())
      write_file_atomic((std::filesystem::path(a.out_dir) / (cases[i].label() + ".json")).string(),
                        run.dump(2) + "\n", "run output");
    measured.push_back({cases[i], calib::measurement_from_run_json(run, cases[i].label()),
                        run_trace(model->config(), opts[i], rounds.fastest[i], a.dtype, 0, false),
                        rounds.prefill_s[i]});
  }
  // What the engine ran: f32 throughout, or (int8) 8-bit GEMMs over the file's blocks at their bits
  // per weight as the engine counts them, and the f16 K/V cache the CPU backend keeps then
  // (kernels/cpu/kv_cache.h: kv_type_for).
  const sim::Precision precision =
      int8 ? sim::Precision{fmt::format("{}bpw", 8 * model->weights().gemm_bytes_per_weight()), "int8", "f16"}
           : sim::Precision{"f32", "f32", "f32"};
  const calib::LocalValidation v = calib::validate_local(base, model->config(), precision, measured);
  if (!a.json_out) {
    print_local_validation(v, base.name);
    return 0;
  }
  json j = {{"model", model->path()},    {"dtype", a.dtype}, {"threads", ctx.threads()},
            {"base_profile", base.name}, {"quick", a.quick}, {"lengths", lengths},
            {"rounds", a.rounds}};
  j.update(local_validation_json(v));
  std::puts(j.dump(2).c_str());
  return 0;
}

}  // namespace lp::cli
