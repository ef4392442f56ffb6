#include "server/http_server.h"

#include <fmt/format.h>
#include <time.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without including it

#include "admission/request_log.h"
#include "model/error.h"
#include "model/io.h"
#include "server/text_stream.h"

namespace lp::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using asio::awaitable;
using asio::use_awaitable;

namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One request in flight, as its connection sees it: the text the engine has made final and, at
// the end, the record. Touched on the network thread only (the engine posts there).
// One choice of a request (OpenAI's "n"): a scheduler request of its own.
struct Choice {
  uint64_t id = 0;
  std::deque<std::string> pieces;
  std::vector<TokenLogprobs> logprobs;         // of every token so far (when asked), ahead of its text
  std::vector<TokenLogprobs> prompt_logprobs;  // echo with logprobs: the prompt's, after its prefill
  int64_t tokens = 0;                          // generated so far
  std::optional<RequestRecord> done;
};

// A request between its connection and the engine: its choices, and the connection's state.
struct Pending {
  std::vector<Choice> choices;
  bool client_gone = false;
  bool released = false;                 // the connection has moved on: its socket is not to be touched
  asio::steady_timer* waiter = nullptr;  // wakes the connection's coroutine
  void wake() {
    if (waiter) waiter->cancel();
  }
  bool all_done() const {
    return std::all_of(choices.begin(), choices.end(), [](const Choice& c) { return c.done.has_value(); });
  }
};

// What the engine thread keeps of a request between its callbacks.
struct EngineSide {
  TextStream text;
  Clock::time_point last_token{};
  EngineSide(const Tokenizer& t, std::vector<std::string> stop) : text(t, std::move(stop)) {}
};

}  // namespace

struct Server::Impl {
  const Model& m;
  ServerOptions opt;
  Scheduler sched;
  Metrics metrics;
  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  std::optional<AppendFile> log;
  Clock::time_point started = Clock::now();
  int64_t created = unix_now();
  std::mt19937_64 seeds{std::random_device{}()};
  double cpu_at_start = 0;  // the network thread's CPU seconds when run() began (the model load before)

  // Network thread only.
  int connections = 0;
  std::set<uint64_t> in_flight;
  bool draining = false;
  asio::steady_timer grace{ioc};
  std::set<tcp::socket*> idle;   // connections waiting for their next request, closed on shutdown
  std::optional<Access> access;  // API keys, Host and Origin (built once the port is known)
  std::string warm_problem;      // while warming up, or when the warm-up failed: /health's 503
  std::map<const beast::tcp_stream*, std::string> cors;  // a connection's allowed web origin
  bool destroying = false;  // ~Impl has begun: coroutine frames left in ioc touch nothing on their way out
  // Engine thread.
  std::thread engine;
  bool stopping_for_device = false;  // engine thread
  std::string failure;               // network thread: why the server stopped on its own
  std::mutex state_mu;
  EngineState state;                               // after the last iteration, for /health (under state_mu)
  Clock::time_point last_progress = Clock::now();  // an iteration that worked, or idle (under state_mu)
  std::atomic<bool> engine_stop{false};

  Impl(const Model& model, SchedulerOptions so, ServerOptions o)
      : m(model),
        opt(std::move(o)),
        sched(model, std::move(so)),
        metrics(MetricsOptions{opt.api.model_name, max_model_len(opt.api, model.config()),
                               opt.lazyprefill_metric_names, opt.vllm_metric_names}) {
    if (!opt.log_requests.empty()) log.emplace(opt.log_requests, "request log", uint64_t(1) << 40);
    const auto addr = [&] {
      boost::system::error_code ec;
      const auto a = asio::ip::make_address(opt.host, ec);
      if (ec) fail("host '{}' is not an IP address", opt.host);
      return a;
    }();
    const tcp::endpoint ep(addr, opt.port);
    boost::system::error_code ec;
    if (opt.listening_socket >= 0) {  // handed over, listening (LoadingResponder::release)
      acceptor.assign(ep.protocol(), opt.listening_socket, ec);
      if (ec) fail("cannot serve on the socket listening on {}:{}: {}", opt.host, opt.port, ec.message());
    } else {
      acceptor.open(ep.protocol(), ec);
      if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
      if (!ec) acceptor.bind(ep, ec);
      if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
      if (ec) fail("cannot listen on {}:{}: {}", opt.host, opt.port, ec.message());
    }
    access.emplace(opt.access, opt.host, acceptor.local_endpoint().port());
  }

