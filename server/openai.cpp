#include "server/openai.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "model/error.h"
#include "model/json_checks.h"
#include "pruning/method.h"

namespace lp::server {

ApiError::ApiError(int status_, std::string message, std::string param_, std::string code_)
    : std::runtime_error(std::move(message)),
      status(status_),
      type(status_ >= 500 ? "server_error" : "invalid_request_error"),
      param(std::move(param_)),
      code(std::move(code_)) {}

json error_body(const ApiError& e) {
  json err;
  err["message"] = e.what();
  err["type"] = e.type;
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  json j;
  j["error"] = std::move(err);
  return j;
}

namespace {

template <class... Args>
[[noreturn]] void bad(std::string param, fmt::format_string<Args...> f, Args&&... args) {
  throw ApiError(400, fmt::format(f, std::forward<Args>(args)...), std::move(param));
}

// A JSON number as a double, or a 400 naming the field.
double number(const json& v, const char* name) {
  if (!v.is_number()) bad(name, "'{}' must be a number, got {}", name, v.type_name());
  return v.get<double>();
}

// A JSON integer that an int64_t holds (a float with no fraction is accepted, as OpenAI's API
// does, up to 2^53 where doubles stop holding every integer), or a 400. nlohmann keeps integers
// above 2^63 - 1 unsigned: read as int64_t they would wrap to negative numbers.
int64_t integer(const json& v, const char* name) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max()))
      bad(name, "'{}' is out of range (at most 2^63 - 1), got {}", name, u);
    return int64_t(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::nearbyint(d) != d) bad(name, "'{}' must be an integer, got {}", name, d);
    if (std::fabs(d) > 9007199254740992.0)  // 2^53
      bad(name, "'{}' is out of range for an integer written with a fraction or exponent, got {}", name, d);
    return int64_t(d);
  }
  bad(name, "'{}' must be an integer, got {}", name, v.type_name());
}

bool boolean(const json& v, const char* name) {
  if (!v.is_boolean()) bad(name, "'{}' must be true or false, got {}", name, v.type_name());
  return v.get<bool>();
}

// The token ids a completions prompt gives directly ([1, 2, 3]), checked against the vocabulary.
std::vector<int32_t> token_array(const json& a, int32_t n_vocab) {
  std::vector<int32_t> ids;
  ids.reserve(a.size());
  for (const json& t : a) {
    if (!t.is_number_integer()) bad("prompt", "a prompt given as tokens must hold integers only");
    // Unsigned first: an id above 2^63 - 1 read as int64_t would wrap to a negative one.
    const bool inside = t.is_number_unsigned() ? t.get<uint64_t>() < uint64_t(n_vocab)
                                               : t.get<int64_t>() >= 0 && t.get<int64_t>() < n_vocab;
    if (!inside) bad("prompt", "token id {} is outside the vocabulary of {}", t.dump(), n_vocab);
    ids.push_back(t.get<int32_t>());
  }
  return ids;
}

std::vector<int32_t> completion_prompt(const json& p, const Tokenizer& tok, const ModelConfig& c) {
  // One prompt: a string, an array of token ids, or an array holding one of those (the client
  // libraries wrap it so). Several prompts in one request (a batch) are not supported.
  if (p.is_string()) return tok.encode(p.get_ref<const std::string&>(), true, false);
  if (p.is_array()) {
    if (p.empty()) bad("prompt", "the prompt is empty");
    if (p.size() == 1 && (p[0].is_string() || p[0].is_array())) return completion_prompt(p[0], tok, c);
    if (p[0].is_number_integer()) return token_array(p, c.n_vocab);
    bad("prompt", "several prompts in one request are not supported; send one request per prompt");
  }
  bad("prompt", "'prompt' must be a string, an array of token ids, or an array of one of those");
}

