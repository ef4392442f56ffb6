// The OpenAI-compatible API apart from the network: a request body checked and turned into what
// the scheduler runs (ApiRequest), the response and stream-chunk bodies, and the error shape. Pure
// functions of their inputs, so every rule here is tested without a socket (tests/server/).
//
// The API follows OpenAI's completions and chat completions (docs/serving.md lists what is and
// is not supported); one extension field, "lazyprefill", chooses the pruning per request:
//   "lazyprefill": {"prune": "lazyllm", "schedule": "0.3:0.3,0.6:0.3,0.9:0.3", "seed": 7}
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "model/config.h"
#include "model/tokenizer.h"
#include "pruning/policy.h"
#include "pruning/schedule.h"

namespace lp::server {

using json = nlohmann::ordered_json;

// A request the API refuses, as OpenAI reports it: an HTTP status and
// {"error": {"message", "type", "param", "code"}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string code = "");
  int status;
  std::string type;   // invalid_request_error (4xx), server_error (5xx)
  std::string param;  // the body field at fault, "" when none
  std::string code;   // model_not_found, context_length_exceeded, ... or ""
};
json error_body(const ApiError& e);

enum class Endpoint { Completions, ChatCompletions };

// What the server applies where a request is silent.
struct ApiDefaults {
  std::string model_name;  // the one model served; a request naming another gets 404
  PolicyKind policy = PolicyKind::None;
  Schedule schedule = default_schedule();
  // max_tokens when a request gives none: completions 16 (OpenAI's default); chat the rest of
  // the context in OpenAI's API, here at most this many, because every token of max_tokens is
  // reserved K/V (docs/serving.md).
  int64_t chat_max_tokens = 512;
  int max_n = 8;  // "n" (choices a request may ask for) at most this (serve --max-n)
  // The context a request may use, prompt + max_tokens (serve --max-model-len, as vLLM's: on a GPU
  // by default what its memory holds for one request); 0: the model's.
  int64_t max_model_len = 0;
};

// The context a request may use: d.max_model_len where set, else the model's.
int64_t max_model_len(const ApiDefaults& d, const ModelConfig& c);

// A request ready for the scheduler.
struct ApiRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::vector<int32_t> prompt;
  int64_t max_tokens = 16;
  SamplerParams sampler;
  std::vector<std::string> stop;  // up to 4, none empty
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  bool ignore_eos = false;     // vLLM's extension: generate max_tokens even past end of generation
  // Log-probabilities of the generated tokens, with this many alternatives each (0 to 20); -1:
  // none. Completions: "logprobs": k. Chat: "logprobs": true, "top_logprobs": k (default 0).
  int top_logprobs = -1;
  int n = 1;            // choices, each its own generation from the prompt (1 to ApiDefaults::max_n)
  int max_n = 8;        // (parse_request's bound for n, from ApiDefaults)
  int64_t best_of = 0;  // as read (0: not given); 1 or n
  // Completions' echo: the prompt's text before each choice's, and with logprobs the prompt's
  // tokens' log-probabilities before the generated ones' (the first prompt token's null). Not
  // streamed, not with pruning.
  bool echo = false;
  std::string prompt_text;      // the prompt as text (a string prompt as sent; ids decoded)
  int top_logprobs_asked = -1;  // chat's "top_logprobs" as read (parse_request checks it against "logprobs")
  PolicyKind policy = PolicyKind::None;
  Schedule schedule;
  uint64_t prune_seed = 0;
};

// Parses and checks a request body. `fallback_seed` seeds sampling (and --prune random) when the
// body gives no seed. Throws ApiError: 400 for a malformed or unsupported request (not JSON,
// invalid UTF-8, a field of the wrong type or out of range, a prompt plus max_tokens beyond the
// context, a bad pruning override), 404 for another model's name.
ApiRequest parse_request(std::string_view body, Endpoint e, const Tokenizer& tok, const ModelConfig& c,
                         const ApiDefaults& d, uint64_t fallback_seed);

// What a finished request returns, beside its text.
struct Outcome {
  std::string finish_reason;  // "stop" or "length"
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t cached_tokens = 0;  // of the prompt, from the prefix cache (usage.prompt_tokens_details)
  // The "lazyprefill" block of the response: what pruning did.
  std::string policy, schedule;
  double prompt_tokens_computed_fraction = 1;
  int64_t revivals = 0;
  double queue_s = 0, ttft_s = 0;
};

// The "logprobs" of a choice for these generated tokens, as OpenAI shapes them: completions
// {"tokens", "token_logprobs", "top_logprobs" (token -> logprob, the chosen one among them),
// "text_offset" (from `offset`: where the first token's text starts in the completion)}; chat
// {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}.
// A token's text is its own bytes decoded alone (a part of a character is shown as the UTF-8
// replacement, its bytes exact in "bytes").
// With echo (completions): the prompt's first token (its log-probability null) and the rest's
// `prompt` entries come first.
json logprobs_body(Endpoint e, std::span<const TokenLogprobs> lps, const Tokenizer& tok, int64_t offset = 0,
                   std::span<const TokenLogprobs> prompt = {}, int32_t first_prompt_token = -1);

// Response bodies. `id` is "cmpl-..." or "chatcmpl-..." (response_id), `created` Unix seconds.
std::string response_id(Endpoint e, uint64_t request_id);
json completion_body(Endpoint e, const std::string& id, int64_t created, const std::string& model,
                     const std::string& text, const Outcome& o, const json* logprobs = nullptr);
// With several choices ("n"): each one's text, finish reason and logprobs, in index order.
struct ChoiceText {
  std::string text, finish_reason;
  const json* logprobs = nullptr;
};
json completion_body(Endpoint e, const std::string& id, int64_t created, const std::string& model,
                     std::span<const ChoiceText> choices, const Outcome& o);
// One streamed chunk: a piece of text, or (finish_reason set, text empty) the last one. For chat,
// `first` adds the assistant role to the delta.
json chunk_body(Endpoint e, const std::string& id, int64_t created, const std::string& model,
                const std::string& text, const std::string& finish_reason, bool first,
                const json* logprobs = nullptr, int index = 0);
// stream_options.include_usage: the chunk after the last, with no choices and the usage.
json usage_chunk_body(Endpoint e, const std::string& id, int64_t created, const std::string& model,
                      const Outcome& o);
json models_body(const std::string& model, int64_t created, int64_t context_length);

// The engine's state after its last iteration, as GET /health judges it.
struct EngineState {
  int64_t queued = 0, running = 0;
  int64_t kv_reserved = 0, kv_budget = 0;  // bytes
  // Seconds since the engine last made progress (finished an iteration that did work) while
  // requests wait or run; 0 when it is idle with nothing to do.
  double stalled_s = 0;
};
// Why the server cannot serve now (GET /health then answers 503 with it), or "" when it can: it is
// shutting down; K/V is reserved while no request runs (the scheduler releases a request's
// reservation as it finishes, so a reservation with nothing running is one lost, issue 50's
// starvation: requests then queue behind it forever, and only a restart frees it); or, with
// `stall_limit_s` > 0, the engine has made no progress for longer than that with work waiting (an
// iteration that never ends: a hung kernel, a deadlock).
std::string health_problem(const EngineState& s, bool draining, double stall_limit_s = 0);

// A JSON document as text, invalid UTF-8 (a token cut inside a character) replaced by U+FFFD.
std::string dump(const json& j);

}  // namespace lp::server