  ~Impl() { destroying = true; }

  // ---- the engine thread ----

  // What the step's callbacks have for the network thread (engine thread only).
  std::vector<std::function<void()>> outbox;

  void engine_loop() {
    while (true) {
      bool worked = false;
      try {
        worked = sched.step();
      } catch (const std::exception& e) {  // out of memory taking in requests, say: keep serving the others
        fmt::print(stderr, "lazyprefill serve: engine: {}\n", escape_text(e.what()));
      } catch (...) {
        fmt::print(stderr, "lazyprefill serve: engine: an exception that is not a std::exception\n");
      }
      // The state first, then the step's answers: a client that has its answer reads gauges (and a
      // /health) that count its request as finished.
      metrics.engine_state(sched);
      {
        std::lock_guard lk(state_mu);
        state = EngineState{sched.queued(), sched.running(), sched.kv_bytes_reserved(), sched.budget_bytes()};
        if (worked || (state.queued == 0 && state.running == 0)) last_progress = Clock::now();
      }
      if (!outbox.empty())  // the step's text and ends, in order, in one post (one wake-up)
        asio::post(ioc, [v = std::exchange(outbox, {})]() mutable {
          for (auto& f : v) f();
        });
      // A lost GPU: every request has ended with a 503 (the scheduler's), and the server stops, as on
      // SIGTERM, with the reason for run()'s caller.
      if (sched.device_lost() && !stopping_for_device) {
        stopping_for_device = true;
        const std::string why = "the GPU cannot be used any more: " + sched.device_lost_reason();
        asio::post(ioc, [this, why] {
          failure = why;
          begin_shutdown();
        });
      }
      if (!worked) {
        if (engine_stop.load() && sched.queued() == 0 && sched.running() == 0) return;
        sched.wait_for_work(std::chrono::milliseconds(100));
      }
    }
  }

  void write_log(const RequestRecord& r, Endpoint e) {
    const auto t = [&](Clock::time_point x) { return seconds_between(started, x); };
    RequestLogLine l;
    l.id = r.id;
    l.endpoint = e == Endpoint::Completions ? "completions" : "chat";
    l.arrival_s = t(r.arrival);  // seconds since the server started
    l.admitted_s = t(r.admitted);
    l.first_token_s = t(r.first_token);
    l.finished_s = t(r.finished);
    l.prompt_tokens = r.prompt_tokens;
    l.output_tokens = r.output_tokens;
    l.finish = finish_name(r.finish);
    l.error = r.error;
    l.prune = policy_name(r.policy);
    l.schedule = r.schedule;
    l.prompt_tokens_computed_fraction = r.prompt_tokens_computed_fraction;
    l.revivals = r.revivals;
    l.cached_tokens = r.cached_tokens;
    l.kv_bytes_after_prefill = r.kv_bytes_after_prefill;
    l.aux_cache_bytes = r.aux_cache_bytes;
    try {
      log->append(request_log_line(l));
    } catch (const std::exception& ex) {  // a full disk: say so once per request, keep serving
      fmt::print(stderr, "lazyprefill serve: {}\n", escape_text(ex.what()));
    }
  }

