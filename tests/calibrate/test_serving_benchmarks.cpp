// Serving benchmarks from tools nobody here wrote (calibrate/serving_benchmarks.h): the importers
// against the tools' own files (tests/fixtures/serving-benchmarks, README there), their refusals,
// and the fit recovering parameters it was given.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "calibrate/serving_benchmarks.h"
#include "hwmodels/profile.h"
#include "model/error.h"
#include "model/presets.h"
#include "sim/serving_metrics.h"
#include "tests/test_util.h"

namespace lp::calib {
namespace {

using json = nlohmann::json;

std::string bench_fixture(const std::string& name) {
  return testing::fixture_path("serving-benchmarks/" + name);
}
json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}
std::string write_json(const json& j, const std::string& name) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << j.dump();
  return path;
}
// Throws lp::Error with one line holding every part.
void expect_refused(const std::string& path, std::initializer_list<const char*> parts) {
  try {
    (void)read_serving_benchmarks(path);
    ADD_FAILURE() << path << " was read";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    for (const char* p : parts) EXPECT_NE(m.find(p), std::string::npos) << m << " lacks " << p;
  }
}

// vllm bench serve 0.33's files: the load, and the figures recomputed from each request's own
// times equal the ones vLLM computed (numpy's linear percentiles, TPOT excluding the first token).
TEST(ServingBenchmarks, ReadsVllmBenchServe) {
  for (const char* name : {"vllm-rate2.json", "vllm-rate4.json", "vllm-conc1.json", "vllm-conc8.json"}) {
    SCOPED_TRACE(name);
    const std::vector<ServingBenchmark> bs = read_serving_benchmarks(bench_fixture(name));
    ASSERT_EQ(bs.size(), 1u);
    const ServingBenchmark& b = bs[0];
    const json j = read_json(bench_fixture(name));
    EXPECT_EQ(b.tool, "vllm bench serve");
    EXPECT_EQ(b.completed, j["completed"].get<int64_t>());
    EXPECT_EQ(b.prompt_tokens.size(), size_t(b.completed));
    if (j["request_rate"].is_string())
      EXPECT_TRUE(std::isinf(b.rate));
    else
      EXPECT_DOUBLE_EQ(b.rate, j["request_rate"].get<double>());
    EXPECT_EQ(b.concurrency, j["max_concurrency"].is_null() ? 0 : j["max_concurrency"].get<int64_t>());
    for (const auto& [ours, theirs] :
         std::vector<std::pair<double, const char*>>{{b.ttft.p50, "p50_ttft_ms"},
                                                     {b.ttft.p90, "p90_ttft_ms"},
                                                     {b.ttft.p99, "p99_ttft_ms"},
                                                     {b.ttft.mean, "mean_ttft_ms"},
                                                     {b.itl.p50, "p50_tpot_ms"},
                                                     {b.itl.p90, "p90_tpot_ms"},
                                                     {b.itl.mean, "mean_tpot_ms"},
                                                     {b.e2e.p50, "p50_e2el_ms"},
                                                     {b.e2e.p90, "p90_e2el_ms"}})
      EXPECT_NEAR(ours * 1e3, j[theirs].get<double>(), 1e-9 * j[theirs].get<double>()) << theirs;
    EXPECT_DOUBLE_EQ(b.output_tokens_per_s, j["output_throughput"].get<double>());
    EXPECT_NEAR(b.prompt_tokens_mean * double(b.completed), j["total_input_tokens"].get<double>(), 1e-9);
  }
}

