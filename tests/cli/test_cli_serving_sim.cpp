// `lazyprefill simulate-serving` and `validate --serving` through the real binary: outputs, the
// capacity search's unmet case, and bad input (one line, non-zero exit, no output file).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>

#include "tests/cli/cli_harness.h"
#include "tests/test_util.h"

namespace lp {
namespace {

using namespace cli_test;

const std::vector<std::string> kBase = {
    "simulate-serving", "--model-config", "llama-3.1-8b", "--hw", "h100-sxm", "--requests", "200",
    "--kv-budget-mib",  "30000"};
std::vector<std::string> with(std::vector<std::string> more) {
  std::vector<std::string> a = kBase;
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST_F(CliSim, ServingSimulationReportsEveryRateAndMethod) {
  const std::string out = dir_.file("serving.json");
  const CliResult r =
      run_cli(dir_, with({"--rate", "0.5,2", "--prompt-tokens", "2048:4096", "--json", "--out", out}));
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), 4u);  // 2 methods x 2 rates
  for (const auto& row : j["results"]) {
    EXPECT_EQ(row["metrics"]["requests"].get<int64_t>(), 200);
    EXPECT_GT(row["metrics"]["ttft_ms"]["p90"].get<double>(), row["metrics"]["ttft_ms"]["p50"].get<double>());
    EXPECT_FALSE(row["kv_mib_over_time"]["points"].empty());
  }
  // Pruned prefills are shorter: LazyLLM's p50 TTFT is below the unpruned one at the same rate.
  EXPECT_LT(j["results"][2]["metrics"]["ttft_ms"]["p50"].get<double>(),
            j["results"][0]["metrics"]["ttft_ms"]["p50"].get<double>());
  std::ifstream f(out);
  const auto saved = nlohmann::json::parse(f);
  EXPECT_EQ(saved, j);
}

// The paper's baselines under load, each at its default: random-drop serves every prompt 30% shorter
// (floor(0.3 x 2048) = 614 tokens dropped), static-paper computes 3 of the 32 layers on all 2,048
// tokens and the other 29 on 2,048 - floor(0.35 x 2048) = 1,332; both cut p50 TTFT.
TEST_F(CliSim, ServingSimulationRunsThePapersBaselines) {
  const CliResult r = run_cli(dir_, with({"--rate", "2", "--prompt-tokens", "2048", "--prune",
                                          "none,random-drop,static-paper", "--json"}));
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["results"].size(), 3u);
  EXPECT_EQ(j["results"][1]["method"], "random-drop 0.3");
  EXPECT_EQ(j["results"][2]["method"], "static-paper 0.1:0.35");
  const auto share = [&](int i) { return j["results"][i]["metrics"]["prompt_share_mean"].get<double>(); };
  EXPECT_NEAR(share(1), (2048.0 - 614) / 2048, 1e-12);
  EXPECT_NEAR(share(2), (3 * 2048.0 + 29 * 1332.0) / (32 * 2048.0), 1e-12);
  const auto p50 = [&](int i) { return j["results"][i]["metrics"]["ttft_ms"]["p50"].get<double>(); };
  EXPECT_LT(p50(1), p50(0));
  EXPECT_LT(p50(2), p50(0));
  // Prompts are counted as sent.
  EXPECT_NEAR(j["results"][1]["metrics"]["prompt_tokens_per_s"].get<double>(),
              j["results"][0]["metrics"]["prompt_tokens_per_s"].get<double>(),
              0.01 * j["results"][0]["metrics"]["prompt_tokens_per_s"].get<double>());
}