std::vector<int32_t> chat_prompt(const json& msgs, const Tokenizer& tok) {
  if (!msgs.is_array() || msgs.empty()) bad("messages", "'messages' must be a non-empty array");
  std::vector<ChatMessage> conv;
  for (const json& m : msgs) {
    if (!m.is_object()) bad("messages", "each message must be an object with 'role' and 'content'");
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) bad("messages", "each message needs a 'role' string");
    const std::string& r = role->get_ref<const std::string&>();
    ChatMessage cm;
    // OpenAI's "developer" role is its newer name for "system".
    cm.role = r == "developer" ? "system" : r;
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant")
      bad("messages", "unsupported message role '{}' (system, developer, user, assistant)", r);
    const auto content = m.find("content");
    if (content == m.end() || content->is_null()) bad("messages", "each message needs 'content'");
    if (content->is_string()) {
      cm.content = content->get<std::string>();
    } else if (content->is_array()) {
      for (const json& part : *content) {  // [{"type": "text", "text": "..."}]: text parts only
        const auto type = part.is_object() ? part.find("type") : part.end();
        if (type == part.end() || *type != "text" || !part.contains("text") || !part["text"].is_string())
          bad("messages", "only text content parts are supported");
        cm.content += part["text"].get<std::string>();
      }
    } else {
      bad("messages", "a message's 'content' must be a string or an array of text parts");
    }
    conv.push_back(std::move(cm));
  }
  try {
    return tok.encode(tok.apply_chat_template(conv, true), false, true);
  } catch (const lp::Error& e) {
    throw ApiError(400, fmt::format("the model's chat template cannot be applied: {}", e.what()), "messages");
  }
}

std::vector<std::string> stop_strings(const json& s) {
  std::vector<std::string> out;
  if (s.is_null()) return out;
  if (s.is_string()) {
    out.push_back(s.get<std::string>());
  } else if (s.is_array()) {
    if (s.size() > 4) bad("stop", "at most 4 stop strings, got {}", s.size());
    for (const json& x : s) {
      if (!x.is_string()) bad("stop", "'stop' must be a string or an array of strings");
      out.push_back(x.get<std::string>());
    }
  } else {
    bad("stop", "'stop' must be a string or an array of strings");
  }
  for (const std::string& x : out)
    if (x.empty()) bad("stop", "a stop string is empty");
  return out;
}

// The "lazyprefill" extension: pruning for this request. Only inline schedules: a request must
// not name files on the server.
void pruning_override(const json& o, ApiRequest& r) {
  if (!o.is_object()) bad("lazyprefill", "'lazyprefill' must be an object (prune, schedule, seed)");
  const PolicyKind before = r.policy;
  for (const auto& [key, v] : o.items()) {
    if (key == "prune") {
      if (!v.is_string()) bad("lazyprefill.prune", "'lazyprefill.prune' must be a string");
      try {
        r.policy = parse_policy(v.get<std::string>());
      } catch (const lp::Error& e) {
        bad("lazyprefill.prune", "{}", e.what());
      }
    } else if (key == "schedule") {
      if (!v.is_string()) bad("lazyprefill.schedule", "'lazyprefill.schedule' must be a string");
      try {
        r.schedule = parse_schedule(v.get<std::string>());
      } catch (const lp::Error& e) {
        bad("lazyprefill.schedule", "invalid schedule: {}", e.what());
      }
    } else if (key == "seed") {
      r.prune_seed = uint64_t(integer(v, "lazyprefill.seed"));
    } else {
      bad("lazyprefill", "unknown field 'lazyprefill.{}' (prune, schedule, seed)", key);
    }
  }
  // Another policy than the server's and no schedule: that policy's own default.
  if (o.contains("prune") && !o.contains("schedule") && r.policy != before)
    r.schedule = default_schedule(r.policy);
  if (const std::string why = method_problem(r.policy, r.schedule); !why.empty())
    bad("lazyprefill.schedule", "{}", why);
}