  // Queues a parsed request; its callbacks (engine thread) post text and the end to `p`.
  // A probe (/health_generate, the warm-up) is counted in no metric and written to no log.
  // Choice `i` of p (seeded seed + i: the choices of a sampled request differ).
  uint64_t submit(const ApiRequest& a, const std::shared_ptr<Pending>& p, size_t i = 0, bool probe = false) {
    RequestParams rp;
    rp.prompt = a.prompt;
    rp.max_tokens = a.max_tokens;
    rp.sampler = a.sampler;
    rp.sampler.seed += i;
    rp.policy = a.policy;
    rp.schedule = a.schedule;
    rp.prune_seed = a.prune_seed;
    rp.stop_at_end_of_generation = !a.ignore_eos;
    auto side = std::make_shared<EngineSide>(m.tokenizer(), a.stop);
    rp.on_token = [this, p, i, side, probe](int32_t tok) {
      const auto now = Clock::now();
      if (side->last_token != Clock::time_point{} && !probe)
        metrics.inter_token(seconds_between(side->last_token, now));
      side->last_token = now;
      std::string piece = side->text.push(tok);
      outbox.push_back([p, i, piece = std::move(piece)]() mutable {
        Choice& c = p->choices[i];
        if (!piece.empty()) c.pieces.push_back(std::move(piece));
        // Woken for text, and for the first token (the other choices may start then).
        if (++c.tokens == 1 || !c.pieces.empty()) p->wake();
      });
      return !side->text.stopped();
    };
    rp.top_logprobs = a.top_logprobs;
    if (a.echo && a.top_logprobs >= 0) {
      rp.prompt_logprobs = true;
      rp.on_prompt_logprobs = [this, p, i](std::span<const TokenLogprobs> lps) {
        outbox.push_back([p, i, v = std::vector<TokenLogprobs>(lps.begin(), lps.end())]() mutable {
          p->choices[i].prompt_logprobs = std::move(v);
        });
      };
    }
    if (a.top_logprobs >= 0)
      rp.on_logprobs = [this, p, i](const TokenLogprobs& lp) {
        outbox.push_back([p, i, lp] { p->choices[i].logprobs.push_back(lp); });
      };
    const Endpoint e = a.endpoint;
    rp.on_finish = [this, p, i, side, e, probe](const RequestRecord& r) {
      std::string tail = r.finish == Finish::Length || r.finish == Finish::Stop ? side->text.finish() : "";
      if (!probe) metrics.finished(r, m.config().n_layer);
      if (log && !probe) write_log(r, e);
      outbox.push_back([p, i, tail = std::move(tail), r]() mutable {
        if (!tail.empty()) p->choices[i].pieces.push_back(std::move(tail));
        p->choices[i].done = r;
        p->wake();
      });
    };
    return sched.submit(std::move(rp));
  }

  // ---- the network thread ----

  using Request = http::request<http::string_body>;

  template <class Body>
  void common_headers(const beast::tcp_stream& s, http::response<Body>& res, bool keep_alive) {
    res.set(http::field::server, "lazyprefill");
    res.keep_alive(keep_alive && !draining);
    if (const auto it = cors.find(&s); it != cors.end()) {  // a request from an allowed web page
      res.set(http::field::access_control_allow_origin, it->second);
      res.set(http::field::vary, "Origin");
    }
  }

  awaitable<void> write(beast::tcp_stream& s, http::response<http::string_body>& res) {
    res.prepare_payload();
    s.expires_after(opt.write_timeout);
    co_await http::async_write(s, res, use_awaitable);
    s.expires_never();
  }

  awaitable<void> send_json(beast::tcp_stream& s, unsigned version, bool keep_alive, int status,
                            const json& body) {
    http::response<http::string_body> res{http::status(status), version};
    common_headers(s, res, keep_alive);
    res.set(http::field::content_type, "application/json");
    if (status == 401) res.set(http::field::www_authenticate, "Bearer");
    res.body() = dump(body);
    co_await write(s, res);
  }

  // A request refused before the scheduler ran it (counted as such in the metrics).
  awaitable<void> send_error(beast::tcp_stream& s, unsigned version, bool keep_alive, const ApiError& e) {
    metrics.rejected(e.status);
    co_await send_json(s, version, keep_alive, e.status, error_body(e));
  }

  // Closes the connection when the client has gone while its request waits or streams; touches the
  // socket only while the connection still owns the request.
  void watch_disconnect(tcp::socket& sock, const std::shared_ptr<Pending>& p) {
    sock.async_wait(tcp::socket::wait_read, [this, &sock, p](const boost::system::error_code& ec) {
      if (ec == asio::error::operation_aborted || p->released || p->all_done()) return;
      boost::system::error_code ec2;
      if (!ec && sock.available(ec2) > 0 && !ec2) return;  // a pipelined request, not a hang-up
      p->client_gone = true;
      for (const Choice& c : p->choices)
        if (c.id) sched.cancel(c.id);
      p->wake();
    });
  }

