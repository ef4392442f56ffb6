// `lazyprefill serve`'s server over real sockets (server/http_server.h), on a tiny model: answers
// equal to the engine's own greedy output alone, streaming and not, several clients at once; every
// bad input's status; slow clients and too many connections; a client that leaves frees its K/V;
// the request log; a graceful stop.
#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <chrono>
#include <fstream>
#include <memory>
#include <regex>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <utility>  // before Asio (Boost 1.74)
#include <vector>

#include "admission/request_log.h"
#include "engine/generate.h"
#include "kernels/context.h"
#include "kernels/cpu/backend.h"
#include "model/error.h"
#include "server/http_server.h"
#include "server/loading.h"
#include "tests/gguf_writer.h"
#include "tests/http_client.h"

namespace lp::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

CpuContext& ctx() {
  static CpuContext c(2);
  return c;
}

const Model& tiny() {
  static testing::TempDir dir;
  static std::unique_ptr<Model> m = [] {
    testing::TinyModelSpec spec;
    spec.n_layer = 4;
    spec.n_ctx = 256;
    return Model::load(testing::write_tiny_model(dir.path() + "/tiny.gguf", spec), DType::F32, ctx());
  }();
  return *m;
}

// The CPU backend, each token's logits `delay` late: a generation that cannot end before a test's
// client has left (the tiny model makes 200 tokens in tens of milliseconds).
struct SlowCpuBackend : CpuBackend {
  std::chrono::milliseconds delay;
  SlowCpuBackend(int64_t n_ctx, std::chrono::milliseconds d)
      : CpuBackend(ctx(), tiny().config(), tiny().weights(), n_ctx), delay(d) {}
  void lm_head(float* logits) override {
    std::this_thread::sleep_for(delay);
    CpuBackend::lm_head(logits);
  }
};

// A server on a free port, run on its own thread for the test's life.
struct Running {
  std::unique_ptr<Server> srv;
  std::thread t;
  std::atomic<bool> stopped{false};  // run() returned
  explicit Running(ServerOptions o = options(), int64_t budget = int64_t(64) << 20,
                   std::chrono::milliseconds step_delay = 0ms, BackendFactory make_backend = {}) {
    SchedulerOptions so;
    so.kv_budget_bytes = budget;
    so.make_backend = [step_delay](int64_t n_ctx) -> std::unique_ptr<Backend> {
      if (step_delay > 0ms) return std::make_unique<SlowCpuBackend>(n_ctx, step_delay);
      return std::make_unique<CpuBackend>(ctx(), tiny().config(), tiny().weights(), n_ctx);
    };
    if (make_backend) so.make_backend = std::move(make_backend);
    srv = std::make_unique<Server>(tiny(), std::move(so), std::move(o));
    t = std::thread([this] {
      srv->run(false);
      stopped = true;
    });
  }
  ~Running() {
    if (t.joinable()) {
      srv->stop();
      t.join();
    }
  }
  uint16_t port() const { return srv->port(); }
  static ServerOptions options() {
    ServerOptions o;
    o.port = 0;
    o.api.model_name = "tiny";
    o.header_timeout = 500ms;
    o.body_timeout = 500ms;
    o.keep_alive = 500ms;
    o.max_body_bytes = 64 << 10;
    o.max_connections = 8;
    o.warm_up = false;  // Health.WarmUpAndTheGenerationProbe turns it on
    return o;
  }
};

using Reply = testing::HttpReply;

Reply request(uint16_t port, http::verb verb, const std::string& target, const std::string& body = "") {
  return testing::http_request(port, verb, target, body);
}

Reply post(uint16_t port, const std::string& target, const std::string& body) {
  return request(port, http::verb::post, target, body);
}

json parsed(const Reply& r) {
  return json::parse(r.body);
}

// A metric's value from the exposition (the first line with this name and labels), or -1.
double metric(uint16_t port, const std::string& series) {
  const std::string text = request(port, http::verb::get, "/metrics").body;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  return -1;
}

// The engine's own greedy continuation of `prompt`, as text, and its token count.
std::pair<std::string, int64_t> greedy_alone(const std::vector<int32_t>& prompt, int n) {
  GenerateOptions o;
  o.max_new_tokens = n;
  const GenerateResult r = generate(ctx(), tiny(), prompt, o);
  std::vector<int32_t> ids;
  for (const int32_t t : r.generated_ids)
    if (!tiny().tokenizer().is_end_of_generation(t)) ids.push_back(t);
  std::string text;
  for (const int32_t t : ids) text += tiny().tokenizer().token_bytes(t);
  // The random model's tokens are often lone bytes of no character: JSON carries them as U+FFFD.
  return {json::parse(dump(json(text))).get<std::string>(), int64_t(r.generated_ids.size())};
}

std::string ids_json(const std::vector<int32_t>& ids) {
  return json(ids).dump();
}

std::vector<int32_t> prompt_of(int n, uint32_t seed) {
  std::vector<int32_t> ids;
  std::mt19937 rng(seed);
  for (int i = 0; i < n; ++i) ids.push_back(int32_t(rng() % 250));
  return ids;
}

// The text of an SSE stream's chunks, and whether it ended in [DONE].
struct Stream {
  std::string text, finish_reason;
  json usage;
  bool done = false;
  int chunks = 0;
};
Stream read_sse(const std::string& body, Endpoint e) {
  Stream s;
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("data: ", 0) != 0) continue;
    const std::string data = line.substr(6);
    if (data == "[DONE]") {
      s.done = true;
      continue;
    }
    const json j = json::parse(data);
    if (j.contains("usage")) s.usage = j["usage"];
    if (j["choices"].empty()) continue;
    const json& c = j["choices"][0];
    s.text += e == Endpoint::Completions ? c["text"].get<std::string>() : c["delta"].value("content", "");
    if (!c["finish_reason"].is_null()) s.finish_reason = c["finish_reason"];
    ++s.chunks;
  }
  return s;
}