// One optional field of the body (not the prompt, model or max_tokens), into `r`. Anything else
// (user, metadata, store, ...) changes nothing here and is ignored, as OpenAI's own API ignores
// fields it does not use.
void read_field(const std::string& key, const json& v, ApiRequest& r) {
  if (key == "temperature") {
    const double t = number(v, "temperature");
    if (!(t >= 0 && t <= 2)) bad("temperature", "'temperature' must be between 0 and 2, got {}", t);
    r.sampler.temperature = float(t);
  } else if (key == "top_p") {
    const double p = number(v, "top_p");
    // In the sampler's float: 1e-300 passes as a double and becomes 0 (issue 50).
    if (!(p > 0 && p <= 1) || !(float(p) > 0)) bad("top_p", "'top_p' must be in (0, 1], got {}", p);
    r.sampler.top_p = float(p);
  } else if (key == "seed") {
    r.sampler.seed = uint64_t(integer(v, "seed"));
    r.prune_seed = r.sampler.seed;
  } else if (key == "stop") {
    r.stop = stop_strings(v);
  } else if (key == "stream") {
    r.stream = boolean(v, "stream");
  } else if (key == "stream_options") {
    if (!v.is_object()) bad("stream_options", "'stream_options' must be an object");
    if (const auto u = v.find("include_usage"); u != v.end() && !u->is_null())
      r.include_usage = boolean(*u, "stream_options.include_usage");
  } else if (key == "ignore_eos") {  // vLLM's and SGLang's; load generators send it
    r.ignore_eos = boolean(v, "ignore_eos");
  } else if (key == "logprobs") {  // completions: how many alternatives; chat: whether (read below)
    if (r.endpoint == Endpoint::Completions) {
      if (v.is_boolean() && !v.get<bool>()) return;
      const int64_t k = integer(v, "logprobs");
      if (k < 0 || k > 20) bad("logprobs", "'logprobs' must be from 0 to 20, got {}", k);
      r.top_logprobs = int(k);
    } else if (boolean(v, "logprobs")) {
      r.top_logprobs = std::max(r.top_logprobs, 0);
    }
  } else if (key == "top_logprobs" && r.endpoint == Endpoint::ChatCompletions) {
    const int64_t k = integer(v, "top_logprobs");
    if (k < 0 || k > 20) bad("top_logprobs", "'top_logprobs' must be from 0 to 20, got {}", k);
    r.top_logprobs_asked = int(k);
  } else if (key == "n") {
    const int64_t n = integer(v, "n");
    if (n < 1 || n > r.max_n) bad("n", "'n' must be from 1 to {} (the server's --max-n), got {}", r.max_n, n);
    r.n = int(n);
  } else if (key == "best_of") {  // choosing the best of several is not done; as many as n is n
    r.best_of = integer(v, "best_of");
  } else if (key == "echo") {
    r.echo = boolean(v, "echo");
    if (r.echo && r.endpoint != Endpoint::Completions) bad("echo", "'echo' is a completions field");
  } else if (key == "top_logprobs" || key == "tools" || key == "functions" || key == "response_format" ||
             key == "logit_bias" || key == "suffix") {
    bad(key, "'{}' is not supported", key);
  } else if (key == "frequency_penalty" || key == "presence_penalty") {
    if (number(v, key.c_str()) != 0) bad(key, "'{}' is not supported (only 0)", key);
  } else if (key == "lazyprefill") {
    pruning_override(v, r);
  }
}

}  // namespace

int64_t max_model_len(const ApiDefaults& d, const ModelConfig& c) {
  return d.max_model_len > 0 ? std::min<int64_t>(d.max_model_len, c.n_ctx_train) : c.n_ctx_train;
}

