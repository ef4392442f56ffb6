// `lazyprefill report` and `sweep` through the real binary: the capacity report against its
// schema, sweeps that resume and never tear their output, strict grids, and bad input.
#include "tests/cli/cli_harness.h"

namespace lp {
namespace {

using namespace cli_test;

// a given 0 (or NaN) budget or objective is refused, not taken for "none".
TEST_F(CliSim, ReportRefusesAZeroBudgetOrObjective) {
  for (const char* opt : {"--mem-budget-gib", "--slo-ttft-ms"})
    for (const char* v : {"0", "-1", "nan"})
      expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4",
                                           "--prompt-lengths", "512", "--out", dir_.file("r"), opt, v}),
                            {opt});
}

// a report holds what a reader can use; more is refused before it is computed.
TEST_F(CliSim, ReportRefusesMoreResultsThanItHolds) {
  std::vector<int> ns(1025);
  std::iota(ns.begin(), ns.end(), 1);
  const std::string lengths = fmt::format("{}", fmt::join(ns, ","));
  expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4",
                                       "--prompt-lengths", lengths, "--out", dir_.file("r")}),
                        {"1025 prompt lengths", "use sweep"});
}

// `report` against the shipped schema (checked by python3-jsonschema, an independent validator,
// the schema itself too).
void expect_valid_report(const std::string& report) {
  const std::string schema = std::string(LP_SOURCE_DIR) + "/reports/capacity-report.schema.json";
  const std::string cmd = fmt::format(
      "python3 -c \"import json,jsonschema,sys; s=json.load(open(sys.argv[1])); "
      "jsonschema.Draft202012Validator.check_schema(s); "
      "jsonschema.validate(json.load(open(sys.argv[2])), s, cls=jsonschema.Draft202012Validator)\" '{}' '{}'",
      schema, report);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// The capacity report: valid against the shipped schema (checked by python3-jsonschema, an
// independent validator), charts and page written, objectives no length meets said in the
// report, bad input refused with nothing half-written.
TEST_F(CliSim, ReportIsValidAgainstItsSchema) {
  const std::string out = dir_.file("rep");
  // Accuracy evidence for one of the pruned methods (an eval --json result's shape).
  const std::string eval = write_text(
      R"({"results": [{"task": "kv", "length": 1024, "metric": "accuracy", "methods": [
      {"policy": "lazyllm", "schedule": "0.3:0.3,0.6:0.3,0.9:0.3", "samples": 10, "accuracy": 0.9,
       "accuracy_change": -0.1}]}]})",
      "eval.json");
  CliResult r = run_cli(dir_, {"report",
                               "--eval",
                               eval,
                               "--model-config",
                               "llama-3.1-8b",
                               "--hw",
                               "h100-sxm,l4",
                               "--prompt-lengths",
                               "1024,8192",
                               "--slo-ttft-ms",
                               "0.001",
                               "--mem-budget-gib",
                               "30",
                               "--schedule",
                               "0.3:0.3,0.6:0.3,0.9:0.3",
                               "--schedule",
                               "0.1:0.5,0.3:0.5,0.5:0.5",
                               "--out",
                               out,
                               "--serving-slo-ttft-p90-ms",
                               "1500",
                               "--serving-prompt-tokens",
                               "4096",
                               "--serving-output-tokens",
                               "32",
                               "--serving-requests",
                               "200"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_NE(r.out.find("h100-sxm"), std::string::npos);
  expect_valid_report(out + "/capacity-report.json");
  const auto rep = nlohmann::json::parse(slurp_text(out + "/capacity-report.json"));
  // 2 hardware x (none, 2 lazyllm schedules, static, random) x 2 lengths.
  EXPECT_EQ(rep["results"].size(), 2u * 5 * 2);
  for (const auto& c : rep["capacity"]) {
    EXPECT_TRUE(c["max_prompt_tokens_within_slo"].is_null());
    EXPECT_NE(c["slo_note"].get<std::string>().find("no prompt length meets"), std::string::npos);
  }
  for (const char* f : {"report.html", "ttft-vs-prompt-length.svg", "speedup-vs-share-computed.svg",
                        "op-breakdown.svg", "serving-ttft-vs-rate.svg"})
    EXPECT_TRUE(std::filesystem::exists(out + "/" + f)) << f;
  // Serving capacity: every hardware x method; on the H100 each meets 1.5 s at some rate, and
  // pruning's shorter prefills serve at least as many requests/s as none.
  EXPECT_EQ(rep["lazyprefill_capacity_report"].get<int>(), 2);
  const auto& caps = rep["serving"]["capacity"];
  ASSERT_EQ(caps.size(), 2u * 5);
  for (const auto& c : caps) {
    EXPECT_EQ(c["curve"]["rate_per_s"].size(), 10u);
    if (c["hardware"] == "h100-sxm") {
      ASSERT_TRUE(c["met"].get<bool>()) << c.dump();
      EXPECT_LE(c["ttft_p90_ms"].get<double>(), 1500);
      if (c["method"] != "none") {
        EXPECT_GE(c["rate_per_s"].get<double>(), caps[0]["rate_per_s"].get<double>() * 0.98);
      }
    }
  }
  // Every pruned method carries its accuracy evidence, or says none was measured, beside its speedup.
  ASSERT_EQ(rep["provenance"]["methods"].size(), 5u);
  for (const auto& m : rep["provenance"]["methods"]) {
    if (m["policy"] == "none") {
      EXPECT_FALSE(m.contains("accuracy"));
    } else if (m["policy"] == "lazyllm" && m["schedule"] == "0.3:0.3,0.6:0.3,0.9:0.3") {
      ASSERT_TRUE(m["accuracy"].is_array()) << m.dump();
      EXPECT_DOUBLE_EQ(m["accuracy"][0]["value"].get<double>(), 0.9);
    } else {
      EXPECT_EQ(m["accuracy"], "accuracy not measured") << m.dump();
    }
  }
  const std::string html = slurp_text(out + "/report.html");
  EXPECT_NE(html.find("kv at 1024 tokens: accuracy 0.9 (-0.1, 10 samples)"), std::string::npos);
  EXPECT_NE(html.find("accuracy not measured"), std::string::npos);
  EXPECT_NE(r.out.find("accuracy (lazyllm 0.3:0.3,0.6:0.3,0.9:0.3): kv at 1024 tokens"), std::string::npos)
      << r.out;
  // The pruned methods are faster than none everywhere in this compute-bound regime.
  for (const auto& x : rep["results"]) {
    if (x["method"] != "none") {
      EXPECT_GT(x["speedup"].get<double>(), 1.0) << x.dump();
    }
  }
}

// A report of a 2026 deployment: DeepSeek-V3 in fp8 on 8 H100s does not fit (said, not refused);
// over two pipeline stages it does, and the layout and the 8-bit types pass the schema.
TEST_F(CliSim, ReportOfAParallelLayout) {
  const auto report = [&](const std::string& name, const std::string& pp) {
    const std::string out = dir_.file(name);
    CliResult r = run_cli(dir_, {"report",
                                 "--model-config",
                                 "deepseek-v3",
                                 "--hw",
                                 "h100-sxm",
                                 "--prompt-lengths",
                                 "8192",
                                 "--prune",
                                 "lazyllm",
                                 "--tp",
                                 "8",
                                 "--pp",
                                 pp,
                                 "--weights",
                                 "fp8",
                                 "--compute",
                                 "fp8",
                                 "--kv",
                                 "fp8",
                                 "--out",
                                 out});
    EXPECT_TRUE(r.exited && r.code == 0) << describe(r);
    expect_valid_report(out + "/capacity-report.json");
    return nlohmann::json::parse(slurp_text(out + "/capacity-report.json"));
  };
  const auto one = report("tp8", "1"), two = report("tp8pp2", "2");
  EXPECT_EQ(two["provenance"]["parallelism"], (nlohmann::json{{"tp", 8}, {"dp", 1}, {"ep", 1}, {"pp", 2}}));
  EXPECT_EQ(two["provenance"]["precision"]["weights"], "fp8");
  for (const auto& x : one["results"]) EXPECT_FALSE(x["fits_in_memory"].get<bool>()) << x.dump();
  for (const auto& x : two["results"]) EXPECT_TRUE(x["fits_in_memory"].get<bool>()) << x.dump();
  // Refused with one line: experts over GPUs they do not divide.
  CliResult r;
  r = run_cli(dir_, {"report", "--model-config", "deepseek-v3", "--hw", "h100-sxm", "--prompt-lengths",
                     "1024", "--tp", "4", "--ep", "8", "--out", dir_.file("y")});
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_NE(r.err.find("--ep 8 does not divide --tp 4"), std::string::npos) << r.err;
}

TEST_F(CliSim, ReportBadInput) {
  const std::string out = dir_.file("rep");
  // A --validation file whose cases lack what the chart draws: one line naming it (a raw
  // library type error before).
  for (const char* v : {R"({"cases": [{"policy": "none"}]})", R"({"cases": [{"measured_ttft_ms": 5,
      "predicted_ttft_ms": "6"}]})",
                        R"({"cases": 3})", R"([1, 2])"}) {
    const std::string f = write_text(v, "validation.json");
    expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4",
                                         "--prompt-lengths", "1024", "--out", out, "--validation", f}),
                          {"validation.json"});
  }
  expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "h1000",
                                       "--prompt-lengths", "1024", "--out", out}),
                        {"unknown hardware 'h1000'", "h100-sxm"});
  expect_one_line_error(run_cli(dir_, {"report", "--model-config", "gpt-5", "--hw", "l4", "--prompt-lengths",
                                       "1024", "--out", out}),
                        {"unknown model configuration 'gpt-5'", "llama-2-7b"});
  expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4",
                                       "--prompt-lengths", "1024,lots", "--out", out}),
                        {"'lots'"});
  expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4",
                                       "--prompt-lengths", ",", "--out", out}),
                        {"--prompt-lengths is empty"});
  expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4",
                                       "--prompt-lengths", "100000", "--out", out}),
                        {"exceeds the model's context of 4096"});
  EXPECT_FALSE(std::filesystem::exists(out + "/capacity-report.json"));
  const std::string bad = dir_.file("no/such/folder");
  expect_one_line_error(run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4",
                                       "--prompt-lengths", "1024", "--out", bad}),
                        {"cannot write the report", "no/such/folder"});
}

