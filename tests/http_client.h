// A blocking HTTP/1.1 exchange with a server on 127.0.0.1 (Boost.Beast), for the server's tests and
// benches: one request, the whole response read.
#pragma once

#include <boost/asio.hpp>
#include <boost/beast.hpp>
#include <cctype>
#include <cstdint>
#include <map>
#include <string>
#include <utility>  // before Asio (Boost 1.74)
#include <vector>

namespace lp::testing {

struct HttpReply {
  int status = 0;
  std::string body;
  std::string content_type;
  std::map<std::string, std::string> headers;  // every response header, its name in lower case
};

// `headers` are set after the defaults (Host 127.0.0.1, JSON content), so they may replace them.
inline HttpReply http_request(uint16_t port, boost::beast::http::verb verb, const std::string& target,
                              const std::string& body = "",
                              const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  namespace asio = boost::asio;
  namespace beast = boost::beast;
  namespace http = beast::http;
  asio::io_context io;
  beast::tcp_stream s(io);
  s.connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  http::request<http::string_body> req{verb, target, 11};
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::content_type, "application/json");
  for (const auto& [name, value] : headers) req.set(name, value);
  req.body() = body;
  req.prepare_payload();
  http::write(s, req);
  beast::flat_buffer buf;
  http::response_parser<http::string_body> res;
  res.body_limit(64 << 20);
  http::read(s, buf, res);
  HttpReply r{
      int(res.get().result_int()), res.get().body(), std::string(res.get()[http::field::content_type]), {}};
  for (const auto& f : res.get()) {
    std::string name(f.name_string());
    for (char& c : name) c = char(std::tolower(static_cast<unsigned char>(c)));
    r.headers[name] = std::string(f.value());
  }
  return r;
}

}  // namespace lp::testing
