// UTF-8 and GPT-2 byte-table helpers for the tokenizer. Private to model/: pure functions over
// constant tables, no state, safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lp::unicode {

// Length of the well-formed UTF-8 sequence that starts at s[i] (1..4), or 0 if the bytes there
// are not one (overlong form, surrogate, above U+10FFFF, stray continuation byte, truncation).
// Follows Unicode Table 3-7 ("well-formed UTF-8 byte sequences").
int valid_seq_len(std::string_view s, size_t i);

// Byte offset of the first ill-formed sequence, or -1 if `s` is valid UTF-8.
int64_t find_invalid(std::string_view s);

// Code point of the well-formed sequence of `len` bytes at s[i] (see valid_seq_len).
uint32_t decode_at(std::string_view s, size_t i, int len);

void append_utf8(std::string& out, uint32_t cpt);

// Copies `s`, replacing each maximal ill-formed subpart with U+FFFD (the Unicode "best practice"
// policy that Python's errors="replace" and WHATWG decoders use), so a truncated 3-byte sequence
// becomes one U+FFFD, not three.
std::string repair_utf8(std::string_view s);

// GPT-2 byte-level table (openai/gpt-2 encoder.py bytes_to_unicode): printable bytes 33..126,
// 161..172 and 174..255 stand for themselves; the other 68 bytes, in increasing order, map to
// U+0100, U+0101, ... so every byte becomes a visible code point.
uint32_t gpt2_byte_to_cpt(uint8_t b);
// Inverse of gpt2_byte_to_cpt; -1 for a code point that no byte maps to.
int gpt2_cpt_to_byte(uint32_t cpt);

}  // namespace lp::unicode
