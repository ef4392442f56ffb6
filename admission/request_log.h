// A line of the request log, with one owner for its writing and its reading: `serve
// --log-requests` writes one per finished request (server/), `simulate-serving --log-requests` the
// simulated ones (the fields a simulation has), and the serving simulation and `validate
// --serving` read them back (sim/serving.h: read_request_log, read_requests). docs/serving.md
// lists the fields.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace lp {

struct RequestLogLine {
  uint64_t id = 0;
  std::string endpoint;  // "completions" or "chat"; empty in a simulated log (not written)
  // Seconds since the server started (a simulation: since its clock's zero). Only arrival_s is
  // required when reading; a missing time reads as NaN.
  double arrival_s = 0, admitted_s = 0, first_token_s = 0, finished_s = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  std::string finish;  // length, stop, cancelled, error; empty in a simulated log
  std::string error;   // what went wrong, for finish "error"
  std::string prune = "none", schedule;
  double prompt_tokens_computed_fraction = 1;
  std::optional<int64_t> revivals, kv_bytes_after_prefill, aux_cache_bytes;  // the engine's
  std::optional<int64_t> cached_tokens;  // of the prompt, from the prefix cache (0..prompt_tokens)
  bool simulated = false;
  bool failed() const { return finish == "error" || !error.empty(); }
};

// The line as JSON text, newline-terminated; queue_s, ttft_s and e2e_s are written from the times.
std::string request_log_line(const RequestLogLine& r);
// One line read back. Throws lp::Error "<where>: <problem>": not a JSON object, no number
// arrival_s, prompt_tokens or output_tokens, a negative or non-finite arrival, counts that are not
// whole numbers, cached_tokens outside 0..prompt_tokens, or nested deeper than JSON inputs may be.
RequestLogLine parse_request_log_line(std::string_view line, std::string_view where);

}  // namespace lp