ApiRequest parse_request(std::string_view body, Endpoint e, const Tokenizer& tok, const ModelConfig& c,
                         const ApiDefaults& d, uint64_t fallback_seed) {
  // Nesting bounded before anything is built: a body a million levels deep took the server down
  // (issue 50).
  if (const size_t at = json_too_deep(body); at != std::string_view::npos)
    throw ApiError(400,
                   fmt::format("the body is nested deeper than {} levels (at byte {})", kMaxJsonDepth, at));
  json j;
  try {
    j = json::parse(body);               // nlohmann rejects ill-formed UTF-8 in strings, NaN and Infinity
  } catch (const json::exception& ex) {  // parse_error; out_of_range for a number such as 1e400
    // Its message ends in the offending bytes, which may not be UTF-8 themselves: keep the start.
    std::string what = ex.what();
    if (const auto cut = what.find("; last read:"); cut != std::string::npos) what.resize(cut);
    std::string at = json_error_path(body);  // the field, for a number such as 1e400
    throw ApiError(400,
                   at.empty() ? fmt::format("the body is not valid JSON: {}", what)
                              : fmt::format("the body is not valid JSON at '{}': {}", at, what),
                   at);
  }
  if (!j.is_object()) bad("", "the body must be a JSON object");
  ApiRequest r;
  r.endpoint = e;
  r.policy = d.policy;
  r.schedule = d.schedule;
  r.sampler.temperature = 1.0f;  // OpenAI's defaults
  r.sampler.top_p = 1.0f;
  r.sampler.seed = fallback_seed;
  r.prune_seed = fallback_seed;
  r.max_n = d.max_n;

  if (const auto m = j.find("model"); m != j.end() && !m->is_null()) {
    if (!m->is_string()) bad("model", "'model' must be a string");
    if (*m != d.model_name)
      throw ApiError(404,
                     fmt::format("the model '{}' does not exist; this server serves '{}'",
                                 m->get<std::string>(), d.model_name),
                     "model", "model_not_found");
  }
  try {
    if (e == Endpoint::Completions) {
      const auto p = j.find("prompt");
      if (p == j.end()) bad("prompt", "'prompt' is required");
      r.prompt = completion_prompt(*p, tok, c);
    } else {
      const auto m = j.find("messages");
      if (m == j.end()) bad("messages", "'messages' is required");
      r.prompt = chat_prompt(*m, tok);
    }
  } catch (const lp::Error& ex) {  // the tokenizer's own refusals
    bad(e == Endpoint::Completions ? "prompt" : "messages", "{}", ex.what());
  } catch (const json::exception& ex) {  // a read the checks missed
    bad(e == Endpoint::Completions ? "prompt" : "messages", "the prompt could not be read: {}", ex.what());
  }
  if (r.prompt.empty())
    bad(e == Endpoint::Completions ? "prompt" : "messages", "the prompt is empty (no tokens)");

  const int64_t T = int64_t(r.prompt.size()), ctx = max_model_len(d, c);
  const char* max_name = "max_tokens";
  auto max = j.find("max_tokens");
  if (e == Endpoint::ChatCompletions)
    if (const auto mc = j.find("max_completion_tokens"); mc != j.end() && !mc->is_null()) {
      max = mc;
      max_name = "max_completion_tokens";
    }
  if (T >= ctx)
    throw ApiError(
        400, fmt::format("this model's maximum context length is {} tokens, but the prompt has {}", ctx, T),
        e == Endpoint::Completions ? "prompt" : "messages", "context_length_exceeded");
  if (max != j.end() && !max->is_null()) {
    r.max_tokens = integer(*max, max_name);
    if (r.max_tokens < 1) bad(max_name, "'{}' must be at least 1, got {}", max_name, r.max_tokens);
    if (r.max_tokens > ctx - T)  // not T + max_tokens: that overflows near 2^63
      throw ApiError(
          400,
          fmt::format("this model's maximum context length is {} tokens, but {} were asked: {} in the "
                      "prompt and {} to generate",
                      ctx, uint64_t(T) + uint64_t(r.max_tokens), T, r.max_tokens),
          max_name, "context_length_exceeded");
  } else {
    r.max_tokens =
        e == Endpoint::Completions ? std::min<int64_t>(16, ctx - T) : std::min(d.chat_max_tokens, ctx - T);
  }

  for (const auto& [key, v] : j.items()) {
    if (v.is_null()) continue;  // clients send explicit nulls for what they leave at the default
    try {
      read_field(key, v, r);
    } catch (const json::exception& ex) {  // a read the checks above missed: still this field's fault
      bad(key, "'{}' could not be read: {}", key, ex.what());
    }
  }
  if (r.stream == false && r.include_usage) bad("stream_options", "'stream_options' needs 'stream': true");
  if (r.echo) {
    if (r.stream) bad("echo", "'echo' with 'stream' is not supported; ask without streaming");
    if (r.policy != PolicyKind::None && !r.schedule.steps.empty() && r.top_logprobs >= 0)
      bad("echo", "the prompt's log-probabilities need every prompt token computed: not with pruning ({})",
          policy_name(r.policy));
    if (r.top_logprobs >= 0 && T * int64_t(c.n_vocab) > kMaxPromptLogits)
      bad("echo",
          "the prompt's log-probabilities over {} tokens need {} MiB of logits, more than the {} MiB allowed",
          T, T * int64_t(c.n_vocab) * 4 >> 20, kMaxPromptLogits * 4 >> 20);
    const auto p = j.find("prompt");
    const json& one = p->is_array() && p->size() == 1 && (*p)[0].is_string() ? (*p)[0] : *p;
    r.prompt_text = one.is_string() ? one.get<std::string>() : tok.decode(r.prompt);
  }
  if (r.best_of != 0 && r.best_of != 1 && r.best_of != r.n)
    bad("best_of", "'best_of' must be 1 or n ({}): choosing the best of more is not supported", r.n);
  if (r.top_logprobs_asked >= 0) {  // chat's top_logprobs, which needs logprobs: true
    if (r.top_logprobs < 0) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.top_logprobs = r.top_logprobs_asked;
  }
  if (r.policy != PolicyKind::None) {
    try {
      (void)resolve_method(r.policy, r.schedule, c.n_layer, c.global_layers());
    } catch (const lp::Error& ex) {
      bad("lazyprefill.schedule", "invalid schedule for this model: {}", ex.what());
    }
  }
  return r;
}

