// calibrate and calibrate-serving as library calls (calibrate/calibrate_study.h,
// calibrate/calibrate_serving_study.h), on typed requests: bad requests refused in the CLI's words
// before anything is read or written, and the fitted profile's document written whole, read back as a
// run given the file loads it. The CLI's tables and documents over these calls are tested in
// tests/cli; the Python module's against the CLI in python/tests/test_calibrate.py.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "calibrate/calibrate_serving_study.h"
#include "calibrate/calibrate_study.h"
#include "model/error.h"
#include "tests/gguf_writer.h"

namespace lp::calib {
namespace {

const std::string kMeasurements = std::string(LP_SOURCE_DIR) + "/tests/fixtures/measurements/";
const std::string kBenchmarks = std::string(LP_SOURCE_DIR) + "/tests/fixtures/serving-benchmarks/";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

template <class Request, class Call>
void expect_refused(const Request& base, const std::function<void(Request&)>& change,
                    const std::string& words, Call call) {
  Request r = base;
  change(r);
  try {
    (void)call(r);
    ADD_FAILURE() << "accepted; wanted " << words;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

CalibrateRequest h100_measurements() {
  CalibrateRequest r;
  r.measurements = {kMeasurements + "vllm-latency-h100.json", kMeasurements + "lazyprefill-h100.csv"};
  r.base = "h100-sxm";
  r.engine = "vllm";
  return r;
}

TEST(CalibrateStudy, RefusesBadRequestsInTheCliWordsAndWritesNothing) {
  testing::TempDir d;
  const std::string copy = d.file("copy.csv");
  std::filesystem::copy_file(kMeasurements + "plain.csv", copy);
  using Change = std::function<void(CalibrateRequest&)>;
  const std::pair<Change, std::string> cases[] = {
      {[](CalibrateRequest& r) { r.measurements.clear(); }, "give --runs DIR or --measurements FILE..."},
      {[](CalibrateRequest& r) { r.runs = "runs"; }, "not both"},
      {[](CalibrateRequest& r) { r.base.clear(); }, "--base is required"},
      {[](CalibrateRequest& r) {
         r.measurements.clear();
         r.runs = "runs";
         r.engine.clear();
         r.fit = {"gemm.compute"};
       },
       "--fit applies to --measurements"},
      {[](CalibrateRequest& r) {
         r.measurements.clear();
         r.runs = "runs";
       },
       "--engine applies to --measurements"},
      {[](CalibrateRequest& r) { r.model_map = {"no-equals"}; }, "--model-map takes NAME=VALUE"},
      {[copy](CalibrateRequest& r) {
         r.measurements = {copy};
         r.out = copy;
       },
       "--out"},
  };
  for (const auto& [change, words] : cases)
    expect_refused<CalibrateRequest>(h100_measurements(), change, words, calibrate_profile);
  EXPECT_EQ(slurp(copy), slurp(kMeasurements + "plain.csv"));  // the input an --out named is untouched
}

TEST(CalibrateStudy, TheFittedDocumentIsWrittenWholeAndReadsBackAsTheFit) {
  testing::TempDir d;
  CalibrateRequest r = h100_measurements();
  r.name = "h100-mine";
  r.fit = {"gemm.compute", "overhead_us"};  // the stepwise search over every candidate takes a second
  r.out = d.file("h100-mine.json");
  const CalibrateResult res = calibrate_profile(r);
  ASSERT_FALSE(res.from_runs);
  EXPECT_EQ(res.out, r.out);
  // The file holds the document, and loading it gives the profile handed back.
  EXPECT_EQ(nlohmann::ordered_json::parse(slurp(r.out)), res.document);
  const hw::Profile loaded = hw::load_profile(r.out);
  EXPECT_EQ(loaded.name, "h100-mine");
  EXPECT_EQ(res.profile.name, "h100-mine");
  EXPECT_EQ(loaded.engine.name, "vllm");
  ASSERT_FALSE(res.fit.params.empty());
  for (const std::string& p : res.fit.params) {
    EXPECT_EQ(get_param(loaded, p), get_param(res.profile, p)) << p;
    EXPECT_NEAR(get_param(loaded, p), get_param(res.fitted, p), 1e-12 * std::abs(get_param(res.fitted, p)))
        << p;
  }
  // One point per record kept, as the document's record counts them; the fit (least squares in log
  // error, started at the base) at least as close to the measurements as the base.
  ASSERT_EQ(res.points.size(), res.document["calibration"]["points"].get<size_t>());
  double base_loss = 0, fit_loss = 0;
  for (const CalibratedPoint& p : res.points) {
    base_loss += std::pow(std::log(p.base_s / p.measured_s), 2);
    fit_loss += std::pow(std::log(p.fit_s / p.measured_s), 2);
  }
  EXPECT_LE(fit_loss, base_loss * (1 + 1e-12));
  EXPECT_LT(fit_loss, 0.9 * base_loss);  // the two parameters move it: not the base handed back
  EXPECT_EQ(res.to_json()["profile"], r.out);

  // Without an output: the same fit, nothing written, the document's place null.
  r.out.clear();
  const CalibrateResult unwritten = calibrate_profile(r);
  EXPECT_TRUE(unwritten.out.empty());
  EXPECT_TRUE(unwritten.to_json()["profile"].is_null());
  EXPECT_EQ(unwritten.document["efficiency"], res.document["efficiency"]);
}

CalibrateServingRequest smollm_server() {
  CalibrateServingRequest r;
  r.benchmarks = {kBenchmarks + "vllm-rate2.json", kBenchmarks + "vllm-rate4.json"};
  r.model_config = "smollm2-135m";
  r.hw = "cpu-local";
  r.precision = sim::Precision("5bpw", "int8", "f16");
  r.kv_budget_mib = 1024;
  return r;
}

TEST(CalibrateServingStudy, RefusesBadRequestsInTheCliWords) {
  using Change = std::function<void(CalibrateServingRequest&)>;
  const std::pair<Change, std::string> cases[] = {
      {[](CalibrateServingRequest& r) { r.tp = 0; }, "--tp must be between 1 and 4096, got 0"},
      {[](CalibrateServingRequest& r) { r.kv_fraction = 2; },
       "--kv-fraction must be between 0.05 and 1, got 2"},
      {[](CalibrateServingRequest& r) { r.kv_fraction = std::nan(""); }, "--kv-fraction must be between"},
      {[](CalibrateServingRequest& r) { r.kv_budget_mib = 0; }, "--kv-budget-mib must be between 1 and"},
      {[](CalibrateServingRequest& r) { r.kv_element_bytes = 9; },
       "--kv-element-bytes must be between 0.5 and 8"},
      {[](CalibrateServingRequest& r) { r.fit = "scale,bogus"; },
       "--fit: 'bogus' is not scale, iteration or request"},
      {[](CalibrateServingRequest& r) { r.benchmarks.clear(); }, "--benchmark is required"},
      {[](CalibrateServingRequest& r) { r.hw.clear(); }, "--hw is required"},
      {[](CalibrateServingRequest& r) { r.engine = "bogus"; }, "unknown engine 'bogus'"},
      {[](CalibrateServingRequest& r) { r.out = r.benchmarks[0]; }, "--out"},
  };
  for (const auto& [change, words] : cases)
    expect_refused<CalibrateServingRequest>(smollm_server(), change, words, calibrate_serving);
}

TEST(CalibrateServingStudy, TheProfileCarriesTheFittedEngine) {
  testing::TempDir d;
  CalibrateServingRequest r = smollm_server();
  r.out = d.file("served.json");
  const CalibrateServingResult res = calibrate_serving(r);
  EXPECT_EQ(res.benchmarks, 2u);
  EXPECT_EQ(nlohmann::ordered_json::parse(slurp(r.out)), res.document);
  ASSERT_TRUE(res.profile);
  const hw::Profile loaded = hw::load_profile(r.out);
  EXPECT_DOUBLE_EQ(loaded.engine.scheduling.kernel_scale, res.fit.scale);
  EXPECT_DOUBLE_EQ(res.profile->engine.scheduling.kernel_scale, res.fit.scale);
  EXPECT_NEAR(loaded.engine.scheduling.iteration_s, res.fit.iteration_s, 1e-15);
  EXPECT_EQ(res.to_json()["profile"], r.out);
  EXPECT_EQ(res.to_json()["fitted"]["kernel_scale"], res.fit.scale);
}

}  // namespace
}  // namespace lp::calib