TEST(Server, CompletionEqualsTheEngineAloneStreamingOrNot) {
  Running r;
  const auto prompt = prompt_of(40, 1);
  const auto [want, n] = greedy_alone(prompt, 12);
  const Reply plain =
      post(r.port(), "/v1/completions",
           R"({"model": "tiny", "temperature": 0, "max_tokens": 12, "prompt": )" + ids_json(prompt) + "}");
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_EQ(plain.content_type, "application/json");
  const json j = parsed(plain);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], want);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 40);
  EXPECT_EQ(j["usage"]["completion_tokens"], n);
  EXPECT_EQ(j["choices"][0]["finish_reason"], n == 12 ? "length" : "stop");

  const Reply streamed = post(r.port(), "/v1/completions",
                              R"({"temperature": 0, "max_tokens": 12, "stream": true,
                                  "stream_options": {"include_usage": true}, "prompt": )" +
                                  ids_json(prompt) + "}");
  ASSERT_EQ(streamed.status, 200);
  EXPECT_EQ(streamed.content_type, "text/event-stream");
  const Stream s = read_sse(streamed.body, Endpoint::Completions);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.text, want);
  EXPECT_EQ(s.finish_reason, j["choices"][0]["finish_reason"]);
  EXPECT_EQ(s.usage["completion_tokens"], n);
  EXPECT_GE(s.chunks, 2);
}

// ignore_eos (vLLM's extension, which load generators send) generates max_tokens past the end of
// generation: a seeded sampled request that ends early, asked again with it. (The tiny model's
// greedy continuations never reach its end token; hot sampling does, for some seeds.)
TEST(Server, IgnoreEosGeneratesMaxTokens) {
  Running r;
  const auto body = [](uint32_t seed) {
    return R"({"temperature": 2, "max_tokens": 48, "seed": )" + std::to_string(seed) + R"(, "prompt": )" +
           ids_json(prompt_of(8, 3));
  };
  uint32_t seed = 0;
  for (uint32_t s = 1; s < 200 && seed == 0; ++s)
    if (parsed(post(r.port(), "/v1/completions", body(s) + "}"))["usage"]["completion_tokens"] < 48) seed = s;
  ASSERT_NE(seed, 0u) << "no seed ends early";
  const json full = parsed(post(r.port(), "/v1/completions", body(seed) + R"(, "ignore_eos": true})"));
  EXPECT_EQ(full["usage"]["completion_tokens"], 48);
  EXPECT_EQ(full["choices"][0]["finish_reason"], "length");
}

TEST(Server, ChatStreamsRoleThenContent) {
  Running r;
  const std::string body = R"({"messages": [{"role": "user", "content": "hello there"}], "temperature": 0,
                               "max_tokens": 6)";
  const json j = parsed(post(r.port(), "/v1/chat/completions", body + "}"));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  const Reply streamed = post(r.port(), "/v1/chat/completions", body + R"(, "stream": true})");
  const Stream s = read_sse(streamed.body, Endpoint::ChatCompletions);
  EXPECT_TRUE(s.done);
  EXPECT_EQ(s.text, j["choices"][0]["message"]["content"]);
  EXPECT_NE(streamed.body.find(R"("delta":{"role":"assistant")"), std::string::npos);
}

TEST(Server, ClientsAtOnceGetWhatEachGetsAlone) {
  Running r;
  const int n = 5;
  std::vector<std::string> want(n), got(n);
  for (int i = 0; i < n; ++i)
    want[size_t(i)] = greedy_alone(prompt_of(20 + 7 * i, uint32_t(10 + i)), 10).first;
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i)
    clients.emplace_back([&, i] {
      const std::string body = R"({"temperature": 0, "max_tokens": 10, "stream": )" +
                               std::string(i % 2 ? "true" : "false") + R"(, "prompt": )" +
                               ids_json(prompt_of(20 + 7 * i, uint32_t(10 + i))) + "}";
      const Reply rep = post(r.port(), "/v1/completions", body);
      got[size_t(i)] = i % 2 ? read_sse(rep.body, Endpoint::Completions).text
                             : parsed(rep)["choices"][0]["text"].get<std::string>();
    });
  for (auto& c : clients) c.join();
  for (int i = 0; i < n; ++i) EXPECT_EQ(got[size_t(i)], want[size_t(i)]) << "client " << i;
  EXPECT_EQ(metric(r.port(), R"(lazyprefill_requests_total{outcome="length"})") +
                std::max(0.0, metric(r.port(), R"(lazyprefill_requests_total{outcome="stop"})")),
            n);
}

TEST(Server, StopStringsAndThePruningOverride) {
  Running r;
  const auto prompt = prompt_of(60, 3);
  const std::string base = R"({"temperature": 0, "max_tokens": 12, "prompt": )" + ids_json(prompt);
  const std::string full = parsed(post(r.port(), "/v1/completions", base + "}"))["choices"][0]["text"];
  ASSERT_GE(full.size(), 4u);
  const std::string stop = full.substr(2, 2);
  const size_t at = full.find(stop);
  const json j = parsed(post(r.port(), "/v1/completions", base + R"(, "stop": )" + json(stop).dump() + "}"));
  EXPECT_EQ(j["choices"][0]["text"], full.substr(0, at));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");

  const json pruned = parsed(post(r.port(), "/v1/completions",
                                  base + R"(, "lazyprefill": {"prune": "lazyllm", "schedule": "0.5:0.5"}})"));
  EXPECT_EQ(pruned["lazyprefill"]["prune"], "lazyllm");
  EXPECT_EQ(pruned["lazyprefill"]["schedule"], "0.5:0.5");
  // 4 layers, pruning half of the 60 tokens after layer 1: 2 x 60 + 2 x 30 of 4 x 60 pairs.
  EXPECT_DOUBLE_EQ(pruned["lazyprefill"]["prompt_tokens_computed_fraction"].get<double>(), 180.0 / 240.0);
}

