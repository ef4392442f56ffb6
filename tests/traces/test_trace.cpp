// The trace format: round trip, summary arithmetic, bad files, atomic writes, the optional
// detail (kept positions, scores, revived positions) and a real run writing it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "model/error.h"
#include "tests/gguf_writer.h"
#include "traces/trace.h"

extern char** environ;

namespace lp {
namespace {

// A whole model configuration for a trace header (the reader checks it as the simulator would).
nlohmann::json tiny_model(int n_layer) {
  return {{"arch", "llama"}, {"n_layer", n_layer}, {"n_embd", 8}, {"n_head", 2},
          {"n_head_kv", 1},  {"head_dim", 4},      {"n_ff", 16},  {"n_vocab", 32}};
}

trace::Trace sample() {
  trace::Trace t;
  t.header.n_layer = 3;
  t.header.model = tiny_model(3);
  t.header.policy = "lazyllm";
  t.header.schedule = "0:0.5";
  t.header.schedule_layers = {{0, 0.5}};
  t.header.prompt_tokens = 10;
  trace::Step p{"prefill", 10,        {10, 5, 5}, {10, 5, 5}, {55, 15, 15}, {0, 0, 0},
                {0, 0, 0}, {5, 0, 0}, {},         {},         {},           {}};
  trace::Step d{"decode",  1,         {1, 1, 1}, {11, 6, 6}, {11, 6, 6}, {0, 0, 0},
                {0, 0, 0}, {0, 0, 0}, {},        {},         {},         {}};
  t.steps = {p, d};
  return t;
}

TEST(Trace, RoundTripsAndSummarises) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/t.jsonl";
  trace::write_trace(sample(), path);
  const trace::Trace t = trace::read_trace(path);
  EXPECT_EQ(t.header.policy, "lazyllm");
  EXPECT_EQ(t.header.schedule_layers, (std::vector<std::pair<int, double>>{{0, 0.5}}));
  ASSERT_EQ(t.steps.size(), 2u);
  EXPECT_EQ(t.steps[0].queries, (std::vector<int64_t>{10, 5, 5}));
  EXPECT_EQ(t.steps[1].keys, (std::vector<int64_t>{11, 6, 6}));
  const trace::Summary s = trace::summarize(t);
  // Prefill computed 10 + 5 + 5 = 20 of 30 prompt (token, layer) pairs.
  EXPECT_DOUBLE_EQ(s.prompt_tokens_computed_fraction, 20.0 / 30.0);
  EXPECT_EQ(s.prompt_share_per_layer, (std::vector<double>{1.0, 0.5, 0.5}));
  // Whole generation: 20 + 3 of 11 tokens x 3 layers.
  EXPECT_DOUBLE_EQ(s.all_share, 23.0 / 33.0);
  // The paper's figure: the decoding step revived nothing, so still 20 of 30.
  EXPECT_DOUBLE_EQ(s.prompt_tokens_computed_fraction_after_generation, 20.0 / 30.0);
  // A decoding step that brings 2 revived prompt tokens back at layers 1 and 2: 24 of 30.
  trace::Trace r = t;
  r.steps[1].queries = {1, 3, 3};
  r.steps[1].revived = {0, 2, 0};
  EXPECT_DOUBLE_EQ(trace::summarize(r).prompt_tokens_computed_fraction_after_generation, 24.0 / 30.0);
  EXPECT_TRUE(s.at_most_once);
  EXPECT_EQ(s.kv_tokens_final, 23);
  EXPECT_EQ(s.aux_writes, 5);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// Traces written before the paper's baselines existed name the ablations "static" and "random":
// they read as today's names. A random-drop trace's dropped tokens count as computed nowhere.
TEST(Trace, OldPolicyNamesAndDroppedTokens) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/t.jsonl";
  trace::Trace t = sample();
  for (const auto& [old, now] : {std::pair{"static", "frozen"}, std::pair{"random", "random-layers"}}) {
    t.header.policy = old;
    trace::write_trace(t, path);
    EXPECT_EQ(trace::read_trace(path).header.policy, now);
  }
  t.header.policy = "fastest";
  trace::write_trace(t, path);
  EXPECT_THROW(trace::read_trace(path), Error);
  // 10 tokens seen of 15 given: the same 20 pairs of 3 layers over 15 tokens.
  t.header.policy = "random-drop";
  t.header.prompt_tokens_dropped = 5;
  trace::write_trace(t, path);
  const trace::Trace back = trace::read_trace(path);
  EXPECT_EQ(back.header.prompt_tokens_dropped, 5);
  EXPECT_DOUBLE_EQ(trace::summarize(back).prompt_tokens_computed_fraction, 20.0 / 45.0);
  EXPECT_DOUBLE_EQ(trace::prompt_computed_fraction(back), 20.0 / 45.0);
}

TEST(Trace, AtMostOnceFailsWhenALayerComputesTooMuch) {
  trace::Trace t = sample();
  t.steps[1].queries = {1, 9, 1};  // 5 + 9 > 11 tokens at layer 1
  EXPECT_FALSE(trace::summarize(t).at_most_once);
}

TEST(Trace, BadFilesGiveOneClearError) {
  testing::TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir.path() + "/" + name) << text;
    return dir.path() + "/" + name;
  };
  auto expect_error = [](const std::string& path, const std::string& what) {
    try {
      trace::read_trace(path);
      ADD_FAILURE() << "no error for " << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error(dir.path() + "/missing.jsonl", "cannot read trace");
  expect_error(write("empty", ""), "empty file");
  expect_error(write("notjson", "hello\n"), "not a lazyprefill trace");
  testing::TempDir d2;
  const std::string good = d2.path() + "/g.jsonl";
  trace::write_trace(sample(), good);
  std::ifstream in(good);
  std::string head, s1;
  std::getline(in, head);
  std::getline(in, s1);
  std::string v2 = head;
  v2.replace(v2.find("\"lazyprefill_trace\":1"), 21, "\"lazyprefill_trace\":2");
  expect_error(write("v2", v2 + "\n" + s1 + "\n"), "version 2");
  expect_error(write("nosteps", head + "\n"), "no steps");
  std::string short_arr = s1;
  short_arr.replace(short_arr.find("\"queries\":[10,5,5]"), 18, "\"queries\":[10,5]");
  expect_error(write("short", head + "\n" + short_arr + "\n"), "'queries' has 2 entries");
  expect_error(write("garbage", head + "\n{oops\n"), "line 2: not a JSON object");
}

// a trace whose header and body disagree, or whose counts no run can record,
// is refused naming the file, line and field (it used to be summarised and replayed, exit 0).
TEST(Trace, InconsistentTracesAreRefused) {
  testing::TempDir dir;
  const std::string good = dir.file("good.jsonl");
  trace::write_trace(sample(), good);
  std::vector<std::string> lines;
  {
    std::ifstream in(good);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  ASSERT_EQ(lines.size(), 3u);
  int n = 0;
  const auto expect = [&](const std::vector<std::string>& ls, const std::string& what) {
    SCOPED_TRACE(what);
    const std::string path = dir.file("bad" + std::to_string(n++) + ".jsonl");
    {
      std::ofstream out(path);
      for (const auto& l : ls) out << l << '\n';
    }
    try {
      trace::read_trace(path);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  };
  const auto edit = [&](size_t line, const std::function<void(nlohmann::json&)>& f) {
    std::vector<std::string> ls = lines;
    nlohmann::json j = nlohmann::json::parse(ls[line]);
    f(j);
    ls[line] = j.dump();
    return ls;
  };
  expect({lines[0], lines[1]}, "the header says 2 steps but the file holds 1");  // truncated
  expect({lines[0], lines[1], lines[2], lines[2]}, "the header says 2 steps but the file holds more");
  expect({lines[0], lines[2]}, "line 2: the first step must be the prefill");
  expect({lines[0], lines[1], lines[1]}, "line 3: kind 'prefill': every step after the prefill");
  expect(edit(0, [](auto& j) { j["model"]["n_head"] = 0; }), "n_head must be positive");
  expect(edit(0, [](auto& j) { j["model"]["n_head"] = 4294967298ULL; }),
         "field 'n_head' must be a whole number in range, got 4294967298");
  // Found by fuzz_trace: a float where an integer belongs was converted, undefined behaviour.
  expect(edit(0, [](auto& j) { j["model"]["n_head_kv"] = 3.9e19; }),
         "field 'n_head_kv' must be a whole number, got 3.9e+19");
  expect(edit(0, [](auto& j) { j["seed"] = 1e30; }), "seed 1e+30 is not a non-negative integer");
  expect(edit(0, [](auto& j) { j["model"]["rope_theta"] = 1e300; }),
         "rope_theta must be a positive finite number");
  expect(edit(0, [](auto& j) { j["model"]["n_layer"] = 4; }),
         "the header model has 4 layers but n_layer is 3");
  expect(edit(0, [](auto& j) { j["policy"] = "fastest\x1b[2J"; }), "unknown policy 'fastest\\x1b[2J'");
  expect(edit(0, [](auto& j) { j["dtype"] = "bf16\nforged"; }), "dtype 'bf16\\nforged' is not a dtype name");
  expect(edit(0, [](auto& j) { j["schedule_layers"][0]["layer"] = 3; }),
         "layer 3 is outside [0, n_layer = 3)");
  expect(edit(0, [](auto& j) { j["schedule_layers"][0]["share"] = 1.5; }), "share 1.5 is outside [0, 1]");
  expect(edit(0, [](auto& j) { j["prompt_tokens"] = 0; }), "prompt_tokens 0 is out of range");
  expect(edit(0, [](auto& j) { j["steps"] = -1; }), "steps -1 is not a step count");
  expect(edit(1, [](auto& j) { j["new_tokens"] = 9; }),
         "the prefill appends 9 tokens but the header's prompt has 10");
  expect(edit(1, [](auto& j) { j["keys"][1] = 11; }),
         "'keys' at layer 1 is 11, more than the tokens in the context (10)");
  expect(edit(1, [](auto& j) { j["queries"][2] = 12; }), "'queries' at layer 2 is 12");
  expect(edit(2, [](auto& j) { j["revived"][0] = 2; }),
         "'revived' at layer 0 is 2, more than the rows computed there (1)");
  expect(edit(2, [](auto& j) { j["pairs"][0] = 12; }),
         "'pairs' at layer 0 is 12, more than its 1 rows can attend");
  expect(edit(2, [](auto& j) { j["new_tokens"] = 0; }), "line 3: a decoding step appends no token");
}

TEST(Trace, UnwritablePathLeavesNothingBehind) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/no/such/dir/t.jsonl";
  EXPECT_THROW(trace::write_trace(sample(), path), Error);
  EXPECT_FALSE(std::filesystem::exists(path));
  // A directory in the way of the rename: the temporary file is removed.
  const std::string blocked = dir.path() + "/blocked";
  std::filesystem::create_directories(blocked + "/inner");
  EXPECT_THROW(trace::write_trace(sample(), blocked), Error);
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

// ---- the optional detail ------------------------------------------------------------------

// Floats that are awkward to print: they must come back bit for bit.
std::vector<float> awkward_scores(size_t n) {
  const std::vector<float> pool = {0.1f,    1.0f / 3,  1e-30f, std::numeric_limits<float>::denorm_min(),
                                   0.0f,    -0.0f,     1.0f,   std::numeric_limits<float>::max(),
                                   2.5e-8f, 0.999999f, 1e10f,  0.7513864f};
  std::vector<float> v;
  for (size_t i = 0; i < n; ++i) v.push_back(pool[i % pool.size()]);
  return v;
}

// Each listed position's 2 experts of 4: (p, p + 1) mod 4.
trace::Routes routes_of(std::vector<int32_t> positions) {
  trace::Routes r{positions, {}};
  for (const int32_t p : positions) r.experts.insert(r.experts.end(), {p % 4, (p + 1) % 4});
  return r;
}

// Three layers of 4 experts (2 a token), 10 prompt tokens, pruning after layers 0 and 1, then one
// decoding step (the new token at position 10) that revives position 2 at layer 1.
trace::Trace detail_sample() {
  trace::Trace t;
  t.header.n_layer = 3;
  t.header.model = tiny_model(3);
  t.header.model["n_expert"] = 4;
  t.header.model["n_expert_used"] = 2;
  t.header.model["n_ff_exp"] = 8;
  t.header.policy = "lazyllm";
  t.header.schedule = "0:0.5,1:0.4";
  t.header.schedule_layers = {{0, 0.5}, {1, 0.4}};
  t.header.prompt_tokens = 10;
  trace::Step p{"prefill", 10,        {10, 5, 3}, {10, 5, 3}, {55, 15, 6}, {0, 0, 0},
                {0, 0, 0}, {5, 2, 0}, {},         {},         {},          {}};
  p.pruning = {{0, {0, 3, 5, 7, 9}, awkward_scores(10)}, {1, {3, 7, 9}, awkward_scores(5)}};
  trace::Step d{"decode",  1,         {1, 2, 2}, {11, 7, 5}, {11, 12, 8}, {0, 1, 0},
                {0, 1, 0}, {0, 0, 0}, {},        {},         {},          {}};
  d.pruning = {{0, {2, 3, 5, 7, 9, 10}, awkward_scores(11)}, {1, {2, 3, 9, 10}, {}}};
  d.revived_positions = {{{}, {2}, {}}};
  p.routes = {routes_of({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}), routes_of({0, 3, 5, 7, 9}), routes_of({3, 7, 9})};
  d.routes = {routes_of({10}), routes_of({2, 10}), routes_of({2, 10})};
  t.steps = {p, d};
  return t;
}

TEST(Trace, RoundTripsTheOptionalDetail) {
  testing::TempDir dir;
  const std::string path = dir.file("t.jsonl");
  const trace::Trace want = detail_sample();
  trace::write_trace(want, path);
  const trace::Trace t = trace::read_trace(path);
  ASSERT_EQ(t.steps.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(t.steps[i].pruning.has_value());
    ASSERT_EQ(t.steps[i].pruning->size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
      const trace::Pruning &a = (*t.steps[i].pruning)[k], &b = (*want.steps[i].pruning)[k];
      EXPECT_EQ(a.layer, b.layer);
      EXPECT_EQ(a.kept, b.kept);
      ASSERT_EQ(a.scores.size(), b.scores.size());
      for (size_t j = 0; j < a.scores.size(); ++j)  // bit for bit, the sign of zero included
        EXPECT_EQ(std::memcmp(&a.scores[j], &b.scores[j], sizeof(float)), 0)
            << a.scores[j] << " " << b.scores[j];
    }
  }
  EXPECT_FALSE(t.steps[0].revived_positions.has_value());
  EXPECT_EQ(t.steps[1].revived_positions, want.steps[1].revived_positions);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(t.steps[i].routes.has_value());
    for (size_t l = 0; l < 3; ++l) {
      EXPECT_EQ((*t.steps[i].routes)[l].positions, (*want.steps[i].routes)[l].positions);
      EXPECT_EQ((*t.steps[i].routes)[l].experts, (*want.steps[i].routes)[l].experts);
    }
  }
  EXPECT_TRUE(trace::summarize(t).detail);
  // Empty scores are left out of the file; floats are written in their shortest form.
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find(R"({"layer":1,"kept":[2,3,9,10]})"), std::string::npos) << text;
  EXPECT_NE(text.find("[0.1,0.33333334,1e-30,1e-45,0,-0.0,1,3.4028235e+38,"), std::string::npos) << text;
  // Without detail the fields are absent, in the file and after reading.
  trace::write_trace(sample(), path);
  const trace::Trace plain = trace::read_trace(path);
  EXPECT_FALSE(plain.steps[0].pruning.has_value());
  EXPECT_FALSE(plain.steps[1].revived_positions.has_value());
  EXPECT_FALSE(trace::summarize(plain).detail);
}

TEST(Trace, ScoresRoundTripBitForBit) {
  // 4096 scores with random bit patterns (every finite float is allowed), one pruning step.
  trace::Trace t;
  t.header.n_layer = 1;
  t.header.model = tiny_model(1);
  t.header.schedule_layers = {{0, 0.5}};
  t.header.prompt_tokens = 4096;
  trace::Step p{"prefill", 4096, {4096}, {4096}, {4096LL * 4097 / 2}, {0}, {0}, {2048}, {}, {}, {}, {}};
  std::mt19937 rng(7);
  trace::Pruning pr{0, {}, {}};
  for (int32_t i = 0; i < 4096; ++i) {
    if (i % 2 == 1) pr.kept.push_back(i);
    float f;
    do {
      const uint32_t bits = uint32_t(rng());
      std::memcpy(&f, &bits, 4);
    } while (!std::isfinite(f));
    pr.scores.push_back(f);
  }
  p.pruning = {{pr}};
  t.steps = {p};
  testing::TempDir dir;
  trace::write_trace(t, dir.file("t.jsonl"));
  const trace::Trace back = trace::read_trace(dir.file("t.jsonl"));
  const std::vector<float>& got = (*back.steps[0].pruning)[0].scores;
  ASSERT_EQ(got.size(), pr.scores.size());
  EXPECT_EQ(std::memcmp(got.data(), pr.scores.data(), got.size() * sizeof(float)), 0);
}

TEST(Trace, NonFiniteScoresAreNotWritten) {
  testing::TempDir dir;
  trace::Trace t = detail_sample();
  (*t.steps[1].pruning)[0].scores[4] = NAN;
  try {
    trace::write_trace(t, dir.file("t.jsonl"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not finite"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// Writes detail_sample() with step line `step` (0: the prefill, 1: the decoding step) changed by
// `edit`, and expects one error naming that line and containing `what`.
void expect_detail_error(int step, const std::string& what,
                         const std::function<void(nlohmann::json&)>& edit) {
  SCOPED_TRACE(what);
  testing::TempDir dir;
  const std::string path = dir.file("t.jsonl");
  trace::write_trace(detail_sample(), path);
  std::vector<std::string> lines;
  {
    std::ifstream in(path);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  ASSERT_EQ(lines.size(), 3u);
  nlohmann::json j = nlohmann::json::parse(lines[size_t(1 + step)]);
  edit(j);
  lines[size_t(1 + step)] = j.dump();
  {
    std::ofstream out(path);
    for (const auto& l : lines) out << l << '\n';
  }
  try {
    trace::read_trace(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path + ": line " + std::to_string(2 + step) + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(Trace, MalformedDetailIsRejectedNamingTheField) {
  using nlohmann::json;
  // 'pruning' itself.
  expect_detail_error(0, "'pruning' must be an array", [](json& j) { j["pruning"] = 3; });
  expect_detail_error(0, "'pruning' has 1 entries, expected 2", [](json& j) { j["pruning"].erase(1); });
  expect_detail_error(0, "'pruning[1]' must be an object", [](json& j) { j["pruning"][1] = 5; });
  // layer: present, in range, the schedule's.
  expect_detail_error(0, "'pruning[0].layer' must be an integer",
                      [](json& j) { j["pruning"][0].erase("layer"); });
  expect_detail_error(0, "'pruning[1].layer' is 7, outside [0, n_layer = 3)",
                      [](json& j) { j["pruning"][1]["layer"] = 7; });
  expect_detail_error(0, "'pruning[1].layer' is 2, expected 1 (schedule_layers[1])",
                      [](json& j) { j["pruning"][1]["layer"] = 2; });
  // kept: integers, ascending, unique, inside the context, among the tokens active before it.
  expect_detail_error(0, "missing 'pruning[0].kept'", [](json& j) { j["pruning"][0].erase("kept"); });
  expect_detail_error(0, "'pruning[0].kept' must be an array",
                      [](json& j) { j["pruning"][0]["kept"] = "all"; });
  expect_detail_error(0, "'pruning[0].kept' must hold integer positions",
                      [](json& j) { j["pruning"][0]["kept"][2] = 4.5; });
  expect_detail_error(0, "'pruning[0].kept' must be ascending without repeats (3 after 5)", [](json& j) {
    j["pruning"][0]["kept"] = {0, 5, 3, 7, 9};
  });
  expect_detail_error(0, "'pruning[0].kept' must be ascending without repeats (3 after 3)", [](json& j) {
    j["pruning"][0]["kept"] = {0, 3, 3, 7, 9};
  });
  expect_detail_error(0, "'pruning[0].kept' holds position -1, outside the context [0, 10)", [](json& j) {
    j["pruning"][0]["kept"] = {-1, 3, 5, 7, 9};
  });
  expect_detail_error(0, "'pruning[0].kept' holds position 10, outside the context [0, 10)", [](json& j) {
    j["pruning"][0]["kept"] = {0, 3, 5, 7, 10};
  });
  expect_detail_error(1, "'pruning[0].kept' holds position 11, outside the context [0, 11)",
                      [](json& j) { j["pruning"][0]["kept"] = {2, 3, 5, 7, 9, 11}; });
  expect_detail_error(1, "'pruning[1].kept' holds positions that were not active before it", [](json& j) {
    j["pruning"][1]["kept"] = {2, 3, 4, 10};
  });
  // The prefill's kept tokens are the next layer's queries.
  expect_detail_error(0, "'pruning[0].kept' has 4 positions but 'queries' at layer 1 is 5", [](json& j) {
    j["pruning"][0]["kept"] = {0, 3, 7, 9};
  });
  // scores: one per token active before the selection, finite numbers.
  expect_detail_error(0, "'pruning[0].scores' has 9 entries, expected 10",
                      [](json& j) { j["pruning"][0]["scores"].erase(0); });
  expect_detail_error(1, "'pruning[1].scores' has 5 entries, expected 6", [](json& j) {
    j["pruning"][1]["scores"] = {1, 2, 3, 4, 5};
  });
  expect_detail_error(0, "'pruning[1].scores' must be an array",
                      [](json& j) { j["pruning"][1]["scores"] = 0.5; });
  expect_detail_error(0, "'pruning[1].scores' must hold finite numbers",
                      [](json& j) { j["pruning"][1]["scores"][3] = "x"; });
  expect_detail_error(0, "'pruning[1].scores' must hold finite numbers",
                      [](json& j) { j["pruning"][1]["scores"][3] = nullptr; });
  // 1e300 is a finite double but not a finite float.
  expect_detail_error(0, "'pruning[1].scores' must hold finite numbers",
                      [](json& j) { j["pruning"][1]["scores"][3] = 1e300; });
  // revived_positions: n_layer arrays of positions, as many as 'revived' says.
  expect_detail_error(1, "'revived_positions' must be an array", [](json& j) { j["revived_positions"] = 0; });
  expect_detail_error(1, "'revived_positions' has 2 entries, expected n_layer = 3",
                      [](json& j) { j["revived_positions"].erase(2); });
  expect_detail_error(1, "'revived_positions[1]' has 0 positions but 'revived' at layer 1 is 1",
                      [](json& j) { j["revived_positions"][1] = json::array(); });
  expect_detail_error(1, "'revived_positions[1]' holds position 12, outside the context [0, 11)",
                      [](json& j) { j["revived_positions"][1] = {12}; });
  expect_detail_error(1, "'revived_positions[2]' must hold integer positions",
                      [](json& j) { j["revived_positions"][2] = {"2"}; });
  // routes: n_layer objects, the layer's computed rows and n_expert_used experts each, below n_expert.
  expect_detail_error(0, "'routes' must be an array of n_layer = 3 entries",
                      [](json& j) { j["routes"].erase(1); });
  expect_detail_error(0, "'routes[1]' must be an object with 'positions' and 'experts' arrays",
                      [](json& j) { j["routes"][1].erase("experts"); });
  expect_detail_error(0, "'routes[2].positions' has 2 positions but 'queries' at layer 2 is 3", [](json& j) {
    j["routes"][2]["positions"] = {3, 7};
  });
  expect_detail_error(1, "'routes[1].positions' holds position 11, outside the context [0, 11)", [](json& j) {
    j["routes"][1]["positions"] = {2, 11};
  });
  expect_detail_error(0, "'routes[2].experts' has 5 entries, expected 6 (2 per position)",
                      [](json& j) { j["routes"][2]["experts"].erase(0); });
  expect_detail_error(0, "'routes[0].experts' must hold expert numbers in [0, 4)",
                      [](json& j) { j["routes"][0]["experts"][3] = 4; });
  expect_detail_error(0, "'routes[0].experts' must hold expert numbers in [0, 4)",
                      [](json& j) { j["routes"][0]["experts"][3] = -1; });
}

// Routes in a trace whose model has no experts are refused.
TEST(Trace, RoutesNeedAModelWithExperts) {
  testing::TempDir dir;
  const std::string path = dir.file("t.jsonl");
  trace::Trace t = detail_sample();
  t.header.model = tiny_model(3);
  trace::write_trace(t, path);
  try {
    trace::read_trace(path);
    ADD_FAILURE() << "read a trace with routes and no experts";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("'routes' needs the header's model to have n_expert and n_expert_used"),
        std::string::npos)
        << e.what();
  }
}

// ---- a real run through the CLI -----------------------------------------------------------

struct CliRun {
  int code = -1;  // exit status; -1 when killed by a signal
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs the lazyprefill binary (LP_TEST_CLI overrides it) with `args` on one thread, stdout and
// stderr into files under `dir`.
CliRun run_cli(const testing::TempDir& dir, std::vector<std::string> args) {
  const char* env = std::getenv("LP_TEST_CLI");
  const std::string exe = env && *env ? env : LP_CLI_PATH;
  if (!args.empty() && args[0] == "run") args.insert(args.end(), {"--threads", "1"});
  args.insert(args.begin(), exe);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string out = dir.file("stdout.txt"), err = dir.file("stderr.txt");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  CliRun r;
  if (rc != 0) {
    ADD_FAILURE() << "posix_spawn " << exe << ": " << std::strerror(rc);
    return r;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

std::string repeated(const std::string& word, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += word;
  return s;
}

TEST(TraceCli, DetailAgreesWithTheCounts) {
  // The tiny model has 2 layers; pruning half after layer 0, so layer 1 computes what is kept.
  testing::TempDir dir;
  const std::string model = testing::write_tiny_model(dir.file("tiny.gguf"));
  const std::string path = dir.file("run.jsonl");
  const CliRun r = run_cli(
      dir, {"run", "--model", model, "--prompt", repeated("a ", 40), "--max-new-tokens", "5", "--prune",
            "lazyllm", "--schedule", "0:0.5", "--trace", path, "--trace-detail", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_GE(j["trace_write_ms"].get<double>(), 0.0);
  const trace::Trace t = trace::read_trace(path);  // validates every detail field
  ASSERT_EQ(t.steps.size(), 5u);
  ASSERT_EQ(t.header.schedule_layers.size(), 1u);
  int64_t context = 0;
  std::set<int32_t> has_kv1;  // positions holding K/V at layer 1
  for (size_t i = 0; i < t.steps.size(); ++i) {
    SCOPED_TRACE(i);
    const trace::Step& s = t.steps[i];
    context += s.new_tokens;
    ASSERT_TRUE(s.pruning.has_value());
    ASSERT_EQ(s.pruning->size(), 1u);
    const trace::Pruning& last = s.pruning->back();  // the last pruning layer
    EXPECT_EQ(last.layer, 0);
    EXPECT_EQ(int64_t(last.scores.size()), context);  // lazyllm scores every token at layer 0
    EXPECT_EQ(int64_t(last.kept.size()), context - context / 2);
    EXPECT_EQ(last.kept.back(), context - 1);  // the newest token is never pruned
    if (i == 0) {
      EXPECT_EQ(s.queries[1], int64_t(last.kept.size()));  // the layer after it computes the kept tokens
      EXPECT_FALSE(s.revived_positions.has_value());
    } else {
      // Decoding: layer 1 computes the new token and the kept tokens without K/V there, which
      // are exactly the revived ones.
      ASSERT_TRUE(s.revived_positions.has_value());
      std::vector<int32_t> missing;
      for (int32_t p : last.kept)
        if (!has_kv1.count(p) && p != context - 1) missing.push_back(p);
      EXPECT_EQ((*s.revived_positions)[1], missing);
      EXPECT_TRUE((*s.revived_positions)[0].empty());
      EXPECT_EQ(s.queries[1], 1 + int64_t(missing.size()));
    }
    has_kv1.insert(last.kept.begin(), last.kept.end());
    EXPECT_EQ(s.keys[1], int64_t(has_kv1.size()));
  }
  const CliRun ri = run_cli(dir, {"inspect", "--trace", path, "--json"});
  ASSERT_EQ(ri.code, 0) << ri.err;
  EXPECT_EQ(nlohmann::json::parse(ri.out)["detail"], true);
  const CliRun rt = run_cli(dir, {"inspect", "--trace", path});
  EXPECT_NE(rt.out.find("with detail"), std::string::npos) << rt.out;
}

TEST(TraceCli, DetailIsOptional) {
  testing::TempDir dir;
  const std::string model = testing::write_tiny_model(dir.file("tiny.gguf"));
  const std::string path = dir.file("run.jsonl");
  std::vector<std::string> base = {
      "run", "--model", model, "--prompt", repeated("a ", 20), "--max-new-tokens", "3"};
  base.insert(base.end(), {"--prune", "random-layers", "--schedule", "0:0.5", "--trace", path});
  // Without --trace-detail: counts only.
  CliRun r = run_cli(dir, base);
  ASSERT_EQ(r.code, 0) << r.err;
  std::string text = slurp(path);
  EXPECT_EQ(text.find("pruning"), std::string::npos);
  EXPECT_EQ(text.find("revived_positions"), std::string::npos);
  CliRun ri = run_cli(dir, {"inspect", "--trace", path, "--json"});
  EXPECT_EQ(nlohmann::json::parse(ri.out)["detail"], false);
  // With it, under a policy that does not score: kept positions, no scores.
  std::vector<std::string> detail = base;
  detail.push_back("--trace-detail");
  r = run_cli(dir, detail);
  ASSERT_EQ(r.code, 0) << r.err;
  text = slurp(path);
  EXPECT_NE(text.find("\"pruning\":[{\"layer\":0,\"kept\":["), std::string::npos);
  EXPECT_EQ(text.find("scores"), std::string::npos);
  const trace::Trace t = trace::read_trace(path);
  EXPECT_TRUE(trace::summarize(t).detail);
  EXPECT_TRUE((*t.steps[0].pruning)[0].scores.empty());
  // --trace-detail needs --trace: a usage error, one line.
  r = run_cli(dir, {"run", "--model", model, "--prompt", "the cat", "--trace-detail"});
  EXPECT_GT(r.code, 0);
  EXPECT_NE(r.err.find("--trace-detail requires --trace"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace
}  // namespace lp
