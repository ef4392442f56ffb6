#include "calibrate/runahead_validation.h"

#include <algorithm>
#include <boost/math/statistics/univariate_statistics.hpp>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "sim/runahead.h"

namespace lp::calib {

int64_t RunaheadRun::prompt_tokens() const {
  int64_t n = 0;
  for (int64_t c : partition) n += c;
  return n;
}

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

RunaheadFixtures read_runahead_fixtures(const std::string& dir) {
  namespace fs = std::filesystem;
  RunaheadFixtures f;
  f.dir = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("{}: not a folder", dir);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const fs::path& p : files) {
    const std::string origin = p.string();
    const nlohmann::json j =
        json_parse(read_input_file(origin, "run --json file", input_cap::kResults), origin, true);
    if (j.is_discarded() || !j.is_object()) fail("{}: not a JSON object", origin);
    if (j.value("tool", "") == "lazyprefill run --runahead")
      f.runs.push_back(read_runahead_run(j, origin));
    else
      f.singles.push_back(measurement_from_run_json(j, p.filename().string()));
  }
  if (f.singles.empty())
    fail(
        "{}: no single-process `run --json` outputs to calibrate on (bench/runahead_ttft.sh KEEP=DIR keeps "
        "them)",
        dir);
  if (f.runs.empty()) fail("{}: no `run --runahead --json` outputs to validate", dir);
  return f;
}

namespace {
double median(std::vector<double> v) {
  return boost::math::statistics::median(v);
}
}  // namespace

RunaheadValidation validate_runahead(const hw::Profile& base, const RunaheadFixtures& f) {
  RunaheadValidation v;
  v.fitted = calibrate(base, f.singles, &v.report);
  const hw::Profile& hw = v.fitted;

  std::map<std::pair<int64_t, int>, std::pair<std::vector<double>, std::vector<double>>> singles;
  for (size_t i = 0; i < f.singles.size(); ++i) {
    auto& g = singles[{f.singles[i].prompt_tokens, f.singles[i].threads}];
    g.first.push_back(v.report.runs[i].first);
    g.second.push_back(v.report.runs[i].second);
  }
  for (const auto& [k, g] : singles) {
    const double m = median(g.first), p = median(g.second);
    v.single.push_back({k.first, k.second, g.first.size(), m, p, p / m - 1});
  }

  struct Group {
    const RunaheadRun* first = nullptr;
    std::vector<double> ttft;
    std::vector<std::vector<double>> waits;
  };
  std::map<std::tuple<int64_t, std::vector<int64_t>, int>, Group> groups;
  for (const RunaheadRun& r : f.runs) {
    Group& g = groups[{r.prompt_tokens(), r.partition, r.threads}];
    if (!g.first) g.first = &r;
    g.ttft.push_back(r.ttft_s);
    g.waits.push_back(r.wait_s);
  }
  std::map<int64_t, std::map<std::string, std::pair<double, double>>> by_rule;  // prompt -> rule -> (m, p)
  for (const auto& [k, g] : groups) {
    const RunaheadRun& r = *g.first;
    const auto& [n, chunks, threads] = k;
    const double share = hw::thread_share(hw, threads);
    const sim::RunaheadLink link = sim::default_link(hw);
    const sim::RunaheadPrediction p = sim::predict_runahead(r.config, hw, r.precision, chunks, link, share);
    RunaheadCheck c{n, chunks, r.rule, threads, g.ttft.size(), median(g.ttft), p.ttft_s, 0, {}, {}, 0};
    c.error = c.predicted_s / c.measured_s - 1;
    v.worst_abs_error = std::max(v.worst_abs_error, std::fabs(c.error));
    for (size_t rank = 0; rank < chunks.size(); ++rank) {
      std::vector<double> w;
      for (const auto& x : g.waits)
        if (rank < x.size()) w.push_back(x[rank]);
      c.ranks.push_back({chunks[rank], w.empty() ? std::nullopt : std::optional<double>(median(w)),
                         p.ranks[rank].wait_s, p.ranks[rank].done_s});
    }
    c.calibrated_partition =
        sim::optimise_partition(r.config, hw, r.precision, n, int(chunks.size()), link, share);
    c.calibrated_predicted_s =
        sim::predict_runahead(r.config, hw, r.precision, c.calibrated_partition, link, share).ttft_s;
    by_rule[n][r.rule] = {c.measured_s, c.predicted_s};
    v.runahead.push_back(std::move(c));
  }
  for (const auto& [n, rules] : by_rule)
    if (rules.count("auto") && rules.count("even")) {
      const auto& b = rules.at("auto");
      const auto& e = rules.at("even");
      v.auto_over_even.push_back({n, b.first / e.first, b.second / e.second});
    }
  return v;
}

}  // namespace lp::calib
