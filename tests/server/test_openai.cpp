// The OpenAI API's rules without a socket (server/openai.h): what a body must hold, what each
// refusal says and its status; and the text stream (server/text_stream.h): stop strings held back
// across tokens, characters cut between tokens.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "engine/model.h"
#include "kernels/context.h"
#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "server/openai.h"
#include "server/text_stream.h"
#include "tests/gguf_writer.h"
#include "tests/test_util.h"

namespace lp::server {
namespace {

const Model& tiny() {
  static CpuContext ctx(1);
  static testing::TempDir dir;
  static std::unique_ptr<Model> m = [] {
    testing::TinyModelSpec spec;
    spec.n_layer = 6;  // deep enough for the default schedule
    return Model::load(testing::write_tiny_model(dir.path() + "/tiny.gguf", spec), DType::F32, ctx);
  }();
  return *m;
}

ApiDefaults defaults() {
  ApiDefaults d;
  d.model_name = "tiny";
  return d;
}

ApiRequest parse(const std::string& body, Endpoint e = Endpoint::Completions) {
  return parse_request(body, e, tiny().tokenizer(), tiny().config(), defaults(), 42);
}

// The refusal a body gets: its status and the field it names.
std::pair<int, std::string> refusal(const std::string& body, Endpoint e = Endpoint::Completions) {
  try {
    parse(body, e);
  } catch (const ApiError& x) {
    EXPECT_FALSE(std::string(x.what()).empty());
    return {x.status, x.param};
  }
  return {200, ""};
}

TEST(OpenAiRequest, CompletionDefaultsAreOpenAis) {
  const ApiRequest r = parse(R"({"model": "tiny", "prompt": "hello"})");
  EXPECT_EQ(r.prompt, tiny().tokenizer().encode("hello", true, false));
  EXPECT_EQ(r.max_tokens, 16);
  EXPECT_EQ(r.sampler.temperature, 1.0f);
  EXPECT_EQ(r.sampler.top_p, 1.0f);
  EXPECT_EQ(r.sampler.seed, 42u);  // the fallback seed
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.ignore_eos);
  EXPECT_EQ(r.policy, PolicyKind::None);
}

TEST(OpenAiRequest, FieldsAndTheOverride) {
  const ApiRequest r = parse(
      R"({"prompt": [[5, 6, 7]], "max_tokens": 3, "temperature": 0, "top_p": 0.5, "seed": 9,
          "stop": ["ab", "c"], "stream": true, "stream_options": {"include_usage": true}, "user": "x",
          "ignore_eos": true, "lazyprefill": {"prune": "lazyllm", "schedule": "0.5:0.5", "seed": 3}})");
  EXPECT_EQ(r.prompt, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(r.max_tokens, 3);
  EXPECT_EQ(r.sampler.temperature, 0.0f);
  EXPECT_EQ(r.sampler.top_p, 0.5f);
  EXPECT_EQ(r.sampler.seed, 9u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"ab", "c"}));
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.policy, PolicyKind::LazyLLM);
  EXPECT_EQ(r.schedule.to_string(), "0.5:0.5");
  EXPECT_EQ(r.prune_seed, 3u);
}