  awaitable<void> completion(beast::tcp_stream& s, const Request& req, Endpoint e, bool& keep_alive) {
    ApiRequest a;
    try {
      a = parse_request(req.body(), e, m.tokenizer(), m.config(), opt.api, seeds());
    } catch (const nlohmann::json::exception& ex) {  // any read the checks missed: still the body's fault
      throw ApiError(400, fmt::format("the body could not be read: {}", ex.what()));
    }
    auto p = std::make_shared<Pending>();
    p->choices.resize(size_t(a.n));
    // The choices after the first start once it has its first token, so that its prompt's blocks
    // are in the prefix cache for them (the prompt computed once); without the cache, all at once.
    const bool staggered = a.n > 1 && sched.prefix_cache();
    size_t submitted = 0;
    const auto submit_choices = [&](size_t upto) {
      for (; submitted < upto; ++submitted) {
        try {
          p->choices[submitted].id = submit(a, p, submitted);
        } catch (const lp::InternalError& ex) {  // a bug, not the request's fault
          throw ApiError(500, ex.what());
        } catch (const lp::DeviceError& ex) {  // the GPU was lost: the server is stopping
          throw ApiError(503, ex.what());
        } catch (const lp::Error& ex) {  // the scheduler's refusals: over the whole K/V budget
          throw ApiError(400, ex.what(), "max_tokens", "kv_budget_exceeded");
        }
        in_flight.insert(p->choices[submitted].id);
      }
    };
    submit_choices(staggered ? 1 : p->choices.size());  // a refusal here is the request's alone
    asio::steady_timer timer(co_await asio::this_coro::executor);
    p->waiter = &timer;
    watch_disconnect(s.socket(), p);
    const std::string id = response_id(e, p->choices[0].id);
    const std::string& model = opt.api.model_name;
    const int64_t created_at = unix_now();
    std::optional<http::response_serializer<http::empty_body>> sr;
    http::response<http::empty_body> head{http::status::ok, req.version()};
    const size_t n = p->choices.size();
    std::vector<std::string> text(n);  // non-streaming: the whole answers
    std::vector<char> first(n, 1);
    const auto sse = [](const json& j) { return "data: " + dump(j) + "\n\n"; };
    // Log-probabilities: those of a choice's tokens since its last chunk go with the next one.
    std::vector<size_t> lp_sent(n, 0);
    std::vector<int64_t> lp_offset(n, 0);
    const auto next_logprobs = [&](size_t i) -> std::optional<json> {
      const std::vector<TokenLogprobs>& all = p->choices[i].logprobs;
      if (a.top_logprobs < 0 || lp_sent[i] >= all.size()) return std::nullopt;
      const std::span<const TokenLogprobs> fresh = std::span(all).subspan(lp_sent[i]);
      // echo (never streamed): the prompt's tokens first, its first one's log-probability null.
      const bool with_prompt = a.echo && lp_sent[i] == 0;
      json j = with_prompt ? logprobs_body(e, fresh, m.tokenizer(), 0, p->choices[i].prompt_logprobs,
                                           a.prompt.front())
                           : logprobs_body(e, fresh, m.tokenizer(), lp_offset[i]);
      for (const TokenLogprobs& lp : fresh)
        lp_offset[i] += int64_t(m.tokenizer().decode({&lp.token, 1}).size());
      lp_sent[i] = all.size();
      return j;
    };
    const auto cancel_all = [&] {
      for (const Choice& c : p->choices)
        if (c.id) sched.cancel(c.id);
    };
    std::optional<ApiError> refused;  // a later choice the scheduler refused
    try {
      if (a.stream) {
        common_headers(s, head, keep_alive);
        head.set(http::field::content_type, "text/event-stream");
        head.set(http::field::cache_control, "no-cache");
        head.chunked(true);
        sr.emplace(head);
        s.expires_after(opt.write_timeout);
        co_await http::async_write_header(s, *sr, use_awaitable);
        s.expires_never();
      }
      while (true) {
        if (submitted < n && (p->choices[0].tokens > 0 || p->choices[0].done)) {
          try {
            submit_choices(n);
          } catch (const ApiError& x) {
            refused = x;
            cancel_all();
          }
        }
        std::string out;
        bool more = false;
        for (size_t i = 0; i < n; ++i) {
          Choice& c = p->choices[i];
          for (std::string& piece : c.pieces) {
            if (a.stream) {
              const std::optional<json> lp = next_logprobs(i);
              out +=
                  sse(chunk_body(e, id, created_at, model, piece, "", first[i], lp ? &*lp : nullptr, int(i)));
            } else {
              text[i] += piece;
            }
            first[i] = 0;
          }
          c.pieces.clear();
        }
        if (!out.empty()) {
          s.expires_after(opt.write_timeout);
          co_await asio::async_write(s, http::make_chunk(asio::buffer(out)), use_awaitable);
          s.expires_never();
        }
        if (p->client_gone) break;
        for (const Choice& c : p->choices) more = more || !c.pieces.empty();
        if (more) continue;  // more came while the last chunk was being written
        if (refused && std::all_of(p->choices.begin(), p->choices.begin() + std::ptrdiff_t(submitted),
                                   [](const Choice& c) { return c.done.has_value(); }))
          break;
        if (submitted == n && p->all_done()) break;
        timer.expires_at(asio::steady_timer::time_point::max());
        boost::system::error_code ec;
        co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
      }
    } catch (const boost::system::system_error&) {  // the client went away mid-stream
      p->client_gone = true;
      cancel_all();
    }
    p->waiter = nullptr;
    p->released = true;
    for (const Choice& c : p->choices)
      if (c.id) in_flight.erase(c.id);
    boost::system::error_code ignored;
    s.socket().cancel(ignored);  // the disconnect watch
    if (p->client_gone || (!refused && !p->all_done())) {
      keep_alive = false;
      co_return;
    }
    // A choice that failed or was cancelled fails the request (the others' text is not sent).
    std::optional<ApiError> err = refused;
    for (size_t i = 0; i < submitted && !err; ++i) {
      const RequestRecord& r = *p->choices[i].done;
      if (r.finish == Finish::Error && r.device_error)  // not the request's doing: try again (elsewhere)
        err = ApiError(503, "the GPU failed: " + r.error);
      else if (r.finish == Finish::Error || r.finish == Finish::Cancelled)
        err = ApiError(r.finish == Finish::Error ? 500 : 503,
                       r.finish == Finish::Error ? "the engine failed: " + r.error
                                                 : "the request was cancelled: the server is shutting down");
    }
    if (err) {
      if (!a.stream) {  // the scheduler's records have counted it already
        co_await send_json(s, req.version(), keep_alive, err->status, error_body(*err));
        co_return;
      }
      const std::string out = sse(error_body(*err)) + "data: [DONE]\n\n";
      s.expires_after(opt.write_timeout);
      co_await asio::async_write(s, http::make_chunk(asio::buffer(out)), use_awaitable);
      co_await asio::async_write(s, http::make_chunk_last(), use_awaitable);
      s.expires_never();
      co_return;
    }
    // The usage: the prompt once (as the first choice ran it), the tokens of every choice.
    const RequestRecord& r = *p->choices[0].done;
    Outcome o;
    o.prompt_tokens = r.prompt_tokens;
    o.cached_tokens = r.cached_tokens;
    for (const Choice& c : p->choices) o.completion_tokens += c.done->output_tokens;
    o.policy = policy_name(r.policy);
    o.schedule = r.schedule;
    o.prompt_tokens_computed_fraction = r.prompt_tokens_computed_fraction;
    o.revivals = r.revivals;
    o.queue_s = seconds_between(r.arrival, r.admitted);
    o.ttft_s = seconds_between(r.arrival, r.first_token);
    const auto finish_of = [](const RequestRecord& x) {
      return x.finish == Finish::Length ? "length" : "stop";
    };
    if (!a.stream) {
      std::vector<ChoiceText> choices(n);
      std::vector<std::optional<json>> lps(n);
      for (size_t i = 0; i < n; ++i) {
        lps[i] = next_logprobs(i);
        choices[i] = {(a.echo ? a.prompt_text : std::string()) + text[i], finish_of(*p->choices[i].done),
                      lps[i] ? &*lps[i] : nullptr};
      }
      co_await send_json(s, req.version(), keep_alive, 200,
                         completion_body(e, id, created_at, model, choices, o));
      co_return;
    }
    std::string out;
    for (size_t i = 0; i < n; ++i) {
      if (first[i] && e == Endpoint::ChatCompletions)
        out +=
            sse(chunk_body(e, id, created_at, model, "", "", true, nullptr, int(i)));  // the role, at least
      const std::optional<json> lp = next_logprobs(i);  // of the tokens whose text was held back or empty
      out += sse(chunk_body(e, id, created_at, model, "", finish_of(*p->choices[i].done), false,
                            lp ? &*lp : nullptr, int(i)));
    }
    if (a.include_usage) out += sse(usage_chunk_body(e, id, created_at, model, o));
    out += "data: [DONE]\n\n";
    s.expires_after(opt.write_timeout);
    co_await asio::async_write(s, http::make_chunk(asio::buffer(out)), use_awaitable);
    co_await asio::async_write(s, http::make_chunk_last(), use_awaitable);
    s.expires_never();
  }

