#include "calibrate/measurements.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <type_traits>
#include <utility>

#include "model/csv_reader.h"  // fast-cpp-csv-parser
#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"

namespace lp::calib {
namespace {

// Counts (tokens, batch, TP degree, repetitions) above this are refused: no run has them, and
// sums of them must not overflow.
constexpr int64_t kMaxCount = int64_t(1) << 30;

using json = nlohmann::json;

// The files import_measurements has read, each once: detection and the importer see the same
// bytes (a pipe such as <(...) can be read only once), and the caller hashes exactly those. The
// first is the file asked for; a side file (vLLM's <stem>.pytorch.json) follows it.
thread_local std::vector<MeasurementSource>* g_reading = nullptr;

std::string read_text(const std::string& path) {
  if (g_reading)
    for (const MeasurementSource& f : *g_reading)
      if (f.path == path) return f.bytes;
  std::string text = read_input_file(path, "measurement file", input_cap::kResults);
  if (g_reading) g_reading->push_back({path, text});
  return text;
}

// A field of record `rec` of `path`, of the JSON type T (model/json_checks.h); errors name all three.
template <class T>
T field(const json& o, const char* key, const std::string& path, int rec) {
  return json_field<T>(o, key, fmt::format("{}: record {}", path, rec));
}

// "qwen2 7B Q4_K - Medium" -> "Q4_K - Medium": llama.cpp's model_type is "<arch> <size> <ftype>".
std::string ftype_of(const std::string& model_type) {
  const size_t a = model_type.find(' ');
  const size_t b = a == std::string::npos ? a : model_type.find(' ', a + 1);
  return b == std::string::npos ? model_type : model_type.substr(b + 1);
}

Measurement from_llama_bench(const json& o, const std::string& path, int rec) {
  if (!o.is_object()) fail("{}: record {}: not a JSON object", path, rec);
  Measurement m;
  m.file = path;
  m.record = rec;
  m.framework = "llama.cpp";
  m.framework_version = fmt::format("{} ({})", field<std::string>(o, "build_commit", path, rec),
                                    field<int64_t>(o, "build_number", path, rec));
  const std::string model_type = field<std::string>(o, "model_type", path, rec);
  m.dtype = ftype_of(model_type);
  if (o.contains("model_size") && o.contains("model_n_params")) {
    const double size = double(field<int64_t>(o, "model_size", path, rec));
    const double params = double(field<int64_t>(o, "model_n_params", path, rec));
    if (size > 0 && params > 0 && size * 8 / params <= 32) m.weight_bits = size * 8 / params;
  }
  // The file's name says which model ("Qwen2.5-7B-Instruct-Q4_K_M.gguf"); model_type only the
  // architecture and size ("qwen2 7B").
  m.model = o.contains("model_filename") ? field<std::string>(o, "model_filename", path, rec) : model_type;
  if (const size_t slash = m.model.find_last_of('/'); slash != std::string::npos) m.model.erase(0, slash + 1);
  // Settings that change speed between otherwise equal tests (a -t 4,8 or -fa 0,1 sweep).
  const auto opt_text = [&](const char* k) { return o.contains(k) ? o.at(k).dump() : std::string("-"); };
  m.config =
      fmt::format("threads={} batch={} ubatch={} flash_attn={} type_k={} type_v={} ngl={} split={}",
                  opt_text("n_threads"), opt_text("n_batch"), opt_text("n_ubatch"), opt_text("flash_attn"),
                  opt_text("type_k"), opt_text("type_v"), opt_text("n_gpu_layers"), opt_text("split_mode"));
  const int64_t ngl = field<int64_t>(o, "n_gpu_layers", path, rec);
  const std::string gpu_info = o.contains("gpu_info") ? field<std::string>(o, "gpu_info", path, rec) : "";
  // On the CPU (no layer offloaded, or no GPU: a CPU build reports ngl 99 and no gpu_info): its
  // threads' share of the part.
  if ((ngl == 0 || gpu_info.empty()) && o.contains("n_threads")) {
    const int64_t t = field<int64_t>(o, "n_threads", path, rec);
    if (t < 1 || t > 65536) fail("{}: record {}: n_threads must be from 1 to 65536, got {}", path, rec, t);
    m.threads = int(t);
  }
  const std::string gpu = o.contains("gpu_info") ? field<std::string>(o, "gpu_info", path, rec) : "";
  m.hardware = ngl > 0 && !gpu.empty() ? gpu : field<std::string>(o, "cpu_info", path, rec);
  const int64_t n_prompt = field<int64_t>(o, "n_prompt", path, rec);
  const int64_t n_gen = field<int64_t>(o, "n_gen", path, rec);
  m.context_tokens = o.contains("n_depth") ? field<int64_t>(o, "n_depth", path, rec) : 0;
  const double avg_ns = field<double>(o, "avg_ns", path, rec);
  if (o.contains("samples_ns")) {
    m.repetitions = int(field<std::vector<double>>(o, "samples_ns", path, rec).size());
    if (m.repetitions < 1) fail("{}: record {}: field 'samples_ns' is empty", path, rec);
  }
  if (n_prompt < 0 || n_gen < 0 || m.context_tokens < 0)
    fail("{}: record {}: negative n_prompt, n_gen or n_depth", path, rec);
  if (n_prompt > kMaxCount || n_gen > kMaxCount || m.context_tokens > kMaxCount)
    fail("{}: record {}: n_prompt, n_gen or n_depth above {}", path, rec, kMaxCount);
  if (!(avg_ns > 0)) fail("{}: record {}: field 'avg_ns' must be positive, got {}", path, rec, avg_ns);
  if (n_prompt > 0 && n_gen > 0)
    fail(
        "{}: record {}: a combined prompt+generation test (-pg {},{}) cannot be split into TTFT and decode; "
        "run llama-bench with -p and -n instead",
        path, rec, n_prompt, n_gen);
  if (n_prompt == 0 && n_gen == 0) fail("{}: record {}: n_prompt and n_gen are both 0", path, rec);
  if (n_prompt > 0) {
    m.prompt_tokens = n_prompt;
    m.ttft_ms = avg_ns * 1e-6;
  } else {
    m.decode_tokens = n_gen;
    m.decode_ms_per_token = avg_ns * 1e-6 / double(n_gen);
  }
  return m;
}

// A record measuring both a TTFT and a decode latency becomes two, the decode one after the prompt.
void push_split(std::vector<Measurement>& out, Measurement m) {
  if (!m.ttft_ms && m.decode_ms_per_token && m.prompt_tokens > 0) {  // decoding after its prompt
    m.context_tokens += m.prompt_tokens;
    m.prompt_tokens = 0;
  }
  if (m.ttft_ms && m.decode_ms_per_token) {
    Measurement d = m;
    d.ttft_ms.reset();
    d.context_tokens = m.prompt_tokens + m.context_tokens;
    d.prompt_tokens = 0;
    m.decode_ms_per_token.reset();
    m.decode_tokens = 0;
    out.push_back(std::move(m));
    out.push_back(std::move(d));
  } else {
    out.push_back(std::move(m));
  }
}

// Strict numbers for the CSV: the whole cell, finite, in range.
double csv_number(const std::string& cell, const char* column, const std::string& path, int rec) {
  double v = 0;
  const auto [end, ec] = std::from_chars(cell.data(), cell.data() + cell.size(), v);
  if (ec != std::errc() || end != cell.data() + cell.size() || !std::isfinite(v))
    fail("{}: line {}: column '{}': '{}' is not a number", path, rec, column, cell);
  return v;
}

int64_t csv_count(const std::string& cell, const char* column, const std::string& path, int rec,
                  int64_t min) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(cell.data(), cell.data() + cell.size(), v);
  if (ec != std::errc() || end != cell.data() + cell.size())
    fail("{}: line {}: column '{}': '{}' is not a whole number", path, rec, column, cell);
  if (v < min) fail("{}: line {}: column '{}' must be at least {}, got {}", path, rec, column, min, v);
  if (v > kMaxCount)
    fail("{}: line {}: column '{}' is implausibly large ({} > {})", path, rec, column, v, kMaxCount);
  return v;
}

}  // namespace