// report --plan: a saved plan's best layout, launch commands and frontier join the page, its chart
// a file beside it; a file that is not a plan, or a plan missing or mistyping a field, is refused in
// one line naming the file and the field, before anything is written.
TEST_F(CliSim, ReportGainsASavedPlan) {
  const std::string plan = dir_.file("plan.json");
  std::vector<std::string> plan_args = small_plan_args();
  plan_args.insert(plan_args.end(), {"--slo-itl-p90-ms", "100", "--out", plan});
  const CliResult pr = run_cli(dir_, plan_args);
  ASSERT_TRUE(pr.exited && pr.code == 0) << describe(pr);
  const std::vector<std::string> base = {"report",   "--model-config",   "llama-3.1-8b", "--hw",
                                         "h100-sxm", "--prompt-lengths", "2048"};
  const std::string out = dir_.file("rep");
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--plan", plan, "--out", out});
  const CliResult r = run_cli(dir_, args);
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const std::string html = slurp_text(out + "/report.html");
  const auto saved = nlohmann::json::parse(slurp_text(plan));
  EXPECT_NE(html.find("Deployment plan: llama-3.1-8b on 2 x h100-sxm"), std::string::npos);
  EXPECT_NE(html.find("Best within the objectives"), std::string::npos);
  EXPECT_NE(html.find("<td>" + saved["best"]["layout"].get<std::string>() + "</td>"), std::string::npos);
  EXPECT_NE(html.find("vllm serve llama-3.1-8b --tensor-parallel-size"), std::string::npos);
  EXPECT_NE(html.find(fmt::format("Frontier ({} points", saved["frontier"].size())), std::string::npos);
  EXPECT_NE(slurp_text(out + "/plan-frontier.svg").find("Pareto frontier"), std::string::npos);

  const std::string fresh = dir_.file("fresh");
  const auto refused = [&](const std::string& text, std::initializer_list<std::string> needles) {
    const std::string f = write_text(text, "bad-plan.json");
    std::vector<std::string> a = base;
    a.insert(a.end(), {"--plan", f, "--out", fresh});
    expect_one_line_error(run_cli(dir_, a), needles);
  };
  refused("{\"tool\": \"lazyprefill plan\"", {"bad-plan.json", "not valid JSON"});
  refused(R"({"tool": "lazyprefill compare"})", {"bad-plan.json", "not a `lazyprefill plan` result"});
  nlohmann::json missing = saved;
  missing.erase("frontier");
  refused(missing.dump(), {"bad-plan.json", "'frontier'"});
  nlohmann::json typed = saved;
  typed["frontier"][0]["gpus"] = "two";
  refused(typed.dump(), {"bad-plan.json: frontier row 1", "'gpus'"});
  nlohmann::json nan_row = saved;
  nan_row["best"]["ttft_p90_ms"] = -5;
  refused(nan_row.dump(), {"bad-plan.json: best", "not negative"});
  EXPECT_FALSE(std::filesystem::exists(fresh + "/report.html"));
}

