// Every measurement importer, chosen by content as calibrate does: run --json, llama-bench JSON
// and JSON Lines, vLLM serving and latency, trtllm-bench, CSV; then the checks calibrate runs on
// what they return.
#include "fuzz/fuzz_util.h"
#include "sim/measurements.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = lp::fuzz::mem_file().write(data, size);
  lp::fuzz::refuses_cleanly([&] {
    std::vector<lp::sim::Measurement> ms = lp::sim::import_measurements(path);
    lp::fuzz::refuses_cleanly([&] { lp::sim::check_no_duplicates(ms); });
    (void)lp::sim::merge_repetitions(std::move(ms));
  });
  for (auto* import : {&lp::sim::import_csv, &lp::sim::import_llama_bench, &lp::sim::import_trtllm_bench,
                       &lp::sim::import_vllm_latency, &lp::sim::import_run_json})
    lp::fuzz::refuses_cleanly([&] { (void)import(path); });
  return 0;
}