// --log-requests writes one run's requests in serve --log-requests' fields: the same arrivals and
// lengths it was given, times in order, and a file --arrival-file reads back to the same run.
TEST_F(CliSim, ServingSimulationWritesItsRequestsAsAServerLog) {
  const std::string log = dir_.file("sim.jsonl"), again = dir_.file("again.jsonl");
  const CliResult r = run_cli(dir_, with({"--prune", "lazyllm", "--rate", "3", "--prompt-tokens", "1024:4096",
                                          "--log-requests", log, "--json"}));
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  std::ifstream f(log);
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(f, line)) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 200u);
  double last_arrival = 0;
  for (const auto& o : rows) {
    const double a = o["arrival_s"], ad = o["admitted_s"], ft = o["first_token_s"], fin = o["finished_s"];
    EXPECT_GE(a, last_arrival);
    EXPECT_LE(a, ad);
    EXPECT_LE(ad, ft);
    EXPECT_LE(ft, fin);
    EXPECT_NEAR(o["ttft_s"].get<double>(), ft - a, 1e-9);
    EXPECT_GE(o["prompt_tokens"].get<int64_t>(), 1024);
    EXPECT_LE(o["prompt_tokens"].get<int64_t>(), 4096);
    EXPECT_EQ(o["output_tokens"].get<int64_t>(), 32);
    EXPECT_EQ(o["prune"], "lazyllm");
    last_arrival = a;
  }
  // Read back as an arrival file: the same workload, so the same figures.
  const CliResult b = run_cli(
      dir_, {"simulate-serving", "--model-config", "llama-3.1-8b", "--hw", "h100-sxm", "--kv-budget-mib",
             "30000", "--prune", "lazyllm", "--arrival-file", log, "--log-requests", again, "--json"});
  ASSERT_TRUE(b.exited && b.code == 0) << describe(b);
  const auto ja = nlohmann::json::parse(r.out), jb = nlohmann::json::parse(b.out);
  EXPECT_NEAR(ja["results"][0]["metrics"]["ttft_ms"]["p90"].get<double>(),
              jb["results"][0]["metrics"]["ttft_ms"]["p90"].get<double>(), 1e-6);
  // One run only; the log never replaces an input.
  expect_one_line_error(run_cli(dir_, with({"--rate", "1,2", "--log-requests", dir_.file("x.jsonl")})),
                        {"--log-requests", "one --rate"});
  expect_one_line_error(run_cli(dir_, with({"--log-requests", dir_.file("y.jsonl")})),
                        {"one --prune method"});
  expect_one_line_error(run_cli(dir_, {"simulate-serving", "--model-config", "llama-3.1-8b", "--hw",
                                       "h100-sxm", "--kv-budget-mib", "30000", "--prune", "none",
                                       "--arrival-file", log, "--log-requests", log}),
                        {"--log-requests"});
  EXPECT_FALSE(std::filesystem::exists(dir_.file("x.jsonl")));
  EXPECT_FALSE(std::filesystem::exists(dir_.file("y.jsonl")));
}