// a second sweep on a locked output is refused, and a write that fails (the
// file-size limit standing in for a full disk) leaves whole rows only, which a resume completes.
TEST_F(CliSim, SweepOutputIsLockedAndNeverTorn) {
  const std::string grid = write_text(
      R"({"lazyprefill_sweep": 1, "hardware": ["h100-sxm", "l4"], "models": ["llama-2-7b"],
          "methods": [{"policy": "none"}, {"policy": "lazyllm"}], "prompt_lengths": [512, 1024, 2048, 4096]})",
      "grid.json");
  const std::string out = dir_.file("rows.jsonl");
  {
    const int fd = ::open(out.c_str(), O_RDWR | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX), 0);
    expect_one_line_error(run_cli(dir_, {"sweep", "--grid", grid, "--out", out}), {"rows.jsonl", "locked"});
    ::close(fd);
  }
  // Four rows written, then the whole grid under a 2.5 KiB file-size limit: its rows cannot be
  // written, and the four already there stay whole, with nothing torn after them.
  const std::string small = write_text(
      R"({"lazyprefill_sweep": 1, "hardware": ["l4"], "models": ["llama-2-7b"],
          "methods": [{"policy": "none"}, {"policy": "lazyllm"}], "prompt_lengths": [512, 1024]})",
      "small.json");
  CliResult r = run_cli(dir_, {"sweep", "--grid", small, "--out", out});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const Bytes before = testing::read_file(out);
  ASSERT_EQ(std::count(before.begin(), before.end(), '\n'), 4);
  ASSERT_LT(before.size(), 2560u);
  const std::string cmd =
      fmt::format("ulimit -f 5; trap '' XFSZ; exec '{}' sweep --grid '{}' --out '{}'", cli_path(), grid, out);
  const std::string err = dir_.file("limited.err");
  const int rc = std::system(("/bin/sh -c \"" + cmd + "\" > /dev/null 2> '" + err + "'").c_str());
  EXPECT_NE(rc, 0) << "the sweep must fail when its rows cannot be written";
  const Bytes eb = testing::read_file(err);
  const std::string msg(eb.begin(), eb.end());
  EXPECT_NE(msg.find("rows.jsonl"), std::string::npos) << msg;
  EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 1) << msg;
  EXPECT_TRUE(testing::read_file(out) == before);
  r = run_cli(dir_, {"sweep", "--grid", grid, "--out", out});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const Bytes all = testing::read_file(out);
  EXPECT_EQ(std::count(all.begin(), all.end(), '\n'), 16);
}

