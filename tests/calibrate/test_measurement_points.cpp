// calibrate --measurements before the fit (calibrate/measurement_points.h), on typed inputs: each
// file hashed as its bytes are, the same bytes twice refused, and per record the reason it is
// used or left out.
#include <gtest/gtest.h>

#include <filesystem>

#include "calibrate/measurement_points.h"
#include "model/digest.h"
#include "model/error.h"
#include "tests/gguf_writer.h"

namespace lp::calib {
namespace {

const std::string kFixtures = std::string(LP_SOURCE_DIR) + "/tests/fixtures/measurements/";

TEST(MeasurementPoints, EachFileIsHashedAndTheSameBytesTwiceRefused) {
  const MeasurementSet set =
      read_measurement_set({kFixtures + "vllm-latency-h100.json", kFixtures + "lazyprefill-h100.csv"});
  ASSERT_EQ(set.files.size(), 2u);
  EXPECT_EQ(set.files[0].sha256, sha256_file_hex(kFixtures + "vllm-latency-h100.json"));
  ASSERT_EQ(set.files[0].side_files.size(), 1u);  // vLLM's <stem>.pytorch.json, read beside it
  EXPECT_EQ(set.files[0].side_files[0].second, sha256_file_hex(kFixtures + "vllm-latency-h100.pytorch.json"));
  EXPECT_EQ(set.files[1].sha256, sha256_file_hex(kFixtures + "lazyprefill-h100.csv"));
  size_t records = 0;
  for (const MeasurementFile& f : set.files) records += f.records;
  EXPECT_EQ(set.records.size() + size_t(set.repeated), records);
  // A copy under another name is still the same bytes.
  testing::TempDir d;
  std::filesystem::copy_file(kFixtures + "plain.csv", d.file("copy.csv"));
  try {
    (void)read_measurement_set({kFixtures + "plain.csv", d.file("copy.csv")});
    ADD_FAILURE() << "accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("copy.csv hold the same bytes"), std::string::npos) << e.what();
  }
}

Measurement ttft(const std::string& hardware, int64_t tokens, double ms) {
  Measurement m;
  m.file = "m.csv";
  m.record = int(tokens);
  m.model = "my-8b";
  m.hardware = hardware;
  m.dtype = "bf16";
  m.prompt_tokens = tokens;
  m.ttft_ms = ms;
  return m;
}

TEST(MeasurementPoints, EveryRecordIsUsedOrCountedWithItsReason) {
  const hw::Profile base = hw::load_profile("h100-sxm");
  MeasurementSet set;
  set.records = {ttft("NVIDIA H100 80GB HBM3", 1024, 50), ttft("", 2048, 90),
                 ttft("NVIDIA A100-SXM4-80GB", 1024, 80), ttft("mine", 4096, 200)};
  Measurement loaded = ttft("NVIDIA H100 80GB HBM3", 512, 40);
  loaded.isolated = false;
  loaded.note = "under load";
  Measurement cached = ttft("NVIDIA H100 80GB HBM3", 512, 40);
  cached.context_tokens = 1000;
  Measurement pruned = ttft("NVIDIA H100 80GB HBM3", 0, 0);
  pruned.ttft_ms.reset();
  pruned.decode_ms_per_token = 7;
  pruned.context_tokens = 1000;
  pruned.decode_tokens = 16;
  pruned.method = "lazyllm 0.3:0.3";
  set.records.insert(set.records.end(), {loaded, cached, pruned});
  PointMapping map;
  map.models = {{"my-8b", "llama-3.1-8b"}};
  map.hardware = {{"mine", "h100-sxm"}};
  const PointSelection sel = select_points(set, base, map);
  ASSERT_EQ(sel.points.size(), 3u);  // the named H100, the unnamed one (taken as the base), the mapped one
  EXPECT_EQ(sel.points[0].preset, "llama-3.1-8b");
  EXPECT_EQ(sel.points[0].precision.compute, "bf16");
  EXPECT_DOUBLE_EQ(sel.points[1].measured_s, 0.090);
  EXPECT_EQ(sel.unnamed_hw, 1);
  EXPECT_EQ(sel.under_load, 1);
  EXPECT_EQ(sel.cached_context, 1);
  EXPECT_EQ(sel.pruned_decode, 1);
  EXPECT_EQ(sel.other_hw, (std::map<std::string, int>{{"a100-80gb", 1}}));
  EXPECT_EQ(sel.notes.at("under load"), 1);
  EXPECT_EQ(
      sel.skipped("h100-sxm"),
      "1 measured under load (TTFT includes queueing); 1 decode latencies of pruned runs (revivals not "
      "modelled); 1 prompts after a cached context (not modelled); 1 on a100-80gb (--base is h100-sxm)");
  // Imposed precision fields replace the record's.
  map.compute = "fp8";
  EXPECT_EQ(select_points(set, base, map).points[0].precision.compute, "fp8");
  EXPECT_EQ(select_points(set, base, map).points[0].precision.weights, "bf16");
}

TEST(MeasurementPoints, RecordsItCannotPlaceAreRefusedByName) {
  const hw::Profile base = hw::load_profile("h100-sxm");
  const auto refusal = [&](const MeasurementSet& set, const PointMapping& map) {
    try {
      (void)select_points(set, base, map);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  MeasurementSet set;
  set.records = {ttft("a machine of mine", 1024, 50)};
  PointMapping map;
  map.models = {{"my-8b", "llama-3.1-8b"}};
  EXPECT_NE(refusal(set, map).find("m.csv: record 1024: unknown hardware 'a machine of mine'"),
            std::string::npos);
  set.records = {ttft("", 1024, 50)};
  EXPECT_NE(refusal(set, {}).find("unknown model 'my-8b'"), std::string::npos);
  set.records[0].dtype = "q17";
  EXPECT_NE(refusal(set, map).find("m.csv: record 1024:"), std::string::npos);
  set.records = {ttft("NVIDIA A100-SXM4-80GB", 1024, 50)};
  EXPECT_NE(
      refusal(set, map).find("no measurement to fit h100-sxm to: 1 record(s) read, skipped: 1 on a100-80gb"),
      std::string::npos)
      << refusal(set, map);
}

}  // namespace
}  // namespace lp::calib
