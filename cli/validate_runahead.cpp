// `lazyprefill validate --runahead DIR`: the KV-Runahead timeline (sim/runahead.h) against measured
// `mpirun -n P run --runahead --json` outputs (tests/fixtures/runahead/, bench/runahead_ttft.sh
// KEEP=DIR). The hardware profile is calibrated on the folder's single-process `run --json` outputs
// (per-op timings, any thread count: each run priced on the share of the part its threads had),
// then every KV-Runahead run is predicted from its own partition, ranks and threads per rank, and
// the medians per (prompt, partition) are compared. Issue 23's target: TTFT within 10%.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "calibrate/calibrate.h"
#include "cli/calibration_output.h"
#include "cli/commands.h"
#include "model/config.h"
#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "sim/runahead.h"

namespace lp::cli {
namespace {
using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

// One measured `run --runahead --json` output.
struct RunaheadRun {
  std::string origin;
  ModelConfig config;
  sim::Precision precision;
  std::vector<int64_t> partition;
  std::string rule;  // --partition as given: auto, even or sizes
  int threads = 1;   // per rank
  double ttft_s = 0;
  std::vector<double> wait_s;  // per rank, where the output has them
};

RunaheadRun read_runahead_run(const nlohmann::json& j, const std::string& origin) {
  RunaheadRun r;
  r.origin = origin;
  try {
    r.config = config_from_json(j.at("model_config"), origin + ": model_config");
    const std::string dtype = j.at("dtype").get<std::string>(), kv = j.at("kv_dtype").get<std::string>();
    if (dtype != "f32" && dtype != "bf16" && dtype != "int8")
      fail("{}: 'dtype' must be f32, bf16 or int8, got '{}'", origin, dtype);
    if (kv != "f32" && kv != "f16") fail("{}: 'kv_dtype' must be f32 or f16, got '{}'", origin, kv);
    r.precision = {dtype, dtype, kv};
    r.partition = j.at("partition").get<std::vector<int64_t>>();
    r.rule = j.at("partition_rule").get<std::string>();
    r.threads = j.at("threads_per_rank").get<int>();
    r.ttft_s = j.at("ttft_ms").get<double>() * 1e-3;
    const int64_t n = j.at("prompt_tokens").get<int64_t>();
    if (r.partition.size() < 2 || int64_t(r.partition.size()) != j.at("ranks").get<int64_t>())
      fail("{}: 'partition' must have one chunk per rank, at least 2", origin);
    int64_t sum = 0;
    for (int64_t c : r.partition) {
      if (c < 1) fail("{}: a chunk of {} tokens in 'partition'", origin, c);
      sum += c;
    }
    if (sum != n) fail("{}: the partition sums to {} tokens, not the prompt's {}", origin, sum, n);
    if (j.contains("ranks_detail"))
      for (const auto& d : j.at("ranks_detail")) r.wait_s.push_back(d.at("wait_ms").get<double>() * 1e-3);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not a `run --runahead --json` output ({})", origin, e.what());
  }
  if (r.threads < 1) fail("{}: 'threads_per_rank' must be at least 1", origin);
  if (!(r.ttft_s > 0) || !std::isfinite(r.ttft_s)) fail("{}: 'ttft_ms' must be a positive number", origin);
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string ms(double s) {
  return fmt::format("{:.0f}", s * 1e3);
}

}  // namespace

int cmd_validate_runahead(const ValidateArgs& a) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(a.runahead))
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::vector<calib::RunMeasurement> singles;
  std::vector<RunaheadRun> runs;
  for (const fs::path& f : files) {
    const std::string origin = f.string();
    const nlohmann::json j =
        json_parse(read_input_file(origin, "run --json file", input_cap::kResults), origin, true);
    if (j.is_discarded() || !j.is_object()) fail("{}: not a JSON object", origin);
    if (j.value("tool", "") == "lazyprefill run --runahead")
      runs.push_back(read_runahead_run(j, origin));
    else
      singles.push_back(calib::measurement_from_run_json(j, f.filename().string()));
  }
  if (singles.empty())
    fail(
        "{}: no single-process `run --json` outputs to calibrate on (bench/runahead_ttft.sh KEEP=DIR keeps "
        "them)",
        a.runahead);
  if (runs.empty()) fail("{}: no `run --runahead --json` outputs to validate", a.runahead);