// guidellm 0.8.1's report: the strategy's load, each successful request's lengths, the summaries
// of successful requests (ms, and request_latency in s).
TEST(ServingBenchmarks, ReadsGuidellm) {
  for (const auto& [name, rate, clients] : std::vector<std::tuple<const char*, double, int64_t>>{
           {"guidellm-concurrent4.json", HUGE_VAL, 4}, {"guidellm-poisson3.json", 3.0, 0}}) {
    SCOPED_TRACE(name);
    const auto bs = read_serving_benchmarks(bench_fixture(name));
    ASSERT_EQ(bs.size(), 1u);
    const ServingBenchmark& b = bs[0];
    const json g = read_json(bench_fixture(name))["benchmarks"][0];
    EXPECT_EQ(b.tool, "guidellm");
    EXPECT_EQ(b.version, "0.8.1");
    EXPECT_EQ(b.rate, rate);
    EXPECT_EQ(b.concurrency, clients);
    EXPECT_EQ(b.completed, 24);
    ASSERT_EQ(b.prompt_tokens.size(), 24u);
    for (size_t i = 0; i < 24; ++i) {
      EXPECT_EQ(b.prompt_tokens[i], 256);
      EXPECT_EQ(b.output_tokens[i], 16);
    }
    const json& m = g["metrics"];
    EXPECT_DOUBLE_EQ(b.ttft.p90,
                     m["time_to_first_token_ms"]["successful"]["percentiles"]["p90"].get<double>() * 1e-3);
    EXPECT_DOUBLE_EQ(b.itl.p50,
                     m["inter_token_latency_ms"]["successful"]["percentiles"]["p50"].get<double>() * 1e-3);
    EXPECT_DOUBLE_EQ(b.e2e.mean, m["request_latency"]["successful"]["mean"].get<double>());
    EXPECT_DOUBLE_EQ(b.output_tokens_per_s, 24 * 16 / g["duration"].get<double>());
  }
  json bad = read_json(bench_fixture("guidellm-poisson3.json"));
  bad["benchmarks"][0]["config"]["strategy"]["type_"] = "replay";
  expect_refused(write_json(bad, "sb_gl_strategy.json"), {"guidellm", "0.8.1", "'replay'"});
  bad = read_json(bench_fixture("guidellm-poisson3.json"));
  bad["benchmarks"][0]["metrics"].erase("inter_token_latency_ms");
  expect_refused(write_json(bad, "sb_gl_itl.json"), {"guidellm", "0.8.1", "metrics.inter_token_latency_ms"});
}

// AIPerf 0.13's profile export: each metric in its unit, the load in the profiling phase.
TEST(ServingBenchmarks, ReadsAiperf) {
  for (const auto& [name, rate, clients] : std::vector<std::tuple<const char*, double, int64_t>>{
           {"aiperf-conc4.json", HUGE_VAL, 4}, {"aiperf-rate3.json", 3.0, 0}}) {
    SCOPED_TRACE(name);
    const ServingBenchmark b = read_serving_benchmarks(bench_fixture(name)).at(0);
    const json j = read_json(bench_fixture(name));
    EXPECT_EQ(b.tool, "aiperf");
    EXPECT_EQ(b.version, "0.13.0");
    EXPECT_EQ(b.rate, rate);
    EXPECT_EQ(b.concurrency, clients);
    EXPECT_EQ(b.completed, 24);
    EXPECT_DOUBLE_EQ(b.prompt_tokens_mean, 256);
    EXPECT_DOUBLE_EQ(b.ttft.p50, j["time_to_first_token"]["p50"].get<double>() * 1e-3);
    EXPECT_DOUBLE_EQ(b.itl.p90, j["inter_token_latency"]["p90"].get<double>() * 1e-3);
    EXPECT_DOUBLE_EQ(b.duration_s, j["benchmark_duration"]["avg"].get<double>());  // its unit is "sec"
    EXPECT_DOUBLE_EQ(b.output_tokens_per_s, j["output_token_throughput"]["avg"].get<double>());
  }
  json bad = read_json(bench_fixture("aiperf-conc4.json"));
  bad["time_to_first_token"]["unit"] = "fortnights";
  expect_refused(write_json(bad, "sb_ap_unit.json"), {"aiperf", "0.13.0", "'fortnights'"});
  bad = read_json(bench_fixture("aiperf-conc4.json"));
  bad.erase("output_token_throughput");
  expect_refused(write_json(bad, "sb_ap_tput.json"), {"aiperf", "'output_token_throughput'"});
  bad = read_json(bench_fixture("aiperf-conc4.json"));
  bad["input_config"]["phases"][0]["concurrency"] = 0;
  expect_refused(write_json(bad, "sb_ap_conc.json"), {"concurrency", "at least 1"});
}