// The paper's baselines per request: a policy without a schedule takes its own default
// (random-drop 0.3: 18 of the 60 tokens dropped), static-paper prunes once; a schedule that does not
// fit the policy and a renamed policy are 400s.
TEST(Server, ThePapersBaselinesPerRequest) {
  Running r;
  const auto prompt = prompt_of(60, 3);
  const std::string base = R"({"temperature": 0, "max_tokens": 4, "prompt": )" + ids_json(prompt);
  const Reply dr = post(r.port(), "/v1/completions", base + R"(, "lazyprefill": {"prune": "random-drop"}})");
  ASSERT_EQ(dr.status, 200) << dr.body;
  const json drop = parsed(dr);
  EXPECT_EQ(drop["lazyprefill"]["prune"], "random-drop");
  EXPECT_EQ(drop["lazyprefill"]["schedule"], "0.3");
  EXPECT_DOUBLE_EQ(drop["lazyprefill"]["prompt_tokens_computed_fraction"].get<double>(), 42.0 / 60.0);
  const json stat =
      parsed(post(r.port(), "/v1/completions",
                  base + R"(, "lazyprefill": {"prune": "static-paper", "schedule": "1:0.5"}})"));
  EXPECT_EQ(stat["lazyprefill"]["prune"], "static-paper");
  EXPECT_DOUBLE_EQ(stat["lazyprefill"]["prompt_tokens_computed_fraction"].get<double>(), 180.0 / 240.0);
  for (const char* bad :
       {R"({"prune": "random-drop", "schedule": "1:0.5"})", R"({"prune": "static-paper", "schedule": "0.3"})",
        R"({"prune": "static"})", R"({"prune": "random-drop", "schedule": "1"})"}) {
    const Reply rep = post(r.port(), "/v1/completions", base + R"(, "lazyprefill": )" + bad + "}");
    EXPECT_EQ(rep.status, 400) << bad << ": " << rep.body;
  }
}

