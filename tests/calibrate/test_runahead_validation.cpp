// `validate --runahead`'s pipeline (calibrate/runahead_validation.h) on the measured fixtures
// (tests/fixtures/runahead): what it reads, the medians it compares (recomputed here from the
// files), and the refusals, at the library function that makes them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "calibrate/runahead_validation.h"
#include "model/error.h"
#include "tests/gguf_writer.h"

namespace lp::calib {
namespace {

const std::string kFixtures = std::string(LP_SOURCE_DIR) + "/tests/fixtures/runahead";

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

TEST(RunaheadValidation, ComparesTheMediansOfEachPartitionsRuns) {
  const RunaheadFixtures f = read_runahead_fixtures(kFixtures);
  // The files, read here: TTFTs per (prompt, partition), and how many single processes.
  std::map<std::pair<int64_t, std::vector<int64_t>>, std::vector<double>> ttft_ms;
  size_t singles = 0;
  for (const auto& e : std::filesystem::directory_iterator(kFixtures)) {
    if (e.path().extension() != ".json") continue;
    const nlohmann::json j = read_json(e.path().string());
    if (j.value("tool", "") != "lazyprefill run --runahead") {
      ++singles;
      continue;
    }
    ttft_ms[{j["prompt_tokens"].get<int64_t>(), j["partition"].get<std::vector<int64_t>>()}].push_back(
        j["ttft_ms"].get<double>());
  }
  EXPECT_EQ(f.singles.size(), singles);
  ASSERT_EQ(f.runs.size(), 18u);  // 3 prompts x (balanced, even) x 3 rounds
  const RunaheadValidation v = validate_runahead(hw::load_profile("cpu-local"), f);
  ASSERT_EQ(v.runahead.size(), ttft_ms.size());
  double worst = 0;
  for (const RunaheadCheck& c : v.runahead) {
    std::vector<double> t = ttft_ms.at({c.prompt_tokens, c.partition});
    std::sort(t.begin(), t.end());
    ASSERT_EQ(t.size(), 3u);
    EXPECT_EQ(c.runs, 3u);
    EXPECT_NEAR(c.measured_s * 1e3, t[1], 1e-9 * t[1]);
    EXPECT_DOUBLE_EQ(c.error, c.predicted_s / c.measured_s - 1);
    ASSERT_EQ(c.ranks.size(), c.partition.size());
    EXPECT_EQ(c.ranks.back().tokens, c.partition.back());
    EXPECT_EQ(c.ranks[0].predicted_wait_s, 0);  // the first rank waits for nobody
    // The balanced partition the calibrated profile would choose is no slower than this one.
    EXPECT_LE(c.calibrated_predicted_s, c.predicted_s * (1 + 1e-9));
    worst = std::max(worst, std::fabs(c.error));
  }
  EXPECT_EQ(v.worst_abs_error, worst);
  ASSERT_EQ(v.auto_over_even.size(), 3u);
  for (const AutoOverEven& q : v.auto_over_even) EXPECT_LT(q.measured, 1);
  int64_t runs = 0;
  for (const SingleProcessCheck& s : v.single) runs += int64_t(s.runs);
  EXPECT_EQ(runs, int64_t(singles));
}

TEST(RunaheadValidation, RefusesWhatItCannotUse) {
  const auto refusal = [](const std::string& dir) {
    try {
      (void)read_runahead_fixtures(dir);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  testing::TempDir d;
  EXPECT_NE(refusal(d.file("absent")).find("not a folder"), std::string::npos);
  EXPECT_NE(refusal(d.path()).find("no single-process"), std::string::npos);
  nlohmann::json run = read_json(kFixtures + "/runahead-even-2050-r1.json");
  const auto refused = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json j = run;
    change(j);
    try {
      (void)read_runahead_run(j, "r.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(refused([](nlohmann::json&) {}), "accepted");
  EXPECT_NE(refused([](nlohmann::json& j) {
              j["partition"] = {1000, 1000};
            }).find("r.json: the partition sums to 2000"),
            std::string::npos);
  EXPECT_NE(refused([](nlohmann::json& j) { j["partition"] = {2050}; }).find("one chunk per rank"),
            std::string::npos);
  EXPECT_NE(refused([](nlohmann::json& j) {
              j["partition"] = {0, 2050};
            }).find("a chunk of 0 tokens"),
            std::string::npos);
  EXPECT_NE(refused([](nlohmann::json& j) { j["dtype"] = "q4"; }).find("'dtype' must be"), std::string::npos);
  EXPECT_NE(refused([](nlohmann::json& j) { j["ttft_ms"] = -1; }).find("'ttft_ms' must be a positive"),
            std::string::npos);
  EXPECT_NE(refused([](nlohmann::json& j) { j["threads_per_rank"] = 0; }).find("'threads_per_rank'"),
            std::string::npos);
  EXPECT_NE(
      refused([](nlohmann::json& j) { j.erase("ttft_ms"); }).find("not a `run --runahead --json` output"),
      std::string::npos);
}

}  // namespace
}  // namespace lp::calib
