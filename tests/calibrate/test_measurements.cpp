// Importers of measured results (calibrate/measurements.h): llama-bench's JSON and JSON Lines (the
// sample files of its own documentation, tests/fixtures/measurements/README.md) and run --json;
// expected values are read off the sample files by hand.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "calibrate/fit_measurements.h"
#include "calibrate/measurements.h"
#include "hwmodels/profile.h"
#include "model/error.h"
#include "model/presets.h"
#include "tests/gguf_writer.h"
#include "tests/test_util.h"

namespace lp {
namespace {

using calib::Measurement;

std::string sample(const char* name) {
  return testing::fixture_path(std::string("measurements/") + name);
}

std::string write(const testing::TempDir& dir, const std::string& name, const std::string& text) {
  const std::string p = dir.file(name);
  std::ofstream(p) << text;
  return p;
}

void expect_error(const std::string& path, std::initializer_list<std::string> needles) {
  try {
    calib::import_measurements(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
  }
}

TEST(Measurements, LlamaBenchJsonGivesTtftAndDecodeRecords) {
  const auto ms = calib::import_measurements(sample("llama-bench-rtx4080.json"));
  ASSERT_EQ(ms.size(), 2u);
  const Measurement& pp = ms[0];
  EXPECT_EQ(pp.framework, "llama.cpp");
  EXPECT_EQ(pp.framework_version, "8cf427ff (5163)");
  EXPECT_EQ(pp.model, "Qwen2.5-7B-Instruct-Q4_K_M.gguf");  // model_filename without its folder
  EXPECT_EQ(pp.dtype, "Q4_K - Medium");
  EXPECT_EQ(pp.hardware, "NVIDIA GeForce RTX 4080");
  EXPECT_EQ(pp.record, 1);
  EXPECT_EQ(pp.prompt_tokens, 512);
  EXPECT_EQ(pp.batch, 1);
  EXPECT_EQ(pp.tp, 1);
  EXPECT_EQ(pp.repetitions, 5);
  ASSERT_TRUE(pp.ttft_ms.has_value());
  EXPECT_DOUBLE_EQ(*pp.ttft_ms, 72.13564);  // avg_ns 72135640
  EXPECT_FALSE(pp.decode_ms_per_token.has_value());
  const Measurement& tg = ms[1];
  EXPECT_EQ(tg.prompt_tokens, 0);
  EXPECT_EQ(tg.decode_tokens, 128);
  EXPECT_FALSE(tg.ttft_ms.has_value());
  ASSERT_TRUE(tg.decode_ms_per_token.has_value());
  EXPECT_NEAR(*tg.decode_ms_per_token, 1076.76788 / 128, 1e-9);  // avg_ns 1076767880 over 128 tokens
  EXPECT_NO_THROW(calib::check_no_duplicates(ms));
}

// Our own llama-bench runs on the CPU (tests/fixtures/measurements/README.md): F32 and Q8_0 at
// 512-8192 tokens, twice in opposite orders; every record imports, the file type maps to its bits
// per weight from model_size / model_n_params, and the two runs merge as repetitions.
TEST(Measurements, LlamaBenchCpuRunsImportAndMergeAsRepetitions) {
  auto a = calib::import_measurements(sample("llama-bench-smollm2-135m-epyc.json"));
  const auto b = calib::import_measurements(sample("llama-bench-smollm2-135m-epyc-2.json"));
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b.size(), 10u);
  for (const Measurement& m : a) {
    SCOPED_TRACE(m.record);
    EXPECT_EQ(m.framework, "llama.cpp");
    EXPECT_EQ(m.framework_version, "0c1e5709 (11312)");
    EXPECT_EQ(m.hardware, "AMD EPYC");
    EXPECT_TRUE(m.ttft_ms.has_value());
    EXPECT_EQ(m.repetitions, 5);
    const bool f32 = m.dtype == "all F32";
    EXPECT_TRUE(f32 || m.dtype == "Q8_0") << m.dtype;
    // 538,060,032 B over 134,515,008 weights is 32 bits; Q8_0 stores 34 B per 32 weights (8.5),
    // the embedding included.
    EXPECT_NEAR(m.weight_bits, f32 ? 32.0 : 8.5, f32 ? 1e-9 : 0.01);
  }
  a.insert(a.end(), b.begin(), b.end());
  const auto merged = calib::merge_repetitions(a);
  ASSERT_EQ(merged.size(), 10u);
  for (const Measurement& m : merged) EXPECT_EQ(m.repetitions, 10);
}

// llama-bench's n_threads is the share of a CPU profile its runs had: predicted on a profile of
// twice the cores (peaks and bandwidth doubled), 2 threads of 4 are priced as 2 of 2 are.
TEST(Measurements, LlamaBenchThreadsAreTheirShareOfTheCores) {
  const auto ms = calib::import_measurements(sample("llama-bench-smollm2-135m-epyc.json"));
  const hw::Profile two = hw::load_profile("cpu-local");
  ASSERT_EQ(two.compute_units, 2);
  hw::Profile four = two;
  four.compute_units = 4;
  for (auto& [dtype, flops] : four.peak_flops) flops *= 2;
  four.memory_bandwidth *= 2;
  const ModelConfig c = preset_config("smollm2-135m");
  for (const Measurement& m : ms) {
    EXPECT_EQ(m.threads, 2);
    const calib::Point pt = calib::make_point(m, "smollm2-135m", c, sim::Precision{"f32", "f32", "f32"});
    const double on_two = calib::predict_point(two, pt), on_four = calib::predict_point(four, pt);
    EXPECT_NEAR(on_four, on_two, 1e-9 * on_two) << m.record;
  }
}

TEST(Measurements, LlamaBenchJsonLinesAndDuplicatesAcrossFiles) {
  const auto jl = calib::import_measurements(sample("llama-bench-rtx4080.jsonl"));
  ASSERT_EQ(jl.size(), 2u);
  EXPECT_DOUBLE_EQ(*jl[0].ttft_ms, 70.49722);
  EXPECT_NEAR(*jl[1].decode_ms_per_token, 1068.0784 / 128, 1e-9);
  EXPECT_EQ(jl[1].record, 2);
  // The same tests measured twice are the same point: refused, naming both places.
  auto both = calib::import_measurements(sample("llama-bench-rtx4080.json"));
  both.insert(both.end(), jl.begin(), jl.end());
  try {
    calib::check_no_duplicates(both);
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("llama-bench-rtx4080.json record 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("llama-bench-rtx4080.jsonl record 1"), std::string::npos) << msg;
  }
}

TEST(Measurements, CpuOnlyLlamaBenchNamesTheCpu) {
  testing::TempDir dir;
  std::ifstream in(sample("llama-bench-rtx4080.jsonl"));
  std::string line;
  std::getline(in, line);
  const size_t at = line.find("\"n_gpu_layers\": 99");
  ASSERT_NE(at, std::string::npos);
  line.replace(at, 18, "\"n_gpu_layers\": 0");
  const auto ms = calib::import_measurements(write(dir, "cpu.jsonl", line + "\n"));
  ASSERT_EQ(ms.size(), 1u);
  EXPECT_EQ(ms[0].hardware, "AMD Ryzen 7 7800X3D 8-Core Processor");
}

TEST(Measurements, LlamaBenchSweepsOverSettingsAreNotDuplicates) {
  testing::TempDir dir;
  std::ifstream in(sample("llama-bench-rtx4080.jsonl"));
  std::string line;
  std::getline(in, line);
  std::string fa = line;
  fa.replace(fa.find("\"flash_attn\": false"), 19, "\"flash_attn\": true");
  const auto ms = calib::import_measurements(write(dir, "fa.jsonl", line + "\n" + fa + "\n"));
  ASSERT_EQ(ms.size(), 2u);
  EXPECT_NE(ms[0].config, ms[1].config);
  EXPECT_NO_THROW(calib::check_no_duplicates(ms));
  EXPECT_THROW(calib::check_no_duplicates({ms[0], ms[0]}), Error);
}

TEST(Measurements, RunJsonGivesOneRecordWithItsMethod) {
  testing::TempDir dir;
  const std::string p = write(dir, "run.json", R"({"text": "x", "prompt_tokens": 100, "generated_tokens": 5,
      "ttft_ms": 250.0, "prefill_ms": 249.0, "decode_tokens_per_s": 20.0, "model": "m.gguf", "dtype": "f32",
      "version": "0.1.0", "git_commit": "abc", "prune": "lazyllm", "schedule": "0.3:0.3", "ops": {}})");
  const auto ms = calib::import_measurements(p);
  ASSERT_EQ(ms.size(), 2u);  // a TTFT point and a decode point
  EXPECT_EQ(ms[0].framework, "lazyprefill");
  EXPECT_EQ(ms[0].method, "lazyllm 0.3:0.3");
  EXPECT_DOUBLE_EQ(*ms[0].ttft_ms, 250.0);
  EXPECT_EQ(ms[0].prompt_tokens, 100);
  EXPECT_FALSE(ms[0].decode_ms_per_token.has_value());
  EXPECT_EQ(ms[1].decode_tokens, 4);
  EXPECT_DOUBLE_EQ(*ms[1].decode_ms_per_token, 50.0);
  EXPECT_EQ(ms[1].context_tokens, 100);
  EXPECT_NO_THROW(calib::check_no_duplicates(ms));
}

TEST(Measurements, CudaRunJsonNamesItsGpu) {
  testing::TempDir dir;
  const std::string p = write(dir, "gpu.json", R"({"backend": "cuda", "hardware": "NVIDIA H100 80GB HBM3",
      "prompt_tokens": 4096, "generated_tokens": 1, "ttft_ms": 31.5, "decode_tokens_per_s": 0, "model": "/m/x.gguf",
      "dtype": "bf16", "version": "0.1.0", "git_commit": "abc", "prune": "none", "schedule": "none", "ops": []})");
  const auto ms = calib::import_measurements(p);
  ASSERT_EQ(ms.size(), 1u);
  EXPECT_EQ(ms[0].hardware, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(ms[0].framework, "lazyprefill-cuda");
  EXPECT_EQ(ms[0].method, "none");
}

TEST(Measurements, BadInputNamesFileRecordAndField) {
  testing::TempDir dir;
  std::ifstream in(sample("llama-bench-rtx4080.jsonl"));
  std::string l1, l2;
  std::getline(in, l1);
  std::getline(in, l2);
  const auto without = [](std::string s, const std::string& key) {
    const size_t a = s.find("\"" + key + "\"");
    const size_t b = s.find(',', a);
    return s.erase(a, b - a + 2);
  };
  const auto replaced = [](std::string s, const std::string& from, const std::string& to) {
    return s.replace(s.find(from), from.size(), to);
  };
  expect_error(write(dir, "noavg.jsonl", l1 + "\n" + without(l2, "avg_ns") + "\n"),
               {"noavg.jsonl", "record 2", "'avg_ns'"});
  expect_error(write(dir, "type.jsonl", replaced(l1, "\"n_prompt\": 512", "\"n_prompt\": \"512\"") + "\n"),
               {"type.jsonl", "record 1", "'n_prompt'", "whole number"});
  expect_error(write(dir, "frac.jsonl", replaced(l1, "\"n_prompt\": 512", "\"n_prompt\": 512.7") + "\n"),
               {"frac.jsonl", "record 1", "'n_prompt'", "whole number"});
  expect_error(write(dir, "reps.jsonl",
                     replaced(l1, "[ 71551000, 71222800, 70364100, 69439100, 69909100 ]", "[]") + "\n"),
               {"reps.jsonl", "'samples_ns' is empty"});
  expect_error(write(dir, "pg.jsonl", replaced(l1, "\"n_gen\": 0", "\"n_gen\": 128") + "\n"),
               {"pg.jsonl", "record 1", "-pg 512,128"});
  expect_error(write(dir, "zero.jsonl", replaced(l1, "\"avg_ns\": 70497220", "\"avg_ns\": 0") + "\n"),
               {"zero.jsonl", "'avg_ns' must be positive"});
  expect_error(write(dir, "cut.jsonl", l1 + "\n\n" + l2.substr(0, 100) + "\n"),
               {"cut.jsonl", "line 3", "not valid JSON"});
  expect_error(write(dir, "empty.json", "  \n"), {"empty.json", "empty"});
  expect_error(write(dir, "table.md", "| model | size |\n"),
               {"table.md", "not a recognised measurement file"});
  expect_error(write(dir, "arr.json", "[1, 2]"), {"arr.json", "record 1", "not a JSON object"});
  expect_error(dir.file("missing.json"), {"cannot read measurement file", "missing.json"});
}

TEST(Measurements, PlainCsvWithCommentsQuotesAndEmptyCells) {
  const auto ms = calib::import_measurements(sample("plain.csv"));
  ASSERT_EQ(ms.size(), 4u);  // the last row has a TTFT and a decode latency: two records
  EXPECT_EQ(ms[0].model, "llama-3.1-8b");
  EXPECT_EQ(ms[0].hardware, "h100-sxm");
  EXPECT_EQ(ms[0].framework, "vllm");
  EXPECT_EQ(ms[0].framework_version, "0.6.3");
  EXPECT_EQ(ms[0].prompt_tokens, 4096);
  EXPECT_DOUBLE_EQ(*ms[0].ttft_ms, 312.5);
  EXPECT_FALSE(ms[0].decode_ms_per_token.has_value());
  EXPECT_FALSE(ms[1].ttft_ms.has_value());
  EXPECT_DOUBLE_EQ(*ms[1].decode_ms_per_token, 7.25);
  EXPECT_EQ(ms[1].decode_tokens, 128);
  EXPECT_EQ(ms[0].record, 3);  // line 1 is a comment, line 2 the header
  EXPECT_EQ(ms[2].hardware, "a100-80gb");
  EXPECT_EQ(ms[2].batch, 4);
  EXPECT_EQ(ms[2].tp, 2);
  EXPECT_DOUBLE_EQ(*ms[2].ttft_ms, 401.0);
  EXPECT_FALSE(ms[2].decode_ms_per_token.has_value());
  EXPECT_EQ(ms[2].record, 5);
  EXPECT_EQ(ms[3].record, 5);
  EXPECT_FALSE(ms[3].ttft_ms.has_value());
  EXPECT_DOUBLE_EQ(*ms[3].decode_ms_per_token, 12.5);
  EXPECT_EQ(ms[3].prompt_tokens, 0);
  EXPECT_EQ(ms[3].context_tokens, 2048);  // decoding ran after the 2048-token prompt
  EXPECT_EQ(ms[3].decode_tokens, 64);
  EXPECT_NO_THROW(calib::check_no_duplicates(ms));
}

TEST(Measurements, CsvUnitsAndBadInput) {
  testing::TempDir dir;
  const auto seconds =
      calib::import_measurements(write(dir, "s.csv", "model,hardware,prompt_tokens,ttft_s\nm,h,100,0.25\n"));
  EXPECT_DOUBLE_EQ(*seconds[0].ttft_ms, 250.0);
  expect_error(write(dir, "mixed.csv", "model,hardware,prompt_tokens,ttft_ms,ttft_s\nm,h,1,1,1\n"),
               {"mixed.csv", "mixed units", "'ttft_ms'", "'ttft_s'"});
  expect_error(write(dir, "extra.csv", "model,hardware,prompt_tokens,ttft_msec\nm,h,1,1\n"),
               {"extra.csv", "ttft_msec"});
  expect_error(write(dir, "dup.csv", "model,hardware,prompt_tokens,ttft_ms,model\nm,h,1,1,m\n"),
               {"dup.csv", "model"});
  expect_error(write(dir, "nohw.csv", "model,prompt_tokens,ttft_ms\nm,1,1\n"),
               {"nohw.csv", "missing column 'hardware'"});
  expect_error(write(dir, "notime.csv", "model,hardware,prompt_tokens\nm,h,1\n"),
               {"notime.csv", "no time column"});
  expect_error(write(dir, "nan.csv", "model,hardware,prompt_tokens,ttft_ms\nm,h,1,1\nm,h,2,fast\n"),
               {"nan.csv", "line 3", "'ttft_ms'", "'fast'"});
  expect_error(write(dir, "frac.csv", "model,hardware,prompt_tokens,ttft_ms\nm,h,1.5,1\n"),
               {"frac.csv", "line 2", "'prompt_tokens'", "whole number"});
  expect_error(write(dir, "neg.csv", "model,hardware,prompt_tokens,ttft_ms\nm,h,10,-3\n"),
               {"neg.csv", "line 2", "must be positive"});
  const auto bom = calib::import_measurements(
      write(dir, "bom.csv", "\xEF\xBB\xBFmodel,hardware,prompt_tokens,ttft_ms\nm,h,1,2\n"));
  EXPECT_EQ(bom[0].model, "m");
  expect_error(write(dir, "dt.csv", "model,hardware,prompt_tokens,ttft_ms,decode_tokens\nm,h,1,2,5\n"),
               {"dt.csv", "line 2", "decode_tokens without decode_ms_per_token"});
  expect_error(write(dir, "rows.csv", "model,hardware,prompt_tokens,ttft_ms\n"), {"rows.csv", "no rows"});
  expect_error(write(dir, "short.csv", "model,hardware,prompt_tokens,ttft_ms\nm,h,1\n"), {"short.csv"});
  // Duplicate points across rows.
  const auto twice = calib::import_measurements(
      write(dir, "twice.csv", "model,hardware,prompt_tokens,ttft_ms\nm,h,100,1\nm,h,100,2\n"));
  EXPECT_THROW(calib::check_no_duplicates(twice), Error);
}

// Found by review: names that differ only in case or separators are the same point; a decode-only
// row decodes after its prompt; counts that would overflow, numbers JSON cannot hold, present but
// non-positive decode figures and control characters in names.
TEST(Measurements, ReviewedEdgeCases) {
  testing::TempDir dir;
  const auto cased = calib::import_measurements(
      write(dir, "cased.csv",
            "model,hardware,dtype,prompt_tokens,ttft_ms\nLlama-3.1-8B,A100-80GB,BF16,100,1\n"
            "llama_3.1_8b,a100 80gb,bf16,100,2\n"));
  EXPECT_THROW(calib::check_no_duplicates(cased), Error);
  const auto dec = calib::import_measurements(write(
      dir, "dec.csv", "model,hardware,prompt_tokens,context_tokens,decode_ms_per_token\nm,h,8000,100,5\n"));
  ASSERT_EQ(dec.size(), 1u);
  EXPECT_EQ(dec[0].context_tokens, 8100);
  EXPECT_EQ(dec[0].prompt_tokens, 0);
  expect_error(write(dir, "big.csv", "model,hardware,batch,prompt_tokens,ttft_ms\nm,h,4294967297,1,1\n"),
               {"big.csv", "line 2", "'batch'", "implausibly large"});
  expect_error(write(dir, "huge.csv",
                     "model,hardware,prompt_tokens,context_tokens,ttft_ms\nm,h,1,9223372036854775807,1\n"),
               {"huge.csv", "'context_tokens'"});
  expect_error(
      write(dir, "inf.json",
            R"({"model_id": "m", "median_ttft_ms": 1e400, "input_lens": [10], "max_concurrency": 1})"),
      {"inf.json"});
  expect_error(write(dir, "tpot.json",
                     R"({"model_id": "m", "median_ttft_ms": 10, "median_tpot_ms": -1, "input_lens": [10],)"
                     R"( "output_lens": [20], "max_concurrency": 1})"),
               {"tpot.json", "record 1", "positive"});
  const auto lens = calib::import_measurements(
      write(dir, "lens.json",
            R"({"model_id": "m", "median_ttft_ms": 10, "median_tpot_ms": 5, "input_lens": [10, 30],)"
            R"( "output_lens": [20, 40], "max_concurrency": 1})"));
  ASSERT_EQ(lens.size(), 2u);  // the decode latency is not lost when the lengths are per request
  EXPECT_EQ(lens[1].decode_tokens, 29);
  EXPECT_EQ(lens[1].context_tokens, 20);
  // A CSV by content when its name does not say so (a pipe such as <(...)), read once: the bytes
  // handed back for the hash are the bytes imported.
  const std::string csv_text = "model,hardware,prompt_tokens,ttft_ms\nm,h,100,1\n";
  std::vector<calib::MeasurementSource> read;
  const auto piped = calib::import_measurements(write(dir, "63", csv_text), &read);
  ASSERT_EQ(piped.size(), 1u);
  ASSERT_EQ(read.size(), 1u);
  EXPECT_EQ(read[0].bytes, csv_text);
  const auto ctl = calib::import_measurements(write(
      dir, "ctl.json",
      R"({"model_id": "evil\nmodel", "median_ttft_ms": 10, "input_lens": [10], "max_concurrency": 1})"));
  ASSERT_EQ(ctl.size(), 1u);
  EXPECT_EQ(ctl[0].model, "evil model");
}

// vLLM's serving benchmark: the first 3 lines of a real --append-result file (Llama-3.2-3B on
// 4 L40S replicas, random 1000-token prompts, rates 10, 30 and inf requests/s).
TEST(Measurements, VllmServingJsonLines) {
  const auto ms = calib::import_measurements(sample("vllm-serve-l40s.jsonl"));
  ASSERT_EQ(ms.size(), 6u);  // a TTFT and a decode record per line
  const Measurement& t = ms[0];
  EXPECT_EQ(t.framework, "vllm");
  EXPECT_EQ(t.model, "Llama-3.2-3B-Instruct");
  EXPECT_EQ(t.hardware, "4xNVIDIA_L40S");            // --metadata gpu=...
  EXPECT_EQ(t.prompt_tokens, 999);                   // 299700 input tokens / 300 requests
  EXPECT_DOUBLE_EQ(*t.ttft_ms, 52.868896000063614);  // median_ttft_ms
  EXPECT_FALSE(t.isolated);  // max_concurrency null: Poisson arrivals at 10 requests/s
  EXPECT_NE(t.note.find("tp not recorded"), std::string::npos);
  EXPECT_EQ(t.repetitions, 300);
  const Measurement& d = ms[1];
  EXPECT_DOUBLE_EQ(*d.decode_ms_per_token, 13.686303201518745);  // median_tpot_ms
  EXPECT_EQ(d.decode_tokens, 270 - 1);  // 80945 / 300 = 269.8 output tokens, rounded to 270
  EXPECT_EQ(d.context_tokens, 999);     // decoding starts after the prompt
  EXPECT_EQ(ms[4].config, "request_rate=\"inf\" max_concurrency=-");
  EXPECT_NO_THROW(calib::check_no_duplicates(ms));
}

TEST(Measurements, VllmFilesWithoutWhatTheyMeasureAreRefused) {
  // Real files from a vllm-ascend benchmark run: the serving result lacks every prompt-length
  // field, and the latency result (as always) lacks its settings, with no .pytorch.json beside it.
  expect_error(sample("vllm-serve-ascend.json"), {"vllm-serve-ascend.json", "record 1", "no prompt length"});
  expect_error(
      sample("vllm-latency-ascend.json"),
      {"vllm-latency-ascend.json", "does not record the prompt length", "vllm-latency-ascend.pytorch.json"});
}

TEST(Measurements, VllmLatencyReadsItsSettingsFromThePytorchFile) {
  std::vector<calib::MeasurementSource> read;
  const auto ms = calib::import_measurements(sample("vllm-latency-h100.json"), &read);
  // Both files are handed back for the provenance hash: the result, then its settings.
  ASSERT_EQ(read.size(), 2u);
  EXPECT_EQ(read[0].path, sample("vllm-latency-h100.json"));
  EXPECT_EQ(read[1].path, sample("vllm-latency-h100.pytorch.json"));
  std::ifstream side_in(read[1].path, std::ios::binary);
  EXPECT_EQ(read[1].bytes,
            std::string((std::istreambuf_iterator<char>(side_in)), std::istreambuf_iterator<char>()));
  ASSERT_EQ(ms.size(), 1u);
  EXPECT_EQ(ms[0].model, "Llama-3.1-8B-Instruct");
  EXPECT_EQ(ms[0].prompt_tokens, 4096);
  EXPECT_EQ(ms[0].batch, 1);
  EXPECT_EQ(ms[0].tp, 1);
  EXPECT_EQ(ms[0].dtype, "bfloat16");
  EXPECT_EQ(ms[0].hardware, "");  // vLLM's args do not name the GPU
  EXPECT_NEAR(*ms[0].ttft_ms, 287.1, 1e-9);
  EXPECT_EQ(ms[0].repetitions, 5);
  testing::TempDir dir;
  // output_len 2: prefill and a decoding step in one figure.
  std::ifstream side(sample("vllm-latency-h100.pytorch.json"));
  std::string text((std::istreambuf_iterator<char>(side)), std::istreambuf_iterator<char>());
  const std::string one = "\"output_len\": 1";
  text.replace(text.find(one), one.size(), "\"output_len\": 2");
  write(dir, "l.pytorch.json", text);
  std::ifstream main(sample("vllm-latency-h100.json"));
  write(dir, "l.json", std::string((std::istreambuf_iterator<char>(main)), std::istreambuf_iterator<char>()));
  expect_error(dir.file("l.json"), {"l.json", "output_len 2", "--output-len 1"});
}

TEST(Measurements, TrtllmBenchReport) {
  const auto ms = calib::import_measurements(sample("trtllm-bench-report.json"));
  ASSERT_EQ(ms.size(), 2u);
  EXPECT_EQ(ms[0].framework, "tensorrt-llm");
  EXPECT_EQ(ms[0].framework_version, "0.17.0");
  EXPECT_EQ(ms[0].model, "Llama-3.1-8B");
  EXPECT_EQ(ms[0].hardware, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(ms[0].dtype, "bfloat16");
  EXPECT_EQ(ms[0].tp, 2);
  EXPECT_EQ(ms[0].prompt_tokens, 4096);
  EXPECT_DOUBLE_EQ(*ms[0].ttft_ms, 165.2);  // ttft_percentiles.p50
  EXPECT_TRUE(ms[0].isolated);
  EXPECT_DOUBLE_EQ(*ms[1].decode_ms_per_token, 6.45);
  EXPECT_EQ(ms[1].decode_tokens, 128);
  EXPECT_EQ(ms[1].context_tokens, 4096);
  testing::TempDir dir;
  std::ifstream in(sample("trtllm-bench-report.json"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string no_stream = text;
  no_stream.replace(no_stream.find("\"streaming_metrics\""), 19, "\"streaming_metricz\"");
  expect_error(write(dir, "ns.json", no_stream), {"ns.json", "record 1", "streaming_metrics", "--streaming"});
  std::string pp = text;
  pp.replace(pp.find("\"pp_size\": 1"), 12, "\"pp_size\": 2");
  expect_error(write(dir, "pp.json", pp), {"pp.json", "pipeline parallelism"});
}

}  // namespace
}  // namespace lp