std::vector<Measurement> import_csv(const std::string& path) {
  std::string text = read_text(path);                      // a readable file, or our own one-line error
  if (text.starts_with("\xEF\xBB\xBF")) text.erase(0, 3);  // a UTF-8 byte-order mark (spreadsheet exports)
  // Every column the format knows (docs/measurements.md); any other column is an error.
  std::string model, hardware, framework, version, dtype, method, batch, tp, prompt, context, ttft_ms, ttft_s,
      decode_ms, decode_tokens, reps, threads;
  std::vector<Measurement> out;
  try {
    io::CSVReader<16, io::trim_chars<' ', '\t'>, io::double_quote_escape<',', '"'>, io::throw_on_overflow,
                  io::single_line_comment<'#'>>
        in(path, text.data(), text.data() + text.size());
    in.read_header(io::ignore_missing_column, "model", "hardware", "framework", "framework_version", "dtype",
                   "method", "batch", "tp", "prompt_tokens", "context_tokens", "ttft_ms", "ttft_s",
                   "decode_ms_per_token", "decode_tokens", "repetitions", "threads");
    for (const char* need : {"model", "hardware", "prompt_tokens"})
      if (!in.has_column(need))
        fail("{}: missing column '{}' (docs/measurements.md lists the format)", path, need);
    if (in.has_column("ttft_ms") && in.has_column("ttft_s"))
      fail("{}: mixed units: both 'ttft_ms' and 'ttft_s' columns; keep one", path);
    const bool has_ttft = in.has_column("ttft_ms") || in.has_column("ttft_s");
    if (!has_ttft && !in.has_column("decode_ms_per_token"))
      fail("{}: no time column: give 'ttft_ms' (or 'ttft_s') and/or 'decode_ms_per_token'", path);
    const double ttft_scale = in.has_column("ttft_s") ? 1e3 : 1.0;
    while (in.read_row(model, hardware, framework, version, dtype, method, batch, tp, prompt, context,
                       ttft_ms, ttft_s, decode_ms, decode_tokens, reps, threads)) {
      const int rec = int(in.get_file_line());  // the physical line, as the reader's own errors count
      Measurement m;
      m.file = path;
      m.record = rec;
      if (model.empty() || hardware.empty())
        fail("{}: line {}: 'model' and 'hardware' must not be empty", path, rec);
      m.model = model;
      m.hardware = hardware;
      m.framework = framework.empty() ? "unknown" : framework;
      m.framework_version = version;
      m.dtype = dtype;
      if (!method.empty()) m.method = method;
      if (!batch.empty()) m.batch = int(csv_count(batch, "batch", path, rec, 1));
      if (!tp.empty()) m.tp = int(csv_count(tp, "tp", path, rec, 1));
      m.prompt_tokens = csv_count(prompt, "prompt_tokens", path, rec, 0);
      if (!context.empty()) m.context_tokens = csv_count(context, "context_tokens", path, rec, 0);
      if (!reps.empty()) m.repetitions = int(csv_count(reps, "repetitions", path, rec, 1));
      if (!threads.empty())
        m.threads = int(std::min<int64_t>(csv_count(threads, "threads", path, rec, 1), 65536));
      const std::string& ttft = in.has_column("ttft_s") ? ttft_s : ttft_ms;
      if (!ttft.empty()) {
        const double v =
            csv_number(ttft, in.has_column("ttft_s") ? "ttft_s" : "ttft_ms", path, rec) * ttft_scale;
        if (!(v > 0)) fail("{}: line {}: TTFT must be positive, got {}", path, rec, ttft);
        if (m.prompt_tokens < 1) fail("{}: line {}: a TTFT needs prompt_tokens >= 1", path, rec);
        m.ttft_ms = v;
      }
      if (!decode_ms.empty()) {
        const double v = csv_number(decode_ms, "decode_ms_per_token", path, rec);
        if (!(v > 0)) fail("{}: line {}: decode_ms_per_token must be positive, got {}", path, rec, decode_ms);
        m.decode_ms_per_token = v;
        m.decode_tokens = decode_tokens.empty() ? 1 : csv_count(decode_tokens, "decode_tokens", path, rec, 1);
      }
      if (!m.ttft_ms && !m.decode_ms_per_token) fail("{}: line {}: no time given", path, rec);
      if (!m.decode_ms_per_token && !decode_tokens.empty())
        fail("{}: line {}: decode_tokens without decode_ms_per_token", path, rec);
      push_split(out, std::move(m));
      for (std::string* cell : {&framework, &version, &dtype, &method, &batch, &tp, &context, &ttft_ms,
                                &ttft_s, &decode_ms, &decode_tokens, &reps})
        cell->clear();  // a missing column leaves its variable as it was
    }
  } catch (const io::error::base& e) {
    fail("{}: {}", path, e.what());
  }
  if (out.empty()) fail("{}: no rows", path);
  return out;
}

