#include "model/unicode.h"

#include <array>

namespace lp::unicode {

namespace {

// Allowed range of the second byte for each lead byte (Unicode Table 3-7). The narrowed ranges
// after E0, ED, F0 and F4 are what exclude overlong forms, surrogates and values > U+10FFFF;
// later continuation bytes are always 80..BF.
struct Lead {
  int len;  // 0: this byte cannot start a sequence
  uint8_t lo, hi;
};

constexpr Lead lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};  // continuation byte, or C0/C1 (always overlong)
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};  // F5..FF
}

// Number of bytes of the sequence at s[i] that are consistent with a well-formed sequence
// (at least 1), and whether the whole sequence is there.
struct Prefix {
  int n;
  bool complete;
};

Prefix valid_prefix(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  const Lead lead = lead_info(b0);
  if (lead.len == 0) return {1, false};
  if (lead.len == 1) return {1, true};
  int n = 1;
  for (; n < lead.len; ++n) {
    if (i + n >= s.size()) return {n, false};
    const auto b = static_cast<uint8_t>(s[i + n]);
    const uint8_t lo = n == 1 ? lead.lo : 0x80;
    const uint8_t hi = n == 1 ? lead.hi : 0xBF;
    if (b < lo || b > hi) return {n, false};
  }
  return {n, true};
}

struct ByteTable {
  std::array<uint16_t, 256> to_cpt{};
  std::array<int16_t, 324> from_cpt{};  // code points 0..323 cover every mapped value
};

constexpr ByteTable make_byte_table() {
  ByteTable t{};
  for (auto& v : t.from_cpt) v = -1;
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    const int cpt = printable ? b : 256 + extra++;
    t.to_cpt[b] = static_cast<uint16_t>(cpt);
    t.from_cpt[cpt] = static_cast<int16_t>(b);
  }
  return t;
}

constexpr ByteTable kByteTable = make_byte_table();
static_assert(kByteTable.to_cpt[' '] == 0x120, "space must map to U+0120 ('Ġ')");
static_assert(kByteTable.to_cpt['\n'] == 0x10A, "newline must map to U+010A ('Ċ')");
static_assert(kByteTable.to_cpt[0xAD] == 0x143, "soft hyphen is the last unprintable byte");

}  // namespace

int valid_seq_len(std::string_view s, size_t i) {
  const Prefix p = valid_prefix(s, i);
  return p.complete ? p.n : 0;
}

int64_t find_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const int n = valid_seq_len(s, i);
    if (n == 0) return static_cast<int64_t>(i);
    i += n;
  }
  return -1;
}

uint32_t decode_at(std::string_view s, size_t i, int len) {
  const auto b = [&](int k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k])); };
  switch (len) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

void append_utf8(std::string& out, uint32_t cpt) {
  if (cpt < 0x80) {
    out += static_cast<char>(cpt);
  } else if (cpt < 0x800) {
    out += static_cast<char>(0xC0 | (cpt >> 6));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  } else if (cpt < 0x10000) {
    out += static_cast<char>(0xE0 | (cpt >> 12));
    out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cpt >> 18));
    out += static_cast<char>(0x80 | ((cpt >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  }
}

std::string repair_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const Prefix p = valid_prefix(s, i);
    if (p.complete) {
      out.append(s.data() + i, p.n);
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal subpart s[i, i+n)
    }
    i += p.n;
  }
  return out;
}

uint32_t gpt2_byte_to_cpt(uint8_t b) {
  return kByteTable.to_cpt[b];
}

int gpt2_cpt_to_byte(uint32_t cpt) {
  return cpt < kByteTable.from_cpt.size() ? kByteTable.from_cpt[cpt] : -1;
}

}  // namespace lp::unicode
