#include "server/loading.h"

#include <fmt/format.h>
#include <unistd.h>

#include <thread>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange without including it
//
#include <boost/asio.hpp>
#include <boost/beast.hpp>

#include "model/error.h"
#include "server/openai.h"

namespace lp::server {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct LoadingResponder::Impl {
  asio::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::thread thread;
  std::string body;

  void accept() {
    acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket sock) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) answer(std::make_shared<beast::tcp_stream>(std::move(sock)));
      accept();
    });
  }

  // Reads one request (bounded in size and time), answers 503, closes.
  void answer(const std::shared_ptr<beast::tcp_stream>& s) {
    auto buf = std::make_shared<beast::flat_buffer>();
    auto parser = std::make_shared<http::request_parser<http::string_body>>();
    parser->header_limit(16 << 10);
    parser->body_limit(64 << 10);
    s->expires_after(std::chrono::seconds(5));
    http::async_read(*s, *buf, *parser, [this, s, buf, parser](const boost::system::error_code&, size_t) {
      auto res = std::make_shared<http::response<http::string_body>>(http::status::service_unavailable, 11);
      res->set(http::field::server, "lazyprefill");
      res->set(http::field::content_type, "application/json");
      res->set(http::field::retry_after, "1");
      res->keep_alive(false);
      res->body() = body;
      res->prepare_payload();
      http::async_write(*s, *res, [s, res](const boost::system::error_code&, size_t) {
        boost::system::error_code ignored;
        s->socket().shutdown(tcp::socket::shutdown_both, ignored);
      });
    });
  }
};

LoadingResponder::LoadingResponder(const std::string& host, uint16_t port) : impl_(std::make_unique<Impl>()) {
  boost::system::error_code ec;
  const auto addr = asio::ip::make_address(host, ec);
  if (ec) fail("host '{}' is not an IP address", host);
  const tcp::endpoint ep(addr, port);
  tcp::acceptor& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) fail("cannot listen on {}:{}: {}", host, port, ec.message());
  impl_->body = error_body(ApiError(503, "the model is loading; retry shortly", "", "model_loading")).dump();
  impl_->accept();
  impl_->thread = std::thread([this] { impl_->ioc.run(); });
}

LoadingResponder::~LoadingResponder() {
  if (impl_->thread.joinable()) {
    asio::post(impl_->ioc, [this] { impl_->ioc.stop(); });
    impl_->thread.join();
  }
}

uint16_t LoadingResponder::port() const {
  return impl_->acceptor.local_endpoint().port();
}

int LoadingResponder::release() {
  int fd = -1;
  // On the responder's own thread: a duplicate of the listening socket (the same socket, still
  // listening) for the caller, then the responder's own closed.
  asio::post(impl_->ioc, [this, &fd] {
    fd = ::dup(impl_->acceptor.native_handle());
    boost::system::error_code ignored;
    impl_->acceptor.close(ignored);
    impl_->ioc.stop();
  });
  impl_->thread.join();
  if (fd < 0) fail("handing the listening socket to the server failed");
  return fd;
}

}  // namespace lp::server