  // A one-token greedy generation through the scheduler, queued and run as any request is (for
  // /health_generate and the warm-up): its record, or nullopt when it has not finished within
  // `timeout` (it is then cancelled).
  awaitable<std::optional<RequestRecord>> generate_probe(std::chrono::milliseconds timeout) {
    ApiRequest a;
    a.prompt = m.tokenizer().encode("Hello", false, false);
    if (a.prompt.empty()) a.prompt = {0};
    a.max_tokens = 1;
    a.ignore_eos = true;
    auto p = std::make_shared<Pending>();
    p->choices.resize(1);
    Choice& c = p->choices[0];
    try {
      c.id = submit(a, p, 0, true);
    } catch (const lp::DeviceError& e) {  // the GPU is lost: the probe fails as a request would
      RequestRecord failed;
      failed.finish = Finish::Error;
      failed.device_error = true;
      failed.error = e.what();
      co_return failed;
    }
    in_flight.insert(c.id);
    asio::steady_timer timer(co_await asio::this_coro::executor);
    p->waiter = &timer;
    const auto until = asio::steady_timer::clock_type::now() + timeout;
    while (!c.done && asio::steady_timer::clock_type::now() < until) {
      timer.expires_at(until);
      boost::system::error_code ec;
      co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
    }
    p->waiter = nullptr;
    p->released = true;
    in_flight.erase(c.id);
    if (!c.done) {
      sched.cancel(c.id);
      co_return std::nullopt;
    }
    co_return c.done;
  }