std::vector<Measurement> import_llama_bench(const std::string& path) {
  const std::string text = read_text(path);
  std::vector<Measurement> out;
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) fail("{}: empty file", path);
  if (text[first] == '[') {
    json arr;
    try {
      arr = json_parse(text, path);
    } catch (const json::exception& e) {
      fail("{}: not valid JSON ({})", path, e.what());
    }
    for (size_t i = 0; i < arr.size(); ++i) out.push_back(from_llama_bench(arr[i], path, int(i) + 1));
  } else {
    std::istringstream in(text);
    std::string line;
    int rec = 0;  // the physical line number
    while (std::getline(in, line)) {
      ++rec;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      json o;
      try {
        o = json_parse(line, fmt::format("{}: line {}", path, rec));
      } catch (const json::exception& e) {
        fail("{}: line {}: not valid JSON ({})", path, rec, e.what());
      }
      out.push_back(from_llama_bench(o, path, rec));
    }
  }
  if (out.empty()) fail("{}: no llama-bench results in the file", path);
  return out;
}

std::vector<Measurement> import_run_json(const std::string& path) {
  json o;
  try {
    o = json_parse(read_text(path), path);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON ({})", path, e.what());
  }
  if (!o.is_object()) fail("{}: not a `lazyprefill run --json` object", path);
  Measurement m;
  m.file = path;
  m.record = 1;
  m.framework = "lazyprefill";
  m.framework_version = fmt::format("{} ({})", field<std::string>(o, "version", path, 1),
                                    field<std::string>(o, "git_commit", path, 1));
  m.model = field<std::string>(o, "model", path, 1);
  // Our CPU runs are this machine's; a `run --backend cuda` names its GPU.
  m.hardware = o.contains("hardware") ? field<std::string>(o, "hardware", path, 1) : "cpu-local";
  if (o.contains("backend"))
    if (const auto b = field<std::string>(o, "backend", path, 1); b != "cpu")
      m.framework = "lazyprefill-" + b;
  if (m.framework == "lazyprefill" && o.contains("threads")) {  // a CUDA run's threads are the host's
    const int64_t t = field<int64_t>(o, "threads", path, 1);
    if (t < 1 || t > 65536) fail("{}: record 1: threads must be from 1 to 65536, got {}", path, t);
    m.threads = int(t);
  }
  m.dtype = field<std::string>(o, "dtype", path, 1);
  m.prompt_tokens = field<int64_t>(o, "prompt_tokens", path, 1);
  m.ttft_ms = field<double>(o, "ttft_ms", path, 1);
  if (!(*m.ttft_ms > 0) || m.prompt_tokens < 1)
    fail("{}: record 1: ttft_ms and prompt_tokens must be positive", path);
  const std::string prune = field<std::string>(o, "prune", path, 1);
  if (prune != "none") m.method = prune + " " + field<std::string>(o, "schedule", path, 1);
  // The first token comes from the prefill; each later one is a decoding step.
  const int64_t steps = field<int64_t>(o, "generated_tokens", path, 1) - 1;
  const double tps = field<double>(o, "decode_tokens_per_s", path, 1);
  if (steps < 0) fail("{}: record 1: generated_tokens must be at least 1", path);
  if (steps > 0 && !(tps > 0)) fail("{}: record 1: decode_tokens_per_s must be positive, got {}", path, tps);
  if (steps > 0) {
    m.decode_tokens = steps;
    m.decode_ms_per_token = 1e3 / tps;
  }
  std::vector<Measurement> out;
  push_split(out, std::move(m));
  return out;
}

