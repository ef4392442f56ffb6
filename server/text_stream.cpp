#include "server/text_stream.h"

#include <algorithm>

namespace lp::server {

size_t incomplete_utf8_tail(const std::string& s) {
  // Walk back over at most 3 continuation bytes to the lead byte; the character is incomplete when
  // its lead byte announces more bytes than follow it.
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
    const auto b = static_cast<unsigned char>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte
    const size_t need = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
    return need > back ? back : 0;
  }
  return 0;  // only continuation bytes: invalid, not incomplete; nothing to wait for
}

TextStream::TextStream(const Tokenizer& tok, std::vector<std::string> stop)
    : tok_(tok), stop_(std::move(stop)) {}

std::string TextStream::release(size_t n) {
  std::string out = pending_.substr(0, n);
  pending_.erase(0, n);
  text_ += out;
  return out;
}

std::string TextStream::push(int32_t token) {
  if (stopped_ || tok_.is_end_of_generation(token)) return "";
  pending_ += tok_.token_bytes(token);
  // A stop string held in full: everything before its first occurrence, then nothing more.
  size_t first = std::string::npos;
  for (const std::string& s : stop_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    std::string out = release(first);
    pending_.clear();
    stopped_ = true;
    return out;
  }
  // Hold back the longest tail that is a proper prefix of a stop string, and a cut character.
  size_t hold = incomplete_utf8_tail(pending_);
  for (const std::string& s : stop_)
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  return release(pending_.size() - hold);
}

std::string TextStream::finish() {
  if (stopped_) return "";
  return release(pending_.size());
}

}  // namespace lp::server
