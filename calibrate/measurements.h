// Measured end-to-end results from the tools users already run, turned into one record that the
// calibration can fit to (formats in docs/measurements.md).
//
// Importers: llama-bench (`-o json`, `-o jsonl`), vLLM (serving and latency benchmarks),
// TensorRT-LLM (`trtllm-bench --report_json`), our own `run --json` and a plain CSV. Every error
// names the file, the record (1-based) and the field.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lp::calib {

struct Measurement {
  std::string file;  // where it came from
  int record = 0;    // 1-based: the JSON array element, or the file's line (JSON Lines, CSV)
  std::string framework, framework_version;
  std::string model;            // as the file names it (e.g. llama-bench's model_type)
  std::string hardware;         // as the file names it (GPU name, or the CPU when nothing ran on a GPU)
  std::string dtype;            // the weights' type as the file names it ("Q4_K - Medium", "f32")
  std::string method = "none";  // token pruning: "none", or "lazyllm 0.3:0.3,..." (our runs)
  std::string
      config;  // other settings that change speed (llama-bench: threads, ubatch, flash attention, KV types)
  // CPU threads the run used (llama-bench's n_threads, run --json's threads, a CSV's threads),
  // 0 when not recorded or on a GPU: the prediction prices it on that share of the part's cores
  // (hw::thread_share), so files of any thread count calibrate one profile of the whole part.
  int threads = 0;
  int batch = 1;               // sequences processed together
  int tp = 1;                  // tensor-parallel degree
  int64_t prompt_tokens = 0;   // tokens prefilled (0 for a decode-only test)
  int64_t context_tokens = 0;  // tokens already in the KV cache before this work (a decode record
                               // of a run that prefilled P tokens has context P)
  // Prefill time of prompt_tokens (TTFT without queueing or sampling), when measured.
  std::optional<double> ttft_ms;
  // Mean time per generated token, and how many were generated, when measured.
  std::optional<double> decode_ms_per_token;
  int64_t decode_tokens = 0;
  int repetitions = 1;  // samples averaged into the figures
  // Mean bits per weight of the model file when the tool records it (llama-bench: model_size x 8 /
  // model_n_params), 0 otherwise: a K-quant mix such as Q4_K - Medium holds more than its type's
  // nominal 4.5.
  double weight_bits = 0;
  // False when the figures were taken under load (a serving benchmark with several requests in
  // flight): then TTFT includes queueing and batching with other requests, which the simulator
  // does not model, and calibration leaves the record out (saying so).
  bool isolated = true;
  std::string note;  // what the importer assumed, printed by calibrate ("tp not recorded: 1")
};

// llama-bench -o json (an array) or -o jsonl (one object per line). A prompt-processing test
// (n_prompt > 0, n_gen = 0) gives ttft_ms = avg_ns / 1e6; a generation test (n_prompt = 0,
// n_gen > 0) gives decode_ms_per_token = avg_ns / 1e6 / n_gen with context_tokens = n_depth.
// Combined -pg tests cannot be split into the two and are refused. Throws lp::Error.
std::vector<Measurement> import_llama_bench(const std::string& path);

// The plain CSV of docs/measurements.md: a header naming columns from model, hardware,
// prompt_tokens (required), framework, framework_version, dtype, method, batch, tp,
// context_tokens, ttft_ms or ttft_s, decode_ms_per_token, decode_tokens, repetitions, threads; '#' starts
// a comment line; empty cells are "not given". Unknown, duplicated or missing required columns,
// mixed units, and cells that are not numbers are errors naming the file, row and column.
std::vector<Measurement> import_csv(const std::string& path);

// One `lazyprefill run --json` output file. Throws lp::Error.
std::vector<Measurement> import_run_json(const std::string& path);

// vLLM's serving benchmark (`vllm bench serve --save-result`, benchmarks/benchmark_serving.py):
// one JSON object, or one per line (--append-result). TTFT = median_ttft_ms (else mean) at the
// mean prompt (input_lens, else total_input_tokens / completed, else a metadata input_len);
// decode = median_tpot_ms (else mean) over the mean output less one, after the prompt. Model is
// model_id; hardware, tp and version come from --metadata keys when given (gpu / hardware,
// tp / tensor_parallel_size, vllm_version) and are otherwise "" / 1 / "" with a note. Only a run
// with max_concurrency 1 is isolated.
std::vector<Measurement> import_vllm_serving(const std::string& path);

// The JSON values of a result file's text: one value, each element of a top-level array, or one a
// line (JSON Lines, as vLLM's --append-result writes), each with its record number (1-based; the
// line for JSON Lines). Throws lp::Error naming the file and line.
std::vector<std::pair<int, nlohmann::json>> json_values(const std::string& path, const std::string& text);

// vLLM's latency benchmark (`vllm bench latency --output-json`): avg_latency of one generate()
// over a batch. The JSON does not record the prompt, output length or batch; they are read from
// the `<stem>.pytorch.json` file vLLM writes beside it when SAVE_TO_PYTORCH_BENCHMARK_FORMAT is
// set (its args), else the file is refused saying so. Only output_len 1 measures a TTFT.
std::vector<Measurement> import_vllm_latency(const std::string& path);

// TensorRT-LLM's `trtllm-bench ... --report_json FILE`: streaming_metrics (present only with
// --streaming) give TTFT (ttft_percentiles.p50, else avg_ttft_ms) at request_info's average input
// length and decode (tpot p50, else avg_tpot_ms) over the output less one, after the input; model,
// version, dtype from engine, hardware from machine.name, tp from world_info.tp_size. Isolated
// when request_info.avg_num_concurrent_requests is at most 1.1.
std::vector<Measurement> import_trtllm_bench(const std::string& path);

// A .csv file by its name; otherwise by content: a run --json object, a llama-bench array or JSON
// Lines, vLLM or trtllm-bench JSON, or (a first line with commas) the CSV. The file is read once
// (pipes work). Throws lp::Error naming the file when it is none of these.
// `sources` (when given) receives every file the import read, each exactly as it was read and
// imported, once: the file asked for first, then any side file (vLLM's <stem>.pytorch.json).
struct MeasurementSource {
  std::string path, bytes;
};
std::vector<Measurement> import_measurements(const std::string& path,
                                             std::vector<MeasurementSource>* sources = nullptr);

// Each record measures one quantity: a TTFT (prompt_tokens > 0) or a decode latency. A source row
// with both becomes two records, the decode one at context prompt_tokens + context_tokens.
// Two records describe the same point when model, hardware, framework and version, dtype, method,
// config, batch, tp, prompt, context and decode tokens are equal (names as name_key compares them)
// and both measure the same quantity. Throws lp::Error naming both records of the first duplicate.
void check_no_duplicates(const std::vector<Measurement>& ms);

// Records of the same point (as check_no_duplicates compares them) are repetitions of one
// measurement: merged into the first, each figure the mean weighted by repetitions, repetitions
// summed, and `note` naming the records merged. Order otherwise kept. `merged` (when given)
// receives how many records were folded into others.
std::vector<Measurement> merge_repetitions(std::vector<Measurement> ms, int* merged = nullptr);

// A name as calibrate compares names from files: lower case, without spaces, '-' or '_'.
std::string name_key(const std::string& name);

}  // namespace lp::calib