// A closed loop through the binary (vllm bench serve --max-concurrency's workload): the engine's
// scheduler reported, every request released at once, Little's law between the figures printed.
TEST_F(CliSim, ServingClosedLoopUnderAnEnginesScheduler) {
  const CliResult r = run_cli(dir_, {"simulate-serving",
                                     "--model-config",
                                     "llama-3.1-8b",
                                     "--hw",
                                     "h100-sxm",
                                     "--engine",
                                     "sglang",
                                     "--prune",
                                     "none",
                                     "--concurrency",
                                     "8",
                                     "--requests",
                                     "200",
                                     "--prompt-tokens",
                                     "normal:1024:256",
                                     "--output-tokens",
                                     "64",
                                     "--kv-budget-mib",
                                     "20000",
                                     "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["scheduler"]["engine"], "sglang");
  EXPECT_EQ(j["scheduler"]["mixed"], false);
  EXPECT_EQ(j["scheduler"]["kv_mode"], "on-demand");
  EXPECT_EQ(j["scheduler"]["concurrency"], 8);
  const auto& res = j["results"][0];
  EXPECT_EQ(res["rate_per_s"], "inf");
  const auto& m = res["metrics"];
  EXPECT_NEAR(m["requests_per_s"].get<double>() * m["e2e_ms"]["mean"].get<double>() / 1e3, 8, 0.4);
}

// calibrate-serving through the binary on vllm bench serve's own files: every point's figures, the
// held-out errors, and a profile simulate-serving takes; bad input in one line.
TEST_F(CliSim, CalibrateServingFromTheUsersBenchmarks) {
  std::vector<std::string> args = {
      "calibrate-serving", "--model-config", "smollm2-135m", "--hw", "cpu-local",       "--weights", "5bpw",
      "--compute",         "int8",           "--kv",         "f16",  "--kv-budget-mib", "1024"};
  for (const char* f : {"vllm-rate2.json", "vllm-rate4.json", "vllm-conc1.json", "vllm-conc8.json",
                        "aiperf-conc4.json", "guidellm-poisson3.json"})
    args.insert(args.end(), {"--benchmark", testing::fixture_path(std::string("serving-benchmarks/") + f)});
  const std::string profile = dir_.file("fitted.json");
  std::vector<std::string> json_args = args;
  json_args.insert(json_args.end(), {"--json", "--out", profile});
  const CliResult r = run_cli(dir_, json_args);
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["points"].size(), 6u);
  EXPECT_GT(j["fitted"]["kernel_scale"].get<double>(), 0);
  for (const char* f : {"ttft_p50", "itl_p50", "output_tokens_per_s"}) {
    EXPECT_TRUE(j["mape_percent"][f]["held_out"].is_number()) << f;
    EXPECT_LE(j["mape_percent"][f]["calibrated"].get<double>(),
              j["mape_percent"][f]["uncalibrated"].get<double>())
        << f;
  }
  const CliResult sim = run_cli(
      dir_, {"simulate-serving", "--model-config", "smollm2-135m", "--hw", profile, "--prune", "none",
             "--rate", "2", "--requests", "50", "--prompt-tokens", "256", "--output-tokens", "16", "--json"});
  ASSERT_TRUE(sim.exited && sim.code == 0) << describe(sim);
  EXPECT_NEAR(nlohmann::json::parse(sim.out)["scheduler"]["kernel_scale"].get<double>(),
              j["fitted"]["kernel_scale"].get<double>(), 1e-9);
  std::vector<std::string> bad = args;
  bad.insert(bad.end(), {"--fit", "everything", "--out", dir_.file("never.json")});
  expect_one_line_error(run_cli(dir_, bad), {"--fit", "everything"});
  // The ranges are the library's (calib::calibrate_serving), in the Python module's words too; a
  // usage error exits 2.
  for (const auto& [flag, value, words] :
       {std::tuple<std::string, std::string, std::string>{"--tp", "0",
                                                          "--tp must be between 1 and 4096, got 0"},
        {"--kv-fraction", "nan", "--kv-fraction must be between 0.05 and 1, got nan"},
        {"--kv-element-bytes", "9", "--kv-element-bytes must be between 0.5 and 8, got 9"}}) {
    std::vector<std::string> out_of_range = args;
    out_of_range.insert(out_of_range.end(), {flag, value, "--out", dir_.file("never.json")});
    const CliResult r = run_cli(dir_, out_of_range);
    expect_one_line_error(r, {words});
    EXPECT_EQ(r.code, 2) << describe(r);
  }
  const std::string other = dir_.file("other.json");
  std::ofstream(other) << R"({"hello": 1})";
  expect_one_line_error(run_cli(dir_, {"calibrate-serving", "--model-config", "smollm2-135m", "--hw",
                                       "cpu-local", "--benchmark", other}),
                        {"other.json", "not a serving benchmark"});
  EXPECT_FALSE(std::filesystem::exists(dir_.file("never.json")));
}

// Deployments through the binary: replicas behind a router and disaggregated pools, each run's
// deployment and hand-over reported; bad layouts refused in one line.
TEST_F(CliSim, ServingDeployments) {
  const CliResult r = run_cli(dir_, with({"--engine", "vllm", "--replicas", "3", "--router",
                                          "least-outstanding", "--prune", "none", "--rate", "6", "--json"}));
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["results"][0]["deployment"]["replicas"], 3);
  EXPECT_EQ(j["results"][0]["deployment"]["router"], "least-outstanding");
  const CliResult d = run_cli(dir_, with({"--disaggregate", "1:2", "--prefill-hw", "h200", "--kv-link-gbs",
                                          "25", "--prune", "none,lazyllm", "--rate", "2", "--json"}));
  ASSERT_TRUE(d.exited && d.code == 0) << describe(d);
  const auto k = nlohmann::json::parse(d.out);
  ASSERT_EQ(k["results"].size(), 2u);
  const auto& none = k["results"][0]["handover"];
  const auto& lazy = k["results"][1]["handover"];
  EXPECT_EQ(none["link_gbs"], 25.0);
  EXPECT_EQ(none["requests"], 200);
  EXPECT_LT(lazy["mean_mib"].get<double>(), none["mean_mib"].get<double>());
  const std::string out = dir_.file("never.json");
  expect_one_line_error(run_cli(dir_, with({"--disaggregate", "1:0", "--out", out})),
                        {"--disaggregate", "P:D"});
  expect_one_line_error(run_cli(dir_, with({"--disaggregate", "2", "--out", out})), {"--disaggregate"});
  {  // replicas of pipeline stages
    const CliResult c = run_cli(dir_, with({"--replicas", "2", "--pp", "2", "--prune", "none", "--json"}));
    ASSERT_TRUE(c.exited && c.code == 0) << describe(c);
    EXPECT_EQ(nlohmann::json::parse(c.out)["results"][0]["metrics"]["requests"], 200);
  }
  {  // a closed loop over the pools
    const CliResult c =
        run_cli(dir_, with({"--disaggregate", "1:1", "--concurrency", "4", "--prune", "none", "--json"}));
    ASSERT_TRUE(c.exited && c.code == 0) << describe(c);
    EXPECT_EQ(nlohmann::json::parse(c.out)["results"][0]["metrics"]["requests"], 200);
  }
  expect_one_line_error(run_cli(dir_, {"simulate-serving", "--model-config", "llama-3.1-8b", "--hw",
                                       "h100-sxm,h200", "--replicas", "2", "--out", out}),
                        {"one --hw"});
  expect_one_line_error(run_cli(dir_, with({"--router", "random", "--out", out})), {"--router"});
  EXPECT_FALSE(std::filesystem::exists(out));
}