// Without --save-detailed the summary fields stand alone (ms), and bad ones are refused with the
// field and the tool's record named.
TEST(ServingBenchmarks, VllmSummariesAndTheirRefusals) {
  json j = read_json(bench_fixture("vllm-rate2.json"));
  for (const char* k : {"input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times",
                        "generated_texts", "errors"})
    j.erase(k);
  const ServingBenchmark b = read_serving_benchmarks(write_json(j, "sb_summary.json"))[0];
  EXPECT_TRUE(b.prompt_tokens.empty());
  EXPECT_DOUBLE_EQ(b.ttft.p90, j["p90_ttft_ms"].get<double>() * 1e-3);
  EXPECT_DOUBLE_EQ(b.itl.p50, j["p50_tpot_ms"].get<double>() * 1e-3);
  json bad = j;
  bad.erase("completed");
  expect_refused(write_json(bad, "sb_nocompleted.json"), {"vllm bench serve", "dated", "'completed'"});
  bad = j;
  bad["p90_ttft_ms"] = j["p50_ttft_ms"].get<double>() / 2;
  expect_refused(write_json(bad, "sb_monotone.json"), {"p90", "below", "must not decrease"});
  bad = j;
  bad["max_concurrency"] = 0;
  expect_refused(write_json(bad, "sb_conc0.json"), {"max_concurrency", "at least 1"});
  bad = j;
  bad["request_rate"] = "fast";
  expect_refused(write_json(bad, "sb_rate.json"), {"request_rate"});
  expect_refused(write_json(json{{"hello", 1}}, "sb_other.json"), {"not a serving benchmark"});
  expect_refused(write_json(json::array(), "sb_empty.json"), {"no serving benchmark"});
}

// The workload a benchmark ran: its requests' lengths in order, released at its rate or all at
// once, with its clients.
TEST(ServingBenchmarks, WorkloadsAreTheBenchmarks) {
  const ServingBenchmark b = read_serving_benchmarks(bench_fixture("vllm-conc8.json"))[0];
  const auto reqs = benchmark_workload(b, 0);
  ASSERT_EQ(reqs.size(), size_t(b.completed));
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(reqs[i].arrival_s, 0);
    EXPECT_EQ(reqs[i].prompt_tokens, b.prompt_tokens[i]);
    EXPECT_EQ(reqs[i].output_tokens, b.output_tokens[i]);
  }
  const ServingBenchmark r = read_serving_benchmarks(bench_fixture("vllm-rate4.json"))[0];
  const auto at = benchmark_workload(r, 0);
  EXPECT_NEAR(at.back().arrival_s / double(at.size()), 1 / r.rate, 0.5 / r.rate);  // Poisson at the rate
}

// The fit finds the host time and kernel scale that made a set of benchmarks: points simulated with
// known values, read back as benchmarks, fitted from the defaults.
TEST(ServingBenchmarks, TheFitRecoversWhatMadeThePoints) {
  const ModelConfig c = preset_config("llama-3.1-8b");
  const hw::Profile hw = hw::load_profile("h100-sxm");
  sim::ServingConfig cfg;
  cfg.kv_budget_bytes = 30.0 * (1 << 30);
  cfg.max_batch_tokens = 8192;
  std::vector<ServingBenchmark> bs;
  for (const int64_t clients : {1, 4, 16}) {
    ServingBenchmark b;
    b.where = fmt::format("made with {} clients", clients);
    b.concurrency = clients;
    b.completed = 64;
    b.prompt_tokens_mean = 2048, b.output_tokens_mean = 128;
    sim::ServingConfig truth = cfg;
    truth.iteration_overhead_s = 3e-3, truth.time_scale = 1.4, truth.clients = clients;
    const sim::ServingRun run =
        sim::simulate_serving(c, hw, {}, sim::ServingMethod{}, truth, benchmark_workload(b, 0));
    const sim::ServingMetrics m = sim::serving_metrics(run, {});
    b.ttft = {m.ttft.mean, m.ttft.p50, m.ttft.p90, m.ttft.p99};
    b.itl = {m.itl.mean, m.itl.p50, m.itl.p90, m.itl.p99};
    b.output_tokens_per_s = m.output_tokens_per_s;
    bs.push_back(b);
  }
  const ServingFit fit = fit_serving_benchmarks(c, hw, {}, cfg, bs, {});
  EXPECT_NEAR(fit.scale, 1.4, 0.03);
  EXPECT_NEAR(fit.iteration_s, 3e-3, 0.3e-3);
  for (int f = 0; f < kFigures; ++f) {
    EXPECT_LT(fit.mape_calibrated[f], 2) << figure_name(Figure(f));
    EXPECT_LT(fit.mape_held_out[f], 5) << figure_name(Figure(f));
    EXPECT_GT(fit.mape_uncalibrated[f], 10) << figure_name(Figure(f));
  }
}

}  // namespace
}  // namespace lp::calib
