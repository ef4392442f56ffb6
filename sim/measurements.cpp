#include "sim/measurements.h"

#include <fmt/format.h>

// Debian's libfccp-dev (fast-cpp-csv-parser); without its reader thread. Its error types copy
// file names with strncpy into fixed buffers, which GCC flags; the truncation is intended.
#define CSV_IO_NO_THREAD
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-truncation"
#include <libfccp/csv.h>
#pragma GCC diagnostic pop

#include <charconv>
#include <fstream>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>
#include <type_traits>

#include "model/error.h"

namespace lp::sim {
namespace {

using json = nlohmann::json;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read measurements '{}'", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A field of record `rec` of `path`, of the JSON type T; errors name all three.
template <class T>
T field(const json& o, const char* key, const std::string& path, int rec) {
  const auto it = o.find(key);
  if (it == o.end()) fail("{}: record {}: missing field '{}'", path, rec, key);
  if constexpr (std::is_integral_v<T>)
    if (!it->is_number_integer()) fail("{}: record {}: field '{}' must be a whole number, got {}", path, rec, key, it->dump());
  if constexpr (std::is_floating_point_v<T>)
    if (!it->is_number()) fail("{}: record {}: field '{}' must be a number, got {}", path, rec, key, it->dump());
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    fail("{}: record {}: field '{}' has the wrong type ({})", path, rec, key, it->dump());
  }
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
  m.model = field<std::string>(o, "model_type", path, rec);
  m.dtype = ftype_of(m.model);
  // Settings that change speed between otherwise equal tests (a -t 4,8 or -fa 0,1 sweep).
  const auto opt_text = [&](const char* k) { return o.contains(k) ? o.at(k).dump() : std::string("-"); };
  m.config = fmt::format("threads={} batch={} ubatch={} flash_attn={} type_k={} type_v={} ngl={} split={}",
                         opt_text("n_threads"), opt_text("n_batch"), opt_text("n_ubatch"), opt_text("flash_attn"),
                         opt_text("type_k"), opt_text("type_v"), opt_text("n_gpu_layers"), opt_text("split_mode"));
  const int64_t ngl = field<int64_t>(o, "n_gpu_layers", path, rec);
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
  if (!(avg_ns > 0)) fail("{}: record {}: field 'avg_ns' must be positive, got {}", path, rec, avg_ns);
  if (n_prompt > 0 && n_gen > 0)
    fail("{}: record {}: a combined prompt+generation test (-pg {},{}) cannot be split into TTFT and decode; "
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

int64_t csv_count(const std::string& cell, const char* column, const std::string& path, int rec, int64_t min) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(cell.data(), cell.data() + cell.size(), v);
  if (ec != std::errc() || end != cell.data() + cell.size())
    fail("{}: line {}: column '{}': '{}' is not a whole number", path, rec, column, cell);
  if (v < min) fail("{}: line {}: column '{}' must be at least {}, got {}", path, rec, column, min, v);
  return v;
}

}  // namespace

std::vector<Measurement> import_csv(const std::string& path) {
  std::string text = read_text(path);  // a readable file, or our own one-line error
  if (text.starts_with("\xEF\xBB\xBF")) text.erase(0, 3);  // a UTF-8 byte-order mark (spreadsheet exports)
  // Every column the format knows (docs/measurements.md); any other column is an error.
  std::string model, hardware, framework, version, dtype, method, batch, tp, prompt, context, ttft_ms, ttft_s,
      decode_ms, decode_tokens, reps;
  std::vector<Measurement> out;
  try {
    io::CSVReader<15, io::trim_chars<' ', '\t'>, io::double_quote_escape<',', '"'>, io::throw_on_overflow,
                  io::single_line_comment<'#'>>
        in(path, text.data(), text.data() + text.size());
    in.read_header(io::ignore_missing_column, "model", "hardware", "framework", "framework_version", "dtype", "method",
                   "batch", "tp", "prompt_tokens", "context_tokens", "ttft_ms", "ttft_s", "decode_ms_per_token",
                   "decode_tokens", "repetitions");
    for (const char* need : {"model", "hardware", "prompt_tokens"})
      if (!in.has_column(need)) fail("{}: missing column '{}' (docs/measurements.md lists the format)", path, need);
    if (in.has_column("ttft_ms") && in.has_column("ttft_s"))
      fail("{}: mixed units: both 'ttft_ms' and 'ttft_s' columns; keep one", path);
    const bool has_ttft = in.has_column("ttft_ms") || in.has_column("ttft_s");
    if (!has_ttft && !in.has_column("decode_ms_per_token"))
      fail("{}: no time column: give 'ttft_ms' (or 'ttft_s') and/or 'decode_ms_per_token'", path);
    const double ttft_scale = in.has_column("ttft_s") ? 1e3 : 1.0;
    while (in.read_row(model, hardware, framework, version, dtype, method, batch, tp, prompt, context, ttft_ms, ttft_s,
                       decode_ms, decode_tokens, reps)) {
      const int rec = int(in.get_file_line());  // the physical line, as the reader's own errors count
      Measurement m;
      m.file = path;
      m.record = rec;
      if (model.empty() || hardware.empty()) fail("{}: line {}: 'model' and 'hardware' must not be empty", path, rec);
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
      const std::string& ttft = in.has_column("ttft_s") ? ttft_s : ttft_ms;
      if (!ttft.empty()) {
        const double v = csv_number(ttft, in.has_column("ttft_s") ? "ttft_s" : "ttft_ms", path, rec) * ttft_scale;
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
      for (std::string* cell : {&framework, &version, &dtype, &method, &batch, &tp, &context, &ttft_ms, &ttft_s,
                                &decode_ms, &decode_tokens, &reps})
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
      arr = json::parse(text);
    } catch (const json::parse_error& e) {
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
        o = json::parse(line);
      } catch (const json::parse_error& e) {
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
    o = json::parse(read_text(path));
  } catch (const json::parse_error& e) {
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
  m.hardware = "cpu-local";
  m.dtype = field<std::string>(o, "dtype", path, 1);
  m.prompt_tokens = field<int64_t>(o, "prompt_tokens", path, 1);
  m.ttft_ms = field<double>(o, "ttft_ms", path, 1);
  if (!(*m.ttft_ms > 0) || m.prompt_tokens < 1) fail("{}: record 1: ttft_ms and prompt_tokens must be positive", path);
  const std::string prune = field<std::string>(o, "prune", path, 1);
  if (prune != "none") m.method = prune + " " + field<std::string>(o, "schedule", path, 1);
  // The first token comes from the prefill; each later one is a decoding step.
  const int64_t steps = field<int64_t>(o, "generated_tokens", path, 1) - 1;
  const double tps = field<double>(o, "decode_tokens_per_s", path, 1);
  if (steps > 0 && tps > 0) {
    m.decode_tokens = steps;
    m.decode_ms_per_token = 1e3 / tps;
  }
  std::vector<Measurement> out;
  push_split(out, std::move(m));
  return out;
}

std::vector<Measurement> import_measurements(const std::string& path) {
  const std::string text = read_text(path);
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) fail("{}: empty file", path);
  if (path.ends_with(".csv")) return import_csv(path);
  if (text[first] == '{') {
    // A single object: run --json (has "ops"), else the first of llama-bench's JSON Lines.
    try {
      const json o = json::parse(text);
      if (o.contains("ops") && o.contains("ttft_ms")) return import_run_json(path);
    } catch (const json::parse_error&) {
      // several lines: JSON Lines
    }
    return import_llama_bench(path);
  }
  if (text[first] == '[') return import_llama_bench(path);
  fail("{}: not a recognised measurement file (llama-bench -o json/jsonl, lazyprefill run --json, or a .csv)", path);
}

void check_no_duplicates(const std::vector<Measurement>& ms) {
  using Key = std::tuple<std::string, std::string, std::string, std::string, std::string, std::string, std::string,
                         int, int, int64_t, int64_t, int64_t, bool>;
  std::map<Key, const Measurement*> seen;
  for (const Measurement& m : ms) {
    const Key key{m.model,         m.hardware,      m.framework,      m.framework_version, m.dtype,
                  m.method,        m.config,        m.batch,          m.tp,                m.prompt_tokens,
                  m.context_tokens, m.decode_tokens, m.ttft_ms.has_value()};
    const auto [it, fresh] = seen.emplace(key, &m);
    if (!fresh)
      fail("duplicate measurement: {} record {} and {} record {} are the same point ({} on {}, {} prompt tokens, "
           "{} generated)",
           it->second->file, it->second->record, m.file, m.record, m.model, m.hardware, m.prompt_tokens,
           m.decode_tokens);
  }
}

}  // namespace lp::sim