namespace {

// The JSON records of a file: one object, the elements of an array, or one object per line
// (JSON Lines), each with its 1-based number (element or physical line).
std::vector<std::pair<int, json>> json_records(const std::string& path, const std::string& text) {
  std::vector<std::pair<int, json>> out;
  try {
    json all = json_parse(text, path);
    if (all.is_array()) {
      for (size_t i = 0; i < all.size(); ++i) out.emplace_back(int(i) + 1, std::move(all[i]));
    } else {
      out.emplace_back(1, std::move(all));
    }
    return out;
  } catch (const json::exception&) {
    // several values: JSON Lines
  }
  std::istringstream in(text);
  std::string line;
  int rec = 0;
  while (std::getline(in, line)) {
    ++rec;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      out.emplace_back(rec, json_parse(line, fmt::format("{}: line {}", path, rec)));
    } catch (const json::exception& e) {
      fail("{}: line {}: not valid JSON ({})", path, rec, e.what());
    }
  }
  return out;
}

// A number that may be missing or null: the value, or nullopt. Strings holding numbers (vLLM's
// --metadata values are strings) are read too; anything else is an error naming the field.
std::optional<double> opt_number(const json& o, const char* key, const std::string& path, int rec) {
  const auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (it->is_number()) return it->get<double>();
  if (it->is_string()) {
    const std::string v = it->get<std::string>();
    double x = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec == std::errc() && end == v.data() + v.size() && std::isfinite(x)) return x;
  }
  fail("{}: record {}: field '{}' must be a number, got {}", path, rec, key, it->dump());
}

std::string opt_text(const json& o, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (const auto it = o.find(k); it != o.end() && it->is_string() && !it->get<std::string>().empty())
      return it->get<std::string>();
  return "";
}

const json& object_field(const json& o, const char* key, const std::string& path, int rec,
                         const char* hint = "") {
  const auto it = o.find(key);
  if (it == o.end() || !it->is_object()) fail("{}: record {}: missing object '{}'{}", path, rec, key, hint);
  return *it;
}

int64_t whole_tokens(double v, const char* what, const std::string& path, int rec) {
  if (!(v >= 1) || v > double(kMaxCount))
    fail("{}: record {}: {} must be between 1 and {} tokens, got {}", path, rec, what, kMaxCount, v);
  return std::llround(v);
}