std::string response_id(Endpoint e, uint64_t request_id) {
  return fmt::format("{}-{:016x}", e == Endpoint::Completions ? "cmpl" : "chatcmpl", request_id);
}

namespace {

json usage(const Outcome& o) {
  json u;
  u["prompt_tokens"] = o.prompt_tokens;
  u["completion_tokens"] = o.completion_tokens;
  u["total_tokens"] = o.prompt_tokens + o.completion_tokens;
  u["prompt_tokens_details"] = {{"cached_tokens", o.cached_tokens}};  // OpenAI's (and vLLM's) field
  return u;
}

json head(Endpoint e, const std::string& id, int64_t created, const std::string& model, bool chunk) {
  json j;
  j["id"] = id;
  j["object"] = e == Endpoint::Completions ? "text_completion"
                : chunk                    ? "chat.completion.chunk"
                                           : "chat.completion";
  j["created"] = created;
  j["model"] = model;
  return j;
}

}  // namespace

json completion_body(Endpoint e, const std::string& id, int64_t created, const std::string& model,
                     std::span<const ChoiceText> choices, const Outcome& o) {
  json j = head(e, id, created, model, false);
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceText& c = choices[i];
    json choice;
    choice["index"] = i;
    if (e == Endpoint::Completions)
      choice["text"] = c.text;
    else
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    choice["logprobs"] = c.logprobs ? *c.logprobs : json(nullptr);
    choice["finish_reason"] = c.finish_reason;
    list.push_back(std::move(choice));
  }
  j["choices"] = std::move(list);
  j["usage"] = usage(o);
  json lp;
  lp["prune"] = o.policy;
  lp["schedule"] = o.schedule;
  lp["prompt_tokens_computed_fraction"] = o.prompt_tokens_computed_fraction;
  lp["revivals"] = o.revivals;
  lp["queue_ms"] = o.queue_s * 1e3;
  lp["ttft_ms"] = o.ttft_s * 1e3;
  j["lazyprefill"] = std::move(lp);
  return j;
}

json completion_body(Endpoint e, const std::string& id, int64_t created, const std::string& model,
                     const std::string& text, const Outcome& o, const json* logprobs) {
  const ChoiceText one{text, o.finish_reason, logprobs};
  return completion_body(e, id, created, model, std::span(&one, 1), o);
}

