#include "server/access.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "model/error.h"
#include "model/io.h"

namespace lp::server {

namespace {

std::array<unsigned char, 32> sha256(std::string_view s) {
  std::array<unsigned char, 32> d{};
  unsigned int n = 0;
  if (EVP_Digest(s.data(), s.size(), d.data(), &n, EVP_sha256(), nullptr) != 1 || n != d.size())
    internal_fail("SHA-256 of an API key failed");
  return d;
}

std::string lower(std::string_view s) {
  std::string r(s);
  std::transform(r.begin(), r.end(), r.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return r;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// The host of a Host header or an origin's authority: "[::1]:8000" -> "::1", "a.b:80" -> "a.b".
std::string host_only(std::string_view h) {
  if (!h.empty() && h.front() == '[') {
    const size_t close = h.find(']');
    return lower(close == std::string_view::npos ? h.substr(1) : h.substr(1, close - 1));
  }
  const size_t colon = h.find(':');
  if (colon != std::string_view::npos && h.find(':', colon + 1) == std::string_view::npos)
    h = h.substr(0, colon);  // one colon: a port (two or more: a bare IPv6 address)
  return lower(h);
}

// localhost, ::1 or an IPv4 address in 127.0.0.0/8, parsed as an address: "127.0.0.1.evil.example"
// is a name anyone can point anywhere, the very trick DNS rebinding plays.
bool loopback_name(const std::string& h) {
  if (h == "localhost") return true;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  in_addr v4{};
  return ::inet_pton(AF_INET, h.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

bool valid_key(std::string_view k) {
  return !k.empty() &&
         std::none_of(k.begin(), k.end(), [](unsigned char c) { return c <= ' ' || c == 0x7f; });
}

bool valid_origin(std::string_view o) {
  if (o == "*") return true;
  const size_t sep = o.find("://");
  if (sep == std::string_view::npos || sep == 0) return false;
  const std::string_view rest = o.substr(sep + 3);
  return !rest.empty() && rest.find('/') == std::string_view::npos &&
         std::none_of(o.begin(), o.end(), [](unsigned char c) { return c <= ' ' || c == 0x7f; });
}

}  // namespace

std::vector<std::string> read_api_key_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    fail("--api-key-file {}: cannot read it: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("--api-key-file {}: not a regular file", path);
  if (st.st_mode & S_IROTH)
    fail("--api-key-file {}: every user of this machine can read it (mode {:o}); chmod o-r it first", path,
         st.st_mode & 07777);
  std::ifstream in(path);
  if (!in) fail("--api-key-file {}: cannot open it", path);
  std::vector<std::string> keys;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (n > 100000) fail("--api-key-file {}: more than 100,000 lines", path);
    const std::string_view k = trim(line);
    if (k.empty() || k.front() == '#') continue;
    if (!valid_key(k)) fail("--api-key-file {}: line {} holds whitespace or control characters", path, n);
    keys.emplace_back(k);
  }
  if (keys.empty()) fail("--api-key-file {}: holds no key", path);
  return keys;
}

void check_access_options(const AccessOptions& o) {
  for (const std::string& k : o.api_keys)
    if (!valid_key(k)) fail("--api-key: a key must be non-empty, without whitespace or control characters");
  for (const std::string& h : o.allowed_hosts)
    if (h.empty() || !valid_key(h)) fail("--allowed-host '{}': not a host name", h);
  for (const std::string& origin : o.allowed_origins)
    if (!valid_origin(origin))
      fail("--allowed-origin '{}': give scheme://host[:port] as a browser sends it (or *)", origin);
}

Access::Access(AccessOptions o, std::string bound_host, uint16_t port)
    : o_(std::move(o)), bound_(lower(bound_host)), port_(port), loopback_(loopback_name(lower(bound_host))) {
  for (const std::string& k : o_.api_keys) key_digests_.push_back(sha256(k));
  for (std::string& h : o_.allowed_hosts) h = host_only(h);
  for (std::string& origin : o_.allowed_origins) origin = lower(origin);
}

bool Access::host_allowed(std::string_view host) const {
  if (!loopback_ && o_.allowed_hosts.empty()) return true;  // reachable from anywhere, under any name
  if (host.empty()) return loopback_;                       // HTTP/1.0 without Host: not a browser
  const std::string h = host_only(host);
  if (h == bound_ || (loopback_ && loopback_name(h))) return true;
  return std::find(o_.allowed_hosts.begin(), o_.allowed_hosts.end(), h) != o_.allowed_hosts.end();
}

bool Access::origin_allowed(std::string_view origin) const {
  const std::string asked = lower(origin);
  for (const std::string& a : o_.allowed_origins)
    if (a == "*" || a == asked) return true;
  // The server's own pages (none today) and a browser at its address: same origin.
  const size_t sep = origin.find("://");
  if (sep == std::string_view::npos) return false;
  const std::string_view authority = origin.substr(sep + 3);
  const size_t colon = authority.rfind(':');
  const bool has_port =
      colon != std::string_view::npos && authority.find(']', colon) == std::string_view::npos;
  if (!has_port || authority.substr(colon + 1) != std::to_string(port_)) return false;
  const std::string h = host_only(authority);
  return h == bound_ || (loopback_ && loopback_name(h));
}

bool Access::key_matches(std::string_view key) const {
  // Every stored key's digest against the offered one's, whole: the time depends on neither the
  // key's length nor where it differs.
  const std::array<unsigned char, 32> d = sha256(key);
  bool any = false;
  for (const auto& k : key_digests_) any |= CRYPTO_memcmp(k.data(), d.data(), d.size()) == 0;
  return any;
}

std::optional<ApiError> Access::check(std::string_view method, std::string_view path, std::string_view host,
                                      std::string_view origin, std::string_view authorization) const {
  if (!host_allowed(host))
    return ApiError(
        403,
        fmt::format("Host '{}' is not allowed here (the server answers to its own address{}; "
                    "--allowed-host NAME adds a name)",
                    escape_text(std::string(host.substr(0, 200))), loopback_ ? " and localhost" : ""),
        "", "host_not_allowed");
  if (!origin.empty() && !origin_allowed(origin))
    return ApiError(
        403,
        fmt::format("Origin '{}' is not allowed (--allowed-origin ORIGIN lets a web page use this "
                    "server)",
                    escape_text(std::string(origin.substr(0, 200)))),
        "", "origin_not_allowed");
  if (method == "OPTIONS" || key_digests_.empty()) return std::nullopt;
  const bool open = path == "/health" || (path == "/metrics" && !o_.metrics_need_key);
  if (open) return std::nullopt;
  std::string_view auth = trim(authorization);
  if (auth.empty())
    return ApiError(401,
                    "You didn't provide an API key. Send it in an Authorization header using Bearer auth "
                    "(Authorization: Bearer KEY).",
                    "", "invalid_api_key");
  const bool bearer = auth.size() > 7 && lower(auth.substr(0, 7)) == "bearer ";
  if (!bearer || !key_matches(trim(auth.substr(7))))
    return ApiError(401, "Incorrect API key provided.", "", "invalid_api_key");
  return std::nullopt;
}

std::string Access::allow_origin(std::string_view origin) const {
  if (origin.empty() || !origin_allowed(origin)) return "";
  return std::string(origin);
}

}  // namespace lp::server