// Log-probabilities as each endpoint asks for them: completions "logprobs": k; chat "logprobs":
// true with "top_logprobs": k (in either order), which alone is refused.
TEST(OpenAiRequest, LogprobsAsEachEndpointAsks) {
  EXPECT_EQ(parse(R"({"prompt": "x"})").top_logprobs, -1);
  EXPECT_EQ(parse(R"({"prompt": "x", "logprobs": 3})").top_logprobs, 3);
  EXPECT_EQ(parse(R"({"prompt": "x", "logprobs": 0})").top_logprobs, 0);
  EXPECT_EQ(parse(R"({"prompt": "x", "logprobs": null})").top_logprobs, -1);
  const auto chat = [](const std::string& fields) {
    return parse(R"({"messages": [{"role": "user", "content": "Hi"}])" + fields + "}",
                 Endpoint::ChatCompletions);
  };
  EXPECT_EQ(chat("").top_logprobs, -1);
  EXPECT_EQ(chat(R"(, "logprobs": true)").top_logprobs, 0);
  EXPECT_EQ(chat(R"(, "logprobs": false)").top_logprobs, -1);
  EXPECT_EQ(chat(R"(, "logprobs": true, "top_logprobs": 5)").top_logprobs, 5);
  EXPECT_EQ(chat(R"(, "top_logprobs": 20, "logprobs": true)").top_logprobs, 20);
  const std::string msgs = R"({"messages": [{"role": "user", "content": "Hi"}], )";
  EXPECT_EQ(refusal(msgs + R"("top_logprobs": 2})", Endpoint::ChatCompletions),
            std::make_pair(400, std::string("top_logprobs")));
  EXPECT_EQ(refusal(msgs + R"("logprobs": true, "top_logprobs": 21})", Endpoint::ChatCompletions),
            std::make_pair(400, std::string("top_logprobs")));
  EXPECT_EQ(refusal(msgs + R"("logprobs": 2})", Endpoint::ChatCompletions),
            std::make_pair(400, std::string("logprobs")));  // a boolean in chat
}

// The bodies' "logprobs", as OpenAI shapes them, from the engine's numbers.
TEST(OpenAiResponse, LogprobsInOpenAisShapes) {
  const Tokenizer& tok = tiny().tokenizer();
  const std::vector<int32_t> ids = tok.encode("ab", false, false);
  ASSERT_GE(ids.size(), 1u);
  std::vector<TokenLogprobs> lps;
  for (const int32_t id : ids) lps.push_back({id, -0.25f, {{id, -0.25f}, {id == 5 ? 6 : 5, -2.0f}}});
  const json c = logprobs_body(Endpoint::Completions, lps, tok, 7);
  ASSERT_EQ(c["tokens"].size(), ids.size());
  std::string text;
  for (const auto& t : c["tokens"]) text += t.get<std::string>();
  EXPECT_EQ(text, "ab");
  EXPECT_EQ(c["token_logprobs"][0], -0.25f);
  EXPECT_EQ(c["text_offset"][0], 7);
  EXPECT_EQ(c["top_logprobs"][0].size(), 2u);  // the chosen token and the other
  const json h = logprobs_body(Endpoint::ChatCompletions, lps, tok);
  ASSERT_EQ(h["content"].size(), ids.size());
  EXPECT_EQ(h["content"][0]["logprob"], -0.25f);
  EXPECT_EQ(h["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(h["content"][0]["top_logprobs"][1]["logprob"], -2.0f);
  std::string bytes;
  for (const auto& e : h["content"])
    for (const auto& b : e["bytes"]) bytes += char(b.get<int>());
  EXPECT_EQ(bytes, "ab");
}

TEST(OpenAiRequest, EchoKeepsThePromptsText) {
  EXPECT_FALSE(parse(R"({"prompt": "hello"})").echo);
  const ApiRequest s = parse(R"({"prompt": ["hello there"], "echo": true})");
  EXPECT_TRUE(s.echo);
  EXPECT_EQ(s.prompt_text, "hello there");
  const ApiRequest ids = parse(R"({"prompt": [104, 105], "echo": true, "logprobs": 0})");
  EXPECT_EQ(ids.prompt_text, tiny().tokenizer().decode(std::vector<int32_t>{104, 105}));
  EXPECT_EQ(refusal(R"({"messages": [{"role": "user", "content": "Hi"}], "echo": true})",
                    Endpoint::ChatCompletions),
            std::make_pair(400, std::string("echo")));
}

TEST(OpenAiRequest, SeveralChoicesUpToTheServersLimit) {
  EXPECT_EQ(parse(R"({"prompt": "x"})").n, 1);
  EXPECT_EQ(parse(R"({"prompt": "x", "n": 4, "best_of": 4})").n, 4);
  ApiDefaults d = defaults();
  d.max_n = 2;
  EXPECT_EQ(parse_request(R"({"prompt": "x", "n": 2})", Endpoint::Completions, tiny().tokenizer(),
                          tiny().config(), d, 1)
                .n,
            2);
  try {
    (void)parse_request(R"({"prompt": "x", "n": 3})", Endpoint::Completions, tiny().tokenizer(),
                        tiny().config(), d, 1);
    ADD_FAILURE() << "n above --max-n accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "n");
    EXPECT_NE(std::string(e.what()).find("--max-n"), std::string::npos) << e.what();
  }
}

// serve --max-model-len (on a GPU, what its memory holds for one request): the context a request
// may use, in the words and status a model's own context gets (vLLM's); unset, the model's.
TEST(OpenAiRequest, MaxModelLenBoundsPromptAndMaxTokens) {
  ApiDefaults d = defaults();
  EXPECT_EQ(max_model_len(d, tiny().config()), tiny().config().n_ctx_train);
  d.max_model_len = 10;
  EXPECT_EQ(max_model_len(d, tiny().config()), 10);
  const auto ask = [&](const std::string& body) {
    return parse_request(body, Endpoint::Completions, tiny().tokenizer(), tiny().config(), d, 1);
  };
  EXPECT_EQ(ask(R"({"prompt": [1, 2, 3], "max_tokens": 7})").max_tokens, 7);
  EXPECT_EQ(ask(R"({"prompt": [1, 2, 3, 4, 5, 6, 7, 8]})").max_tokens, 2);  // the default, cut to the room
  for (const char* body :
       {R"({"prompt": [1, 2, 3], "max_tokens": 8})", R"({"prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]})"})
    try {
      (void)ask(body);
      ADD_FAILURE() << "accepted beyond --max-model-len: " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.code, "context_length_exceeded");
      EXPECT_NE(std::string(e.what()).find("maximum context length is 10 tokens"), std::string::npos)
          << e.what();
    }
  d.max_model_len = int64_t(1) << 40;  // never beyond the model's
  EXPECT_EQ(max_model_len(d, tiny().config()), tiny().config().n_ctx_train);
}