json chunk_body(Endpoint e, const std::string& id, int64_t created, const std::string& model,
                const std::string& text, const std::string& finish_reason, bool first, const json* logprobs,
                int index) {
  json j = head(e, id, created, model, true);
  json choice;
  choice["index"] = index;
  if (e == Endpoint::Completions) {
    choice["text"] = text;
  } else {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    choice["delta"] = std::move(delta);
  }
  choice["logprobs"] = logprobs ? *logprobs : json(nullptr);
  choice["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  j["choices"] = json::array({choice});
  return j;
}

json logprobs_body(Endpoint e, std::span<const TokenLogprobs> lps, const Tokenizer& tok, int64_t offset,
                   std::span<const TokenLogprobs> prompt, int32_t first_prompt_token) {
  // A token's text alone, valid UTF-8 (a part of a character replaced), and its bytes.
  const auto text_of = [&tok](int32_t id) {
    const std::string raw = tok.decode(std::span<const int32_t>(&id, 1));
    return std::make_pair(json_text(json(raw), -1), raw);
  };
  const auto as_text = [](const std::string& dumped) { return json::parse(dumped).get<std::string>(); };
  if (e == Endpoint::Completions) {
    json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
    if (first_prompt_token >= 0) {  // echo: the prompt's first token has no log-probability
      const auto [dumped, raw] = text_of(first_prompt_token);
      tokens.push_back(as_text(dumped));
      values.push_back(nullptr);
      tops.push_back(nullptr);
      offsets.push_back(offset);
      offset += int64_t(raw.size());
    }
    std::vector<TokenLogprobs> all(prompt.begin(), prompt.end());
    all.insert(all.end(), lps.begin(), lps.end());
    for (const TokenLogprobs& lp : all) {
      const auto [dumped, raw] = text_of(lp.token);
      tokens.push_back(as_text(dumped));
      values.push_back(lp.logprob);
      offsets.push_back(offset);
      offset += int64_t(raw.size());
      json top = json::object();
      top[as_text(dumped)] = lp.logprob;
      for (const auto& [id, v] : lp.top) top[as_text(text_of(id).first)] = v;
      tops.push_back(std::move(top));
    }
    return {{"tokens", std::move(tokens)},
            {"token_logprobs", std::move(values)},
            {"top_logprobs", std::move(tops)},
            {"text_offset", std::move(offsets)}};
  }
  const auto entry = [&](int32_t id, float v) {
    const auto [dumped, raw] = text_of(id);
    json bytes = json::array();
    for (const unsigned char ch : raw) bytes.push_back(int(ch));
    return json{{"token", as_text(dumped)}, {"logprob", v}, {"bytes", std::move(bytes)}};
  };
  json content = json::array();
  for (const TokenLogprobs& lp : lps) {
    json c = entry(lp.token, lp.logprob);
    json top = json::array();
    for (const auto& [id, v] : lp.top) top.push_back(entry(id, v));
    c["top_logprobs"] = std::move(top);
    content.push_back(std::move(c));
  }
  return {{"content", std::move(content)}};
}

json usage_chunk_body(Endpoint e, const std::string& id, int64_t created, const std::string& model,
                      const Outcome& o) {
  json j = head(e, id, created, model, true);
  j["choices"] = json::array();
  j["usage"] = usage(o);
  return j;
}

json models_body(const std::string& model, int64_t created, int64_t context_length) {
  json m;
  m["id"] = model;
  m["object"] = "model";
  m["created"] = created;
  m["owned_by"] = "lazyprefill";
  m["max_model_len"] = context_length;
  json j;
  j["object"] = "list";
  j["data"] = json::array({m});
  return j;
}

std::string health_problem(const EngineState& s, bool draining, double stall_limit_s) {
  if (draining) return "the server is shutting down";
  if (stall_limit_s > 0 && s.stalled_s > stall_limit_s)
    return fmt::format(
        "the engine has made no progress for {:.0f} s ({} request(s) running, {} queued; the limit is {:.0f} "
        "s)",
        s.stalled_s, s.running, s.queued, stall_limit_s);
  if (s.running == 0 && s.kv_reserved > 0)
    return fmt::format(
        "{} of the K/V budget's {} bytes are reserved with no request running ({} queued): the reservation "
        "is lost; restart the server",
        s.kv_reserved, s.kv_budget, s.queued);
  return "";
}

std::string dump(const json& j) {
  return json_text(j, -1);
}

}  // namespace lp::server
