// While `serve` loads its model (seconds for a large file, minutes for a very large one), its port
// answers already: every request gets 503 with OpenAI's error shape and `Retry-After: 1`, so a
// readiness probe sees "not ready" rather than a refused connection and a client knows to retry.
// When the model is loaded the listening socket is handed to the server (ServerOptions::
// listening_socket): there is no moment at which the port is closed, and connections waiting in
// its backlog are served by the server.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace lp::server {

class LoadingResponder {
 public:
  // Binds host:port (0: any free port) and answers on its own thread. lp::Error naming the address
  // when it cannot.
  LoadingResponder(const std::string& host, uint16_t port);
  ~LoadingResponder();
  LoadingResponder(const LoadingResponder&) = delete;
  LoadingResponder& operator=(const LoadingResponder&) = delete;

  uint16_t port() const;
  // Stops answering (a connection being answered at that moment is closed unanswered; its client
  // retries as after any 503) and gives the listening socket, still listening, to the caller (a
  // native handle: ServerOptions::listening_socket).
  int release();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lp::server