TEST(OpenAiRequest, ChatUsesTheTemplate) {
  const ApiRequest r = parse(R"({"messages": [{"role": "developer", "content": "Be brief."},
                                              {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]})",
                             Endpoint::ChatCompletions);
  const Tokenizer& tok = tiny().tokenizer();
  const ChatMessage msgs[] = {{"system", "Be brief."}, {"user", "Hi"}};
  EXPECT_EQ(r.prompt, tok.encode(tok.apply_chat_template(msgs, true), false, true));
  // The server's chat default, within the context.
  EXPECT_EQ(r.max_tokens, std::min<int64_t>(512, tiny().config().n_ctx_train - int64_t(r.prompt.size())));
}

TEST(OpenAiRequest, EachBadBodyGetsItsStatusAndField) {
  const int ctx = tiny().config().n_ctx_train;
  const std::map<std::string, std::pair<int, std::string>> cases = {
      {"{\"prompt\": \"x\",", {400, ""}},                                   // malformed JSON
      {"[1, 2]", {400, ""}},                                                // not an object
      {"{\"prompt\": \"x\", \"temperature\": NaN}", {400, "temperature"}},  // JSON has no NaN
      {"{\"prompt\": \"\xff\xfe\"}", {400, "prompt"}},                      // invalid UTF-8
      {R"({"model": "gpt-4", "prompt": "x"})", {404, "model"}},             // another model
      {R"({"max_tokens": 3})", {400, "prompt"}},                            // no prompt
      {R"({"prompt": ""})", {400, "prompt"}},                               // empty
      {R"({"prompt": ["a", "b"]})", {400, "prompt"}},                       // several prompts
      {R"({"prompt": [1, 99999]})", {400, "prompt"}},                       // outside the vocabulary
      {R"({"prompt": "x", "max_tokens": 0})", {400, "max_tokens"}},         //
      {R"({"prompt": "x", "max_tokens": 1.5})", {400, "max_tokens"}},       //
      {R"({"prompt": "x", "max_tokens": "8"})", {400, "max_tokens"}},       //
      {R"({"prompt": "x", "temperature": -0.5})", {400, "temperature"}},    //
      {R"({"prompt": "x", "temperature": 3})", {400, "temperature"}},       //
      {R"({"prompt": "x", "top_p": 0})", {400, "top_p"}},                   //
      {R"({"prompt": "x", "top_p": 1.5})", {400, "top_p"}},                 //
      {R"({"prompt": "x", "stop": ""})", {400, "stop"}},                    //
      {R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", {400, "stop"}},
      {R"({"prompt": "x", "n": 9})", {400, "n"}},  // above --max-n
      {R"({"prompt": "x", "n": 2, "best_of": 3})", {400, "best_of"}},
      {R"({"prompt": "x", "logprobs": 21})", {400, "logprobs"}},            // above vLLM's 20
      {R"({"prompt": "x", "top_logprobs": 2})", {400, "top_logprobs"}},     // chat's field
      {R"({"prompt": "x", "echo": true, "stream": true})", {400, "echo"}},  // echo is not streamed
      {R"({"prompt": "x", "echo": true, "logprobs": 1, "lazyprefill": {"prune": "lazyllm"}})", {400, "echo"}},
      {R"({"prompt": "x", "stream": "yes"})", {400, "stream"}},  //
      {R"({"prompt": "x", "ignore_eos": 1})", {400, "ignore_eos"}},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", {400, "stream_options"}},
      {R"({"prompt": "x", "lazyprefill": {"prune": "magic"}})", {400, "lazyprefill.prune"}},
      {R"({"prompt": "x", "lazyprefill": {"prune": "lazyllm", "schedule": "0.5:1.5"}})",
       {400, "lazyprefill.schedule"}},
      {R"({"prompt": "x", "lazyprefill": {"prune": "lazyllm", "schedule": "/etc/passwd"}})",
       {400, "lazyprefill.schedule"}},  // never a file on the server
      {R"({"prompt": "x", "lazyprefill": {"prune": "lazyllm", "schedule": "40:0.5"}})",
       {400, "lazyprefill.schedule"}},  // beyond this model's layers
      {R"({"prompt": "x", "lazyprefill": {"colour": 1}})", {400, "lazyprefill"}},
      {R"({"prompt": "x", "lazyprefill": 1})", {400, "lazyprefill"}},
  };
  for (const auto& [body, want] : cases) EXPECT_EQ(refusal(body), want) << body;
  // The context: a prompt that fills it, and max_tokens past it.
  std::string ones = "[1";
  for (int i = 1; i < ctx; ++i) ones += ",1";
  ones += "]";
  EXPECT_EQ(refusal("{\"prompt\": " + ones + "}"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(refusal(R"({"prompt": [1, 2], "max_tokens": )" + std::to_string(ctx) + "}"),
            std::make_pair(400, std::string("max_tokens")));
  EXPECT_EQ(refusal(R"({"prompt": [1, 2], "max_tokens": )" + std::to_string(ctx - 2) + "}").first, 200);
  // Chat.
  EXPECT_EQ(refusal(R"({"messages": []})", Endpoint::ChatCompletions),
            std::make_pair(400, std::string("messages")));
  EXPECT_EQ(refusal(R"({"messages": [{"role": "tool", "content": "x"}]})", Endpoint::ChatCompletions),
            std::make_pair(400, std::string("messages")));
  EXPECT_EQ(refusal(R"({"messages": [{"role": "user"}]})", Endpoint::ChatCompletions),
            std::make_pair(400, std::string("messages")));
  EXPECT_EQ(refusal(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
                    Endpoint::ChatCompletions),
            std::make_pair(400, std::string("messages")));
}

// The bodies the official openai client (3.57.0) sent, recorded by tests/clients/openai_client.py
// --record: each parses into what it asked for.
// The three bodies of issue 50, each once a crash or a lost request: a body nested a million levels
// deep before its prompt (a stack overflow), a top_p that is positive as a double and 0 as the
// sampler's float, and a number past double's range. Each is a 400; the bound's edge is exact,
// and brackets in strings are text.
TEST(OpenAiRequest, DeepBodiesTinyFloatsAndHugeNumbersAreRefused) {
  const auto deep = [](int arrays) {  // the object is one level, each array one more
    return "{\"x\": " + std::string(size_t(arrays), '[') + std::string(size_t(arrays), ']') +
           ", \"prompt\": \"hi\"}";
  };
  EXPECT_EQ(refusal(deep(1000000)).first, 400);
  EXPECT_EQ(refusal(deep(kMaxJsonDepth)).first, 400);
  EXPECT_EQ(refusal(deep(kMaxJsonDepth - 1)).first, 200);
  EXPECT_EQ(refusal(R"({"prompt": ")" + std::string(300, '[') + "\"}").first, 200);  // text, not nesting
  EXPECT_EQ(refusal(R"({"prompt": "x", "top_p": 1e-300})"), std::make_pair(400, std::string("top_p")));
  EXPECT_EQ(refusal(R"({"prompt": "x", "top_p": 1e-45})").first, 200);  // a float subnormal, not 0
  EXPECT_EQ(parse(R"({"prompt": "x", "top_p": 1e-45})").sampler.top_p, 1e-45f);
  EXPECT_EQ(refusal(R"({"prompt": "x", "max_tokens": 1e400})").first, 400);
  EXPECT_EQ(refusal(R"({"prompt": "x", "temperature": -1e400})").first, 400);
}

// Every request parameter at its boundaries, judged in the representation the engine uses (the
// sampler's float, int64_t counts): the last value accepted and the first refused on each side, a
// subnormal, an integer past int64_t (nlohmann keeps it unsigned), one past double (1e400), and a
// float spelling of an integer. Each refusal names its field.
TEST(OpenAiRequest, EveryParameterAtItsBoundaries) {
  const int64_t ctx = tiny().config().n_ctx_train;
  const auto body = [](const std::string& field, const std::string& value) {
    return R"({"prompt": [1, 2], )" + field + ": " + value + "}";
  };
  struct Case {
    std::string field, value;
    bool ok;
  };
  const std::string room = std::to_string(ctx - 2), over = std::to_string(ctx - 1);
  const std::vector<Case> cases = {
      // max_tokens: 1 to the context's room, integers only; past int64_t and past double refused.
      {R"("max_tokens")", "1", true},
      {R"("max_tokens")", room, true},
      {R"("max_tokens")", room + ".0", true},
      {R"("max_tokens")", "0", false},
      {R"("max_tokens")", "-1", false},
      {R"("max_tokens")", over, false},
      {R"("max_tokens")", "9223372036854775807", false},   // 2^63 - 1: T + it would overflow
      {R"("max_tokens")", "9223372036854775808", false},   // 2^63: unsigned in nlohmann
      {R"("max_tokens")", "18446744073709551615", false},  // 2^64 - 1
      {R"("max_tokens")", "-9223372036854775808", false},
      {R"("max_tokens")", "1e19", false},
      {R"("max_tokens")", "1e400", false},
      {R"("max_tokens")", "2.5", false},
      {R"("max_tokens")", "true", false},
      {R"("max_completion_tokens")", "1", true},  // completions ignore the chat-only name
      // temperature: [0, 2]; a tiny one is greedy in the sampler's float (0 or a subnormal).
      {R"("temperature")", "0", true},
      {R"("temperature")", "-0.0", true},
      {R"("temperature")", "1e-300", true},
      {R"("temperature")", "1e-45", true},
      {R"("temperature")", "2", true},
      {R"("temperature")", "2.0000001", false},
      {R"("temperature")", "-1e-300", false},
      {R"("temperature")", "1e400", false},
      {R"("temperature")", R"("1")", false},
      // top_p: (0, 1] as a float.
      {R"("top_p")", "1", true},
      {R"("top_p")", "1e-45", true},
      {R"("top_p")", "1e-46", false},  // 0 as a float
      {R"("top_p")", "0", false},
      {R"("top_p")", "-0.5", false},
      {R"("top_p")", "1.0000001", false},
      // seed: any int64_t, as vLLM takes it.
      {R"("seed")", "-9223372036854775808", true},
      {R"("seed")", "9223372036854775807", true},
      {R"("seed")", "9223372036854775808", false},
      {R"("seed")", "0.5", false},
      {R"("seed")", "1e400", false},
      // n and best_of: 1 only.
      {R"("n")", "1", true},
      {R"("n")", "1.0", true},
      {R"("n")", "0", false},
      {R"("n")", "8", true},
      {R"("n")", "9", false},
      {R"("n")", "18446744073709551617", false},  // past uint64_t: a float to nlohmann
      {R"("best_of")", "1", true},
      {R"("best_of")", "2", false},
      // logprobs (completions): the alternatives wanted, 0 to 20; false for none.
      {R"("logprobs")", "0", true},
      {R"("logprobs")", "20", true},
      {R"("logprobs")", "false", true},
      {R"("logprobs")", "21", false},
      {R"("logprobs")", "-1", false},
      {R"("logprobs")", "1.5", false},
      // stop: up to 4 non-empty strings.
      {R"("stop")", R"(["a", "b", "c", "d"])", true},
      {R"("stop")", R"(["a", "b", "c", "d", "e"])", false},
      {R"("stop")", R"([""])", false},
      {R"("stop")", "[1]", false},
      // penalties: 0 only, however it is written.
      {R"("frequency_penalty")", "0", true},
      {R"("frequency_penalty")", "-0.0", true},
      {R"("frequency_penalty")", "1e-300", false},
      {R"("presence_penalty")", "1e400", false},
      // the pruning seed: any int64_t.
      {R"("lazyprefill")", R"({"seed": -1})", true},
      {R"("lazyprefill")", R"({"seed": 9223372036854775808})", false},
  };
  for (const Case& c : cases) {
    const std::string b = body(c.field, c.value);
    const auto [status, param] = refusal(b);
    if (c.ok) {
      EXPECT_EQ(status, 200) << b;
      continue;
    }
    EXPECT_EQ(status, 400) << b;
    std::string field = c.field.substr(1, c.field.size() - 2);
    if (field == "lazyprefill") field = "lazyprefill.seed";
    EXPECT_EQ(param, field) << b;
  }
  // What the accepted edges become.
  EXPECT_EQ(parse(body(R"("max_tokens")", room)).max_tokens, ctx - 2);
  EXPECT_EQ(parse(body(R"("temperature")", "1e-300")).sampler.temperature, 0.0f);
  EXPECT_EQ(parse(body(R"("seed")", "-1")).sampler.seed, ~uint64_t(0));
  // Token ids: the vocabulary's last and the first past it, and one past int64_t, which once
  // wrapped to a negative id in the message.
  const int64_t V = tiny().config().n_vocab;
  EXPECT_EQ(refusal("{\"prompt\": [" + std::to_string(V - 1) + "]}").first, 200);
  EXPECT_EQ(refusal("{\"prompt\": [" + std::to_string(V) + "]}"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(refusal(R"({"prompt": [-1]})"), std::make_pair(400, std::string("prompt")));
  try {
    parse(R"({"prompt": [18446744073709551615]})");
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_NE(std::string(e.what()).find("18446744073709551615"), std::string::npos) << e.what();
  }
}

TEST(OpenAiRequest, ParsesWhatTheOfficialClientSends) {
  const json f =
      json::parse(read_input_file(testing::fixture_path("openai_client_requests.json"), "fixture", 1 << 20));
  ASSERT_EQ(f["requests"].size(), 4u);
  ApiDefaults d = defaults();
  d.model_name = "m";
  std::vector<ApiRequest> r;
  for (const json& q : f["requests"])
    r.push_back(parse_request(
        q["body"].dump(), q["path"] == "/v1/completions" ? Endpoint::Completions : Endpoint::ChatCompletions,
        tiny().tokenizer(), tiny().config(), d, 42));
  EXPECT_EQ(r[0].max_tokens, 8);
  EXPECT_EQ(r[0].sampler.temperature, 0.0f);
  EXPECT_FALSE(r[0].stream);
  EXPECT_TRUE(r[1].stream && r[1].include_usage);
  EXPECT_EQ(r[1].stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(r[1].sampler.seed, 3u);
  EXPECT_EQ(r[1].sampler.top_p, 0.9f);
  EXPECT_EQ(r[2].endpoint, Endpoint::ChatCompletions);
  EXPECT_EQ(r[2].max_tokens, 8);  // max_completion_tokens
  EXPECT_EQ(r[2].policy, PolicyKind::LazyLLM);
  EXPECT_EQ(r[2].schedule.to_string(), default_schedule().to_string());
  EXPECT_TRUE(r[3].stream);
  EXPECT_EQ(r[3].stop, std::vector<std::string>{"x"});
}

TEST(OpenAiRequest, ErrorBodyHasOpenAisShape) {
  const json j = error_body(ApiError(404, "no such model", "model", "model_not_found"));
  EXPECT_EQ(j["error"]["message"], "no such model");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "model");
  EXPECT_EQ(j["error"]["code"], "model_not_found");
  EXPECT_TRUE(error_body(ApiError(400, "x"))["error"]["code"].is_null());
  EXPECT_EQ(error_body(ApiError(500, "x"))["error"]["type"], "server_error");
}

// The id of the token whose bytes are `s`.
int32_t token_of(const std::string& s) {
  const Tokenizer& tok = tiny().tokenizer();
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    if (tok.token_bytes(id) == s) return id;
  ADD_FAILURE() << "no token for '" << s << "'";
  return 0;
}

TEST(TextStream, HoldsBackWhatMayStartAStopString) {
  TextStream ts(tiny().tokenizer(), {"XYZ"});
  EXPECT_EQ(ts.push(token_of("a")), "a");
  EXPECT_EQ(ts.push(token_of("X")), "");  // may begin "XYZ"
  EXPECT_EQ(ts.push(token_of("Y")), "");
  EXPECT_EQ(ts.push(token_of("b")), "XYb");  // it did not
  EXPECT_EQ(ts.push(token_of("X")), "");
  EXPECT_EQ(ts.push(token_of("Y")), "");
  EXPECT_FALSE(ts.stopped());
  EXPECT_EQ(ts.push(token_of("Z")), "");  // the stop string: neither it nor anything after
  EXPECT_TRUE(ts.stopped());
  EXPECT_EQ(ts.push(token_of("c")), "");
  EXPECT_EQ(ts.finish(), "");
  EXPECT_EQ(ts.text(), "aXYb");
}

TEST(TextStream, ReturnsTheTextBeforeAStopInsideOneToken) {
  TextStream ts(tiny().tokenizer(), {"b"});
  EXPECT_EQ(ts.push(token_of("a")), "a");
  EXPECT_EQ(ts.push(token_of("b")), "");
  EXPECT_TRUE(ts.stopped());
  TextStream held(tiny().tokenizer(), {"XY"});
  EXPECT_EQ(held.push(token_of("X")), "");
  EXPECT_EQ(held.finish(), "X");  // the end came first: what was held back is text after all
}

TEST(TextStream, KeepsACharacterCutBetweenTokensWhole) {
  // "é" is C3 A9 in UTF-8: two byte tokens.
  TextStream ts(tiny().tokenizer(), {});
  EXPECT_EQ(ts.push(token_of("\xC3")), "");
  EXPECT_EQ(ts.push(token_of("\xA9")), "\xC3\xA9");
  EXPECT_EQ(ts.push(token_of("\xE2")), "");  // 3 bytes announced, the generation ends
  EXPECT_EQ(ts.finish(), "\xE2");
  EXPECT_EQ(dump(json("\xE2")), "\"\xEF\xBF\xBD\"");  // written as U+FFFD
  const Tokenizer& tok = tiny().tokenizer();
  EXPECT_EQ(TextStream(tok, {}).push(tok.eos_id()), "");  // end of generation: no text
  EXPECT_EQ(incomplete_utf8_tail("ab\xF0\x9F\x98"), 3u);
  EXPECT_EQ(incomplete_utf8_tail("ab\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("\x80\x80"), 0u);
}

}  // namespace
}  // namespace lp::server
