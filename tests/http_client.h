// A blocking HTTP/1.1 exchange with a server on 127.0.0.1 (Boost.Beast), for the server's tests and
// benches: one request, the whole response read.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <cstdint>
#include <string>
#include <utility>  // before Asio (Boost 1.74)

namespace lp::testing {

struct HttpReply {
  int status = 0;
  std::string body;
  std::string content_type;
};

inline HttpReply http_request(uint16_t port, boost::beast::http::verb verb, const std::string& target,
                              const std::string& body = "") {
  namespace asio = boost::asio;
  namespace beast = boost::beast;
  namespace http = beast::http;
  asio::io_context io;
  beast::tcp_stream s(io);
  s.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  http::request<http::string_body> req{verb, target, 11};
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  http::write(s, req);
  beast::flat_buffer buf;
  http::response_parser<http::string_body> res;
  res.body_limit(64 << 20);
  http::read(s, buf, res);
  return {int(res.get().result_int()), res.get().body(), std::string(res.get()[http::field::content_type])};
}

}  // namespace lp::testing
