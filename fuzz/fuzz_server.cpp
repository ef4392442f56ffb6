// The whole server, as a stranger on the network reaches it: the input's bytes sent over a TCP
// connection to a running `serve` (the tests' tiny model, a 256-token context, its own threads),
// read to the end, the connection closed. Beast's parser, the access check, routing, the OpenAI
// reader, the coroutine handlers (streamed or not, n choices, log-probabilities, cancellation by
// the half-closed connection), the scheduler, the prefix cache: all of it runs on the input. A
// crash, a sanitizer report or a hang (no answer within 10 s; the server's own limits cut off a
// slow client sooner) is a finding; so is a server that stops answering GET /health with 200.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "engine/model.h"
#include "kernels/context.h"
#include "kernels/cpu/backend.h"
#include "server/http_server.h"
#include "tests/gguf_writer.h"

namespace {

using namespace std::chrono_literals;

struct Running {
  std::unique_ptr<lp::CpuContext> ctx;
  std::unique_ptr<lp::Model> model;
  std::unique_ptr<lp::server::Server> srv;
  std::thread thread;
  uint16_t port = 0;
  Running() {
    char dir[] = "/tmp/lp-fuzz-server-XXXXXX";
    if (!::mkdtemp(dir)) std::abort();
    lp::testing::TinyModelSpec spec;
    spec.n_ctx = 256;
    ctx = std::make_unique<lp::CpuContext>(1);
    model = lp::Model::load(lp::testing::write_tiny_model(std::string(dir) + "/tiny.gguf", spec),
                            lp::DType::F32, *ctx);
    lp::SchedulerOptions so;
    so.kv_budget_bytes = int64_t(16) << 20;
    so.max_batch_tokens = 512;
    so.make_backend = [this](int64_t n_ctx) -> std::unique_ptr<lp::Backend> {
      return std::make_unique<lp::CpuBackend>(*ctx, model->config(), model->weights(), n_ctx);
    };
    lp::server::ServerOptions o;
    o.port = 0;
    o.api.model_name = "tiny";
    o.api.max_n = 4;
    o.header_timeout = 1s, o.body_timeout = 1s, o.keep_alive = 1s, o.write_timeout = 2s;
    o.max_body_bytes = 64 << 10;
    o.warm_up = false;
    o.shutdown_grace = 1s;
    srv = std::make_unique<lp::server::Server>(*model, std::move(so), o);
    port = srv->port();
    thread = std::thread([this] { srv->run(false); });
  }
  // Stopped and joined when libFuzzer ends the process, before the statics its threads use are
  // destroyed: left running, one of them ran into unmapped code after the last input ("SEGV on
  // unknown address", pc = the address, thread T3, after "Done 17033 runs"; CI, 2026-11-30).
  void stop() {
    srv->stop();
    if (thread.joinable()) thread.join();
  }
};
Running* running = nullptr;

// Sends `data` on a new connection, half-closes it, reads the answer to its end; false on a hang.
// libFuzzer's timer signal interrupts system calls: each is resumed (EINTR), never taken for a
// failure or a hang; an interrupted connect goes on in the background and is waited for.
bool exchange(uint16_t port, const uint8_t* data, size_t size, std::string* answer = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) std::abort();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    if (err == EINTR || err == EINPROGRESS) {
      pollfd w{fd, POLLOUT, 0};
      while (::poll(&w, 1, 10000) < 0 && errno == EINTR) {
      }
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err != 0) {
      std::fprintf(stderr, "fuzz_server: connect: %s\n", std::strerror(err));
      std::abort();
    }
  }
  for (size_t sent = 0; sent < size;) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the server closed early (a bad request): fine
    sent += size_t(n);
  }
  ::shutdown(fd, SHUT_WR);
  const auto until = std::chrono::steady_clock::now() + 10s;
  char buf[4096];
  bool ok = true;
  while (true) {
    pollfd p{fd, POLLIN, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left <= 0ms) {
      ok = false;
      break;
    }
    const int ready = ::poll(&p, 1, int(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      ok = false;
      break;
    }
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (answer) answer->append(buf, size_t(n));
  }
  // Closed with a reset, not a FIN: thousands of connections a second would otherwise leave this
  // side's ports in TIME_WAIT, and a new connection reusing one waits seconds for its SYN.
  const linger reset{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  ::close(fd);
  return ok;
}

}  // namespace

// The server runs until the process ends (its CPU context's threads with it, idle after the
// server stops at exit): their per-thread scratch buffers are still held then, which LeakSanitizer
// would report at exit. Nothing else is suppressed.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:lp::CpuContext::scratch_bytes\n";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Running* s = [] {  // never destroyed; stopped at exit
    running = new Running();
    std::atexit([] { running->stop(); });
    return running;
  }();
  std::string answer;
  if (!exchange(s->port, data, size, &answer)) {
    std::fprintf(stderr, "fuzz_server: no end to the answer within 10 s; it began: %.300s\n", answer.c_str());
    if (std::getenv("LP_FUZZ_SERVER_HOLD")) {  // for a debugger: the process waits, hung as it is
      std::fprintf(stderr, "fuzz_server: pid %d held\n", int(::getpid()));
      std::this_thread::sleep_for(std::chrono::minutes(10));
    }
    std::abort();  // a hang
  }
  static const std::string health = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  answer.clear();
  if (!exchange(s->port, reinterpret_cast<const uint8_t*>(health.data()), health.size(), &answer) ||
      answer.rfind("HTTP/1.1 200", 0) != 0) {
    std::fprintf(stderr, "fuzz_server: GET /health answered: %.300s\n", answer.c_str());
    std::abort();  // the server stopped serving
  }
  return 0;
}
