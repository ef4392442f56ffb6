// Who may use `lazyprefill serve`, decided per request before anything else reads it: API keys
// (`Authorization: Bearer KEY`, as OpenAI's API and vLLM, SGLang and llama.cpp's servers take them),
// the Host header (a page that rebinds its own name to 127.0.0.1 must not reach a server bound to
// loopback: DNS rebinding) and the Origin header (no other web page may use the server unless it is
// allowed, and then with CORS headers). docs/serving.md "Access" has the rules.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai.h"

namespace lp::server {

struct AccessOptions {
  std::vector<std::string> api_keys;         // empty: no key needed
  bool metrics_need_key = false;             // GET /metrics behind the key too (/health stays open)
  std::vector<std::string> allowed_hosts;    // Host names beyond the bound address and loopback's
  std::vector<std::string> allowed_origins;  // browser origins allowed ("*": any), with CORS headers
};

// The keys one per line of `path` (blank lines and lines starting with '#' skipped, spaces around
// a key trimmed). Throws lp::Error naming the file when it is missing, unreadable, not a regular
// file, readable by every user (mode o+r: a key file must not be), or holds no key.
std::vector<std::string> read_api_key_file(const std::string& path);

// Throws lp::Error naming the option for a key that is empty or holds whitespace or control
// characters (it could not travel in a header), or an origin that is not "*" or scheme://host[:port].
void check_access_options(const AccessOptions& o);

class Access {
 public:
  // `bound_host`: the address the server listens on (127.0.0.1, ::1, 0.0.0.0, ...); `port` its port.
  Access(AccessOptions o, std::string bound_host, uint16_t port);

  // The refusal of a request with these headers ("" where absent), or nullopt to serve it: 403 for
  // a Host or Origin not allowed, 401 for a missing or wrong key where the path needs one. An
  // OPTIONS preflight from an allowed origin needs no key.
  std::optional<ApiError> check(std::string_view method, std::string_view path, std::string_view host,
                                std::string_view origin, std::string_view authorization) const;
  // The Access-Control-Allow-Origin value for a response to `origin` ("" for none).
  std::string allow_origin(std::string_view origin) const;
  bool needs_key() const { return !key_digests_.empty(); }
  // Loopback only (127.0.0.0/8, ::1, "localhost"): where the Host check applies without
  // --allowed-host.
  bool loopback() const { return loopback_; }

 private:
  bool host_allowed(std::string_view host) const;
  bool origin_allowed(std::string_view origin) const;
  bool key_matches(std::string_view key) const;
  AccessOptions o_;
  std::string bound_;
  uint16_t port_;
  bool loopback_;
  std::vector<std::array<unsigned char, 32>> key_digests_;  // SHA-256 of each key
};

}  // namespace lp::server