TEST(Server, EachBadRequestGetsItsStatusAndTheServerGoesOn) {
  Running r;
  const uint16_t p = r.port();
  const auto expect_error = [&](const Reply& rep, int status) {
    EXPECT_EQ(rep.status, status) << rep.body;
    const json j = json::parse(rep.body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << rep.body;
    EXPECT_TRUE(j["error"]["message"].is_string()) << rep.body;
  };
  expect_error(post(p, "/v1/completions", "{\"prompt\": "), 400);
  expect_error(post(p, "/v1/completions", "{\"prompt\": \"\xc3\x28\"}"), 400);
  expect_error(post(p, "/v1/completions", R"({"model": "gpt-4", "prompt": "x"})"), 404);
  expect_error(post(p, "/v1/completions", R"({"prompt": "x", "max_tokens": 100000})"), 400);
  expect_error(post(p, "/v1/completions", R"({"prompt": "x", "temperature": -1})"), 400);
  expect_error(post(p, "/v1/completions", R"({"prompt": "x", "top_p": NaN})"), 400);
  expect_error(
      post(p, "/v1/completions", R"({"prompt": "x", "lazyprefill": {"prune": "lazyllm", "schedule": "x"}})"),
      400);
  expect_error(post(p, "/v1/completions", "{\"prompt\": \"" + std::string(100 << 10, 'a') + "\"}"), 413);
  expect_error(post(p, "/v1/nothing", "{}"), 404);
  expect_error(request(p, http::verb::get, "/v1/completions"), 405);
  // A request over the whole K/V budget: refused at once, never queued forever.
  {
    Running small(Running::options(), int64_t(64) << 10);
    expect_error(post(small.port(), "/v1/completions", R"({"prompt": [1, 2, 3], "max_tokens": 200})"), 400);
  }
  EXPECT_EQ(post(p, "/v1/completions", R"({"prompt": [1, 2, 3], "max_tokens": 2})").status, 200);
  EXPECT_EQ(metric(p, R"(lazyprefill_requests_total{outcome="400"})"), 6);
  EXPECT_EQ(metric(p, R"(lazyprefill_requests_total{outcome="413"})"), 1);
}

// Issue 50's three bodies against a running server, each a 400 in OpenAI's shape: nesting past the
// bound before the prompt (10,000 levels: within this server's 64 KiB body cap; a million levels
// crashed it), a top_p that is 0 as a float (it once lost its request and its K/V reservation), a
// number past double's range (once a closed connection with no reply). Then a plain request is
// served and nothing stays reserved.
TEST(Server, DeepTinyAndHugeBodiesAreRefusedAndLeakNothing) {
  Running r;
  const uint16_t p = r.port();
  const auto expect_400 = [&](const std::string& body) {
    const Reply rep = post(p, "/v1/completions", body);
    EXPECT_EQ(rep.status, 400) << rep.body;
    const json j = json::parse(rep.body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << rep.body;
    EXPECT_TRUE(j["error"]["message"].is_string()) << rep.body;
  };
  expect_400(R"({"x": )" + std::string(10000, '[') + std::string(10000, ']') + R"(, "prompt": "hi"})");
  for (int i = 0; i < 3; ++i) expect_400(R"({"prompt": [1, 2, 3], "max_tokens": 2, "top_p": 1e-300})");
  expect_400(R"({"prompt": "x", "max_tokens": 1e400})");
  EXPECT_EQ(post(p, "/v1/completions", R"({"prompt": [1, 2, 3], "max_tokens": 2})").status, 200);
  EXPECT_EQ(metric(p, R"(lazyprefill_requests_total{outcome="400"})"), 5);
  EXPECT_EQ(metric(p, "lazyprefill_kv_cache_bytes_reserved"), 0);
}

// The CPU backend with failures planted: a prompt of 13 tokens fails as its prefill begins, any other
// request at its third decoding step.
struct FailingCpuBackend : CpuBackend {
  int decodes = 0;
  explicit FailingCpuBackend(int64_t n_ctx) : CpuBackend(ctx(), tiny().config(), tiny().weights(), n_ctx) {}
  void embed(std::span<const int32_t> ids) override {
    if (ids.size() == 13 || (ids.size() == 1 && ++decodes == 3)) throw Error("planted failure");
    CpuBackend::embed(ids);
  }
};

// Issue 50: an engine failure after admission reaches the client (a 500 in OpenAI's error shape, or
// an SSE error event after the text already streamed), is counted and logged, and leaves no
// reservation behind; the server goes on.
TEST(Server, AnEngineFailureIsA500OrAnSseErrorAndReleasesItsKv) {
  testing::TempDir dir;
  ServerOptions o = Running::options();
  o.log_requests = dir.path() + "/requests.jsonl";
  Running r(o, int64_t(64) << 20, 0ms, [](int64_t n_ctx) -> std::unique_ptr<Backend> {
    return std::make_unique<FailingCpuBackend>(n_ctx);
  });
  const uint16_t p = r.port();
  const std::string thirteen = ids_json(prompt_of(13, 1)), five = ids_json(prompt_of(5, 2));
  for (const std::string& prompt : {thirteen, five}) {
    const Reply rep =
        post(p, "/v1/completions", R"({"max_tokens": 8, "ignore_eos": true, "prompt": )" + prompt + "}");
    EXPECT_EQ(rep.status, 500) << rep.body;
    const json e = parsed(rep)["error"];
    EXPECT_EQ(e["type"], "server_error");
    EXPECT_NE(e["message"].get<std::string>().find(prompt == thirteen ? "prefill: planted failure"
                                                                      : "decoding step: planted failure"),
              std::string::npos)
        << rep.body;
  }
  // Streaming: the role and whatever text the first three tokens made, then the error event and
  // the end.
  const Reply st = post(p, "/v1/chat/completions",
                        R"({"max_tokens": 8, "ignore_eos": true, "stream": true, "messages": [{"role": "user",
                            "content": "hi"}]})");
  EXPECT_EQ(st.status, 200);
  std::vector<json> events;
  bool done = false;
  std::istringstream in(st.body);
  for (std::string line; std::getline(in, line);) {
    if (line == "data: [DONE]")
      done = true;
    else if (line.rfind("data: ", 0) == 0)
      events.push_back(json::parse(line.substr(6)));
  }
  ASSERT_FALSE(events.empty()) << st.body;
  EXPECT_TRUE(done) << st.body;
  EXPECT_EQ(events.back()["error"]["type"], "server_error") << st.body;
  for (size_t i = 0; i + 1 < events.size(); ++i) EXPECT_TRUE(events[i].contains("choices")) << st.body;
  EXPECT_EQ(metric(p, R"(lazyprefill_requests_total{outcome="error"})"), 3);
  EXPECT_EQ(metric(p, "lazyprefill_kv_cache_bytes_reserved"), 0);
  EXPECT_EQ(metric(p, "lazyprefill_requests_running"), 0);
  EXPECT_EQ(request(p, http::verb::get, "/health").status, 200);
  std::ifstream log(o.log_requests);
  int errors = 0;
  for (std::string line; std::getline(log, line);) {
    const json rec = json::parse(line);
    EXPECT_EQ(rec["finish"], "error") << line;
    EXPECT_NE(rec.value("error", "").find("planted failure"), std::string::npos) << line;
    ++errors;
  }
  EXPECT_EQ(errors, 3);
}

// The CPU backend with a GPU's failure planted (lp::DeviceError, as the CUDA backend throws for a CUDA
// error): a prompt of 13 tokens fails as its prefill begins, the device lost or not.
struct DeviceFailingCpuBackend : CpuBackend {
  bool lost;
  DeviceFailingCpuBackend(int64_t n_ctx, bool l)
      : CpuBackend(ctx(), tiny().config(), tiny().weights(), n_ctx), lost(l) {}
  void embed(std::span<const int32_t> ids) override {
    if (ids.size() == 13)
      throw DeviceError("CUDA error in attention_kernel: an illegal memory access was encountered", lost);
    CpuBackend::embed(ids);
  }
};