TEST_F(CliSim, SweepWritesJsonLinesAndResumes) {
  const std::string grid = write_text(
      R"({"lazyprefill_sweep": 1, "hardware": ["h100-sxm", "l4"], "models": ["llama-2-7b", "smollm2-135m"],
          "methods": [{"policy": "none"}, {"policy": "lazyllm", "schedule": "0.3:0.3,0.6:0.3,0.9:0.3"}],
          "prompt_lengths": [512, 2048, 8192]})",
      "grid.json");
  const std::string out = dir_.file("sweep.jsonl");
  CliResult r = run_cli(dir_, {"sweep", "--grid", grid, "--out", out});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_TRUE(r.err.empty()) << "no progress bar when stderr is not a terminal: " << r.err;
  std::string text = slurp_text(out);
  // 2 hw x 2 models x 2 methods x 3 lengths, less llama-2-7b at 8192 (its context is 4096).
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2 * 2 * 2 * 3 - 2 * 2);
  // Cut the file mid-row, as an interrupted run would: the rerun keeps complete rows, redoes the rest.
  write_text(text.substr(0, text.size() - 40), "sweep.jsonl");
  r = run_cli(dir_, {"sweep", "--grid", grid, "--out", out});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_NE(r.out.find("1 configurations simulated, 19 already"), std::string::npos) << r.out;
  const std::string again = slurp_text(out);
  EXPECT_EQ(again.size(), text.size());
  for (size_t a = 0, b; (b = again.find('\n', a)) != std::string::npos; a = b + 1)
    EXPECT_TRUE(nlohmann::json::accept(again.substr(a, b - a))) << again.substr(a, b - a);
  const std::string bad =
      write_text(R"({"lazyprefill_sweep": 1, "hardware": [], "models": ["x"]})", "bad.json");
  expect_one_line_error(run_cli(dir_, {"sweep", "--grid", bad, "--out", out}), {"bad.json", "'hardware'"});
  // Revivals and engines in a grid: rows say how revivals were modelled; bad values are one line.
  const std::string rv = write_text(
      R"({"lazyprefill_sweep": 1, "hardware": ["h100-sxm"], "models": ["llama-2-7b"], "engine": "trtllm",
          "methods": [{"policy": "lazyllm", "schedule": "0.3:0.3"}], "prompt_lengths": [1024], "new_tokens": 8,
          "revival_share": 0})",
      "rv.json");
  const std::string rv_out = dir_.file("rv.jsonl");
  r = run_cli(dir_, {"sweep", "--grid", rv, "--out", rv_out});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_NE(slurp_text(rv_out).find("optimistic bound"), std::string::npos) << slurp_text(rv_out);
  for (const char* g : {R"("engine": "tgi")", R"("revival_share": "lots")", R"("revival_share": 2)",
                        R"("map": "yes")", R"("revival_model": 3)"}) {
    const std::string f = write_text(fmt::format(R"({{"lazyprefill_sweep": 1, "hardware": ["l4"], "models":
        ["llama-2-7b"], "methods": [{{"policy": "lazyllm"}}], "prompt_lengths": [512], {}}})",
                                                 g),
                                     "badrv.json");
    SCOPED_TRACE(g);
    expect_one_line_error(run_cli(dir_, {"sweep", "--grid", f, "--out", dir_.file("never.jsonl")}), {});
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.file("never.jsonl")));
}

