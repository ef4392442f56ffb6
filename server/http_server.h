// `lazyprefill serve`'s HTTP server: Boost.Beast over Asio, one network thread (every connection a
// C++20 coroutine on it) and one engine thread that runs the scheduler's iterations
// (engine/scheduler.h). The scheduler's callbacks run on the engine thread and post each request's
// text to its connection; nothing else crosses between the two threads. docs/serving.md has the
// endpoints, the limits and the shutdown sequence.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/scheduler.h"
#include "server/access.h"
#include "server/metrics.h"
#include "server/openai.h"

namespace lp::server {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback only unless asked
  uint16_t port = 8000;            // 0: any free port (port() says which)
  int64_t max_body_bytes = int64_t(4) << 20;
  int64_t max_header_bytes = 64 << 10;
  int max_connections = 256;  // one more is answered 429 and closed
  // A request's header must arrive within header_timeout of its first byte being awaited (a
  // keep-alive connection's next request: keep_alive + header_timeout), its body within
  // body_timeout after the header; a response write must progress within write_timeout. Past
  // any of them the connection is closed (slow clients).
  std::chrono::milliseconds header_timeout{10'000}, body_timeout{30'000}, keep_alive{30'000},
      write_timeout{60'000};
  // On SIGINT/SIGTERM (or stop()), requests in flight get this long to finish; then they are
  // cancelled. A second signal cancels them at once.
  std::chrono::milliseconds shutdown_grace{30'000};
  // /health answers 503 once the engine has made no progress for this long with requests waiting
  // or running (0: never). An iteration of a large prompt on a CPU can take tens of seconds.
  std::chrono::milliseconds health_stall{120'000};
  // GET /health_generate runs a one-token generation and answers 503 past this (SGLang's probe).
  std::chrono::milliseconds health_generate_timeout{30'000};
  // run() first generates one token (the warm-up); /health answers 503 until it has.
  bool warm_up = true;
  std::string log_requests;  // a JSON Lines file, one line per finished request ("" = none)
  ApiDefaults api;
  AccessOptions access;  // API keys, allowed Host names and web origins (server/access.h)
  bool lazyprefill_metric_names = true, vllm_metric_names = true;  // /metrics' names (MetricsOptions)
  // A socket already listening on host:port to serve on (the LoadingResponder's, server/loading.h;
  // the server owns it from then on); -1: the server binds host:port itself.
  int listening_socket = -1;
};

class Server {
 public:
  // Binds the address (lp::Error naming it when it cannot); serves nothing until run().
  Server(const Model& m, SchedulerOptions sched, ServerOptions opt);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const;
  // Serves until stop(), or SIGINT/SIGTERM when handle_signals; returns once every request has
  // finished or been cancelled and the engine has stopped.
  void run(bool handle_signals);
  void stop();  // any thread: as SIGTERM
  // After run(): why the server stopped on its own (the GPU was lost: every request was answered
  // 503), or empty after stop() or a signal.
  const std::string& failure() const;

  Scheduler& scheduler();
  Metrics& metrics();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lp::server