  // The warm-up: /health answers 503 until the first generation has run (the kernels' first use,
  // the K/V allocation), then 200, or keeps 503 with the engine's error.
  awaitable<void> warm_up() {
    const std::optional<RequestRecord> r = co_await generate_probe(std::chrono::minutes(30));
    if (r && (r->finish == Finish::Length || r->finish == Finish::Stop))
      warm_problem.clear();
    else
      warm_problem =
          r ? "the warm-up generation failed: " + r->error : "the warm-up generation did not finish";
  }

  awaitable<void> route(beast::tcp_stream& s, const Request& req, bool& keep_alive) {
    const std::string target(req.target());
    const std::string path = target.substr(0, target.find('?'));
    const bool get = req.method() == http::verb::get, post = req.method() == http::verb::post;
    const auto sv = [](beast::string_view v) { return std::string_view(v.data(), v.size()); };
    const std::string_view origin = sv(req[http::field::origin]);
    if (auto refused = access->check(sv(req.method_string()), path, sv(req[http::field::host]), origin,
                                     sv(req[http::field::authorization])))
      throw *refused;
    if (const std::string allowed = access->allow_origin(origin); !allowed.empty()) cors[&s] = allowed;
    if (req.method() == http::verb::options) {  // a browser's preflight, from an allowed origin
      http::response<http::string_body> res{http::status::no_content, req.version()};
      common_headers(s, res, keep_alive);
      res.set(http::field::allow, "GET, POST, OPTIONS");
      if (!origin.empty()) {
        res.set(http::field::access_control_allow_methods, "GET, POST, OPTIONS");
        res.set(http::field::access_control_allow_headers, "Authorization, Content-Type");
        res.set(http::field::access_control_max_age, "600");
      }
      co_await write(s, res);
      co_return;
    }
    if (path == "/health_generate" && get) {
      if (draining) throw ApiError(503, "the server is shutting down");
      const auto t0 = Clock::now();
      const std::optional<RequestRecord> r = co_await generate_probe(opt.health_generate_timeout);
      if (!r)
        throw ApiError(503, fmt::format("no token was generated within {:.0f} s",
                                        std::chrono::duration<double>(opt.health_generate_timeout).count()));
      if (r->finish != Finish::Length && r->finish != Finish::Stop)
        throw ApiError(
            503, "the probe generation failed: " + (r->error.empty() ? finish_name(r->finish) : r->error));
      json ok;
      ok["status"] = "ok";
      ok["seconds"] = seconds_between(t0, Clock::now());
      co_await send_json(s, req.version(), keep_alive, 200, ok);
    } else if (path == "/health" && get) {
      if (!warm_problem.empty()) throw ApiError(503, warm_problem);
      const std::string problem = health_problem(
          [&] {
            std::lock_guard lk(state_mu);
            EngineState st = state;
            // Work waits when the engine's last state says so, or when this thread holds requests it
            // has not answered (the state is published after each iteration: one that never ends
            // leaves the idle state before it in place).
            if (st.queued + st.running > 0 || !in_flight.empty())
              st.stalled_s = seconds_between(last_progress, Clock::now());
            return st;
          }(),
          draining, std::chrono::duration<double>(opt.health_stall).count());
      if (!problem.empty()) throw ApiError(503, problem);
      json ok;
      ok["status"] = "ok";
      co_await send_json(s, req.version(), keep_alive, 200, ok);
    } else if (path == "/v1/models" && get) {
      co_await send_json(s, req.version(), keep_alive, 200,
                         models_body(opt.api.model_name, created, max_model_len(opt.api, m.config())));
    } else if (path == "/metrics" && get) {
      metrics.set_server_cpu_seconds(thread_cpu_seconds() - cpu_at_start);
      http::response<http::string_body> res{http::status::ok, req.version()};
      common_headers(s, res, keep_alive);
      res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res.body() = metrics.text();
      co_await write(s, res);
    } else if ((path == "/v1/completions" || path == "/v1/chat/completions") && post) {
      if (draining) throw ApiError(503, "the server is shutting down");
      co_await completion(
          s, req, path == "/v1/completions" ? Endpoint::Completions : Endpoint::ChatCompletions, keep_alive);
    } else if (path == "/health" || path == "/health_generate" || path == "/v1/models" ||
               path == "/metrics" || path == "/v1/completions" || path == "/v1/chat/completions") {
      throw ApiError(405,
                     fmt::format("method {} is not allowed on {}", std::string(req.method_string()), path));
    } else {
      throw ApiError(404, fmt::format("no such endpoint: {}", path));
    }
  }

