// The tokenizer: any bytes in; valid UTF-8 must come back byte for byte (decode(encode(text)) ==
// text, special tokens not parsed) when every byte of it has a byte token, and anything else is
// refused cleanly. (SmolLM2's vocabulary has no token for 21 bytes, 0x04 and 0x06 among them:
// like llama.cpp, the encoder drops such a byte, so those texts cannot round-trip. Found by this
// harness.) The vocabulary is the
// GGUF named by LP_FUZZ_VOCAB (scripts/fuzz passes the default model's), else the tests' tiny
// byte-level BPE vocabulary.
#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "fuzz/fuzz_util.h"
#include "fuzz/tiny_vocab.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/vocab.h"

namespace {
const lp::Tokenizer& tokenizer() {
  static const std::unique_ptr<lp::Tokenizer> tok = [] {
    const char* path = std::getenv("LP_FUZZ_VOCAB");
    if (path && *path) return std::make_unique<lp::Tokenizer>(lp::vocab_from_gguf(lp::GgufFile::open(path)));
    return std::make_unique<lp::Tokenizer>(lp::fuzz::tiny_vocab_data());
  }();
  return *tok;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = lp::fuzz::as_text(data, size);
  const lp::Tokenizer& tok = tokenizer();
  lp::fuzz::refuses_cleanly([&] { (void)tok.encode(text, true, true); });
  if (lp::find_invalid_utf8(text) >= 0) return 0;
  static const std::array<bool, 256> has_token = [&] {
    std::array<bool, 256> h{};
    for (int32_t id = 0; id < tok.n_vocab(); ++id)
      if (const std::string b = tok.token_bytes(id); b.size() == 1) h[static_cast<uint8_t>(b[0])] = true;
    return h;
  }();
  for (const char c : text)
    if (!has_token[static_cast<uint8_t>(c)]) {
      (void)tok.decode(tok.encode(text, false, false));
      return 0;
    }
  const std::vector<int32_t> ids = tok.encode(text, false, false);
  const std::string back = tok.decode(ids);
  if (back != text) {
    std::fprintf(stderr, "round trip changed the text: %zu bytes in, %zu out\n", text.size(), back.size());
    for (const std::string_view x : {text, std::string_view(back)}) {
      for (unsigned char c : x) std::fprintf(stderr, "%02x", c);
      std::fprintf(stderr, "\n");
    }
    for (int32_t id : ids) {
      std::fprintf(stderr, "%d[", id);
      for (unsigned char c : tok.token_bytes(id)) std::fprintf(stderr, "%02x", c);
      std::fprintf(stderr, "] ");
    }
    std::fprintf(stderr, "\n");
    std::abort();
  }
  return 0;
}
