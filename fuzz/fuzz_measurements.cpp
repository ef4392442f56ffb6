// Every measurement importer, chosen by content as calibrate does: run --json, llama-bench JSON
// and JSON Lines, vLLM serving and latency, trtllm-bench, CSV; then the checks calibrate runs on
// what they return. And the serving benchmarks' importers (vllm bench serve, guidellm, AIPerf,
// genai-perf: calibrate-serving), with the workload each benchmark's load rebuilds.
#include <algorithm>

#include "calibrate/measurements.h"
#include "calibrate/serving_benchmarks.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = lp::fuzz::mem_file().write(data, size);
  lp::fuzz::refuses_cleanly([&] {
    std::vector<lp::calib::Measurement> ms = lp::calib::import_measurements(path);
    lp::fuzz::refuses_cleanly([&] { lp::calib::check_no_duplicates(ms); });
    (void)lp::calib::merge_repetitions(std::move(ms));
  });
  for (auto* import :
       {&lp::calib::import_csv, &lp::calib::import_llama_bench, &lp::calib::import_trtllm_bench,
        &lp::calib::import_vllm_latency, &lp::calib::import_run_json})
    lp::fuzz::refuses_cleanly([&] { (void)import(path); });
  lp::fuzz::refuses_cleanly([&] {
    for (lp::calib::ServingBenchmark& b : lp::calib::read_serving_benchmarks(path)) {
      b.completed = std::min<int64_t>(b.completed, 64);  // a workload of a bounded size
      b.prompt_tokens.resize(std::min<size_t>(b.prompt_tokens.size(), 64));
      b.output_tokens.resize(b.prompt_tokens.size());
      (void)lp::calib::benchmark_workload(b, 1);
    }
  });
  return 0;
}