  const hw::Profile base = hw::load_profile(a.base);
  calib::CalibrationReport rep;
  const hw::Profile hw = calib::calibrate(base, singles, &rep);
  if (!a.profile_out.empty())
    write_fitted_profile(a.profile_out, hw, hw.name + "-runahead",
                         fmt::format("lazyprefill validate --runahead {}: calibrated from --base {} on {} "
                                     "single-process runs",
                                     a.runahead, a.base, singles.size()));

  // The single processes: medians per (prompt, threads).
  std::map<std::pair<int64_t, int>, std::pair<std::vector<double>, std::vector<double>>> single_groups;
  for (size_t i = 0; i < singles.size(); ++i) {
    auto& g = single_groups[{singles[i].prompt_tokens, singles[i].threads}];
    g.first.push_back(rep.runs[i].first);
    g.second.push_back(rep.runs[i].second);
  }
  json single = json::array();
  for (const auto& [k, v] : single_groups) {
    const double m = median(v.first), p = median(v.second);
    single.push_back({{"prompt_tokens", k.first},
                      {"threads", k.second},
                      {"runs", v.first.size()},
                      {"measured_prefill_ms", m * 1e3},
                      {"predicted_prefill_ms", p * 1e3},
                      {"error", p / m - 1}});
  }

  // The KV-Runahead runs: medians per (prompt, partition, threads per rank).
  struct Group {
    const RunaheadRun* first = nullptr;
    std::vector<double> ttft;
    std::vector<std::vector<double>> waits;
  };
  std::map<std::tuple<int64_t, std::vector<int64_t>, int>, Group> groups;
  for (const RunaheadRun& r : runs) {
    int64_t n = 0;
    for (int64_t c : r.partition) n += c;
    Group& g = groups[{n, r.partition, r.threads}];
    if (!g.first) g.first = &r;
    g.ttft.push_back(r.ttft_s);
    g.waits.push_back(r.wait_s);
  }
  json out_runs = json::array();
  double worst = 0;
  std::map<int64_t, std::map<std::string, std::pair<double, double>>>
      by_rule;  // prompt -> rule -> (meas, pred)
  for (const auto& [k, g] : groups) {
    const RunaheadRun& r = *g.first;
    const auto& [n, chunks, threads] = k;
    const double share = hw::thread_share(hw, threads);
    const sim::RunaheadLink link = sim::default_link(hw);
    const sim::RunaheadPrediction p = sim::predict_runahead(r.config, hw, r.precision, chunks, link, share);
    const double m = median(g.ttft), err = p.ttft_s / m - 1;
    worst = std::max(worst, std::fabs(err));
    json waits = json::array();
    for (size_t rank = 0; rank < chunks.size(); ++rank) {
      std::vector<double> w;
      for (const auto& v : g.waits)
        if (rank < v.size()) w.push_back(v[rank]);
      waits.push_back({{"rank", rank},
                       {"tokens", chunks[rank]},
                       {"measured_wait_ms", w.empty() ? json(nullptr) : json(median(w) * 1e3)},
                       {"predicted_wait_ms", p.ranks[rank].wait_s * 1e3},
                       {"predicted_done_ms", p.ranks[rank].done_s * 1e3}});
    }
    // What the calibrated profile would have balanced instead (run --runahead --runahead-hw FILE).
    const std::vector<int64_t> balanced =
        sim::optimise_partition(r.config, hw, r.precision, n, int(chunks.size()), link, share);
    const double balanced_s = sim::predict_runahead(r.config, hw, r.precision, balanced, link, share).ttft_s;
    by_rule[n][r.rule] = {m, p.ttft_s};
    out_runs.push_back({{"prompt_tokens", n},
                        {"partition", chunks},
                        {"rule", r.rule},
                        {"threads_per_rank", threads},
                        {"runs", g.ttft.size()},
                        {"measured_ttft_ms", m * 1e3},
                        {"predicted_ttft_ms", p.ttft_s * 1e3},
                        {"error", err},
                        {"ranks", waits},
                        {"calibrated_partition", balanced},
                        {"calibrated_partition_predicted_ttft_ms", balanced_s * 1e3}});
  }
  json ratios = json::array();
  for (const auto& [n, rules] : by_rule)
    if (rules.count("auto") && rules.count("even")) {
      const auto& b = rules.at("auto");
      const auto& e = rules.at("even");
      ratios.push_back({{"prompt_tokens", n},
                        {"measured_auto_over_even", b.first / e.first},
                        {"predicted_auto_over_even", b.second / e.second}});
    }

