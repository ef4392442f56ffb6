// `lazyprefill validate --runahead DIR`: renders calibrate/runahead_validation's steps (the
// KV-Runahead timeline against measured `mpirun -n P run --runahead --json` outputs).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "calibrate/runahead_validation.h"
#include "cli/calibration_output.h"
#include "cli/commands.h"
#include "model/json_checks.h"

namespace lp::cli {
namespace {
using json = nlohmann::ordered_json;

std::string ms(double s) {
  return fmt::format("{:.0f}", s * 1e3);
}

json runahead_validation_json(const calib::RunaheadValidation& v, const calib::RunaheadFixtures& f,
                              const ValidateArgs& a) {
  json single = json::array();
  for (const calib::SingleProcessCheck& s : v.single)
    single.push_back({{"prompt_tokens", s.prompt_tokens},
                      {"threads", s.threads},
                      {"runs", s.runs},
                      {"measured_prefill_ms", s.measured_s * 1e3},
                      {"predicted_prefill_ms", s.predicted_s * 1e3},
                      {"error", s.error}});
  json runs = json::array();
  for (const calib::RunaheadCheck& r : v.runahead) {
    json ranks = json::array();
    for (size_t rank = 0; rank < r.ranks.size(); ++rank) {
      const calib::RankCheck& k = r.ranks[rank];
      ranks.push_back(
          {{"rank", rank},
           {"tokens", k.tokens},
           {"measured_wait_ms", k.measured_wait_s ? json(*k.measured_wait_s * 1e3) : json(nullptr)},
           {"predicted_wait_ms", k.predicted_wait_s * 1e3},
           {"predicted_done_ms", k.predicted_done_s * 1e3}});
    }
    runs.push_back({{"prompt_tokens", r.prompt_tokens},
                    {"partition", r.partition},
                    {"rule", r.rule},
                    {"threads_per_rank", r.threads_per_rank},
                    {"runs", r.runs},
                    {"measured_ttft_ms", r.measured_s * 1e3},
                    {"predicted_ttft_ms", r.predicted_s * 1e3},
                    {"error", r.error},
                    {"ranks", ranks},
                    {"calibrated_partition", r.calibrated_partition},
                    {"calibrated_partition_predicted_ttft_ms", r.calibrated_predicted_s * 1e3}});
  }
  json ratios = json::array();
  for (const calib::AutoOverEven& q : v.auto_over_even)
    ratios.push_back({{"prompt_tokens", q.prompt_tokens},
                      {"measured_auto_over_even", q.measured},
                      {"predicted_auto_over_even", q.predicted}});
  json out;
  out["validation"] = "runahead";
  out["fixtures"] = f.dir;
  out["calibration"] = calib::calibration_json(v.fitted, v.report, f.singles);
  out["calibration"]["base"] = a.base;
  out["single_process"] = single;
  out["runahead"] = runs;
  out["auto_over_even"] = ratios;
  out["worst_abs_error"] = v.worst_abs_error;
  out["target"] = v.kTarget;
  out["within_target"] = v.within_target();
  if (!a.profile_out.empty()) out["profile_out"] = a.profile_out;
  return out;
}

void print_runahead_validation(const calib::RunaheadValidation& v, const calib::RunaheadFixtures& f,
                               const ValidateArgs& a) {
  fmt::print(
      "KV-Runahead validation on {}: {} single-process runs calibrate {} (share per run: threads / {} "
      "cores), "
      "{} KV-Runahead runs predicted from their partitions\n\n",
      f.dir, f.singles.size(), a.base, v.fitted.compute_units, f.runs.size());
  fmt::print("{:>7} {:>8} {:>5} {:>13} {:>14} {:>7}\n", "prompt", "threads", "runs", "measured ms",
             "predicted ms", "error");
  for (const calib::SingleProcessCheck& s : v.single)
    fmt::print("{:>7} {:>8} {:>5} {:>13.0f} {:>14.0f} {:>+6.1f}%\n", s.prompt_tokens, s.threads, s.runs,
               s.measured_s * 1e3, s.predicted_s * 1e3, 100 * s.error);
  fmt::print("\n{:>7} {:>13} {:>6} {:>5} {:>13} {:>14} {:>7}   {}\n", "prompt", "partition", "rule", "runs",
             "measured ms", "predicted ms", "error", "last rank waits, measured / predicted ms");
  for (const calib::RunaheadCheck& r : v.runahead) {
    const calib::RankCheck& last = r.ranks.back();
    fmt::print("{:>7} {:>13} {:>6} {:>5} {:>13.0f} {:>14.0f} {:>+6.1f}%   {} / {}\n", r.prompt_tokens,
               fmt::format("{}", fmt::join(r.partition, "+")), r.rule, r.runs, r.measured_s * 1e3,
               r.predicted_s * 1e3, 100 * r.error, last.measured_wait_s ? ms(*last.measured_wait_s) : "-",
               ms(last.predicted_wait_s));
  }
  for (const calib::AutoOverEven& q : v.auto_over_even)
    fmt::print("\n{} tokens: balanced / even TTFT measured {:.2f}, predicted {:.2f}", q.prompt_tokens,
               q.measured, q.predicted);
  if (!v.auto_over_even.empty()) fmt::print("\n");
  fmt::print("\nworst TTFT error {:.1f}% ({} the 10% target)\n", 100 * v.worst_abs_error,
             v.within_target() ? "within" : "outside");
  if (!a.profile_out.empty()) fmt::print("wrote {}\n", a.profile_out);
}

}  // namespace

int cmd_validate_runahead(const ValidateArgs& a) {
  const calib::RunaheadFixtures f = calib::read_runahead_fixtures(a.runahead);
  const calib::RunaheadValidation v = calib::validate_runahead(hw::load_profile(a.base), f);
  if (!a.profile_out.empty())
    calib::write_fitted_profile(
        a.profile_out, v.fitted, v.fitted.name + "-runahead",
        fmt::format("lazyprefill validate --runahead {}: calibrated from --base {} on {} "
                    "single-process runs",
                    a.runahead, a.base, f.singles.size()));
  if (a.json_out)
    fmt::print("{}\n", json_text(runahead_validation_json(v, f, a)));
  else
    print_runahead_validation(v, f, a);
  return 0;
}

}  // namespace lp::cli
