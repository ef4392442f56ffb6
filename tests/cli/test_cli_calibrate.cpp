// `lazyprefill calibrate`, `calibrate-revivals` and `validate` through the real binary: fits from
// runs, from end-to-end measurements and from traces, their provenance, and bad input.
#include <map>
#include <sstream>

#include "tests/cli/cli_harness.h"

namespace lp {
namespace {

using namespace cli_test;

TEST_F(CliSim, CalibrateFromRunsAndUseTheProfile) {
  std::filesystem::create_directory(dir_.file("runs"));
  for (int words : {20, 60, 120}) {
    nlohmann::json run;
    make_trace("t" + std::to_string(words) + ".jsonl", words, &run);
    write_text(run.dump(), "runs/r" + std::to_string(words) + ".json");
  }
  const std::string out = dir_.file("fit.json");
  CliResult r = run_cli(dir_, {"calibrate", "--runs", dir_.file("runs"), "--base", "cpu-local", "--out", out,
                               "--name", "tiny-local", "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto rep = nlohmann::json::parse(r.out);
  EXPECT_EQ(rep["runs"].size(), 3u);
  const auto prof = nlohmann::json::parse(slurp_text(out));
  EXPECT_EQ(prof["name"], "tiny-local");
  EXPECT_EQ(prof["efficiency"]["default"], false);
  EXPECT_NE(prof["sources"]["efficiency"].get<std::string>().find("lazyprefill calibrate"),
            std::string::npos);
  r = run_cli(dir_, {"simulate", "--trace", dir_.file("t20.jsonl"), "--hw", out, "--compute", "f32"});
  EXPECT_TRUE(r.exited && r.code == 0) << describe(r);

  expect_one_line_error(
      run_cli(dir_, {"calibrate", "--runs", dir_.file("none"), "--base", "l4", "--out", out}),
      {"is not a folder"});
  write_text("{\"hello\": 1}", "runs/zz.json");
  expect_one_line_error(
      run_cli(dir_, {"calibrate", "--runs", dir_.file("runs"), "--base", "l4", "--out", out}),
      {"zz.json", "not a `run --json` output"});
}

// End-to-end measurements (calibrate/fit_measurements.h): a small CSV whose SHA-256 was computed with
// coreutils' sha256sum, the published TensorRT-LLM table, and the refusals.
TEST_F(CliSim, CalibrateFromMeasurementsRecordsProvenance) {
  const std::string csv = write_text(
      "model,hardware,prompt_tokens,ttft_ms,tp\nllama-2-7b,a100-80gb,512,40.5,1\nllama-2-7b,a100-80gb,1024,"
      "75.25,1\n"
      "llama-2-7b,a100-80gb,2048,150,1\nllama-2-70b,a100-80gb,2048,380,4\n",
      "k.csv");
  const std::string out = dir_.file("a100-fit.json");
  // Four points: the per-op overhead explains the short prompts' gap significantly (judged where
  // its fit ends up); GEMM efficiency beside it falls short of the 5% point of F(1, 2), 18.5, and
  // is left out unless asked for.
  CliResult r =
      run_cli(dir_, {"calibrate", "--measurements", csv, "--base", "a100-80gb", "--out", out, "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const nlohmann::json out_json = nlohmann::json::parse(r.out);  // a named object: the loop reads into it
  for (const auto& c : out_json["parameters"]) {
    if (c["name"] == "overhead_us") {
      EXPECT_TRUE(c["fitted"].get<bool>()) << c.dump();
    }
    if (c["name"] == "gemm.compute") {
      EXPECT_FALSE(c["fitted"].get<bool>()) << c.dump();
      EXPECT_NE(c["reason"].get<std::string>().find("the 5% point of F(1, 2)"), std::string::npos)
          << c.dump();
    }
  }
  r = run_cli(dir_, {"calibrate", "--measurements", csv, "--base", "a100-80gb", "--fit", "gemm.compute",
                     "--out", out, "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto rep = nlohmann::json::parse(r.out);
  ASSERT_EQ(rep["points"].size(), 4u);
  EXPECT_EQ(rep["points"][3]["tp"], 4);
  EXPECT_EQ(rep["points"][3]["preset"], "llama-2-70b");
  const auto prof = nlohmann::json::parse(slurp_text(out));
  EXPECT_EQ(prof["efficiency"]["default"], false);
  const auto& cal = prof["calibration"];
  EXPECT_EQ(cal["files"][0]["sha256"], "3c34f45a2e15d762b5867fbd0025a3b47968f8f5947e7a017b8dd61d77cd9e9b");
  EXPECT_EQ(cal["cross_validation"], "leave-one-out");
  EXPECT_EQ(cal["ttft_points"], 4);
  EXPECT_GE(cal["fitted"].size(), 1u);
  EXPECT_TRUE(cal["ttft_mape_pct"]["held_out"].is_number());
  EXPECT_NE(prof["sources"]["efficiency"].get<std::string>().find("held-out TTFT MAPE"), std::string::npos);
  // The fitted profile is a profile.
  r = run_cli(dir_, {"simulate", "--prune", "none", "--prompt-tokens", "1000", "--model-config", "llama-2-7b",
                     "--hw", out});
  EXPECT_TRUE(r.exited && r.code == 0) << describe(r);

  // The published TensorRT-LLM table: its "A100" must be mapped to a profile.
  const std::string trt =
      std::string(LP_SOURCE_DIR) + "/tests/fixtures/measurements/trtllm-v0.5-first-token.csv";
  r = run_cli(dir_, {"calibrate", "--measurements", trt, "--base", "a100-80gb", "--hw-map", "A100=a100-80gb",
                     "--out", dir_.file("trt.json")});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_NE(r.out.find("skipped: 4 on h100-sxm"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("held out (leave-one-out)"), std::string::npos) << r.out;
}

// Our own GPU measurements (tests/fixtures/measurements/README.md): SmolLM2-135M runs and the
// Llama-3.1-8B shape of lp_gpu_bench on one H100. The datasheet profile misses them by ~77% (our
// attention runs on CUDA cores in f32, and the tiny model's kernels are launch-bound); fitted on
// both models it must hold every point out within reach (5.9% measured when the fixture was made).
TEST_F(CliSim, CalibrateOnMeasuredH100RunsOfTwoModels) {
  const std::string csv = std::string(LP_SOURCE_DIR) + "/tests/fixtures/measurements/lazyprefill-h100.csv";
  const std::string out = dir_.file("h100.json");
  const auto r = run_cli(dir_, {"calibrate", "--measurements", csv, "--base", "h100-sxm", "--engine",
                                "lazyprefill", "--out", out, "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto cal = nlohmann::json::parse(slurp_text(out))["calibration"];
  EXPECT_EQ(cal["ttft_points"], 21);
  EXPECT_EQ(cal["decode_points"], 5);
  EXPECT_GT(cal["ttft_mape_pct"]["base"].get<double>(), 50);
  EXPECT_LT(cal["ttft_mape_pct"]["held_out"].get<double>(), 8);
  EXPECT_LT(cal["decode_mape_pct"]["held_out"].get<double>(), 12);
}

// Issue 55's goal for pruned runs: the dense runs of our H100 fixture and one pruned prompt
// length (SmolLM2-135M, LazyLLM at 1,864 tokens, three rounds) fitted with the parameters the
// selection picks; the other lengths' pruned TTFTs (462-7,641 tokens, measured, the mean of
// their rounds) predicted within 5% each (0.2-3.3% when this was written). About 2 s: the
// stepwise fit's leave-one-out refits and four simulations.
TEST_F(CliSim, CalibrateOnDenseRunsAndOnePrunedRunPredictsTheOthers) {
  const std::string fixture =
      std::string(LP_SOURCE_DIR) + "/tests/fixtures/measurements/lazyprefill-h100.csv";
  std::istringstream in(slurp_text(fixture));
  std::string train, line;
  std::map<int64_t, std::vector<double>> pruned;  // prompt tokens -> measured TTFTs
  while (std::getline(in, line)) {
    const bool smollm_lazyllm =
        line.rfind("smollm2-135m,", 0) == 0 && line.find("lazyllm") != std::string::npos;
    if (smollm_lazyllm) {
      std::vector<std::string> f;
      std::stringstream cells(line);
      for (std::string c; std::getline(cells, c, ',');) f.push_back(c);
      const int64_t n = std::stoll(f[7]);
      if (n != 1864) {
        pruned[n].push_back(std::stod(f[8]));
        continue;
      }
    } else if (line.find("lazyllm") != std::string::npos || line.find("static") != std::string::npos) {
      continue;  // the other pruned rows stay out of the fit
    }
    train += line + "\n";
  }
  ASSERT_EQ(pruned.size(), 4u);
  const std::string csv = write_text(train, "dense-and-one-pruned.csv"), out = dir_.file("fit.json");
  const CliResult r = run_cli(dir_, {"calibrate", "--measurements", csv, "--base", "h100-sxm", "--engine",
                                     "lazyprefill", "--out", out});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  EXPECT_NE(r.out.find("pruning.key_ns"), std::string::npos);
  for (const auto& [n, ms] : pruned) {
    const CliResult p = run_cli(
        dir_, {"simulate", "--hw", out, "--model-config", "smollm2-135m", "--prompt-tokens",
               std::to_string(n), "--prune", "lazyllm", "--schedule", "0.3:0.3,0.6:0.3,0.9:0.3", "--json"});
    ASSERT_TRUE(p.exited && p.code == 0) << describe(p);
    const double predicted = nlohmann::json::parse(p.out)["results"].back()["ttft_ms"].get<double>();
    double measured = 0;
    for (const double m : ms) measured += m / double(ms.size());
    EXPECT_NEAR(predicted / measured, 1.0, 0.05)
        << n << " tokens: predicted " << predicted << " ms, measured " << measured << " ms";
  }
}

TEST_F(CliSim, CalibrateFromMeasurementsRefusesBadInput) {
  const std::string out = dir_.file("never.json");
  const auto calibrate = [&](const std::string& text, std::vector<std::string> extra = {}) {
    const std::string f = write_text(text, "m.csv");
    std::vector<std::string> args = {"calibrate", "--measurements", f, "--base", "h100-sxm", "--out", out};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(dir_, args);
  };
  const std::string head = "model,hardware,prompt_tokens,ttft_ms,tp\n";
  // 1.3 times the base profile's predictions: a gemm.compute (or overhead) fit explains them.
  const std::string ok =
      head +
      "llama-2-7b,h100-sxm,512,17.82,1\nllama-2-7b,h100-sxm,1024,33.29,1\nllama-2-7b,h100-sxm,2048,64.77,1\n";
  expect_one_line_error(
      calibrate(ok + "llama-2-7b,NVIDIA H100 PCIe,512,30,1\n"),
      {"m.csv", "record 5", "unknown hardware 'NVIDIA H100 PCIe'", "h100-sxm", "a100-80gb", "--hw-map"});
  expect_one_line_error(calibrate(ok + "Phi-3-mini,h100-sxm,512,10,1\n"),
                        {"m.csv", "record 5", "unknown model 'Phi-3-mini'", "llama-2-7b", "--model-map"});
  expect_one_line_error(calibrate(ok + "llama-2-7b,h100-sxm,512,20,16\n"),
                        {"m.csv", "record 5", "tensor parallelism over 16 GPUs", "max_tp 8"});
  // A pruned record without its schedule, and the same file given twice.
  expect_one_line_error(
      calibrate("model,hardware,prompt_tokens,ttft_ms,method\n" +
                std::string("llama-2-7b,h100-sxm,512,17.82,none\nllama-2-7b,h100-sxm,1024,33.29,none\n") +
                "llama-2-7b,h100-sxm,2048,50,lazyllm\n"),
      {"m.csv", "record 4", "method 'lazyllm' names no schedule"});
  {
    const std::string f = write_text(ok, "twice.csv");
    expect_one_line_error(
        run_cli(dir_, {"calibrate", "--measurements", f, f, "--base", "h100-sxm", "--out", out}),
        {"twice.csv", "same bytes"});
  }
  expect_one_line_error(
      calibrate("model,hardware,prompt_tokens,ttft_ms,ttft_s\nllama-2-7b,h100-sxm,512,20,0.02\n"),
      {"m.csv", "mixed units"});
  expect_one_line_error(calibrate(ok, {"--fit", "gemm.memory"}), {"cannot fit gemm.memory", "decode"});
  expect_one_line_error(calibrate(ok, {"--model-map", "x=llama-9"}), {"llama-9"});
  expect_one_line_error(calibrate(head + "llama-2-7b,h100-sxm,512,20,1\n"), {"at least 3 points"});
  EXPECT_FALSE(std::filesystem::exists(out));  // nothing written by any of them
  // A point measured twice is one point with two repetitions, its time their mean.
  {
    const CliResult rep = calibrate(ok + "llama-2-7b,h100-sxm,512,18.82,1\n", {"--json"});
    ASSERT_TRUE(rep.exited && rep.code == 0) << describe(rep);
    const auto j = nlohmann::json::parse(rep.out);
    EXPECT_EQ(j["repetitions_merged"], 1);
    ASSERT_EQ(j["points"].size(), 3u);
    EXPECT_EQ(j["points"][0]["repetitions"], 2);
    EXPECT_DOUBLE_EQ(j["points"][0]["measured_ms"].get<double>(), (17.82 + 18.82) / 2);
  }
  // A model name the presets know under another spelling is accepted with --model-map.
  const CliResult r =
      calibrate(ok + "Llama-3.2-3B,h100-sxm,4096,133.0,1\n", {"--model-map", "Llama-3.2-3B=llama-2-7b"});
  EXPECT_TRUE(r.exited && r.code == 0) << describe(r);
}

// calibrate-revivals fits the tiny model's LazyLLM traces, writes the model atomically, and the
// model it wrote is what simulate and report use; a model of another layer count needs --map,
// and without it nothing is written.
TEST_F(CliSim, CalibrateRevivalsFitsAndIsUsed) {
  std::vector<std::string> traces;
  for (int k = 0; k < 3; ++k) {
    std::string prompt;
    for (int i = 0; i < 50 + 10 * k; ++i) prompt += i % 3 ? "b a " : "c ";
    const std::string t = dir_.file(fmt::format("r{}.jsonl", k));
    const CliResult r = run_cli(dir_, {"run", "--model", tiny_, "--prompt", prompt, "--max-new-tokens", "6",
                                       "--prune", "lazyllm", "--schedule", "0:0.6", "--trace", t, "--json"});
    ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
    traces.push_back(t);
  }
  const std::string model = dir_.file("rv.json");
  CliResult r = run_cli(dir_, {"calibrate-revivals", traces[0], traces[1], "--held-out", traces[2], "--out",
                               model, "--json", "--compute", "f32"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  const auto m = nlohmann::json::parse(slurp_text(model));
  EXPECT_EQ(m["n_layer"], 2);
  ASSERT_EQ(m["stages"].size(), 1u);
  EXPECT_EQ(m["stages"][0]["points"], 2 * 5);
  ASSERT_EQ(m["traces"].size(), 2u);
  EXPECT_EQ(m["traces"][0]["sha256"].get<std::string>().size(), 64u);
  ASSERT_EQ(j["held_out"].size(), 1u);
  EXPECT_TRUE(j["held_out"][0]["error"].contains("kv"));

  // simulate: the built-in model by default, the file when named, --revival-share 0 as the bound.
  const auto sim = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"simulate",   "--prune",      "lazyllm", "--prompt-tokens",
                                     "2000",       "--new-tokens", "16",      "--model-config",
                                     "llama-2-7b", "--hw",         "l4",      "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult res = run_cli(dir_, args);
    EXPECT_TRUE(res.exited && res.code == 0) << describe(res);
    return nlohmann::json::parse(res.out);
  };
  const auto builtin = sim({}), bound = sim({"--revival-share", "0"}),
             fitted = sim({"--revival-model", model, "--map"});
  EXPECT_NE(builtin["revivals"].get<std::string>().find("built-in"), std::string::npos)
      << builtin["revivals"];
  EXPECT_NE(bound["revivals"].get<std::string>().find("optimistic bound"), std::string::npos)
      << bound["revivals"];
  EXPECT_NE(fitted["revivals"].get<std::string>().find("rv.json"), std::string::npos) << fitted["revivals"];
  // Revivals cost decode time and KV: the bound is the cheapest.
  EXPECT_GT(builtin["results"][0]["decode_step_mean_ms"].get<double>(),
            bound["results"][0]["decode_step_mean_ms"].get<double>());
  EXPECT_GT(builtin["results"][0]["memory_bytes"]["kv"].get<double>(),
            bound["results"][0]["memory_bytes"]["kv"].get<double>());

  // A 2-layer model on a 32-layer target without --map: one line naming the file, nothing written.
  expect_one_line_error(
      run_cli(dir_, {"simulate", "--prune", "lazyllm", "--prompt-tokens", "2000", "--new-tokens", "4",
                     "--model-config", "llama-2-7b", "--hw", "l4", "--revival-model", model}),
      {"rv.json", "2-layer", "32 layers", "--map"});
  const std::string out = dir_.file("rep");
  expect_one_line_error(
      run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4", "--prompt-lengths", "1024",
                     "--new-tokens", "8", "--revival-model", model, "--out", out}),
      {"rv.json", "2-layer", "--map"});
  EXPECT_FALSE(std::filesystem::exists(out));
  r = run_cli(dir_, {"report", "--model-config", "llama-2-7b", "--hw", "l4", "--prompt-lengths", "1024",
                     "--new-tokens", "8", "--prune", "lazyllm", "--out", out, "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto rep = nlohmann::json::parse(r.out);
  EXPECT_NE(rep["provenance"]["methods"][1]["revivals"].get<std::string>().find("built-in"),
            std::string::npos);

  // Bad input to calibrate-revivals itself.
  const std::string none = dir_.file("none.jsonl");
  r = run_cli(dir_,
              {"run", "--model", tiny_, "--prompt", "a b c a b c", "--max-new-tokens", "3", "--trace", none});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const std::string never = dir_.file("never.json");
  expect_one_line_error(run_cli(dir_, {"calibrate-revivals", none, "--out", never}),
                        {"none.jsonl", "no revivals"});
  expect_one_line_error(run_cli(dir_, {"calibrate-revivals", traces[0], traces[0], "--out", never}),
                        {"same trace"});
  expect_one_line_error(run_cli(dir_, {"calibrate-revivals", traces[0], "--held-out", traces[0]}),
                        {"--held-out", "fitted on"});
  expect_one_line_error(
      run_cli(dir_, {"calibrate-revivals", "--revival-model", tiny_, "--held-out", traces[2]}),
      {"tiny.gguf", "not valid JSON"});
  expect_one_line_error(run_cli(dir_, {"calibrate-revivals"}), {"give traces to fit"});
  EXPECT_FALSE(std::filesystem::exists(never));
}

// validate end to end on the tiny model: every pruned case's measured speedup is the median of the
// rounds' paired ratios, inside their range, and the count of predictions inside it adds up.
TEST_F(CliSim, ValidateReportsPairedSpeedupsWithTheirRange) {
  testing::TinyModelSpec spec;
  spec.n_layer = 10;  // the aggressive schedule (0.1, 0.3, 0.5) needs distinct layers
  spec.n_ctx = 512;
  const std::string model = testing::write_tiny_model(dir_.file("tiny4.gguf"), spec);
  // Two rounds give each speedup a range (min <= median <= max) at two thirds of three's cost; the
  // four lengths are a quarter of --quick's (46 s under ASan with those, for the same properties).
  const CliResult r =
      run_cli(dir_, {"validate", "--model", model, "--lengths", "64,128,256,512", "--rounds", "2", "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["lengths"], nlohmann::json::parse("[64, 128, 256, 512]"));
  EXPECT_EQ(j["cases"].size(), 8u);  // the held-out half of 4 lengths x 4 methods
  ASSERT_EQ(j["speedups"].size(), 12u);
  int inside = 0;
  for (const auto& x : j["speedups"]) {
    const double lo = x["measured_speedup_min"], mid = x["measured_speedup"], hi = x["measured_speedup_max"];
    EXPECT_GT(lo, 0) << x.dump();
    EXPECT_LE(lo, mid) << x.dump();
    EXPECT_LE(mid, hi) << x.dump();
    EXPECT_GT(x["measured_speedup_fastest_runs"].get<double>(), 0) << x.dump();
    const double pred = x["predicted_speedup"];
    EXPECT_EQ(x["predicted_within_measured_range"].get<bool>(), pred >= lo && pred <= hi) << x.dump();
    EXPECT_NEAR(x["error_points"].get<double>(), 100 * (pred - mid), 1e-9) << x.dump();
    inside += x["predicted_within_measured_range"].get<bool>();
  }
  EXPECT_EQ(j["speedups_predicted_within_measured_range"].get<int>(), inside);
}

TEST_F(CliErrors, ValidateRoundsOutOfRange) {
  expect_one_line_error(run_cli(dir_, {"validate", "--model", tiny_, "--rounds", "0"}), {"--rounds", "0"});
  expect_one_line_error(run_cli(dir_, {"validate", "--model", tiny_, "--rounds", "21"}), {"--rounds", "21"});
}

TEST_F(CliErrors, ValidateLengthsMustBeDistinctPositiveAndWithinTheContext) {
  expect_one_line_error(run_cli(dir_, {"validate", "--model", tiny_, "--lengths", "64,x"}),
                        {"--lengths", "'x'"});
  expect_one_line_error(run_cli(dir_, {"validate", "--model", tiny_, "--lengths", "64,0"}),
                        {"--lengths", "'0'"});
  expect_one_line_error(run_cli(dir_, {"validate", "--model", tiny_, "--lengths", "64"}),
                        {"--lengths", "two"});
  expect_one_line_error(run_cli(dir_, {"validate", "--model", tiny_, "--lengths", "64,64"}),
                        {"--lengths", "64 twice"});
  expect_one_line_error(run_cli(dir_, {"validate", "--model", tiny_, "--lengths", "64,99999999"}),
                        {"--lengths", "99999999", "context"});
  expect_one_line_error(run_cli(dir_, {"validate", "--model", tiny_, "--lengths", "64,128", "--quick"}),
                        {"--lengths", "--quick"});
  expect_one_line_error(run_cli(dir_, {"validate", "--lengths", "64,128", "--runahead",
                                       LP_SOURCE_DIR "/tests/fixtures/runahead"}),
                        {"--lengths", "--runahead"});
}

}  // namespace
}  // namespace lp
