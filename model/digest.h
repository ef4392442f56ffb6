// SHA-256 (OpenSSL's EVP), in lowercase hex: of bytes in memory, or of a file read in 1 MiB pieces
// (a model can be larger than memory wants to hold twice). Provenance of calibration inputs, and
// KV-Runahead's check that every rank loaded the same model and prompt.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace lp {

// `what` names the data in the error when OpenSSL fails.
std::string sha256_hex(std::string_view data, const std::string& what);
// Throws lp::Error naming the file when it cannot be read.
std::string sha256_file_hex(const std::string& path);

}  // namespace lp
