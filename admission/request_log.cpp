#include "admission/request_log.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "model/error.h"
#include "model/json_checks.h"

namespace lp {

using ordered = nlohmann::ordered_json;

std::string request_log_line(const RequestLogLine& r) {
  ordered j;
  j["id"] = r.id;
  if (!r.endpoint.empty()) j["endpoint"] = r.endpoint;
  j["arrival_s"] = r.arrival_s;
  j["admitted_s"] = r.admitted_s;
  j["first_token_s"] = r.first_token_s;
  j["finished_s"] = r.finished_s;
  j["queue_s"] = r.admitted_s - r.arrival_s;
  j["ttft_s"] = r.first_token_s - r.arrival_s;
  j["e2e_s"] = r.finished_s - r.arrival_s;
  j["prompt_tokens"] = r.prompt_tokens;
  j["output_tokens"] = r.output_tokens;
  if (r.cached_tokens) j["cached_tokens"] = *r.cached_tokens;
  if (!r.finish.empty()) j["finish"] = r.finish;
  if (!r.error.empty()) j["error"] = r.error;
  j["prune"] = r.prune;
  if (!r.schedule.empty()) j["schedule"] = r.schedule;
  j["prompt_tokens_computed_fraction"] = r.prompt_tokens_computed_fraction;
  if (r.revivals) j["revivals"] = *r.revivals;
  if (r.kv_bytes_after_prefill) j["kv_bytes_after_prefill"] = *r.kv_bytes_after_prefill;
  if (r.aux_cache_bytes) j["aux_cache_bytes"] = *r.aux_cache_bytes;
  if (r.simulated) j["simulated"] = true;
  // An error's text may hold bytes of no character (a token cut in two): replaced, never refused.
  return json_text(j, -1) + "\n";
}

RequestLogLine parse_request_log_line(std::string_view line, std::string_view where) {
  nlohmann::json j;
  try {
    j = json_parse(line, where);  // too deep: json_parse's own error, naming the depth
  } catch (const nlohmann::json::exception&) {
    fail("{}: not a JSON object", where);
  }
  if (!j.is_object()) fail("{}: not a JSON object", where);
  for (const char* k : {"arrival_s", "prompt_tokens", "output_tokens"})
    if (!j.contains(k) || !j[k].is_number()) fail("{}: no number '{}'", where, k);
  RequestLogLine r;
  r.arrival_s = j["arrival_s"].get<double>();
  if (!std::isfinite(r.arrival_s) || r.arrival_s < 0)
    fail("{}: arrival_s {} is negative or not finite", where, r.arrival_s);
  const auto count = [&](const char* k) {
    const auto v = json_integer(j[k], 0, std::numeric_limits<int64_t>::max());
    if (!v) fail("{}: token counts must be whole numbers, got {} {}", where, k, j[k].dump());
    return *v;
  };
  r.prompt_tokens = count("prompt_tokens");
  r.output_tokens = count("output_tokens");
  const auto time = [&](const char* k) {
    return j.contains(k) && j[k].is_number() ? j[k].get<double>() : std::numeric_limits<double>::quiet_NaN();
  };
  r.admitted_s = time("admitted_s"), r.first_token_s = time("first_token_s"),
  r.finished_s = time("finished_s");
  const auto text = [&](const char* k) {
    return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : "";
  };
  const auto whole = [&](const char* k) -> std::optional<int64_t> {
    if (!j.contains(k)) return std::nullopt;
    return json_integer(j[k], std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max());
  };
  if (const auto id = whole("id"); id && *id >= 0) r.id = uint64_t(*id);
  r.endpoint = text("endpoint");
  r.finish = text("finish");
  r.error = text("error");
  if (r.error.empty() && j.contains("error") && !j["error"].is_null()) r.error = j["error"].dump();
  if (j.contains("prune") && j["prune"].is_string()) r.prune = j["prune"].get<std::string>();
  r.schedule = text("schedule");
  if (j.contains("prompt_tokens_computed_fraction") && j["prompt_tokens_computed_fraction"].is_number())
    r.prompt_tokens_computed_fraction = j["prompt_tokens_computed_fraction"].get<double>();
  r.revivals = whole("revivals");
  r.kv_bytes_after_prefill = whole("kv_bytes_after_prefill");
  r.aux_cache_bytes = whole("aux_cache_bytes");
  if (j.contains("cached_tokens")) {
    const auto c = json_integer(j["cached_tokens"], 0, r.prompt_tokens);
    if (!c)
      fail("{}: cached_tokens must be a whole number from 0 to prompt_tokens ({}), got {}", where,
           r.prompt_tokens, j["cached_tokens"].dump());
    r.cached_tokens = *c;
  }
  r.simulated = j.contains("simulated") && j["simulated"].is_boolean() && j["simulated"].get<bool>();
  return r;
}

}  // namespace lp
