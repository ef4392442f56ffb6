#include "model/digest.h"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <fstream>
#include <memory>
#include <vector>

#include "model/error.h"

namespace lp {
namespace {

// The digest of the pieces `next()` returns until an empty one. Throws lp::Error naming `what`.
template <class Next>
std::string digest(const std::string& what, Next&& next) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  bool ok = ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1;
  while (ok) {
    const std::string_view piece = next();
    if (piece.empty()) break;
    ok = EVP_DigestUpdate(ctx.get(), piece.data(), piece.size()) == 1;
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (!ok || EVP_DigestFinal_ex(ctx.get(), md, &len) != 1) fail("SHA-256 of '{}' failed", what);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

}  // namespace

std::string sha256_hex(std::string_view data, const std::string& what) {
  bool given = false;
  return digest(what, [&]() -> std::string_view {
    if (given) return {};
    given = true;
    return data;
  });
}

std::string sha256_file_hex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read", path);
  std::vector<char> buf(1 << 20);
  return digest(path, [&]() -> std::string_view {
    if (!in) return {};
    in.read(buf.data(), std::streamsize(buf.size()));
    if (in.bad()) fail("{}: read failed", path);
    return {buf.data(), size_t(in.gcount())};
  });
}

}  // namespace lp
