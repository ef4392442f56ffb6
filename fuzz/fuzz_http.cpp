// The HTTP layer a stranger reaches first: Beast's request parser on the raw bytes, with the
// server's own limits (64 KiB of header, the body within the input), then what `serve` decides from
// the parsed request before any handler runs: the path, and the access check (API key, Host and
// Origin: server/access.h) under two policies, a keyed server on loopback with an allowed origin and
// an open one on every interface. A parse error is the client's (the server answers 400 and
// closes); a crash, a sanitizer report, any exception or a hang is a finding. An accepted request
// must not pass a keyed server's check on an API path without the key.
#include <boost/beast/http.hpp>
#include <cstdlib>
#include <string>
#include <utility>  // before Asio (Boost 1.74)

#include "fuzz/fuzz_util.h"
#include "server/access.h"

namespace http = boost::beast::http;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const lp::server::Access keyed({{"fuzz-key"}, true, {"api.example"}, {"https://app.example"}},
                                        "127.0.0.1", 8000);
  static const lp::server::Access open({}, "0.0.0.0", 8000);
  http::request_parser<http::string_body> parser;
  parser.header_limit(64 << 10);
  parser.body_limit(1 << 20);
  parser.eager(true);
  boost::system::error_code ec;
  size_t used = 0;
  while (used < size && !parser.is_done()) {
    const size_t n = parser.put(boost::asio::buffer(data + used, size - used), ec);
    if (ec == http::error::need_more) {
      ec = {};
      if (n == 0) break;  // the input ends inside a message
    } else if (ec) {
      return 0;  // malformed: 400 and the connection closed
    }
    used += n;
  }
  if (!parser.is_done()) return 0;
  const http::request<http::string_body>& req = parser.get();
  const auto sv = [](boost::beast::string_view v) { return std::string_view(v.data(), v.size()); };
  const std::string target(req.target());
  const std::string path = target.substr(0, target.find('?'));
  for (const lp::server::Access* a : {&keyed, &open}) {
    const auto refused = a->check(sv(req.method_string()), path, sv(req[http::field::host]),
                                  sv(req[http::field::origin]), sv(req[http::field::authorization]));
    if (refused && (refused->status < 400 || refused->status > 499)) std::abort();
    (void)a->allow_origin(sv(req[http::field::origin]));
    // A keyed server lets no API request through without its key.
    const std::string_view auth = sv(req[http::field::authorization]);
    if (a == &keyed && !refused && req.method() != http::verb::options && path != "/health" &&
        auth.find("fuzz-key") == std::string_view::npos)
      std::abort();
  }
  return 0;
}