  ApiError body_too_large() const {
    return ApiError(413, fmt::format("the body is over the limit of {} bytes", opt.max_body_bytes));
  }

  awaitable<void> connection(tcp::socket sock) {
    struct Count {  // the connection leaves the count however the coroutine ends
      Impl& impl;
      ~Count() {
        if (impl.destroying) return;  // a frame destroyed with the io_context, after the members it counts
        --impl.connections;
        impl.maybe_finish_shutdown();
      }
    } count{*this};
    beast::tcp_stream s(std::move(sock));
    struct Forget {  // the connection's CORS origin goes with it
      Impl& impl;
      const beast::tcp_stream* s;
      ~Forget() {
        if (!impl.destroying) impl.cors.erase(s);
      }
    } forget{*this, &s};
    beast::flat_buffer buf;
    bool first_request = true;
    try {
      if (connections > opt.max_connections) {
        const ApiError e(429, fmt::format("too many connections (the limit is {})", opt.max_connections));
        co_await send_error(s, 11, false, e);
        s.socket().shutdown(tcp::socket::shutdown_send);
        co_return;
      }
      while (!draining) {
        http::request_parser<http::string_body> parser;
        parser.body_limit(uint64_t(opt.max_body_bytes));
        parser.header_limit(uint32_t(opt.max_header_bytes));
        s.expires_after(first_request ? opt.header_timeout : opt.keep_alive + opt.header_timeout);
        first_request = false;
        boost::system::error_code ec;
        idle.insert(&s.socket());
        co_await http::async_read_header(s, buf, parser, asio::redirect_error(use_awaitable, ec));
        idle.erase(&s.socket());
        if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
            ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
            ec == asio::error::eof)
          break;
        if (ec == http::error::header_limit) {
          co_await send_error(s, 11, false, ApiError(431, "the request's header is too large"));
          break;
        }
        if (ec == http::error::body_limit) {  // a Content-Length over the limit, seen with the header
          co_await send_error(s, 11, false, body_too_large());
          break;
        }
        if (ec) {
          co_await send_error(s, 11, false,
                              ApiError(400, fmt::format("malformed HTTP request: {}", ec.message())));
          break;
        }
        // A client that waits for "100 Continue" before its body (curl does, for large ones).
        if (beast::iequals(parser.get()[http::field::expect], "100-continue")) {
          if (parser.content_length() && *parser.content_length() > uint64_t(opt.max_body_bytes)) {
            co_await send_error(s, 11, false, body_too_large());
            break;
          }
          http::response<http::empty_body> cont{http::status::continue_, 11};
          co_await http::async_write(s, cont, use_awaitable);
        }
        s.expires_after(opt.body_timeout);
        co_await http::async_read(s, buf, parser, asio::redirect_error(use_awaitable, ec));
        s.expires_never();
        if (ec == beast::error::timeout || ec == http::error::end_of_stream || ec == asio::error::eof ||
            ec == asio::error::connection_reset)
          break;
        if (ec == http::error::body_limit) {  // chunked: found while reading
          co_await send_error(s, 11, false, body_too_large());
          break;
        }
        if (ec) {
          co_await send_error(s, 11, false,
                              ApiError(400, fmt::format("malformed HTTP request: {}", ec.message())));
          break;
        }
        const Request req = parser.release();
        bool keep_alive = req.keep_alive();
        std::optional<ApiError> refused;
        try {
          co_await route(s, req, keep_alive);
        } catch (const ApiError& e) {
          refused = e;
        }
        if (refused) co_await send_error(s, req.version(), keep_alive, *refused);
        if (!keep_alive || draining) break;
      }
      boost::system::error_code ignored;
      s.socket().shutdown(tcp::socket::shutdown_send, ignored);
    } catch (const std::exception&) {
      // A write failed or timed out: the client is gone; its request, if any, was cancelled.
    }
    idle.erase(&s.socket());
  }

  awaitable<void> accept_loop() {
    while (acceptor.is_open()) {
      boost::system::error_code ec;
      tcp::socket sock = co_await acceptor.async_accept(asio::redirect_error(use_awaitable, ec));
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) break;
      if (ec) continue;  // out of descriptors and the like: keep serving the others
      ++connections;
      asio::co_spawn(ioc, connection(std::move(sock)), asio::detached);
    }
  }

  // ---- shutdown ----

  void begin_shutdown() {
    if (draining) {  // a second signal: cancel what is in flight now
      cancel_all();
      return;
    }
    draining = true;
    fmt::print(stderr, "lazyprefill serve: shutting down: {} request(s) in flight get {:.0f} s to finish\n",
               in_flight.size(), std::chrono::duration<double>(opt.shutdown_grace).count());
    boost::system::error_code ignored;
    acceptor.close(ignored);
    for (tcp::socket* s : idle) s->close(ignored);  // connections between requests
    grace.expires_after(opt.shutdown_grace);
    grace.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      cancel_all();
      // The cancelled requests end at the engine's next iteration; a connection that still has not
      // closed 5 s later (a client that reads nothing) is dropped with the rest.
      grace.expires_after(std::chrono::seconds(5));
      grace.async_wait([this](const boost::system::error_code& ec2) {
        if (!ec2) ioc.stop();
      });
    });
    maybe_finish_shutdown();
  }

  void cancel_all() {
    for (const uint64_t id : in_flight) sched.cancel(id);
  }

  void maybe_finish_shutdown() {
    if (!draining || connections > 0) return;
    grace.cancel();
    ioc.stop();
  }
};