// plan through the binary: the best layout with its launch commands, the frontier, accuracy
// evidence from an eval --json file (or "accuracy not measured"), refusals in one line.
TEST_F(CliSim, PlanFindsALayoutAndSaysItsAccuracy) {
  const std::string eval = dir_.file("eval.json");
  std::ofstream(eval) << R"({"results": [{"task": "kv", "length": 1024, "metric": "accuracy", "methods": [
      {"policy": "lazyllm", "schedule": "0.3:0.3,0.6:0.3,0.9:0.3", "samples": 10, "accuracy": 0.9,
       "accuracy_change": -0.1}]}]})";
  std::vector<std::string> base = small_plan_args();
  base.insert(base.end(), {"--slo-ttft-p90-ms", "2000", "--slo-itl-p90-ms", "100"});
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--eval", eval, "--json"});
  const CliResult r = run_cli(dir_, args);
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  // TP1 x 2, TP1 PP2 x 1, TP2 x 1, prefill TP1 + decode TP1; x 2 methods
  EXPECT_EQ(j["layouts_searched"], 4 * 2);
  ASSERT_TRUE(j.contains("best"));
  EXPECT_EQ(j["best"]["launch"].size() >= 3, true);
  EXPECT_FALSE(j["frontier"].empty());
  const auto& acc = j["accuracy"]["lazyllm 0.3:0.3,0.6:0.3,0.9:0.3"];
  ASSERT_TRUE(acc.is_array()) << acc;
  EXPECT_DOUBLE_EQ(acc[0]["value"].get<double>(), 0.9);
  std::vector<std::string> charted = base;
  const std::string chart = dir_.file("plan.svg");
  charted.insert(charted.end(), {"--chart", chart});
  const CliResult none = run_cli(dir_, charted);
  ASSERT_TRUE(none.exited && none.code == 0) << describe(none);
  const std::string svg = slurp_text(chart);
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("Pareto frontier"), std::string::npos);
  const std::string out = dir_.file("never.json");
  std::vector<std::string> bad = base;
  bad.insert(bad.end(), {"--max-layouts", "3", "--out", out});
  expect_one_line_error(run_cli(dir_, bad), {"8 layouts", "over the limit of 3"});
  bad = base;
  bad.insert(bad.end(), {"--eval", dir_.file("missing.json"), "--out", out});
  expect_one_line_error(run_cli(dir_, bad), {"missing.json"});
  EXPECT_FALSE(std::filesystem::exists(out));
}

// `mpirun -n 2`: plan's layouts and sweep's rows dealt over two ranks give byte for byte what one
// process gives (sweep also when resuming a torn output); ranks given different models are
// refused by rank 0, naming the rank. Four mpiruns of two processes each, and the one-process runs:
// about 3 s, mostly Open MPI starting.
TEST_F(CliSim, PlanAndSweepOverMpiRanksAreOneProcess) {
  std::vector<std::string> plan = small_plan_args();
  plan[6] = "4";  // --gpus: more layouts to deal
  plan.insert(plan.end(), {"--slo-itl-p90-ms", "30", "--json"});
  const CliResult one = run_cli(dir_, plan);
  ASSERT_TRUE(one.exited && one.code == 0) << describe(one);
  const CliResult two = run_mpi(dir_, 2, plan);
  ASSERT_TRUE(two.exited && two.code == 0) << describe(two);
  EXPECT_EQ(two.out, one.out);
  EXPECT_GT(nlohmann::json::parse(one.out)["layouts_searched"].get<int>(), 2);

  const std::string grid = dir_.file("grid.json");
  {
    std::ofstream(grid)
        << R"({"lazyprefill_sweep": 1, "hardware": ["h100-sxm", "l4"], "models": ["llama-3.1-8b"],
      "methods": [{"policy": "none"}, {"policy": "lazyllm", "schedule": "0.3:0.3,0.6:0.3,0.9:0.3"}],
      "prompt_lengths": [1024, 2048, 4096, 8192, 3000]})";
  }
  const std::string a = dir_.file("one.jsonl"), b = dir_.file("two.jsonl");
  ASSERT_EQ(run_cli(dir_, {"sweep", "--grid", grid, "--out", a}).code, 0);
  const CliResult s2 = run_mpi(dir_, 2, {"sweep", "--grid", grid, "--out", b});
  ASSERT_TRUE(s2.exited && s2.code == 0) << describe(s2);
  EXPECT_NE(s2.out.find("by 2 ranks"), std::string::npos) << s2.out;
  const std::string whole = slurp_text(a);
  EXPECT_EQ(std::count(whole.begin(), whole.end(), '\n'), 20);
  EXPECT_EQ(slurp_text(b), whole);
  {  // resumed: 7 rows and a torn eighth
    const size_t cut = [&] {
      size_t at = 0;
      for (int k = 0; k < 7; ++k) at = whole.find('\n', at) + 1;
      return at + 10;
    }();
    std::ofstream(b, std::ios::trunc) << whole.substr(0, cut);
  }
  const CliResult resumed = run_mpi(dir_, 2, {"sweep", "--grid", grid, "--out", b});
  ASSERT_TRUE(resumed.exited && resumed.code == 0) << describe(resumed);
  EXPECT_NE(resumed.out.find("13 configurations simulated by 2 ranks, 7 already"), std::string::npos)
      << resumed.out;
  EXPECT_EQ(slurp_text(b), whole);

  // Ranks given different models (mpirun's MPMD form: one command line per rank).
  mpi_env();
  std::vector<std::string> mpmd = {"mpirun", "--oversubscribe", "-n", "1"};
  for (const char* m : {"llama-3.1-8b", "qwen3-0.6b"}) {
    std::vector<std::string> args = plan;
    args[2] = m;
    const std::vector<std::string> rank = cli_argv(args);
    mpmd.insert(mpmd.end(), rank.begin(), rank.end());
    if (std::string(m) == "llama-3.1-8b") mpmd.insert(mpmd.end(), {":", "-n", "1"});
  }
  const CliResult d = run_program(dir_, mpmd);
  EXPECT_TRUE(d.exited && d.code != 0) << describe(d);
  EXPECT_NE(d.err.find("rank 1 searches qwen3-0.6b on h100-sxm"), std::string::npos) << describe(d);
}