// Issue 58's bad input: a CUDA error mid-run answers that request 503 (the GPU's failure, not the
// request's: try again) in OpenAI's error shape, and the server goes on serving the others; an error
// that loses the device (a sticky one) ends every request with a 503 and stops the server, which
// says why (Server::failure, what `serve` prints as it exits 1).
TEST(Server, AGpuFailureIsA503AndALostGpuStopsTheServer) {
  {
    Running r(Running::options(), int64_t(64) << 20, 0ms, [](int64_t n_ctx) -> std::unique_ptr<Backend> {
      return std::make_unique<DeviceFailingCpuBackend>(n_ctx, false);
    });
    const uint16_t p = r.port();
    const Reply bad =
        post(p, "/v1/completions", R"({"max_tokens": 4, "prompt": )" + ids_json(prompt_of(13, 1)) + "}");
    EXPECT_EQ(bad.status, 503) << bad.body;
    const json e = parsed(bad)["error"];
    EXPECT_EQ(e["type"], "server_error");
    EXPECT_NE(e["message"].get<std::string>().find("the GPU failed: prefill: CUDA error in attention_kernel"),
              std::string::npos)
        << bad.body;
    // Streaming: the error event says the same, then the end.
    const Reply st =
        post(p, "/v1/completions",
             R"({"max_tokens": 4, "stream": true, "prompt": )" + ids_json(prompt_of(13, 3)) + "}");
    EXPECT_NE(st.body.find("the GPU failed: prefill: CUDA error in attention_kernel"), std::string::npos)
        << st.body;
    EXPECT_NE(st.body.find("data: [DONE]"), std::string::npos) << st.body;
    const Reply good =
        post(p, "/v1/completions", R"({"max_tokens": 4, "prompt": )" + ids_json(prompt_of(5, 2)) + "}");
    EXPECT_EQ(good.status, 200) << good.body;
    EXPECT_EQ(request(p, http::verb::get, "/health").status, 200);
    EXPECT_FALSE(r.stopped);
  }
  Running r(Running::options(), int64_t(64) << 20, 0ms, [](int64_t n_ctx) -> std::unique_ptr<Backend> {
    return std::make_unique<DeviceFailingCpuBackend>(n_ctx, true);
  });
  const Reply lost =
      post(r.port(), "/v1/completions", R"({"max_tokens": 4, "prompt": )" + ids_json(prompt_of(13, 1)) + "}");
  EXPECT_EQ(lost.status, 503) << lost.body;
  EXPECT_NE(lost.body.find("illegal memory access"), std::string::npos) << lost.body;
  for (int i = 0; i < 200 && !r.stopped; ++i) std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(r.stopped) << "the server did not stop after losing its GPU";
  EXPECT_NE(r.srv->failure().find("the GPU cannot be used any more: CUDA error in attention_kernel"),
            std::string::npos)
      << r.srv->failure();
  EXPECT_TRUE(r.srv->scheduler().device_lost());
}

// GET /health's verdict from the engine's state: 503 with a reservation and nothing running (the
// state issue 50's lost reservations left, while /health said 200), while shutting down; 200 with
// work running or nothing reserved, however full the budget or long the queue.
// API keys, Host and Origin over real sockets (server/access.h decides; these check the wiring):
// 401 with WWW-Authenticate and OpenAI's error shape, the API with the key, /health open, a foreign
// Host 403 before any key is asked, a preflight from an allowed page answered with CORS headers and
// its requests carrying Access-Control-Allow-Origin, another page 403; the key in no log line.
TEST(Server, ApiKeysHostAndOriginChecks) {
  testing::TempDir dir;
  ServerOptions o = Running::options();
  o.access.api_keys = {"s3cret-key"};
  o.access.allowed_origins = {"https://app.example"};
  o.log_requests = dir.file("requests.jsonl");
  Reply r;
  {
    Running srv(o);
    const uint16_t p = srv.port();
    // ignore_eos: the default sampler is seeded at random, and an early end would change the counts.
    const std::string body = R"({"prompt": [1, 2, 3], "max_tokens": 2, "ignore_eos": true})";
    r = testing::http_request(p, http::verb::post, "/v1/completions", body);
    EXPECT_EQ(r.status, 401);
    EXPECT_EQ(r.headers["www-authenticate"], "Bearer");
    EXPECT_EQ(parsed(r)["error"]["code"], "invalid_api_key");
    r = testing::http_request(p, http::verb::post, "/v1/completions", body,
                              {{"Authorization", "Bearer wrong"}});
    EXPECT_EQ(r.status, 401);
    EXPECT_EQ(r.body.find("wrong"), std::string::npos);
    r = testing::http_request(p, http::verb::post, "/v1/completions", body,
                              {{"Authorization", "Bearer s3cret-key"}});
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(parsed(r)["usage"]["completion_tokens"], 2);
    EXPECT_EQ(request(p, http::verb::get, "/health").status, 200);
    r = testing::http_request(p, http::verb::get, "/v1/models", "", {{"Host", "rebound.evil.example:80"}});
    EXPECT_EQ(r.status, 403);
    EXPECT_EQ(parsed(r)["error"]["code"], "host_not_allowed");
    r = testing::http_request(p, http::verb::options, "/v1/completions", "",
                              {{"Origin", "https://app.example"}, {"Access-Control-Request-Method", "POST"}});
    EXPECT_EQ(r.status, 204);
    EXPECT_EQ(r.headers["access-control-allow-origin"], "https://app.example");
    EXPECT_NE(r.headers["access-control-allow-headers"].find("Authorization"), std::string::npos);
    r = testing::http_request(p, http::verb::get, "/v1/models", "",
                              {{"Origin", "https://app.example"}, {"Authorization", "Bearer s3cret-key"}});
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.headers["access-control-allow-origin"], "https://app.example");
    r = testing::http_request(p, http::verb::get, "/v1/models", "",
                              {{"Origin", "https://evil.example"}, {"Authorization", "Bearer s3cret-key"}});
    EXPECT_EQ(r.status, 403);
    EXPECT_EQ(r.headers.count("access-control-allow-origin"), 0u);
    EXPECT_EQ(metric(p, "lazyprefill_requests_total{outcome=\"401\"}"), 2);
  }
  std::ifstream log(dir.file("requests.jsonl"));
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text.find("s3cret"), std::string::npos);
}