Server::Server(const Model& m, SchedulerOptions sched, ServerOptions opt)
    : impl_(std::make_unique<Impl>(m, std::move(sched), std::move(opt))) {}

Server::~Server() {
  // run() normally joins the engine; a Server destroyed without run() never started one.
  if (impl_->engine.joinable()) {
    impl_->engine_stop = true;
    impl_->sched.wake();
    impl_->engine.join();
  }
}

uint16_t Server::port() const {
  return impl_->acceptor.local_endpoint().port();
}

Scheduler& Server::scheduler() {
  return impl_->sched;
}

Metrics& Server::metrics() {
  return impl_->metrics;
}

const std::string& Server::failure() const {
  return impl_->failure;
}

void Server::stop() {
  asio::post(impl_->ioc, [this] { impl_->begin_shutdown(); });
}

void Server::run(bool handle_signals) {
  Impl& s = *impl_;
  s.engine = std::thread([&s] { s.engine_loop(); });
  std::optional<asio::signal_set> signals;
  std::function<void(const boost::system::error_code&, int)> on_signal;
  if (handle_signals) {
    signals.emplace(s.ioc, SIGINT, SIGTERM);
    on_signal = [&](const boost::system::error_code& ec, int) {
      if (ec) return;
      s.begin_shutdown();
      signals->async_wait(on_signal);
    };
    signals->async_wait(on_signal);
  }
  asio::co_spawn(s.ioc, s.accept_loop(), asio::detached);
  if (s.opt.warm_up) {
    s.warm_problem = "warming up: the first generation has not finished";
    asio::co_spawn(s.ioc, s.warm_up(), asio::detached);
  }
  s.cpu_at_start = thread_cpu_seconds();
  s.ioc.run();
  // Every connection has ended. Anything still in the scheduler (a request whose client left in
  // the last instant) is cancelled, and the engine stops once it is empty.
  s.cancel_all();
  s.engine_stop = true;
  s.sched.wake();
  s.engine.join();
  if (signals) {
    boost::system::error_code ignored;
    signals->cancel(ignored);
  }
}

}  // namespace lp::server