  json out;
  out["validation"] = "runahead";
  out["fixtures"] = a.runahead;
  out["calibration"] = calibration_json(hw, rep, singles);
  out["calibration"]["base"] = a.base;
  out["single_process"] = single;
  out["runahead"] = out_runs;
  out["auto_over_even"] = ratios;
  out["worst_abs_error"] = worst;
  out["target"] = 0.10;
  out["within_target"] = worst <= 0.10;
  if (!a.profile_out.empty()) out["profile_out"] = a.profile_out;
  if (a.json_out) {
    fmt::print("{}\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  }
  fmt::print(
      "KV-Runahead validation on {}: {} single-process runs calibrate {} (share per run: threads / {} "
      "cores), "
      "{} KV-Runahead runs predicted from their partitions\n\n",
      a.runahead, singles.size(), a.base, hw.compute_units, runs.size());
  fmt::print("{:>7} {:>8} {:>5} {:>13} {:>14} {:>7}\n", "prompt", "threads", "runs", "measured ms",
             "predicted ms", "error");
  for (const auto& s : single)
    fmt::print("{:>7} {:>8} {:>5} {:>13.0f} {:>14.0f} {:>+6.1f}%\n", s["prompt_tokens"].get<int64_t>(),
               s["threads"].get<int>(), s["runs"].get<size_t>(), s["measured_prefill_ms"].get<double>(),
               s["predicted_prefill_ms"].get<double>(), 100 * s["error"].get<double>());
  fmt::print("\n{:>7} {:>13} {:>6} {:>5} {:>13} {:>14} {:>7}   {}\n", "prompt", "partition", "rule", "runs",
             "measured ms", "predicted ms", "error", "last rank waits, measured / predicted ms");
  for (const auto& r : out_runs) {
    const json& last = r["ranks"].back();
    fmt::print("{:>7} {:>13} {:>6} {:>5} {:>13.0f} {:>14.0f} {:>+6.1f}%   {} / {}\n",
               r["prompt_tokens"].get<int64_t>(),
               fmt::format("{}", fmt::join(r["partition"].get<std::vector<int64_t>>(), "+")),
               r["rule"].get<std::string>(), r["runs"].get<size_t>(), r["measured_ttft_ms"].get<double>(),
               r["predicted_ttft_ms"].get<double>(), 100 * r["error"].get<double>(),
               last["measured_wait_ms"].is_null() ? std::string("-")
                                                  : ms(last["measured_wait_ms"].get<double>() * 1e-3),
               ms(last["predicted_wait_ms"].get<double>() * 1e-3));
  }
  for (const auto& q : ratios)
    fmt::print("\n{} tokens: balanced / even TTFT measured {:.2f}, predicted {:.2f}",
               q["prompt_tokens"].get<int64_t>(), q["measured_auto_over_even"].get<double>(),
               q["predicted_auto_over_even"].get<double>());
  if (!ratios.empty()) fmt::print("\n");
  fmt::print("\nworst TTFT error {:.1f}% ({} the 10% target)\n", 100 * worst,
             worst <= 0.10 ? "within" : "outside");
  if (!a.profile_out.empty()) fmt::print("wrote {}\n", a.profile_out);
  return 0;
}

}  // namespace lp::cli
