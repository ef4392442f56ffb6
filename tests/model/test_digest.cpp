// SHA-256 (model/digest.h) against the FIPS 180-2 examples, and a file read in pieces gives the
// digest of its bytes at once.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "model/digest.h"
#include "model/error.h"
#include "tests/gguf_writer.h"

namespace lp {
namespace {

TEST(Digest, Sha256OfTheStandardsExamples) {
  EXPECT_EQ(sha256_hex("", "empty"), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc", "abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "two blocks"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Digest, AFileInPiecesIsItsBytesAtOnce) {
  testing::TempDir d;
  std::string bytes;
  const std::string piece("a7\x00z\xff", 5);
  while (bytes.size() < (3u << 20) + 5) bytes += piece + std::to_string(bytes.size() % 10);  // 4 pieces
  std::ofstream(d.file("f"), std::ios::binary) << bytes;
  EXPECT_EQ(sha256_file_hex(d.file("f")), sha256_hex(bytes, "bytes"));
  std::ofstream(d.file("empty"), std::ios::binary).flush();
  EXPECT_EQ(sha256_file_hex(d.file("empty")), sha256_hex("", "empty"));
  EXPECT_THROW(sha256_file_hex(d.file("absent")), Error);
}

}  // namespace
}  // namespace lp