// /metrics shows this server's names, vLLM's, or both (the default): each set alone when asked,
// vLLM's with its model_name and engine labels and counting what ours count. The request ignores
// the end of generation: the default sampler's seed is random, and an early end token (one run in
// CI did) would finish it as "stop" with fewer tokens.
TEST(Server, MetricNamesOursVllmsOrBoth) {
  for (const auto& [ours, vllms] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
    ServerOptions o = Running::options();
    o.lazyprefill_metric_names = ours;
    o.vllm_metric_names = vllms;
    Running srv(o);
    ASSERT_EQ(
        post(srv.port(), "/v1/completions", R"({"prompt": [5, 6, 7], "max_tokens": 3, "ignore_eos": true})")
            .status,
        200);
    const std::string text = request(srv.port(), http::verb::get, "/metrics").body;
    EXPECT_EQ(text.find("lazyprefill_") != std::string::npos, ours);
    EXPECT_EQ(text.find("vllm:") != std::string::npos, vllms);
    if (vllms) {
      const std::string labels = "{engine=\"0\",model_name=\"tiny\"}";
      EXPECT_EQ(metric(srv.port(), "vllm:prompt_tokens_total" + labels), 3);
      EXPECT_EQ(metric(srv.port(), "vllm:generation_tokens_total" + labels), 3);
      EXPECT_EQ(
          metric(srv.port(),
                 "vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"tiny\"}"),
          1);
      EXPECT_EQ(metric(srv.port(), "vllm:num_preemptions_total" + labels), 0);
    }
  }
}

// The prefix cache through the API: a second prompt sharing the first's 40-token start finds its
// two full blocks (usage.prompt_tokens_details.cached_tokens, OpenAI's field), answers what the
// engine answers cold, and both name sets and the request log count it; with the cache off
// nothing is found.
TEST(Server, APrefixCacheHitShowsInUsageMetricsAndTheLog) {
  std::vector<int32_t> doc(40);
  for (size_t i = 0; i < doc.size(); ++i) doc[i] = int32_t(3 + (i * 7) % 50);
  const auto with = [&](std::vector<int32_t> tail) {
    std::vector<int32_t> p = doc;
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  const auto body = [](const std::vector<int32_t>& p, bool stream) {
    return R"({"temperature": 0, "max_tokens": 4, "ignore_eos": true, "prompt": )" + ids_json(p) +
           (stream ? R"(, "stream": true, "stream_options": {"include_usage": true}})" : "}");
  };
  for (const bool cache : {true, false}) {
    testing::TempDir dir;
    ServerOptions o = Running::options();
    o.log_requests = dir.file("requests.jsonl");
    SchedulerOptions so;
    so.kv_budget_bytes = int64_t(64) << 20;
    so.prefix_cache = cache;
    so.make_backend = [](int64_t n_ctx) -> std::unique_ptr<Backend> {
      return std::make_unique<CpuBackend>(ctx(), tiny().config(), tiny().weights(), n_ctx);
    };
    {
      Server srv(tiny(), std::move(so), o);
      std::thread t([&] { srv.run(false); });
      const uint16_t p = srv.port();
      const json first = parsed(post(p, "/v1/completions", body(with({60, 61, 62}), false)));
      EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
      const std::vector<int32_t> second = with({70, 71});
      const json again = parsed(post(p, "/v1/completions", body(second, false)));
      EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], cache ? 32 : 0);
      EXPECT_EQ(again["choices"][0]["text"], greedy_alone(second, 4).first);
      const Reply streamed = post(p, "/v1/completions", body(second, true));
      EXPECT_NE(streamed.body.find(cache ? R"("cached_tokens":32)" : R"("cached_tokens":0)"),
                std::string::npos)
          << streamed.body;
      const double prompts = double(with({60, 61, 62}).size() + 2 * second.size());
      const std::string labels = "{engine=\"0\",model_name=\"tiny\"}";
      EXPECT_EQ(metric(p, "vllm:prefix_cache_queries_total" + labels), cache ? prompts : 0);
      EXPECT_EQ(metric(p, "vllm:prefix_cache_hits_total" + labels), cache ? 64 : 0);
      EXPECT_EQ(metric(p, "lazyprefill_prefix_cache_hit_tokens_total"), cache ? 64 : 0);
      EXPECT_EQ(metric(p, "lazyprefill_prefix_cache_blocks") > 0, cache);
      srv.stop();
      t.join();
    }
    std::ifstream log(o.log_requests);
    std::vector<int64_t> cached;
    for (std::string line; std::getline(log, line);)
      cached.push_back(parse_request_log_line(line, "log").cached_tokens.value_or(-1));
    EXPECT_EQ(cached, (std::vector<int64_t>{0, cache ? 32 : 0, cache ? 32 : 0}));
  }
}

// Several choices ("n"): each its own generation, index 0 to n - 1, whole and streamed alike (the
// same seeds), the completion tokens of all of them in the usage; the choices after the first
// find its prompt in the prefix cache; log-probabilities per choice.
TEST(Server, SeveralChoicesShareThePromptAndStreamByIndex) {
  Running srv;
  const uint16_t p = srv.port();
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(7 + (i * 11) % 60);
  const std::string base =
      R"({"temperature": 0.9, "seed": 5, "max_tokens": 6, "ignore_eos": true, "n": 3, "prompt": )" +
      ids_json(prompt);
  const json whole = parsed(post(p, "/v1/completions", base + R"(, "logprobs": 1})"));
  ASSERT_EQ(whole["choices"].size(), 3u) << whole.dump();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(whole["choices"][i]["index"], i);
    EXPECT_EQ(whole["choices"][i]["logprobs"]["tokens"].size(), 6u);
  }
  EXPECT_EQ(whole["usage"]["completion_tokens"], 18);
  EXPECT_EQ(whole["usage"]["prompt_tokens"], 40);
  EXPECT_NE(whole["choices"][0]["text"], whole["choices"][1]["text"]);        // seeds 5, 6, 7
  EXPECT_EQ(metric(p, "lazyprefill_prefix_cache_hit_tokens_total"), 2 * 32);  // choices 1 and 2: two blocks
  const Reply streamed = post(p, "/v1/completions", base + R"(, "stream": true})");
  std::vector<std::string> texts(3);
  std::istringstream in(streamed.body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("data: {", 0) != 0) continue;
    const json chunk = json::parse(line.substr(6));
    for (const json& c : chunk["choices"]) texts[c["index"].get<size_t>()] += c["text"].get<std::string>();
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(texts[size_t(i)], whole["choices"][i]["text"]) << i;
  EXPECT_EQ(post(p, "/v1/completions", R"({"prompt": [1, 2], "n": 9})").status, 400);
}