// Grids are read strictly: a typo'd key, a fractional length, a
// negative new_tokens, a wrongly typed field, a version that wraps to 1 in 32 bits, and --out
// naming the grid itself are each one line naming the file and the field, with nothing written.
TEST_F(CliSim, SweepGridsAreReadStrictly) {
  const std::string base = R"("hardware": ["l4"], "models": ["llama-2-7b"], "prompt_lengths": [512])";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": "lazyllm", "shedule": "0.3:0.3"}])",
       "unknown key 'shedule'"},
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": "none"}], "new_token": 4)",
       "unknown key 'new_token'"},
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": "none"}], "new_tokens": -3)",
       "new_tokens must be in [0"},
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": "none"}], "batch": "4")",
       "batch must be a whole number"},
      {R"("lazyprefill_sweep": 4294967297, "methods": [{"policy": "none"}])", "lazyprefill_sweep must be in"},
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": 3}])", "'policy' must be a string"},
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": "none"}], "batch": 0)", "batch must be in [1"},
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": "lazyllm", "schedule": ""}])", "empty schedule"},
      {R"("lazyprefill_sweep": 1, "methods": [{"policy": "none"}], "precision": {"weight": "fp8"})",
       "unknown key 'weight'"},
  };
  for (const auto& [fields, needle] : cases) {
    SCOPED_TRACE(fields);
    const std::string f = write_text("{" + fields + ", " + base + "}", "strict.json");
    expect_one_line_error(run_cli(dir_, {"sweep", "--grid", f, "--out", dir_.file("never.jsonl")}),
                          {"strict.json", needle});
  }
  const std::string frac =
      write_text(R"({"lazyprefill_sweep": 1, "hardware": ["l4"], "models": ["llama-2-7b"],
      "methods": [{"policy": "none"}], "prompt_lengths": [1.5]})",
                 "frac.json");
  expect_one_line_error(run_cli(dir_, {"sweep", "--grid", frac, "--out", dir_.file("never.jsonl")}),
                        {"frac.json", "prompt_lengths: a length must be a whole number, got 1.5"});
  EXPECT_FALSE(std::filesystem::exists(dir_.file("never.jsonl")));
  const std::string good = write_text(
      R"({"lazyprefill_sweep": 1, "hardware": ["l4"], "models": ["llama-2-7b"], "methods": [{"policy": "none"}],
          "prompt_lengths": [512]})",
      "good.json");
  const std::string before = slurp_text(good);
  const CliResult r = run_cli(dir_, {"sweep", "--grid", good, "--out", good});
  expect_one_line_error(r, {"is the grid itself"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(slurp_text(good), before);
}

}  // namespace
}  // namespace lp