// Whether a serving result carries a decode latency: a time per output token over at least two
// output tokens (the first comes from the prefill). A present but non-positive time is an error.
bool has_decode(const std::optional<double>& tpot, double output_tokens, const std::string& path, int rec) {
  if (!tpot || output_tokens < 2) return false;
  if (!(*tpot > 0))
    fail("{}: record {}: the time per output token must be positive, got {}", path, rec, *tpot);
  return true;
}

Measurement from_vllm_serving(const json& o, const std::string& path, int rec) {
  if (!o.is_object()) fail("{}: record {}: not a JSON object", path, rec);
  Measurement m;
  m.file = path;
  m.record = rec;
  m.framework = o.contains("backend") ? field<std::string>(o, "backend", path, rec) : "vllm";
  m.framework_version = opt_text(o, {"vllm_version", "version"});
  m.model = field<std::string>(o, "model_id", path, rec);
  if (const size_t slash = m.model.find_last_of('/'); slash != std::string::npos) m.model.erase(0, slash + 1);
  m.hardware = opt_text(o, {"gpu", "hardware", "gpu_type"});
  m.dtype = opt_text(o, {"dtype"});
  std::vector<std::string> notes;
  if (m.hardware.empty()) notes.push_back("hardware not recorded");
  if (const auto tp = opt_number(o, "tensor_parallel_size", path, rec)
                          ? opt_number(o, "tensor_parallel_size", path, rec)
                          : opt_number(o, "tp", path, rec)) {
    if (*tp < 1 || *tp > 4096 || *tp != std::floor(*tp))
      fail("{}: record {}: the tensor-parallel degree must be a whole number from 1 to 4096", path, rec);
    m.tp = int(*tp);
  } else {
    notes.push_back("tp not recorded: 1 assumed");
  }
  // Prompt length: the per-request lengths when saved, else the mean from the totals.
  double prompt = 0, output = 0;
  if (const auto it = o.find("input_lens"); it != o.end() && it->is_array() && !it->empty()) {
    for (const json& v : *it) {
      if (!v.is_number()) fail("{}: record {}: field 'input_lens' must hold numbers", path, rec);
      prompt += v.get<double>();
    }
    prompt /= double(it->size());
  } else if (const auto total = opt_number(o, "total_input_tokens", path, rec)) {
    const auto done = opt_number(o, "completed", path, rec);
    if (!done || !(*done >= 1))
      fail("{}: record {}: field 'completed' must be at least 1 with 'total_input_tokens'", path, rec);
    prompt = *total / *done;
    if (const auto out_total = opt_number(o, "total_output_tokens", path, rec)) output = *out_total / *done;
  } else if (const auto len = opt_number(o, "input_len", path, rec)
                                  ? opt_number(o, "input_len", path, rec)
                                  : opt_number(o, "random_input_len", path, rec)) {
    prompt = *len;
  } else {
    fail(
        "{}: record {}: no prompt length: none of 'input_lens', 'total_input_tokens' with 'completed', or a "
        "metadata 'input_len'",
        path, rec);
  }
  if (const auto it = o.find("output_lens"); output == 0 && it != o.end() && it->is_array() && !it->empty()) {
    for (const json& v : *it) {
      if (!v.is_number()) fail("{}: record {}: field 'output_lens' must hold numbers", path, rec);
      output += v.get<double>();
    }
    output /= double(it->size());
  }
  if (output == 0)
    if (const auto out_total = opt_number(o, "total_output_tokens", path, rec))
      if (const auto done = opt_number(o, "completed", path, rec); done && *done >= 1)
        output = *out_total / *done;
  if (output == 0)
    if (const auto len = opt_number(o, "output_len", path, rec)) output = *len;
  m.prompt_tokens = whole_tokens(prompt, "the mean prompt", path, rec);
  const auto ttft = opt_number(o, "median_ttft_ms", path, rec) ? opt_number(o, "median_ttft_ms", path, rec)
                                                               : opt_number(o, "mean_ttft_ms", path, rec);
  if (!ttft) fail("{}: record {}: missing field 'median_ttft_ms' (or 'mean_ttft_ms')", path, rec);
  if (!(*ttft > 0)) fail("{}: record {}: the TTFT must be positive, got {}", path, rec, *ttft);
  m.ttft_ms = *ttft;
  const auto tpot = opt_number(o, "median_tpot_ms", path, rec) ? opt_number(o, "median_tpot_ms", path, rec)
                                                               : opt_number(o, "mean_tpot_ms", path, rec);
  if (has_decode(tpot, output, path, rec)) {
    m.decode_ms_per_token = *tpot;
    m.decode_tokens = std::llround(output) - 1;
  }
  // Load: requests in flight at once. Only one at a time measures a request alone.
  const auto conc = opt_number(o, "max_concurrency", path, rec);
  const auto rate = o.contains("request_rate") ? o.at("request_rate").dump() : std::string("-");
  m.config = fmt::format("request_rate={} max_concurrency={}", rate, conc ? fmt::format("{}", *conc) : "-");
  m.isolated = conc && *conc == 1;
  if (!m.isolated) notes.push_back("under load (max_concurrency is not 1): TTFT includes queueing");
  if (const auto done = opt_number(o, "completed", path, rec))
    m.repetitions = int(std::clamp(*done, 1.0, 1e9));
  for (const std::string& n : notes) m.note += (m.note.empty() ? "" : "; ") + n;
  return m;
}

}  // namespace