// While the model loads the port answers 503 "loading" with Retry-After (server/loading.h); then
// the same listening socket is handed to the server, which answers on it: the port is never closed.
TEST(Health, ThePortAnswers503WhileTheModelLoadsThenServesOnTheSameSocket) {
  LoadingResponder loading("127.0.0.1", 0);
  const uint16_t port = loading.port();
  const Reply h = request(port, http::verb::get, "/health");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.headers.at("retry-after"), "1");
  EXPECT_EQ(parsed(h)["error"]["code"], "model_loading");
  EXPECT_EQ(post(port, "/v1/completions", R"({"prompt": [1, 2]})").status, 503);
  ServerOptions o = Running::options();
  o.port = port;
  o.listening_socket = loading.release();
  SchedulerOptions so;
  so.kv_budget_bytes = int64_t(64) << 20;
  so.make_backend = [](int64_t n_ctx) -> std::unique_ptr<Backend> {
    return std::make_unique<CpuBackend>(ctx(), tiny().config(), tiny().weights(), n_ctx);
  };
  Server srv(tiny(), std::move(so), o);
  EXPECT_EQ(srv.port(), port);
  std::thread t([&] { srv.run(false); });
  EXPECT_EQ(request(port, http::verb::get, "/health").status, 200);
  srv.stop();
  t.join();
}

TEST(Health, AReservationWithNothingRunningOrAShutdownIsUnhealthy) {
  EXPECT_EQ(health_problem(EngineState{}, false), "");
  EXPECT_EQ(health_problem(EngineState{5, 3, 1000, 1000}, false), "");  // full, and working
  EXPECT_EQ(health_problem(EngineState{50, 0, 0, 1000}, false), "");    // a queue about to be admitted
  const std::string lost = health_problem(EngineState{4, 0, 536739840, 536870912}, false);
  EXPECT_NE(lost.find("536739840"), std::string::npos) << lost;
  EXPECT_NE(lost.find("restart"), std::string::npos) << lost;
  EXPECT_NE(health_problem(EngineState{0, 0, 1, 1000}, false), "");
  EXPECT_EQ(health_problem(EngineState{}, true), "the server is shutting down");
  // No progress for longer than the limit with work waiting: a hung engine.
  const std::string stuck = health_problem(EngineState{3, 1, 1000, 2000, 130}, false, 120);
  EXPECT_NE(stuck.find("no progress for 130 s"), std::string::npos) << stuck;
  EXPECT_EQ(health_problem(EngineState{3, 1, 1000, 2000, 110}, false, 120), "");
  EXPECT_EQ(health_problem(EngineState{3, 1, 1000, 2000, 130}, false, 0), "");  // the check off
}

// The warm-up and the readiness probe: with the warm-up on, /health is 503 until the first
// generation has run (each iteration here takes 300 ms), then 200; /health_generate runs one token
// through the scheduler and answers 200, counted in no metric; with a timeout shorter than an
// iteration it answers 503 and its request is cancelled.
TEST(Health, WarmUpAndTheGenerationProbe) {
  ServerOptions o = Running::options();
  o.warm_up = true;
  o.health_generate_timeout = 2000ms;
  Running srv(o, int64_t(64) << 20, 300ms);
  const uint16_t p = srv.port();
  const Reply warming = request(p, http::verb::get, "/health");
  EXPECT_EQ(warming.status, 503);
  EXPECT_NE(warming.body.find("warming up"), std::string::npos) << warming.body;
  int status = 503;
  for (int i = 0; i < 100 && status == 503; ++i) {  // the warm-up's one iteration, however slow the machine
    std::this_thread::sleep_for(50ms);
    status = request(p, http::verb::get, "/health").status;
  }
  EXPECT_EQ(status, 200);
  const Reply probe = request(p, http::verb::get, "/health_generate");
  EXPECT_EQ(probe.status, 200) << probe.body;
  EXPECT_EQ(parsed(probe)["status"], "ok");
  EXPECT_EQ(metric(p, "lazyprefill_requests_total{outcome=\"length\"}"), -1);  // no request counted
}

TEST(Health, AGenerationProbePastItsTimeoutIs503) {
  ServerOptions o = Running::options();
  o.health_generate_timeout = 100ms;
  Running srv(o, int64_t(64) << 20, 400ms);
  const Reply probe = request(srv.port(), http::verb::get, "/health_generate");
  EXPECT_EQ(probe.status, 503);
  EXPECT_NE(probe.body.find("no token was generated within"), std::string::npos) << probe.body;
}

// Over a socket: an engine whose one iteration takes 600 ms, with a stall limit of 100 ms, is
// unhealthy 300 ms into it (the last progress was its idle pass before the request: 300 ms ago at
// least, however slow the machine), and healthy again once it is idle.
TEST(Health, AnEngineThatMakesNoProgressIsUnhealthyUntilIdle) {
  ServerOptions o = Running::options();
  o.health_stall = 100ms;
  Running srv(o, int64_t(64) << 20, 600ms);
  const uint16_t p = srv.port();
  EXPECT_EQ(request(p, http::verb::get, "/health").status, 200);
  std::thread client([p] { post(p, "/v1/completions", R"({"prompt": [1, 2, 3], "max_tokens": 1})"); });
  std::this_thread::sleep_for(300ms);
  const Reply busy = request(p, http::verb::get, "/health");
  client.join();
  EXPECT_EQ(busy.status, 503);
  EXPECT_NE(busy.body.find("no progress"), std::string::npos) << busy.body;
  std::this_thread::sleep_for(150ms);  // the engine's next idle pass (every 100 ms)
  EXPECT_EQ(request(p, http::verb::get, "/health").status, 200);
}