// --warmup and --cooldown: the figures are those of the requests between them, as the logged
// requests give them; leaving none to measure, or asking it of --capacity, is refused.
TEST_F(CliSim, ServingWarmupAndCooldownLeaveRequestsOut) {
  const std::string log = dir_.file("closed.jsonl");
  const CliResult r = run_cli(dir_, {"simulate-serving",
                                     "--model-config",
                                     "llama-3.1-8b",
                                     "--hw",
                                     "h100-sxm",
                                     "--kv-budget-mib",
                                     "30000",
                                     "--prune",
                                     "none",
                                     "--concurrency",
                                     "6",
                                     "--requests",
                                     "60",
                                     "--prompt-tokens",
                                     "512:4096",
                                     "--output-tokens",
                                     "16:64",
                                     "--warmup",
                                     "12",
                                     "--cooldown",
                                     "6",
                                     "--log-requests",
                                     log,
                                     "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  std::vector<double> ttft;
  std::istringstream lines(slurp_text(log));
  for (std::string line; std::getline(lines, line);)
    ttft.push_back(nlohmann::json::parse(line)["ttft_s"].get<double>());
  ASSERT_EQ(ttft.size(), 60u);
  double sum = 0;
  for (size_t i = 12; i < 54; ++i) sum += ttft[i];
  const auto& m = j["results"][0]["metrics"];
  EXPECT_EQ(m["requests"].get<int64_t>(), 42);
  EXPECT_NEAR(m["ttft_ms"]["mean"].get<double>(), 1e3 * sum / 42, 1e-6);
  expect_one_line_error(run_cli(dir_, {"simulate-serving", "--model-config", "llama-3.1-8b", "--hw",
                                       "h100-sxm", "--kv-budget-mib", "30000", "--concurrency", "2",
                                       "--requests", "10", "--warmup", "6", "--cooldown", "4"}),
                        {"--warmup 6 and --cooldown 4 leave none of the 10 requests"});
  expect_one_line_error(run_cli(dir_, with({"--capacity", "--slo-ttft-p90-ms", "500", "--warmup", "10"})),
                        {"--warmup and --cooldown", "--capacity"});
}

// --prefix-cache under an engine holding K/V on demand (vLLM's preset): prompts of shared groups
// find their prefix cached, and the run serves more requests a second than without the cache.
TEST_F(CliSim, ServingPrefixCacheWithKvOnDemand) {
  const auto run = [&](bool cache) {
    std::vector<std::string> args =
        with({"--engine", "vllm", "--prune", "none", "--rate", "20", "--prompt-tokens", "4096",
              "--output-tokens", "16", "--shared-prefix", "3584:2", "--json"});
    if (cache) args.push_back("--prefix-cache");
    const CliResult r = run_cli(dir_, args);
    EXPECT_TRUE(r.exited && r.code == 0) << describe(r);
    return nlohmann::json::parse(r.out)["results"][0];
  };
  const auto cached = run(true), cold = run(false);
  EXPECT_GT(cached["prompt_tokens_cached_share"].get<double>(),
            0.3);  // those sent before their group's first prefill ended miss
  EXPECT_GT(cached["metrics"]["requests_per_s"].get<double>(),
            1.5 * cold["metrics"]["requests_per_s"].get<double>());
}

TEST_F(CliSim, ServingCapacityStatesWhenNoRateMeetsTheObjectives) {
  const CliResult r = run_cli(dir_, with({"--capacity", "--slo-ttft-p90-ms", "0.001", "--prompt-tokens",
                                          "4096", "--seeds", "1", "--json"}));
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  for (const auto& c : j["capacity"]) {
    EXPECT_FALSE(c["met"].get<bool>());
    EXPECT_GT(c["best_at_lowest_rate"]["ttft_ms"]["p90"].get<double>(), 0.001);
  }
}

TEST_F(CliSim, ServingSimulationRefusesBadInput) {
  const auto file = [&](const char* name, const char* text) {
    const std::string p = dir_.file(name);
    std::ofstream(p) << text;
    return p;
  };
  const std::string out = dir_.file("never.json");
  expect_one_line_error(run_cli(dir_, with({"--rate", "0", "--out", out})), {"--rate", "'0'"});
  expect_one_line_error(run_cli(dir_, with({"--rate", "abc"})), {"--rate", "abc"});
  expect_one_line_error(run_cli(dir_, with({"--prompt-tokens", "9:3"})), {"--prompt-tokens", "LO above HI"});
  expect_one_line_error(run_cli(dir_, with({"--prompt-tokens", "200000"})), {"exceed the model's context"});
  expect_one_line_error(run_cli(dir_, {"simulate-serving", "--model-config", "llama-3.1-8b", "--hw",
                                       "h100-sxm", "--prompt-tokens", "100000", "--kv-budget-mib", "1000"}),
                        {"could never run"});
  expect_one_line_error(run_cli(dir_, with({"--capacity"})), {"--capacity needs"});
  // The engines' schedulers and benchmark workloads (issue 55).
  expect_one_line_error(run_cli(dir_, with({"--concurrency", "0", "--out", out})), {"--concurrency"});
  expect_one_line_error(run_cli(dir_, with({"--kv-mode", "lazy"})), {"--kv-mode"});
  expect_one_line_error(run_cli(dir_, with({"--prompt-tokens", "normal:0:5"})),
                        {"--prompt-tokens", "normal"});
  expect_one_line_error(run_cli(dir_, with({"--rate", "-inf"})), {"--rate"});
  expect_one_line_error(run_cli(dir_, with({"--capacity", "--slo-ttft-p90-ms", "500", "--concurrency", "4"})),
                        {"--concurrency"});
  const std::vector<std::string> file_base = {
      "simulate-serving", "--model-config", "llama-3.1-8b", "--hw", "h100-sxm", "--out", out,
      "--arrival-file"};
  const auto from_file = [&](const std::string& p) {
    std::vector<std::string> a = file_base;
    a.push_back(p);
    return run_cli(dir_, a);
  };
  expect_one_line_error(
      from_file(file("unsorted.csv", "arrival_s,prompt_tokens,output_tokens\n2,100,4\n1,100,4\n")),
      {"unsorted.csv:3", "sorted"});
  expect_one_line_error(from_file(file("negative.csv", "arrival_s,prompt_tokens,output_tokens\n-1,100,4\n")),
                        {"negative.csv:2", "negative"});
  expect_one_line_error(from_file(file("words.csv", "arrival_s,prompt_tokens,output_tokens\n1,many,4\n")),
                        {"words.csv:2", "'many'"});
  expect_one_line_error(from_file(file("cols.csv", "arrival_s,output_tokens\n1,4\n")),
                        {"cols.csv", "prompt_tokens"});
  expect_one_line_error(from_file(dir_.file("missing.csv")), {"missing.csv"});
  EXPECT_FALSE(std::filesystem::exists(out));
}

// The measured load test kept as fixtures, replayed. What holds today (docs/serving.md has the
// table; issue 22's targets are not all met): both methods' saturation throughput within 15%;
// TTFT p50 and p90 within 10% at every rate up to 0.3 requests/s (80-90% of saturation); ITL p50
// within 10% at the calibration rate and at 0.3; throughput within 5% at every rate below
// saturation. The fitted profile comes out as a file simulate --hw takes.
// The prefix cache's validation (issue 54): a same-day load test without the cache calibrates
// (tests/fixtures/serving-prefix/base: both methods' TTFT within 5% at every rate), then a
// shared-prefix load test (four 2,048-token documents, 32-128-token questions, 95% of the prompt
// tokens found cached) is replayed with each request's logged hit. Guarded where the model holds
// (docs/serving.md): unpruned TTFT p50 within 25% and p90 within 30% at every rate, every
// throughput within 5%. Not guarded: LazyLLM's cached TTFT and every ITL (revivals after a hit are
// fewer than the synthetic model's cold ones; unpruned decoding is fitted jointly with LazyLLM's).
// About 2 s: the calibration's fits and the replays of 4 + 3 rates for both methods.
TEST_F(CliSim, ServingValidationOfThePrefixCache) {
  const std::string fx = std::string(LP_SOURCE_DIR) + "/tests/fixtures/serving-prefix";
  const CliResult r = run_cli(dir_, {"validate", "--serving", fx + "/base", "--prefix-load", fx, "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  for (const auto& g : j["rates"])
    for (const char* k : {"ttft_p50", "ttft_p90"})
      EXPECT_LE(std::fabs(g["error"][k].get<double>()), 0.05) << g.dump();
  const auto& p = j["prefix_cache"];
  EXPECT_GT(p["prompt_tokens_cached_share"].get<double>(), 0.9);
  ASSERT_EQ(p["rates"].size(), 8u);
  for (const auto& g : p["rates"]) {
    EXPECT_LE(std::fabs(g["error"]["requests_per_s"].get<double>()), 0.05) << g.dump();
    if (g["method"] != "none") continue;
    EXPECT_LE(std::fabs(g["error"]["ttft_p50"].get<double>()), 0.25) << g.dump();
    EXPECT_LE(std::fabs(g["error"]["ttft_p90"].get<double>()), 0.30) << g.dump();
  }
  const CliResult bad = run_cli(dir_, {"validate", "--prefix-load", fx});
  EXPECT_NE(bad.code, 0);
}

TEST_F(CliSim, ServingValidationAgainstTheMeasuredLoadTest) {
  const std::string prof = dir_.file("fitted.json");
  const CliResult r =
      run_cli(dir_, {"validate", "--serving", std::string(LP_SOURCE_DIR) + "/tests/fixtures/serving",
                     "--json", "--profile-out", prof});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rates"].size(), 10u);
  for (const char* m : {"none", "lazyllm"})
    EXPECT_LE(std::fabs(j["saturation"][m]["error"].get<double>()), 0.15) << j["saturation"].dump();
  for (const auto& g : j["rates"]) {
    const double rate = g["rate"].get<double>();
    if (rate <= 0.3) {
      for (const char* k : {"ttft_p50", "ttft_p90"}) {
        EXPECT_LE(std::fabs(g["error"][k].get<double>()), 0.10) << g.dump();
      }
    }
    if (rate == 0.1 || rate == 0.3) {
      EXPECT_LE(std::fabs(g["error"]["itl_p50"].get<double>()), 0.10) << g.dump();
    }
    if (g["below_saturation"].get<bool>()) {
      EXPECT_LE(std::fabs(g["error"]["requests_per_s"].get<double>()), 0.05) << g.dump();
    }
  }
  // Each figure's uncertainty: the measured figure inside its 95% interval, the prediction inside
  // its band over the machine's drift (the log's lone prefills move by a few percent between rates);
  // every figure outside 10% below saturation is listed with its verdict.
  const double drift = j["machine_drift"]["largest"].get<double>();
  EXPECT_GT(drift, 0);
  EXPECT_LT(drift, 0.10);
  size_t outside = 0;
  for (const auto& g : j["rates"])
    for (const char* k : {"ttft_p50", "ttft_p90", "itl_p50", "requests_per_s"}) {
      const auto& u = g["uncertainty"][k];
      const std::string f = std::string(k) == "requests_per_s" ? k : std::string(k) + "_ms";
      const double measured = g["measured"][f].get<double>(), predicted = g["predicted"][f].get<double>();
      EXPECT_LE(u["predicted_band"][0].get<double>(), predicted) << g.dump();
      EXPECT_GE(u["predicted_band"][1].get<double>(), predicted) << g.dump();
      if (u.contains("measured_interval_95")) {
        EXPECT_LE(u["measured_interval_95"][0].get<double>(), measured) << g.dump();
        EXPECT_GE(u["measured_interval_95"][1].get<double>(), measured) << g.dump();
      }
      if (g["below_saturation"].get<bool>() && std::fabs(g["error"][k].get<double>()) > 0.10) ++outside;
    }
  EXPECT_EQ(j["outside_targets"].size(), outside);
  EXPECT_EQ(j["within_targets"].get<bool>(), outside == 0);
  // Decoding attention got a share of its own, below prefill attention's (docs/serving.md).
  const double decode = j["calibration"]["decode_attention_compute"].get<double>();
  std::ifstream f(prof);
  const auto p = nlohmann::json::parse(f);
  EXPECT_DOUBLE_EQ(p["efficiency"]["attention"]["decode_compute"].get<double>(), decode);
  EXPECT_LT(decode, p["efficiency"]["attention"]["compute"].get<double>());
  // simulate takes it back.
  const CliResult s = run_cli(dir_, {"simulate", "--model-config", "smollm2-135m", "--hw", prof,
                                     "--prompt-tokens", "2048", "--new-tokens", "8", "--json"});
  EXPECT_TRUE(s.exited && s.code == 0) << describe(s);
  expect_one_line_error(run_cli(dir_, {"validate", "--profile-out", dir_.file("p.json")}),
                        {"--profile-out needs --serving"});
  // Decoding over listed keys and the pruning stages, fitted on the lone runs op by op (lone/),
  // with the revival model fitted on the load test's own prompts (revivals.json, the default):
  // every LazyLLM figure below saturation within 10%; the one figure outside is the unpruned ITL
  // p50 at 0.2 requests/s, which single requests decide (docs/serving.md).
  const auto& lf = j["calibration"]["lone_decodes"];
  ASSERT_TRUE(lf.is_object()) << j["calibration"].dump();
  EXPECT_EQ(lf["spans"].get<int>(), 9);
  EXPECT_LT(lf["attention_rms_log_error_after"].get<double>(), 0.2);
  EXPECT_LT(lf["attention_rms_log_error_after"].get<double>(),
            lf["attention_rms_log_error_before"].get<double>());
  EXPECT_LT(lf["pruning_rms_log_error_after"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(
      p["efficiency"]["attention"]["listed_memory"].get<double>(),
      lf["listed_memory"].get<double>() / lf["scale_on_the_load_tests_lone_decodes"].get<double>());
  EXPECT_NE(j["calibration"]["revival_model"].get<std::string>().find("revivals.json"), std::string::npos);
  for (const auto& g : j["rates"]) {
    if (g["method"] == "lazyllm" && g["below_saturation"].get<bool>()) {
      for (const char* k : {"ttft_p50", "ttft_p90", "itl_p50", "requests_per_s"}) {
        EXPECT_LE(std::fabs(g["error"][k].get<double>()), 0.10) << g.dump();
      }
    }
  }
  ASSERT_EQ(j["outside_targets"].size(), 1u) << j["outside_targets"].dump();
  EXPECT_EQ(j["outside_targets"][0]["method"], "none");
  EXPECT_EQ(j["outside_targets"][0]["figure"], "itl_p50");
  // And it is ill-conditioned: on the simulation's own long run at that rate, a median of 16
  // requests lands within 10% of the long-run one in under a quarter of the draws (about 7%).
  const auto& sp = j["outside_targets"][0]["sampling"];
  ASSERT_TRUE(sp.is_object() && sp["stable"].get<bool>()) << sp.dump();
  EXPECT_EQ(sp["sample_size"].get<int>(), 16);
  EXPECT_LT(sp["share_within_10pct"].get<double>(), 0.25) << sp.dump();
  EXPECT_GT(sp["sample_range_90"][1].get<double>(), 2 * sp["sample_range_90"][0].get<double>()) << sp.dump();
  // The log's constant revival share instead: a request's revivals spread evenly over its steps,
  // so LazyLLM near saturation comes out shorter (docs/serving.md has both tables).
  const std::string fixtures = std::string(LP_SOURCE_DIR) + "/tests/fixtures/serving";
  const CliResult m =
      run_cli(dir_, {"validate", "--serving", fixtures, "--revival-share-from-log", "--json"});
  ASSERT_TRUE(m.exited && m.code == 0) << describe(m);
  const auto jm = nlohmann::json::parse(m.out);
  EXPECT_TRUE(jm["calibration"]["revival_model"].is_null());
  const auto ttft_p90 = [](const nlohmann::json& v, double rate) {
    for (const auto& g : v["rates"])
      if (g["method"] == "lazyllm" && g["rate"].get<double>() == rate)
        return g["predicted"]["ttft_p90_ms"].get<double>();
    return 0.0;
  };
  EXPECT_LT(ttft_p90(jm, 0.45), ttft_p90(j, 0.45));
  expect_one_line_error(run_cli(dir_, {"validate", "--serving", fixtures, "--revival-share-from-log",
                                       "--revival-model", fixtures + "/revivals.json"}),
                        {"excludes"});
  expect_one_line_error(run_cli(dir_, {"validate", "--revival-share-from-log"}),
                        {"--revival-share-from-log needs --serving"});
  expect_one_line_error(run_cli(dir_, {"validate", "--revival-model", fixtures + "/revivals.json"}),
                        {"--revival-model needs --serving"});
}

}  // namespace
}  // namespace lp