std::vector<std::pair<int, nlohmann::json>> json_values(const std::string& path, const std::string& text) {
  return json_records(path, text);
}

std::vector<Measurement> import_vllm_serving(const std::string& path) {
  std::vector<Measurement> out;
  for (const auto& [rec, o] : json_records(path, read_text(path))) {
    Measurement m = from_vllm_serving(o, path, rec);
    push_split(out, std::move(m));  // the decode record starts after the prompt
  }
  if (out.empty()) fail("{}: no vLLM results in the file", path);
  return out;
}

std::vector<Measurement> import_vllm_latency(const std::string& path) {
  const auto recs = json_records(path, read_text(path));
  if (recs.size() != 1 || !recs[0].second.is_object())
    fail("{}: a vLLM latency result is one JSON object", path);
  const json& o = recs[0].second;
  const double avg_s = field<double>(o, "avg_latency", path, 1);
  if (!(avg_s > 0)) fail("{}: record 1: field 'avg_latency' must be positive, got {}", path, avg_s);
  // The settings live only on the command line, or in the PyTorch-benchmark-format file.
  std::string side = path;
  if (side.ends_with(".json")) side.resize(side.size() - 5);
  side += ".pytorch.json";
  if (::access(side.c_str(), F_OK) != 0)
    fail(
        "{}: a vLLM latency JSON does not record the prompt length, output length or batch; rerun with "
        "SAVE_TO_PYTORCH_BENCHMARK_FORMAT=1 so vLLM writes {} beside it, or enter the point in the plain CSV",
        path, side);
  const auto side_recs = json_records(side, read_text(side));
  const json* args = nullptr;
  for (const auto& [rec, r] : side_recs) {
    const json* a = r.is_object() && r.contains("benchmark") && r["benchmark"].is_object() &&
                            r["benchmark"].contains("extra_info") && r["benchmark"]["extra_info"].is_object()
                        ? &r["benchmark"]["extra_info"]
                        : nullptr;
    if (a && a->contains("args") && (*a)["args"].is_object()) args = &(*a)["args"];
    if (args) break;
  }
  if (!args) fail("{}: record 1: missing field 'benchmark.extra_info.args'", side);
  Measurement m;
  m.file = path;
  m.record = 1;
  m.framework = "vllm";
  m.framework_version = opt_text(*args, {"vllm_version"});
  m.model = field<std::string>(*args, "model", side, 1);
  if (const size_t slash = m.model.find_last_of('/'); slash != std::string::npos) m.model.erase(0, slash + 1);
  m.hardware = opt_text(*args, {"gpu", "hardware", "device"});
  if (m.hardware.empty() || m.hardware == "auto" || m.hardware == "cuda") {
    m.hardware.clear();
    m.note = "hardware not recorded";
  }
  m.dtype = opt_text(*args, {"dtype"});
  if (const std::string q = opt_text(*args, {"quantization"}); !q.empty()) m.dtype = q;
  const int64_t input = field<int64_t>(*args, "input_len", side, 1);
  const int64_t output = field<int64_t>(*args, "output_len", side, 1);
  m.batch = int(field<int64_t>(*args, "batch_size", side, 1));
  m.tp = args->contains("tensor_parallel_size") ? int(field<int64_t>(*args, "tensor_parallel_size", side, 1))
                                                : 1;
  if (input < 1 || m.batch < 1 || m.tp < 1)
    fail("{}: record 1: input_len, batch_size and tensor_parallel_size must be at least 1", side);
  if (output != 1)
    fail(
        "{}: record 1: output_len {}: the latency covers the prefill and {} decoding steps and cannot be "
        "split; "
        "`vllm bench latency --output-len 1` measures the TTFT",
        path, output, output - 1);
  m.prompt_tokens = input;
  m.ttft_ms = avg_s * 1e3;
  if (o.contains("latencies") && o["latencies"].is_array())
    m.repetitions = std::max(1, int(o["latencies"].size()));
  m.config =
      fmt::format("enforce_eager={} enable_chunked_prefill={}",
                  args->contains("enforce_eager") ? (*args)["enforce_eager"].dump() : "-",
                  args->contains("enable_chunked_prefill") ? (*args)["enable_chunked_prefill"].dump() : "-");
  return {m};
}