// Bytes written on a raw socket, and what comes back before the server closes it (or `wait` ends).
std::string raw_exchange(uint16_t port, const std::string& bytes, std::chrono::milliseconds wait) {
  asio::io_context io;
  tcp::socket s(io);
  s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  asio::write(s, asio::buffer(bytes));
  std::string got;
  const auto until = std::chrono::steady_clock::now() + wait;
  s.non_blocking(true);
  char buf[4096];
  while (std::chrono::steady_clock::now() < until) {
    boost::system::error_code ec;
    const size_t n = s.read_some(asio::buffer(buf), ec);
    if (ec == asio::error::would_block) {
      std::this_thread::sleep_for(10ms);
      continue;
    }
    if (ec) return got + "<closed>";
    got.append(buf, n);
  }
  return got;
}

TEST(Server, SlowClientsAreCutOffAndMalformedHttpRefused) {
  Running r;  // header and body timeouts of 0.5 s
  // A header that never ends, a body that never comes: closed without an answer.
  EXPECT_EQ(raw_exchange(r.port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\n", 3s), "<closed>");
  EXPECT_EQ(
      raw_exchange(r.port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{", 3s),
      "<closed>");
  const std::string garbage = raw_exchange(r.port(), "HELLO\r\n\r\n", 3s);
  EXPECT_EQ(garbage.rfind("HTTP/1.1 400", 0), 0u) << garbage;
  const std::string huge_header =
      raw_exchange(r.port(), "GET /health HTTP/1.1\r\nX: " + std::string(100 << 10, 'a') + "\r\n\r\n", 3s);
  EXPECT_EQ(huge_header.rfind("HTTP/1.1 431", 0), 0u) << huge_header.substr(0, 40);
  EXPECT_EQ(request(r.port(), http::verb::get, "/health").status, 200);
}

TEST(Server, ConnectionsBeyondTheLimitGet429) {
  Running r;  // 8 connections
  asio::io_context io;
  std::vector<std::unique_ptr<tcp::socket>> held;
  for (int i = 0; i < 8; ++i) {
    held.push_back(std::make_unique<tcp::socket>(io));
    held.back()->connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), r.port()));
  }
  std::this_thread::sleep_for(100ms);
  const std::string over = raw_exchange(r.port(), "", 2s);
  EXPECT_EQ(over.rfind("HTTP/1.1 429", 0), 0u) << over;
  held.clear();
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(request(r.port(), http::verb::get, "/health").status, 200);
}

TEST(Server, AClientThatLeavesCancelsItsRequestAndFreesItsKv) {
  Running r(Running::options(), int64_t(64) << 20, 10ms);  // 200 tokens take 2 s at least
  {
    asio::io_context io;
    beast::tcp_stream s(io);
    s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), r.port()));
    http::request<http::string_body> req{http::verb::post, "/v1/completions", 11};
    req.body() = R"({"temperature": 0.7, "max_tokens": 200, "ignore_eos": true, "stream": true, "prompt": )" +
                 ids_json(prompt_of(30, 5)) + "}";
    req.prepare_payload();
    http::write(s, req);
    beast::flat_buffer buf;
    http::response_parser<http::buffer_body> res;
    http::read_header(s, buf, res);  // streaming has begun
    EXPECT_EQ(res.get().result_int(), 200u);
  }  // the client hangs up
  double cancelled = -1;
  for (int i = 0; i < 200 && cancelled < 1; ++i) {
    std::this_thread::sleep_for(20ms);
    cancelled = metric(r.port(), R"(lazyprefill_requests_total{outcome="cancelled"})");
  }
  EXPECT_EQ(cancelled, 1);
  EXPECT_EQ(metric(r.port(), "lazyprefill_kv_cache_bytes_reserved"), 0);
  EXPECT_EQ(metric(r.port(), "lazyprefill_requests_running"), 0);
}

TEST(Server, StopsGracefullyAndLogsEveryRequest) {
  testing::TempDir dir;
  ServerOptions o = Running::options();
  o.log_requests = dir.path() + "/requests.jsonl";
  auto r = std::make_unique<Running>(o);
  const uint16_t port = r->port();
  Reply last;
  std::thread client([&] {
    last = post(port, "/v1/completions", R"({"temperature": 0, "max_tokens": 100, "prompt": [1, 2, 3]})");
  });
  std::this_thread::sleep_for(50ms);
  r->srv->stop();  // while the request is in flight: it finishes
  r->t.join();
  client.join();
  EXPECT_EQ(last.status, 200) << last.body;
  // The server is gone: a new connection is refused.
  asio::io_context io;
  tcp::socket s(io);
  boost::system::error_code ec;
  s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), ec);
  EXPECT_TRUE(ec);
  std::ifstream log(o.log_requests);
  std::string line;
  ASSERT_TRUE(std::getline(log, line));
  const json rec = json::parse(line);
  EXPECT_EQ(rec["prompt_tokens"], 3);
  EXPECT_EQ(rec["output_tokens"], parsed(last)["usage"]["completion_tokens"]);
  EXPECT_LE(rec["arrival_s"].get<double>(), rec["first_token_s"].get<double>());
  EXPECT_LE(rec["first_token_s"].get<double>(), rec["finished_s"].get<double>());
  EXPECT_EQ(rec["prune"], "none");
  EXPECT_FALSE(std::getline(log, line));
}

}  // namespace
}  // namespace lp::server
