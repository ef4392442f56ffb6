// The trace format: round trip, summary arithmetic, bad files, atomic writes.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "model/error.h"
#include "tests/gguf_writer.h"
#include "traces/trace.h"

namespace lp {
namespace {

trace::Trace sample() {
  trace::Trace t;
  t.header.n_layer = 3;
  t.header.model = {{"n_layer", 3}, {"n_embd", 8}, {"n_head_kv", 1}, {"head_dim", 4}};
  t.header.policy = "lazyllm";
  t.header.schedule = "0:0.5";
  t.header.schedule_layers = {{0, 0.5}};
  t.header.prompt_tokens = 10;
  trace::Step p{"prefill", 10, {10, 5, 5}, {10, 5, 5}, {55, 15, 15}, {0, 0, 0}, {0, 0, 0}, {5, 0, 0}};
  trace::Step d{"decode", 1, {1, 1, 1}, {11, 6, 6}, {11, 6, 6}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}};
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
  EXPECT_DOUBLE_EQ(s.prompt_share, 20.0 / 30.0);
  EXPECT_EQ(s.prompt_share_per_layer, (std::vector<double>{1.0, 0.5, 0.5}));
  // Whole generation: 20 + 3 of 11 tokens x 3 layers.
  EXPECT_DOUBLE_EQ(s.generation_share, 23.0 / 33.0);
  EXPECT_TRUE(s.at_most_once);
  EXPECT_EQ(s.kv_tokens_final, 23);
  EXPECT_EQ(s.aux_writes, 5);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
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

}  // namespace
}  // namespace lp