std::vector<Measurement> import_trtllm_bench(const std::string& path) {
  const auto recs = json_records(path, read_text(path));
  std::vector<Measurement> out;
  for (const auto& r : recs) {
    const auto& rec = r.first;  // not a structured binding: the lambdas below capture it
    const json& o = r.second;
    if (!o.is_object()) fail("{}: record {}: not a JSON object", path, rec);
    const json& engine = object_field(o, "engine", path, rec);
    const json& world = object_field(o, "world_info", path, rec);
    const json& req = object_field(o, "request_info", path, rec);
    const json& stream = object_field(o, "streaming_metrics", path, rec,
                                      " (TTFT is reported only by `trtllm-bench ... --streaming`)");
    Measurement m;
    m.file = path;
    m.record = rec;
    m.framework = "tensorrt-llm";
    m.framework_version = opt_text(engine, {"version"});
    m.model = field<std::string>(engine, "model", path, rec);
    if (const size_t slash = m.model.find_last_of('/'); slash != std::string::npos)
      m.model.erase(0, slash + 1);
    m.dtype = opt_text(engine, {"quantization"});
    if (m.dtype.empty() || m.dtype == "None") m.dtype = opt_text(engine, {"dtype"});
    if (const auto it = o.find("machine"); it != o.end() && it->is_object())
      m.hardware = opt_text(*it, {"name"});
    if (m.hardware.empty()) m.note = "hardware not recorded";
    m.tp = int(std::clamp<int64_t>(field<int64_t>(world, "tp_size", path, rec), 0, 4097));
    const int64_t pp = world.contains("pp_size") ? field<int64_t>(world, "pp_size", path, rec) : 1;
    if (m.tp < 1 || m.tp > 4096) fail("{}: record {}: world_info.tp_size must be from 1 to 4096", path, rec);
    if (pp != 1) fail("{}: record {}: pipeline parallelism (pp_size {}) is not modelled", path, rec, pp);
    const double input = field<double>(req, "avg_input_length", path, rec);
    const double output =
        req.contains("avg_output_length") ? field<double>(req, "avg_output_length", path, rec) : 0;
    m.prompt_tokens = whole_tokens(input, "request_info.avg_input_length", path, rec);
    const auto p50 = [&](const char* pct, const char* avg) -> std::optional<double> {
      if (const auto it = stream.find(pct); it != stream.end() && it->is_object())
        if (const auto v = opt_number(*it, "p50", path, rec)) return v;
      return opt_number(stream, avg, path, rec);
    };
    const auto ttft = p50("ttft_percentiles", "avg_ttft_ms");
    if (!ttft || !(*ttft > 0))
      fail("{}: record {}: streaming_metrics has no positive TTFT (avg_ttft_ms)", path, rec);
    m.ttft_ms = *ttft;
    const double conc = req.contains("avg_num_concurrent_requests")
                            ? field<double>(req, "avg_num_concurrent_requests", path, rec)
                            : 0;
    m.isolated = conc > 0 && conc <= 1.1;
    m.config = fmt::format("max_batch_size={} max_num_tokens={} concurrency={:.2f}",
                           world.contains("max_batch_size") ? world["max_batch_size"].dump() : "-",
                           world.contains("max_num_tokens") ? world["max_num_tokens"].dump() : "-", conc);
    if (!m.isolated)
      m.note += std::string(m.note.empty() ? "" : "; ") +
                "under load (concurrency above 1): TTFT includes queueing";
    if (const auto n = opt_number(req, "num_requests", path, rec))
      m.repetitions = int(std::clamp(*n, 1.0, 1e9));
    const auto tpot = p50("tpot_percentiles", "avg_tpot_ms");
    if (has_decode(tpot, output, path, rec)) {
      Measurement d = m;
      d.ttft_ms.reset();
      d.prompt_tokens = 0;
      d.decode_tokens = std::llround(output) - 1;
      d.context_tokens = m.prompt_tokens;
      d.decode_ms_per_token = *tpot;
      out.push_back(std::move(m));
      out.push_back(std::move(d));
    } else {
      out.push_back(std::move(m));
    }
  }
  if (out.empty()) fail("{}: no trtllm-bench report in the file", path);
  return out;
}

