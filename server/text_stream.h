// Generated tokens -> the text a client may be sent so far. Two things are held back: the bytes of
// a character cut between tokens (byte-level BPE pieces are not whole characters), and any tail
// that could still turn out to be the start of a stop string (OpenAI's API returns the text
// before a stop string, never the stop string itself, streaming or not).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace lp::server {

class TextStream {
 public:
  TextStream(const Tokenizer& tok, std::vector<std::string> stop);

  // Adds a generated token (end-of-generation tokens add no text) and returns the text that is
  // now final. Once a stop string completes, the text before it has been returned, stopped() is
  // true, and every later call returns "".
  std::string push(int32_t token);
  // The end of generation: what was held back for a stop string that never came, and a cut
  // character's bytes (as they are; the JSON writer replaces invalid UTF-8 with U+FFFD).
  std::string finish();

  bool stopped() const { return stopped_; }
  const std::string& text() const { return text_; }  // everything returned so far

 private:
  const Tokenizer& tok_;
  std::vector<std::string> stop_;
  std::string pending_;  // decoded but not yet returned
  std::string text_;
  bool stopped_ = false;

  std::string release(size_t n);  // returns and drops the first n bytes of pending_
};

// Bytes at the end of `s` that begin a UTF-8 character not yet complete (0 to 3).
size_t incomplete_utf8_tail(const std::string& s);

}  // namespace lp::server
