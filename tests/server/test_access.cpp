// server/access.h on typed inputs: which requests API keys, the Host check and the Origin check let
// through, the key file's refusals, and the options' checks.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <string>

#include "model/error.h"
#include "server/access.h"
#include "tests/gguf_writer.h"

namespace lp::server {
namespace {

int status(const std::optional<ApiError>& e) {
  return e ? e->status : 200;
}

TEST(Access, KeysGuardTheApiNotHealth) {
  const Access a({{"k-one", "k-two"}, false, {}, {}}, "127.0.0.1", 8000);
  EXPECT_TRUE(a.needs_key());
  const auto get = [&](std::string_view path, std::string_view auth) {
    return status(a.check("GET", path, "127.0.0.1:8000", "", auth));
  };
  EXPECT_EQ(get("/v1/models", ""), 401);
  EXPECT_EQ(get("/v1/models", "Bearer k-one"), 200);
  EXPECT_EQ(get("/v1/models", "bearer k-two"), 200);  // the scheme is case-insensitive
  EXPECT_EQ(get("/v1/models", "Bearer  k-two "), 200);
  EXPECT_EQ(get("/v1/models", "Bearer k-on"), 401);  // a prefix of a key is no key
  EXPECT_EQ(get("/v1/models", "Bearer k-one2"), 401);
  EXPECT_EQ(get("/v1/models", "Basic k-one"), 401);
  EXPECT_EQ(get("/v1/models", "k-one"), 401);
  EXPECT_EQ(get("/v1/completions", "Bearer "), 401);
  EXPECT_EQ(get("/health", ""), 200);
  EXPECT_EQ(get("/metrics", ""), 200);
  EXPECT_EQ(get("/no-such-path", ""), 401);  // nothing about the server before the key
  const auto missing = a.check("POST", "/v1/completions", "localhost", "", "");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->code, "invalid_api_key");
  const auto wrong = a.check("POST", "/v1/completions", "localhost", "", "Bearer nope");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(std::string(wrong->what()), "Incorrect API key provided.");  // the key is not echoed
  const Access metrics({{"k"}, true, {}, {}}, "127.0.0.1", 8000);
  EXPECT_EQ(status(metrics.check("GET", "/metrics", "localhost", "", "")), 401);
  EXPECT_EQ(status(metrics.check("GET", "/health", "localhost", "", "")), 200);
  const Access open({}, "127.0.0.1", 8000);
  EXPECT_FALSE(open.needs_key());
  EXPECT_EQ(status(open.check("POST", "/v1/completions", "localhost:8000", "", "")), 200);
}

TEST(Access, OnLoopbackOnlyLoopbackNamesAndTheAllowedHosts) {
  const Access a({{}, false, {"My-Box.lan"}, {}}, "127.0.0.1", 8000);
  EXPECT_TRUE(a.loopback());
  for (const char* h : {"127.0.0.1:8000", "127.0.0.1", "localhost:8000", "LOCALHOST", "[::1]:8000",
                        "127.1.2.3", "my-box.lan:8000", "", "MY-BOX.LAN"})
    EXPECT_EQ(status(a.check("GET", "/v1/models", h, "", "")), 200) << h;
  for (const char* h : {"evil.example:8000", "evil.example", "127.0.0.1.evil.example",
                        "localhost.evil.example", "[::2]:8000", "10.0.0.5:8000"}) {
    const auto e = a.check("GET", "/v1/models", h, "", "");
    ASSERT_TRUE(e) << h;
    EXPECT_EQ(e->status, 403);
    EXPECT_EQ(e->code, "host_not_allowed");
  }
  // Reachable from the network: any name, unless names are given.
  const Access wide({}, "0.0.0.0", 8000);
  EXPECT_FALSE(wide.loopback());
  EXPECT_EQ(status(wide.check("GET", "/v1/models", "anything.example", "", "")), 200);
  const Access named({{}, false, {"api.example"}, {}}, "0.0.0.0", 8000);
  EXPECT_EQ(status(named.check("GET", "/v1/models", "api.example:8000", "", "")), 200);
  EXPECT_EQ(status(named.check("GET", "/v1/models", "other.example", "", "")), 403);
}

TEST(Access, WebPagesNeedAnAllowedOrigin) {
  const Access a({{"k"}, false, {}, {"https://app.example"}}, "127.0.0.1", 8000);
  EXPECT_EQ(status(a.check("POST", "/v1/completions", "localhost", "https://app.example", "Bearer k")), 200);
  EXPECT_EQ(a.allow_origin("https://app.example"), "https://app.example");
  EXPECT_EQ(status(a.check("POST", "/v1/completions", "localhost", "https://evil.example", "Bearer k")), 403);
  EXPECT_EQ(a.allow_origin("https://evil.example"), "");
  EXPECT_EQ(status(a.check("POST", "/v1/completions", "localhost", "null", "Bearer k")), 403);
  // A preflight carries no key; the request after it does.
  EXPECT_EQ(status(a.check("OPTIONS", "/v1/completions", "localhost", "https://app.example", "")), 200);
  EXPECT_EQ(status(a.check("OPTIONS", "/v1/completions", "localhost", "https://evil.example", "")), 403);
  // The server's own origin is the same origin.
  EXPECT_EQ(status(a.check("GET", "/v1/models", "localhost", "http://localhost:8000", "Bearer k")), 200);
  EXPECT_EQ(status(a.check("GET", "/v1/models", "localhost", "http://localhost:8001", "Bearer k")), 403);
  const Access any({{}, false, {}, {"*"}}, "127.0.0.1", 8000);
  EXPECT_EQ(any.allow_origin("https://whatever.example"), "https://whatever.example");
}

TEST(Access, KeyFilesAndOptionsAreChecked) {
  testing::TempDir dir;
  const auto write = [&](const std::string& name, const std::string& text, mode_t mode) {
    const std::string p = dir.file(name);
    std::ofstream(p) << text;
    ::chmod(p.c_str(), mode);
    return p;
  };
  const auto error = [](auto f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(read_api_key_file(write("ok", "# keys\n  alpha  \n\nbeta\n", 0600)),
            (std::vector<std::string>{"alpha", "beta"}));
  EXPECT_NE(error([&] { read_api_key_file(write("open", "alpha\n", 0644)); }).find("every user"),
            std::string::npos);
  EXPECT_NE(error([&] { read_api_key_file(write("empty", "# none\n\n", 0600)); }).find("holds no key"),
            std::string::npos);
  EXPECT_NE(error([&] { read_api_key_file(dir.file("missing")); }).find("cannot read it"), std::string::npos);
  EXPECT_NE(error([&] { read_api_key_file(dir.path()); }).find("not a regular file"), std::string::npos);
  EXPECT_NE(error([&] { read_api_key_file(write("space", "al pha\n", 0600)); }).find("line 1"),
            std::string::npos);
  EXPECT_NE(error([&] { check_access_options({{""}, false, {}, {}}); }).find("--api-key"), std::string::npos);
  EXPECT_NE(error([&] {
              check_access_options({{"a\tb"}, false, {}, {}});
            }).find("--api-key"),
            std::string::npos);
  EXPECT_NE(error([&] {
              check_access_options({{}, false, {}, {"app.example"}});
            }).find("--allowed-origin"),
            std::string::npos);
  EXPECT_NE(error([&] {
              check_access_options({{}, false, {}, {"https://app.example/"}});
            }).find("--allowed-origin"),
            std::string::npos);
  EXPECT_EQ(error([&] {
              check_access_options({{"k"}, false, {"a.example"}, {"*", "https://b.example:8443"}});
            }),
            "");
}

}  // namespace
}  // namespace lp::server
