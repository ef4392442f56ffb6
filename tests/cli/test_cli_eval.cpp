// `lazyprefill eval` through the real binary: JSON and charts on the tiny model, bad input, and
// an unpruned eval that answers exactly like `run` on the real model.
#include <set>

#include "evals/tasks.h"
#include "model/gguf.h"
#include "model/vocab.h"
#include "tests/cli/cli_harness.h"

namespace lp {
namespace {

using namespace cli_test;

class CliEval : public CliErrors {
 protected:
  std::string six_layers() {
    TinyModelSpec s;
    s.n_layer = 6;
    return testing::write_tiny_model(dir_.file("six.gguf"), s);
  }
};

TEST_F(CliEval, WritesJsonAndChartsOnTheTinyModel) {
  const std::string out = dir_.file("ev");
  CliResult r = run_cli(dir_, {"eval", "--model", six_layers(), "--task", "kv,nll", "--lengths", "300",
                               "--samples", "2", "--prune", "lazyllm,random-layers", "--schedule",
                               "0.3:0.3,0.6:0.3", "--threads", "1", "--out", out, "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j, nlohmann::json::parse(slurp_text(out + "/eval.json")));
  ASSERT_EQ(j["results"].size(), 2u);
  for (const auto& res : j["results"]) {
    EXPECT_EQ(res["methods"].size(), 2u);
    EXPECT_EQ(res["samples"].size(), 2u);
    EXPECT_DOUBLE_EQ(res["baseline"]["prompt_tokens_computed_fraction"].get<double>(), 1.0);
    EXPECT_LT(res["methods"][0]["prompt_tokens_computed_fraction"].get<double>(), 1.0);
    // The layers the schedule resolved to: 0.3 of 6 -> 1.8 -> 2 -> layer 1; 0.6 -> 3.6 -> 4 -> layer 3.
    EXPECT_EQ(res["methods"][0]["layers"], nlohmann::json::parse("[[1, 0.3], [3, 0.3]]"));
    EXPECT_EQ(res["baseline"]["layers"], nlohmann::json::array());
    const std::string svg =
        slurp_text(fmt::format("{}/speed-accuracy-{}-300.svg", out, res["task"].get<std::string>()));
    EXPECT_TRUE(svg.starts_with("<svg") || svg.starts_with("<?xml")) << svg.substr(0, 80);
  }
  EXPECT_EQ(j["results"][0]["task"], "kv");
  EXPECT_DOUBLE_EQ(j["results"][0]["chance_accuracy"].get<double>(), 0.25);
  EXPECT_FALSE(j["results"][0]["samples"][0].contains("prompt"));  // only with --with-prompts
  EXPECT_TRUE(j["results"][1]["baseline"].contains("nll_mean"));
  // One progress line per sample on stderr.
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 4) << r.err;
}

// The paper's baselines: each policy takes the --schedule values that fit it; random-drop's accuracy
// is averaged over --drop-seeds seeds per sample, so it moves in steps of 1 / (samples x seeds).
TEST_F(CliEval, PapersBaselinesTakeTheirSchedulesAndRandomDropAveragesItsSeeds) {
  const CliResult r = run_cli(dir_, {"eval",
                                     "--model",
                                     six_layers(),
                                     "--task",
                                     "kv",
                                     "--lengths",
                                     "300",
                                     "--samples",
                                     "2",
                                     "--prune",
                                     "random-drop,static-paper",
                                     "--schedule",
                                     "0.3",
                                     "--schedule",
                                     "2:0.5",
                                     "--drop-seeds",
                                     "3",
                                     "--threads",
                                     "1",
                                     "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["drop_seeds"], 3);
  const auto& methods = j["results"][0]["methods"];
  ASSERT_EQ(methods.size(), 2u);
  EXPECT_EQ(methods[0]["method"], "random-drop 0.3");
  EXPECT_EQ(methods[1]["method"], "static-paper 2:0.5");
  const double acc = methods[0]["accuracy"].get<double>() * 6;
  EXPECT_NEAR(acc, std::round(acc), 1e-9);
  // random-drop computes 1 - floor(0.3 T) / T of the prompt, T the sample's tokens.
  for (const auto& s : j["results"][0]["samples"]) {
    const double T = s["tokens"].get<double>();
    EXPECT_NEAR(s["methods"][0]["share"].get<double>(), (T - std::floor(0.3 * T)) / T, 1e-12);
  }
}

// The LazyLLM paper's Figure 6 grid: 25 single-layer schedules (5 depths x 5 shares kept), LazyLLM
// only unless --prune says otherwise, and one grid chart per task and length.
TEST_F(CliEval, SingleLayerGridIsThePapersFigureSix) {
  const std::string out = dir_.file("grid");
  const CliResult r =
      run_cli(dir_, {"eval", "--model", six_layers(), "--task", "nll", "--lengths", "300", "--samples", "1",
                     "--grid", "single-layer", "--threads", "1", "--out", out, "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto methods = nlohmann::json::parse(r.out)["results"][0]["methods"];
  ASSERT_EQ(methods.size(), 25u);
  std::set<std::string> schedules;
  for (const auto& m : methods) {
    EXPECT_EQ(m["policy"], "lazyllm");
    const std::string sched = m["schedule"].get<std::string>();
    EXPECT_EQ(std::count(sched.begin(), sched.end(), ':'), 1) << sched;  // one pruning layer
    schedules.insert(sched);
  }
  EXPECT_EQ(schedules.size(), 25u);
  EXPECT_TRUE(schedules.count("0.1:0.9"));  // after 10% of the depth, keep 10%
  EXPECT_TRUE(schedules.count("0.9:0.1"));  // after 90%, keep 90%
  const std::string svg = slurp_text(out + "/grid-single-layer-nll-300-lazyllm.svg");
  EXPECT_NE(svg.find("pruned after 50% of the layers"), std::string::npos);
  // Not with --schedule; only the named grid.
  expect_one_line_error(run_cli(dir_, {"eval", "--model", six_layers(), "--lengths", "300", "--grid",
                                       "single-layer", "--schedule", "0.5:0.5"}),
                        {"--schedule"});
  expect_one_line_error(
      run_cli(dir_, {"eval", "--model", six_layers(), "--lengths", "300", "--grid", "figure9"}), {"--grid"});
}

TEST_F(CliEval, BadInput) {
  const std::string six = six_layers(), out = dir_.file("ev");
  const auto eval = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"eval", "--model", six, "--threads", "1", "--out", out};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_cli(dir_, args);
  };
  CliResult r = eval({"--task", "squad", "--lengths", "300"});
  expect_one_line_error(r, {"unknown task 'squad'", "passkey, kv, mdqa, nll"});
  EXPECT_EQ(r.code, 2);
  r = eval({"--lengths", "600"});
  expect_one_line_error(r, {"600 tokens", "context of 512 tokens"});
  EXPECT_EQ(r.code, 2);
  expect_one_line_error(eval({"--lengths", "300", "--samples", "0"}), {"--samples: Value 0 not in range"});
  expect_one_line_error(eval({"--lengths", "300", "--schedule", "9:0.5"}), {"'9:0.5'", "6-layer model"});
  expect_one_line_error(eval({"--lengths", "300,many"}), {"--lengths", "'many'"});
  expect_one_line_error(eval({"--lengths", "300,200,300"}), {"--lengths lists 300 twice"});
  expect_one_line_error(eval({"--lengths", "300", "--agreement-tokens", "9"}), {"--agreement-tokens"});
  expect_one_line_error(eval({"--lengths", "300", "--prune", "lazy"}), {"lazy"});
  expect_one_line_error(eval({"--lengths", "300", "--prune", "random-drop", "--drop-seeds", "0"}),
                        {"--drop-seeds"});
  expect_one_line_error(eval({"--lengths", "300", "--prune", "static-paper", "--schedule", "6:0.5"}),
                        {"'6:0.5'", "6-layer model"});
  expect_one_line_error(eval({"--lengths", "300", "--prune", "random-drop", "--schedule", "1.5"}), {"1.5"});
  expect_one_line_error(eval({"--lengths", "300", "--corpus", "/no/such/text.txt"}), {"/no/such/text.txt"});
  // The default schedules need at least 4 layers; the 2-layer model says so.
  expect_one_line_error(run_cli(dir_, {"eval", "--model", tiny_, "--lengths", "300", "--out", out}),
                        {"does not fit this 2-layer model"});
  EXPECT_FALSE(std::filesystem::exists(out + "/eval.json"));
}

// The eval path with --prune none is the plain `run`: same prompt tokens, same greedy answer. One
// sample of kv and of mdqa (a `run` process per sample, each loading the model: 13 s here, 104 s
// under ASan with two samples each, issue 49; 64 s with one of three tasks each, so passkey, whose
// prompt tests/evals checks, was left out in issue 52).
TEST_F(CliEval, UnprunedEvalAnswersExactlyLikeRunOnTheRealModel) {
  const std::string model = testing::real_model_path();
  CliResult r =
      run_cli(dir_, {"eval", "--model", model, "--task", "kv,mdqa", "--lengths", "400", "--samples", "1",
                     "--prune", "none", "--seed", "3", "--threads", "1", "--with-prompts", "--json"});
  ASSERT_TRUE(r.exited && r.code == 0) << describe(r);
  const auto j = nlohmann::json::parse(r.out);
  const Tokenizer tok(vocab_from_gguf(GgufFile::open(model)));
  const eval::Corpus corpus = eval::load_corpus(eval::default_corpus_path());
  int compared = 0;
  for (const auto& res : j["results"]) {
    const eval::TaskInfo& info = eval::task_info(res["task"].get<std::string>());
    const auto samples = eval::make_samples(info.task, corpus, tok, 400, 1, 3);
    for (const auto& s : res["samples"]) {
      const eval::Sample& sample = samples[s["index"].get<size_t>()];
      EXPECT_EQ(s["answer"], sample.answer);
      EXPECT_EQ(s["prompt"], sample.prompt);
      const std::string prompt = write_text(sample.prompt, "prompt.txt");
      const CliResult run = run_cli(dir_, {"run", "--model", model, "--prompt-file", prompt,
                                           "--max-new-tokens", "8", "--threads", "1", "--json"});
      ASSERT_TRUE(run.exited && run.code == 0) << describe(run);
      const auto rj = nlohmann::json::parse(run.out);
      EXPECT_EQ(rj["prompt_tokens"].get<int64_t>(), s["tokens"].get<int64_t>());
      EXPECT_EQ(rj["text"], s["none"]["generated"]);
      EXPECT_EQ(eval::answer_correct(info.task, rj["text"].get<std::string>(), sample.answer),
                s["none"]["correct"].get<bool>());
      ++compared;
    }
  }
  EXPECT_EQ(compared, 2);  // kv and mdqa (passkey's prompt is built as kv's; tests/evals checks it)
}

}  // namespace
}  // namespace lp