namespace {

// Control characters in names from a file become spaces: every message stays one line.
void clean_names(std::vector<Measurement>& ms) {
  for (Measurement& m : ms)
    for (std::string* t :
         {&m.model, &m.hardware, &m.framework, &m.framework_version, &m.dtype, &m.method, &m.config})
      for (char& c : *t)
        if (std::iscntrl(static_cast<unsigned char>(c))) c = ' ';
}

std::vector<Measurement> import_any(const std::string& path);

}  // namespace

std::vector<Measurement> import_measurements(const std::string& path,
                                             std::vector<MeasurementSource>* sources) {
  std::vector<MeasurementSource> read;
  g_reading = &read;
  struct Done {
    ~Done() { g_reading = nullptr; }
  } done;
  read_text(path);
  std::vector<Measurement> ms = import_any(path);
  clean_names(ms);
  if (sources) *sources = std::move(read);
  return ms;
}

namespace {

std::vector<Measurement> import_any(const std::string& path) {
  const std::string text = read_text(path);
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) fail("{}: empty file", path);
  const bool json_like = text[first] == '{' || text[first] == '[';
  // A .csv by name; a name without it (a pipe, <(...)) by content: a first line with commas.
  if (path.ends_with(".csv") ||
      (!json_like && text.substr(0, text.find('\n')).find(',') != std::string::npos))
    return import_csv(path);
  if (json_like) {
    // By the keys of the first record (an object, an array's first element, or the first line).
    const auto recs = json_records(path, text);
    if (recs.empty()) fail("{}: no records", path);
    const json& o = recs[0].second;
    if (!o.is_object()) fail("{}: record {}: not a JSON object", path, recs[0].first);
    {
      if (o.contains("ops") && o.contains("ttft_ms")) return import_run_json(path);
      if (o.contains("build_commit") && o.contains("avg_ns")) return import_llama_bench(path);
      if (o.contains("model_id") && (o.contains("mean_ttft_ms") || o.contains("median_ttft_ms")))
        return import_vllm_serving(path);
      if (o.contains("avg_latency") && o.contains("latencies")) return import_vllm_latency(path);
      if (o.contains("engine") && o.contains("world_info")) return import_trtllm_bench(path);
    }
  }
  fail(
      "{}: not a recognised measurement file (llama-bench -o json/jsonl, vLLM serving or latency JSON, "
      "trtllm-bench --report_json, lazyprefill run --json, or a .csv)",
      path);
}

}  // namespace

std::string name_key(const std::string& name) {
  std::string k;
  for (char ch : name)
    if (ch != ' ' && ch != '_' && ch != '-') k += char(std::tolower(static_cast<unsigned char>(ch)));
  return k;
}

namespace {
auto point_key(const Measurement& m) {
  return std::tuple{name_key(m.model),
                    name_key(m.hardware),
                    name_key(m.framework),
                    m.framework_version,
                    name_key(m.dtype),
                    m.method,
                    m.config,
                    m.batch,
                    m.tp,
                    m.prompt_tokens,
                    m.context_tokens,
                    m.decode_tokens,
                    m.ttft_ms.has_value()};
}
using PointKey = decltype(point_key(std::declval<const Measurement&>()));
}  // namespace

std::vector<Measurement> merge_repetitions(std::vector<Measurement> ms, int* merged) {
  std::map<PointKey, size_t> first;
  std::vector<Measurement> out;
  int folded = 0;
  for (Measurement& m : ms) {
    const auto [it, fresh] = first.emplace(point_key(m), out.size());
    if (fresh) {
      out.push_back(std::move(m));
      continue;
    }
    Measurement& a = out[it->second];
    const double wa = a.repetitions, wb = m.repetitions;
    const auto mean = [&](std::optional<double>& x, const std::optional<double>& y) {
      if (x && y) x = (*x * wa + *y * wb) / (wa + wb);
    };
    mean(a.ttft_ms, m.ttft_ms);
    mean(a.decode_ms_per_token, m.decode_ms_per_token);
    a.repetitions = int(std::min<int64_t>(int64_t(a.repetitions) + m.repetitions, int64_t(1) << 30));
    a.note +=
        fmt::format("{}repetition: {} record {} averaged in", a.note.empty() ? "" : "; ", m.file, m.record);
    ++folded;
  }
  if (merged) *merged = folded;
  return out;
}

void check_no_duplicates(const std::vector<Measurement>& ms) {
  std::map<PointKey, const Measurement*> seen;
  for (const Measurement& m : ms) {
    const auto [it, fresh] = seen.emplace(point_key(m), &m);
    if (!fresh)
      fail(
          "duplicate measurement: {} record {} and {} record {} are the same point ({} on {}, {} prompt "
          "tokens, "
          "{} generated)",
          it->second->file, it->second->record, m.file, m.record, m.model, m.hardware, m.prompt_tokens,
          m.decode_tokens);
  }
}

}  // namespace lp::calib
