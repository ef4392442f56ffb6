// Tests for model/quant: every dequantizer against blocks built byte by byte here, with the
// expected floats worked out by hand from the format (docs/gguf.md) in the comments. No expected
// value comes from running our own code.
//
// Exact float equality is used throughout the block tests: every scale, min and quant chosen
// below is a small integer or a power of two, so each product and difference is exact in f32
// and any correct implementation must produce the same bits.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "model/error.h"
#include "model/quant.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace lp {
namespace {

using Bytes = std::vector<uint8_t>;

// f16 bit patterns used as block scales.
constexpr uint16_t kHalfZero = 0x0000;
constexpr uint16_t kHalfQuarter = 0x3400;  // 0.25 = 2^-2: exponent 13
constexpr uint16_t kHalfHalf = 0x3800;     // 0.5  = 2^-1: exponent 14
constexpr uint16_t kHalfOne = 0x3C00;      // 1.0: exponent 15 (the bias)
constexpr uint16_t kHalfTwo = 0x4000;      // 2.0: exponent 16
constexpr uint16_t kHalfMinusOne = 0xBC00;
constexpr uint16_t kHalfMinusTwo = 0xC000;

void put_u16(Bytes& b, size_t off, uint16_t v) {  // little-endian, as on disk
  b[off] = uint8_t(v & 0xFF);
  b[off + 1] = uint8_t(v >> 8);
}

void append(Bytes& dst, const Bytes& src) {
  dst.insert(dst.end(), src.begin(), src.end());
}

std::vector<float> deq(GgmlType t, const Bytes& bytes, int64_t n) {
  const std::optional<int64_t> size = type_bytes(t, n);
  EXPECT_TRUE(size.has_value());
  EXPECT_EQ(int64_t(bytes.size()), size.value_or(-1)) << "test built a block of the wrong size";
  std::vector<float> out(size_t(n), -12345.0f);
  dequantize(t, bytes.data(), out.data(), n);
  return out;
}

uint32_t bits(float f) {
  return std::bit_cast<uint32_t>(f);
}
float from_bits(uint32_t u) {
  return std::bit_cast<float>(u);
}

void expect_all(const std::vector<float>& got, size_t begin, const std::vector<float>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[begin + i], want[i]) << "element " << begin + i;
  }
}

// ---- type_info / type_bytes -----------------------------------------------------------------

TEST(TypeInfo, SizesOfEveryDefinedType) {
  // Block sizes follow from the ggml block structs (ggml/src/ggml-common.h); f16 fields are 2
  // bytes, f32 fields 4. The arithmetic for each is spelled out.
  struct Want {
    uint32_t id;
    const char* name;
    int64_t elems, bytes;
    bool deq;
  };
  const Want want[] = {
      {0, "F32", 1, 4, true},
      {1, "F16", 1, 2, true},
      {2, "Q4_0", 32, 2 + 16, true},                   // d + 32 nibbles
      {3, "Q4_1", 32, 2 + 2 + 16, true},               // d, m + 32 nibbles
      {6, "Q5_0", 32, 2 + 4 + 16, true},               // d + 32 high bits + 32 nibbles
      {7, "Q5_1", 32, 2 + 2 + 4 + 16, true},           // d, m + high bits + nibbles
      {8, "Q8_0", 32, 2 + 32, true},                   // d + 32 int8
      {9, "Q8_1", 32, 2 + 2 + 32, false},              // d, s + 32 int8
      {10, "Q2_K", 256, 16 + 64 + 2 + 2, false},       // scales, 2-bit quants, d, dmin
      {11, "Q3_K", 256, 32 + 64 + 12 + 2, false},      // hmask, quants, scales, d
      {12, "Q4_K", 256, 2 + 2 + 12 + 128, true},       // d, dmin, scales, nibbles
      {13, "Q5_K", 256, 2 + 2 + 12 + 32 + 128, true},  // ... + high-bit plane
      {14, "Q6_K", 256, 128 + 64 + 16 + 2, true},      // ql, qh, int8 scales, d
      {15, "Q8_K", 256, 4 + 256 + 16 * 2, false},      // f32 d, int8 quants, int16 sums
      {16, "IQ2_XXS", 256, 2 + 32 * 2, false},         // d + 32 uint16
      {17, "IQ2_XS", 256, 2 + 32 * 2 + 8, false},      // d + 32 uint16 + 8 scales
      {18, "IQ3_XXS", 256, 2 + 96, false},             // d + 3*256/8
      {19, "IQ1_S", 256, 2 + 32 + 8 * 2, false},       // d + qs + 8 uint16
      {20, "IQ4_NL", 32, 2 + 16, false},               // d + 32 nibbles
      {21, "IQ3_S", 256, 2 + 64 + 8 + 32 + 4, false},  // d, qs, qh, signs, scales
      {22, "IQ2_S", 256, 2 + 64 + 8 + 8, false},       // d, qs, qh, scales
      {23, "IQ4_XS", 256, 2 + 2 + 4 + 128, false},     // d, scales_h, scales_l, nibbles
      {24, "I8", 1, 1, false},
      {25, "I16", 1, 2, false},
      {26, "I32", 1, 4, false},
      {27, "I64", 1, 8, false},
      {28, "F64", 1, 8, false},
      {29, "IQ1_M", 256, 32 + 16 + 8, false},  // qs, qh, scales (no d field)
      {30, "BF16", 1, 2, true},
      {34, "TQ1_0", 256, 48 + 4 + 2, false},  // base-3 packed qs, qh, d
      {35, "TQ2_0", 256, 64 + 2, false},      // 2-bit qs, d
      {39, "MXFP4", 32, 1 + 16, false},       // E8M0 exponent + 32 nibbles
      {40, "NVFP4", 64, 4 + 32, false},       // 4 E4M3 scales + 64 nibbles
      {41, "Q1_0", 128, 2 + 16, false},       // d + 128 bits
      {42, "Q2_0", 64, 2 + 16, false},        // d + 64 2-bit quants
  };
  for (const Want& w : want) {
    const std::optional<TypeInfo> info = type_info(w.id);
    ASSERT_TRUE(info.has_value()) << "id " << w.id;
    EXPECT_EQ(info->name, w.name) << "id " << w.id;
    EXPECT_EQ(info->block_elems, w.elems) << w.name;
    EXPECT_EQ(info->block_bytes, w.bytes) << w.name;
    EXPECT_EQ(info->dequantizable, w.deq) << w.name;
  }
}

TEST(TypeInfo, UndefinedIdsAreNullopt) {
  // 4, 5 (Q4_2, Q4_3), 31-33 (Q4_0_4_4 ...) and 36-38 (IQ4_NL_4_4 ...) were removed by ggml.
  for (uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 43u, 100u, 1000u, 0xFFFFFFFFu}) {
    EXPECT_FALSE(type_info(id).has_value()) << "id " << id;
  }
}

TEST(TypeInfo, EveryEnumeratorIsDefined) {
  for (uint32_t id = 0; id <= 35; ++id) {
    const bool removed = id == 4 || id == 5 || (id >= 31 && id <= 33);
    EXPECT_EQ(type_info(id).has_value(), !removed) << "id " << id;
  }
}

TEST(TypeBytes, MultiplesAndOverflow) {
  EXPECT_EQ(type_bytes(GgmlType::F32, 3), 12);
  EXPECT_EQ(type_bytes(GgmlType::BF16, 7), 14);
  EXPECT_EQ(type_bytes(GgmlType::Q4_K, 0), 0);
  EXPECT_EQ(type_bytes(GgmlType::Q4_K, 256), 144);
  EXPECT_EQ(type_bytes(GgmlType::Q4_K, 512), 288);
  EXPECT_EQ(type_bytes(GgmlType::Q8_0, 96), 3 * 34);
  EXPECT_EQ(type_bytes(GgmlType::Q3_K, 256), 110);  // sizes work for types we cannot dequantize
  EXPECT_FALSE(type_bytes(GgmlType::Q4_K, 255).has_value());
  EXPECT_FALSE(type_bytes(GgmlType::Q4_0, 48).has_value());
  EXPECT_FALSE(type_bytes(GgmlType::Q4_0, -32).has_value());
  EXPECT_FALSE(type_bytes(GgmlType(4), 32).has_value());

  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  // F32: kMax/4 elements take 4*(kMax/4) <= kMax bytes; one more element overflows.
  EXPECT_EQ(type_bytes(GgmlType::F32, kMax / 4), kMax / 4 * 4);
  EXPECT_FALSE(type_bytes(GgmlType::F32, kMax / 4 + 1).has_value());
  // Q8_0: 34 bytes per 32 elements. kMax/34 blocks fit; one more block does not, while its
  // element count 32*(kMax/34 + 1) ~ 0.94*kMax is still a valid int64.
  EXPECT_EQ(type_bytes(GgmlType::Q8_0, 32 * (kMax / 34)), kMax / 34 * 34);
  EXPECT_FALSE(type_bytes(GgmlType::Q8_0, 32 * (kMax / 34 + 1)).has_value());
}

TEST(Dequantize, RejectsWhatItCannotDo) {
  Bytes block(110, 0);
  std::vector<float> out(256);
  try {
    dequantize(GgmlType::Q3_K, block.data(), out.data(), 256);
    FAIL() << "Q3_K should not be dequantizable";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q3_K"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize(GgmlType::IQ2_XXS, block.data(), out.data(), 256), Error);
  EXPECT_THROW(dequantize(GgmlType::I32, block.data(), out.data(), 4), Error);
  EXPECT_THROW(dequantize(GgmlType(4), block.data(), out.data(), 32), Error);     // removed id
  EXPECT_THROW(dequantize(GgmlType(1000), block.data(), out.data(), 32), Error);  // never defined
  EXPECT_THROW(dequantize(GgmlType::Q4_0, block.data(), out.data(), 31), Error);  // partial block
  EXPECT_THROW(dequantize(GgmlType::Q4_0, block.data(), out.data(), -32), Error);
  EXPECT_NO_THROW(dequantize(GgmlType::Q4_K, nullptr, nullptr, 0));
}

// ---- plain types ------------------------------------------------------------------------------

TEST(Dequantize, F32IsACopy) {
  // 1.5 = 0x3FC00000, -2.25 = 0xC0100000, stored little-endian.
  const Bytes b = {0x00, 0x00, 0xC0, 0x3F, 0x00, 0x00, 0x10, 0xC0};
  expect_all(deq(GgmlType::F32, b, 2), 0, {1.5f, -2.25f});
}

TEST(Dequantize, F16) {
  const Bytes b = {
      0x00, 0x38,  // 0x3800 = 0.5
      0x00, 0xC0,  // 0xC000 = -2
      0x01, 0x00,  // 0x0001 = smallest subnormal 2^-24
      0xFF, 0x7B,  // 0x7BFF = (1 + 1023/1024) * 2^15 = 65504
      0x55, 0x35,  // 0x3555 = (1 + 341/1024) * 2^-2 = 0.333251953125
  };
  expect_all(deq(GgmlType::F16, b, 5), 0, {0.5f, -2.0f, 0x1p-24f, 65504.0f, 0.333251953125f});
}

TEST(Dequantize, BF16) {
  const Bytes b = {
      0x80, 0x3F,  // 0x3F80 -> f32 0x3F800000 = 1
      0x40, 0xC0,  // 0xC040 -> 0xC0400000 = -1.5 * 2 = -3
      0x49, 0x40,  // 0x4049 -> 0x40490000 = (1 + 0x49/128) * 2 = 3.140625
      0x01, 0x00,  // 0x0001 -> 0x00010000, an f32 subnormal: 2^16 * 2^-149 = 2^-133
  };
  expect_all(deq(GgmlType::BF16, b, 4), 0, {1.0f, -3.0f, 3.140625f, 0x1p-133f});
}

// ---- legacy 32-element blocks ------------------------------------------------------------------

// Byte j holds nibble j (low) and nibble 15-j (high), so every nibble value appears once in each
// half and a layout that interleaved elements (low -> 2j, high -> 2j+1) would fail at element 1.
Bytes ramp_nibbles() {
  Bytes qs(16);
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t(j | (15 - j) << 4);
  return qs;
}

TEST(Dequantize, Q4_0) {
  // Block 0: d = 0.5. Element j < 16 is (j - 8) * 0.5; element j + 16 has nibble 15 - j, so it is
  // (15 - j - 8) * 0.5 = (7 - j) * 0.5.
  Bytes b(18);
  put_u16(b, 0, kHalfHalf);
  const Bytes qs = ramp_nibbles();
  std::copy(qs.begin(), qs.end(), b.begin() + 2);
  // Block 1: d = 2, every byte 0x9A: low nibble 10 -> (10 - 8) * 2 = 4 for elements 32..47,
  // high nibble 9 -> (9 - 8) * 2 = 2 for elements 48..63.
  Bytes b1(18, 0x9A);
  put_u16(b1, 0, kHalfTwo);
  append(b, b1);

  const std::vector<float> y = deq(GgmlType::Q4_0, b, 64);
  expect_all(y, 0, {-4, -3.5, -3, -2.5, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5});
  expect_all(y, 16, {3.5, 3, 2.5, 2, 1.5, 1, 0.5, 0, -0.5, -1, -1.5, -2, -2.5, -3, -3.5, -4});
  expect_all(y, 32, std::vector<float>(16, 4.0f));
  expect_all(y, 48, std::vector<float>(16, 2.0f));
}

TEST(Dequantize, Q4_1) {
  // d = 0.5, m = -1: element j < 16 is 0.5 * j - 1; element j + 16 is 0.5 * (15 - j) - 1.
  // e.g. element 3: 0.5 * 3 - 1 = 0.5; element 16: 0.5 * 15 - 1 = 6.5.
  Bytes b(20);
  put_u16(b, 0, kHalfHalf);
  put_u16(b, 2, kHalfMinusOne);
  const Bytes qs = ramp_nibbles();
  std::copy(qs.begin(), qs.end(), b.begin() + 4);
  // Block 1: d = 0.25, m = 2, bytes 0x0F: low nibble 15 -> 0.25 * 15 + 2 = 5.75,
  // high nibble 0 -> 0 + 2 = 2.
  Bytes b1(20, 0x0F);
  put_u16(b1, 0, kHalfQuarter);
  put_u16(b1, 2, kHalfTwo);
  append(b, b1);

  const std::vector<float> y = deq(GgmlType::Q4_1, b, 64);
  expect_all(y, 0, {-1, -0.5, 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5, 6, 6.5});
  expect_all(y, 16, {6.5, 6, 5.5, 5, 4.5, 4, 3.5, 3, 2.5, 2, 1.5, 1, 0.5, 0, -0.5, -1});
  expect_all(y, 32, std::vector<float>(16, 5.75f));
  expect_all(y, 48, std::vector<float>(16, 2.0f));
}

TEST(Dequantize, Q5_0) {
  // d = 0.5, nibbles as ramp_nibbles(). qh bytes {0x01, 0x80, 0x02, 0x00} form the little-endian
  // word 0x00028001: bits 0, 15 and 17 set, i.e. fifth bits for elements 0, 15 and 17.
  // Without a fifth bit: element j < 16 -> (j - 16) * 0.5; element j + 16 -> (15 - j - 16) * 0.5.
  //   element 0:  q = 0 | 16 = 16  -> (16 - 16) * 0.5 = 0
  //   element 15: q = 15 | 16 = 31 -> 15 * 0.5 = 7.5
  //   element 16: nibble 15, bit 16 clear -> (15 - 16) * 0.5 = -0.5
  //   element 17: nibble 14 | 16 = 30 -> 14 * 0.5 = 7
  Bytes b(22);
  put_u16(b, 0, kHalfHalf);
  b[2] = 0x01;
  b[3] = 0x80;
  b[4] = 0x02;
  b[5] = 0x00;
  const Bytes qs = ramp_nibbles();
  std::copy(qs.begin(), qs.end(), b.begin() + 6);
  // Block 1: d = -1, qh all ones, qs all 0x3C: low nibble 12 | 16 = 28 -> (28 - 16) * -1 = -12
  // for elements 32..47; high nibble 3 | 16 = 19 -> (19 - 16) * -1 = -3 for elements 48..63.
  Bytes b1(22, 0x3C);
  put_u16(b1, 0, kHalfMinusOne);
  b1[2] = b1[3] = b1[4] = b1[5] = 0xFF;
  append(b, b1);

  const std::vector<float> y = deq(GgmlType::Q5_0, b, 64);
  expect_all(y, 0, {0, -7.5, -7, -6.5, -6, -5.5, -5, -4.5, -4, -3.5, -3, -2.5, -2, -1.5, -1, 7.5});
  expect_all(y, 16, {-0.5, 7, -1.5, -2, -2.5, -3, -3.5, -4, -4.5, -5, -5.5, -6, -6.5, -7, -7.5, -8});
  expect_all(y, 32, std::vector<float>(16, -12.0f));
  expect_all(y, 48, std::vector<float>(16, -3.0f));
}

TEST(Dequantize, Q5_1) {
  // d = 0.5, m = -1, nibbles as ramp_nibbles(). qh {0x00, 0x00, 0x01, 0x80} = word 0x80010000:
  // bits 16 and 31, the fifth bits of elements 16 and 31 (the first and last high nibbles).
  //   element j < 16: 0.5 * j - 1
  //   element 16: nibble 15 | 16 = 31 -> 0.5 * 31 - 1 = 14.5
  //   element 16 + j, 1 <= j <= 14: nibble 15 - j -> 0.5 * (15 - j) - 1 = 6.5 - 0.5 * j
  //   element 31: nibble 0 | 16 = 16 -> 0.5 * 16 - 1 = 7
  Bytes b(24);
  put_u16(b, 0, kHalfHalf);
  put_u16(b, 2, kHalfMinusOne);
  b[4] = 0x00;
  b[5] = 0x00;
  b[6] = 0x01;
  b[7] = 0x80;
  const Bytes qs = ramp_nibbles();
  std::copy(qs.begin(), qs.end(), b.begin() + 8);
  // Block 1: d = 1, m = -2, qh = 0x0000FFFF (fifth bits on elements 0..15 only), qs all 0xFF:
  // elements 32..47: 31 * 1 - 2 = 29; elements 48..63: 15 - 2 = 13.
  Bytes b1(24, 0xFF);
  put_u16(b1, 0, kHalfOne);
  put_u16(b1, 2, kHalfMinusTwo);
  b1[4] = 0xFF;
  b1[5] = 0xFF;
  b1[6] = 0x00;
  b1[7] = 0x00;
  append(b, b1);

  const std::vector<float> y = deq(GgmlType::Q5_1, b, 64);
  expect_all(y, 0, {-1, -0.5, 0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5, 6, 6.5});
  expect_all(y, 16, {14.5, 6, 5.5, 5, 4.5, 4, 3.5, 3, 2.5, 2, 1.5, 1, 0.5, 0, -0.5, 7});
  expect_all(y, 32, std::vector<float>(16, 29.0f));
  expect_all(y, 48, std::vector<float>(16, 13.0f));
}

TEST(Dequantize, Q8_0) {
  // Block 0: d = 0.5, qs[j] = j - 16 as int8 except qs[0] = 0x80 (-128) and qs[31] = 0x7F (127).
  //   element j -> (j - 16) * 0.5; element 0 -> -64; element 31 -> 63.5.
  Bytes b(34);
  put_u16(b, 0, kHalfHalf);
  for (int j = 0; j < 32; ++j) b[2 + j] = uint8_t(int8_t(j - 16));
  b[2] = 0x80;
  b[33] = 0x7F;
  // Block 1: d = -2, qs all 3 -> -6. Block 2: d = 0, qs all 5 -> 0.
  Bytes b1(34, 0x03);
  put_u16(b1, 0, kHalfMinusTwo);
  Bytes b2(34, 0x05);
  put_u16(b2, 0, kHalfZero);
  append(b, b1);
  append(b, b2);

  const std::vector<float> y = deq(GgmlType::Q8_0, b, 96);
  EXPECT_EQ(y[0], -64.0f);
  EXPECT_EQ(y[1], -7.5f);   // (1 - 16) * 0.5
  EXPECT_EQ(y[16], 0.0f);   // (16 - 16) * 0.5
  EXPECT_EQ(y[17], 0.5f);   // (17 - 16) * 0.5
  EXPECT_EQ(y[30], 7.0f);   // (30 - 16) * 0.5
  EXPECT_EQ(y[31], 63.5f);  // 127 * 0.5
  expect_all(y, 32, std::vector<float>(32, -6.0f));
  expect_all(y, 64, std::vector<float>(32, 0.0f));
}

// ---- K-quants ---------------------------------------------------------------------------------

// The 12 scale/min bytes shared by the Q4_K and Q5_K tests, packing
//   scale = {1, 2, 3, 40, 21, 38, 55, 8}
//   min   = {5, 6, 7, 36, 36, 1, 50, 19}
// Sub-blocks 4-7 are split: their low 4 bits go to bytes 8-11 (scale low nibble, min high
// nibble) and their top 2 bits to the top of bytes 0-3 (scales) and 4-7 (mins).
//   21 = 0b01'0101, 38 = 0b10'0110, 55 = 0b11'0111, 8 = 0b00'1000
//   36 = 0b10'0100,  1 = 0b00'0001, 50 = 0b11'0010, 19 = 0b01'0011
// The top-bit pairs differ between scales (01 10 11 00) and mins (10 00 11 01), so taking a
// min's top bits from the scale bytes (or the reverse) changes the result.
// 40 and 36 use bits 4-5 in sub-block 3, so masking the first bytes with 0x0F instead of 0x3F
// fails too.
const Bytes kScaleBytes = {
    0x41,  // scale0 = 1  | top bits of scale4 (01) << 6
    0x82,  // scale1 = 2  | top bits of scale5 (10) << 6
    0xC3,  // scale2 = 3  | top bits of scale6 (11) << 6
    0x28,  // scale3 = 40 | top bits of scale7 (00) << 6
    0x85,  // min0 = 5    | top bits of min4 (10) << 6
    0x06,  // min1 = 6    | top bits of min5 (00) << 6
    0xC7,  // min2 = 7    | top bits of min6 (11) << 6
    0x64,  // min3 = 36   | top bits of min7 (01) << 6
    0x45,  // scale4 low 0101, min4 low 0100
    0x16,  // scale5 low 0110, min5 low 0001
    0x27,  // scale6 low 0111, min6 low 0010
    0x38,  // scale7 low 1000, min7 low 0011
};

// With d = 0.5, dmin = 1 and quant q, sub-block s gives 0.5 * scale[s] * q - min[s]. With the
// quants used below (q = 1 in even sub-blocks, q = 2 in odd ones):
//   s0: 0.5*1*1  - 5  = -4.5     s1: 0.5*2*2  - 6  = -4
//   s2: 0.5*3*1  - 7  = -5.5     s3: 0.5*40*2 - 36 = 4
//   s4: 0.5*21*1 - 36 = -25.5    s5: 0.5*38*2 - 1  = 37
//   s6: 0.5*55*1 - 50 = -22.5    s7: 0.5*8*2  - 19 = -11
constexpr float kKBase[8] = {-4.5f, -4.0f, -5.5f, 4.0f, -25.5f, 37.0f, -22.5f, -11.0f};

TEST(Dequantize, Q4_K) {
  Bytes b(144);
  put_u16(b, 0, kHalfHalf);  // d
  put_u16(b, 2, kHalfOne);   // dmin
  std::copy(kScaleBytes.begin(), kScaleBytes.end(), b.begin() + 4);
  // qs[32g + l]: low nibble -> element 64g + l (sub-block 2g), high -> 64g + 32 + l (2g + 1).
  for (int i = 0; i < 128; ++i) b[16 + i] = 0x21;  // low 1, high 2
  b[16 + 0] = 0xF0;    // element 0: q 0 -> 0.5*1*0 - 5 = -5; element 32: q 15 -> 0.5*2*15 - 6 = 9
  b[16 + 127] = 0x3F;  // element 223 (s6): q 15 -> 0.5*55*15 - 50 = 362.5
                       // element 255 (s7): q 3 -> 0.5*8*3 - 19 = -7
  // Block 1: d = 1, dmin = 0; scales bytes 0-3 = 2, 4-7 = 0, 8-11 = 0x03 -> scale 2 for
  // sub-blocks 0-3, 3 for 4-7, all mins 0. qs all 0x54 (low 4, high 5):
  //   s0, s2: 2*4 = 8; s1, s3: 2*5 = 10; s4, s6: 3*4 = 12; s5, s7: 3*5 = 15.
  Bytes b1(144, 0x54);
  put_u16(b1, 0, kHalfOne);
  put_u16(b1, 2, kHalfZero);
  for (int i = 0; i < 4; ++i) {
    b1[4 + i] = 0x02;
    b1[8 + i] = 0x00;
    b1[12 + i] = 0x03;
  }
  append(b, b1);

  const std::vector<float> y = deq(GgmlType::Q4_K, b, 512);
  EXPECT_EQ(y[0], -5.0f);
  EXPECT_EQ(y[32], 9.0f);
  EXPECT_EQ(y[223], 362.5f);
  EXPECT_EQ(y[255], -7.0f);
  EXPECT_EQ(y[16], kKBase[0]);  // a Q4_0-style layout would have put element 32's nibble here
  for (int e = 0; e < 256; ++e) {
    if (e == 0 || e == 32 || e == 223 || e == 255) continue;
    EXPECT_EQ(y[e], kKBase[e / 32]) << "element " << e;
  }
  const float want1[8] = {8, 10, 8, 10, 12, 15, 12, 15};
  for (int e = 0; e < 256; ++e) EXPECT_EQ(y[256 + e], want1[e / 32]) << "element " << 256 + e;
}

TEST(Dequantize, Q5_K) {
  Bytes b(176);
  put_u16(b, 0, kHalfHalf);  // d
  put_u16(b, 2, kHalfOne);   // dmin
  std::copy(kScaleBytes.begin(), kScaleBytes.end(), b.begin() + 4);
  // qh[l] bit 2g is the fifth bit of element 64g + l, bit 2g + 1 that of element 64g + 32 + l.
  b[16 + 0] = 0x01;   // bit 0 (g0 low):  element 0   (s0): q 1+16 = 17 -> 0.5*1*17 - 5 = 3.5
  b[16 + 1] = 0x02;   // bit 1 (g0 high): element 33  (s1): q 2+16 = 18 -> 0.5*2*18 - 6 = 12
  b[16 + 5] = 0x14;   // bit 2 (g1 low):  element 69  (s2): q 17 -> 0.5*3*17 - 7 = 18.5
                      // bit 4 (g2 low):  element 133 (s4): q 17 -> 0.5*21*17 - 36 = 142.5
  b[16 + 2] = 0x40;   // bit 6 (g3 low):  element 194 (s6): q 17 -> 0.5*55*17 - 50 = 417.5
  b[16 + 31] = 0x80;  // bit 7 (g3 high): element 255 (s7): q 18 -> 0.5*8*18 - 19 = 53
  for (int i = 0; i < 128; ++i) b[48 + i] = 0x21;  // low nibble 1, high nibble 2, as in Q4_K
  // Block 1: d = 1, dmin = 0, every scale 1 (bytes 0-3 = 1, 8-11 = 0x01), every min 0,
  // qh and qs all ones: q = 15 | 16 = 31 -> 31 everywhere.
  Bytes b1(176, 0xFF);
  put_u16(b1, 0, kHalfOne);
  put_u16(b1, 2, kHalfZero);
  for (int i = 0; i < 4; ++i) {
    b1[4 + i] = 0x01;
    b1[8 + i] = 0x00;
    b1[12 + i] = 0x01;
  }
  append(b, b1);

  const std::vector<float> y = deq(GgmlType::Q5_K, b, 512);
  const std::pair<int, float> special[] = {{0, 3.5f},     {33, 12.0f},   {69, 18.5f},
                                           {133, 142.5f}, {194, 417.5f}, {255, 53.0f}};
  for (auto [e, v] : special) EXPECT_EQ(y[e], v) << "element " << e;
  for (int e = 0; e < 256; ++e) {
    bool is_special = false;
    for (auto [s, v] : special) is_special |= s == e;
    if (!is_special) {
      EXPECT_EQ(y[e], kKBase[e / 32]) << "element " << e;
    }
  }
  // Neighbours of set bits stay at the base value: element 1 (qh[1] bit 0 clear), element 32
  // (qh[0] bit 1 clear), element 65 (qh[1] bit 2 clear).
  EXPECT_EQ(y[1], -4.5f);
  EXPECT_EQ(y[32], -4.0f);
  EXPECT_EQ(y[65], -5.5f);
  for (int e = 256; e < 512; ++e) EXPECT_EQ(y[e], 31.0f) << "element " << e;
}

TEST(Dequantize, Q6_K) {
  // Layout: ql[0..127], qh[128..191], int8 scales[192..207], d at 208. Element e uses
  // scales[e / 16]; value = d * scale * (q6 - 32).
  Bytes b(210);
  const int8_t scales[16] = {1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, -7, 8, -128};
  for (int i = 0; i < 16; ++i) b[192 + i] = uint8_t(scales[i]);
  put_u16(b, 208, kHalfHalf);
  // Default: every nibble 1 and every 2-bit field 2, so q6 = 1 | 2 << 4 = 33 and each element is
  // 0.5 * scale * 1 -- checks which scale every element uses.
  for (int i = 0; i < 128; ++i) b[i] = 0x11;
  for (int i = 0; i < 64; ++i) b[128 + i] = 0xAA;
  // First half (elements 0..127): l = 0 touches elements 0, 32, 64, 96.
  b[0] = 0x7F;    // ql[0]: low 15 (element 0), high 7 (element 64)
  b[128] = 0x1E;  // qh[0] = 0b00'01'11'10: element 0 -> 2, 32 -> 3, 64 -> 1, 96 -> 0
  //   element 0:  15 | 2<<4 = 47 -> 15;  0.5 * scales[0] * 15 = 0.5 * 1 * 15 = 7.5
  //   element 32: ql[32] low 1 | 3<<4 = 49 -> 17;  0.5 * scales[2] * 17 = 0.5 * 2 * 17 = 17
  //   element 64: 7 | 1<<4 = 23 -> -9;  0.5 * scales[4] * -9 = 0.5 * 3 * -9 = -13.5
  //   element 96: ql[32] high 1 | 0 = 1 -> -31;  0.5 * scales[6] * -31 = 0.5 * 4 * -31 = -62
  // Second half (elements 128..255) uses ql[64..127] and qh[160..191]; l = 1 touches elements
  // 129, 161, 193, 225.
  b[64 + 33] = 0xF3;   // ql[97]: low 3 (element 161), high 15 (element 225)
  b[128 + 33] = 0xE8;  // qh[33] = 0b11'10'10'00: 129 -> 0, 161 -> 2, 193 -> 2, 225 -> 3
  //   element 129: ql[65] low 1 | 0 = 1 -> -31;  0.5 * scales[8] * -31 = 0.5 * 5 * -31 = -77.5
  //   element 161: 3 | 2<<4 = 35 -> 3;  0.5 * scales[10] * 3 = 0.5 * 6 * 3 = 9
  //   element 193: ql[65] high 1 | 2<<4 = 33 -> 1;  0.5 * scales[12] = 3.5 (the default)
  //   element 225: 15 | 3<<4 = 63 -> 31;  0.5 * scales[14] * 31 = 0.5 * 8 * 31 = 124
  // Block 1: d = 2, scales all 1, ql all 0x0F (low 15, high 0), qh all 0x33 (fields 3, 0, 3, 0):
  //   elements l:      15 | 3<<4 = 63 -> 31  -> 62
  //   elements l + 32: 15 | 0    = 15 -> -17 -> -34
  //   elements l + 64:  0 | 3<<4 = 48 -> 16  -> 32
  //   elements l + 96:  0 | 0    = 0  -> -32 -> -64
  Bytes b1(210);
  for (int i = 0; i < 128; ++i) b1[i] = 0x0F;
  for (int i = 0; i < 64; ++i) b1[128 + i] = 0x33;
  for (int i = 0; i < 16; ++i) b1[192 + i] = 1;
  put_u16(b1, 208, kHalfTwo);
  append(b, b1);

  const std::vector<float> y = deq(GgmlType::Q6_K, b, 512);
  const std::pair<int, float> special[] = {{0, 7.5f},     {32, 17.0f}, {64, -13.5f}, {96, -62.0f},
                                           {129, -77.5f}, {161, 9.0f}, {225, 124.0f}};
  for (auto [e, v] : special) EXPECT_EQ(y[e], v) << "element " << e;
  for (int e = 0; e < 256; ++e) {
    bool is_special = false;
    for (auto [s, v] : special) is_special |= s == e;
    if (!is_special) {
      EXPECT_EQ(y[e], 0.5f * float(scales[e / 16])) << "element " << e;
    }
  }
  EXPECT_EQ(y[193], 3.5f);
  EXPECT_EQ(y[255], -64.0f);  // 0.5 * -128 * 1
  const float want1[4] = {62, -34, 32, -64};
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(y[256 + e], want1[(e % 128) / 32]) << "element " << 256 + e;
  }
}

// ---- f16 -------------------------------------------------------------------------------------

// The f16 value straight from its definition, computed in double:
// (-1)^s * 2^(e-15) * (1 + m/1024) for 1 <= e <= 30, (-1)^s * m * 2^-24 for e = 0.
double f16_by_definition(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  const double mag = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1024.0 + m, e - 25);
  return s ? -mag : mag;
}

TEST(F16, EdgeCases) {
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);         // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03FF), 1023 * 0x1p-24f);  // largest subnormal
  EXPECT_EQ(f16_to_f32(0x0400), 0x1p-14f);         // smallest normal
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);         // largest finite: (2 - 2^-10) * 2^15
  EXPECT_EQ(f16_to_f32(0xFBFF), -65504.0f);
  EXPECT_EQ(bits(f16_to_f32(0x7C00)), 0x7F800000u);  // +inf
  EXPECT_EQ(bits(f16_to_f32(0xFC00)), 0xFF800000u);  // -inf
  EXPECT_EQ(bits(f16_to_f32(0x8000)), 0x80000000u);  // -0 keeps its sign
  EXPECT_EQ(bits(f16_to_f32(0x0000)), 0x00000000u);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7C01)));  // smallest-payload nan must not become inf
  EXPECT_TRUE(std::signbit(f16_to_f32(0xFE00)));
}

TEST(F16, ToF32ExhaustiveAgainstDefinition) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = f16_to_f32(uint16_t(h));
    const int e = (h >> 10) & 31;
    const bool neg = h >> 15;
    if (e == 31) {
      if ((h & 1023) == 0) {
        EXPECT_TRUE(std::isinf(got)) << std::hex << h;
      } else {
        EXPECT_TRUE(std::isnan(got)) << std::hex << h;
      }
      EXPECT_EQ(std::signbit(got), neg) << std::hex << h;
      continue;
    }
    // Every f16 value has at most 11 significant bits and an exponent f32 covers, so the double
    // converts to float exactly; comparing bits also checks the sign of zero.
    ASSERT_EQ(bits(got), bits(float(f16_by_definition(uint16_t(h))))) << std::hex << h;
  }
}

#if defined(__F16C__)
TEST(F16, AgreesWithF16CHardware) {
  // _cvtsh_ss / _cvtss_sh are an independent implementation (the CPU's). Nan payload handling
  // is not part of our contract, so nans are only checked to stay nans.
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = _cvtsh_ss(uint16_t(h));
    const float got = f16_to_f32(uint16_t(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << h;
    } else {
      ASSERT_EQ(bits(got), bits(want)) << std::hex << h;
    }
  }
  // A strided sweep over all f32 bit patterns (about a million values, every exponent).
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4099) {
    const float f = from_bits(uint32_t(u));
    const uint16_t want = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const uint16_t got = f32_to_f16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE((got & 0x7C00) == 0x7C00 && (got & 0x3FF) != 0) << std::hex << u;
    } else {
      ASSERT_EQ(got, want) << std::hex << u;
    }
  }
}
#endif

TEST(F16, FromF32RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    if (((h >> 10) & 31) == 31 && (h & 1023) != 0) continue;  // nan payloads may change
    ASSERT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h) << std::hex << h;
  }
}

TEST(F16, FromF32RoundsToNearestEven) {
  // Between every pair of neighbouring positive finite f16 values a and a+1 (as bit patterns),
  // the midpoint goes to whichever pattern is even; a hair either side goes to the nearer one.
  // The midpoint needs 12 significant bits, so it is exact in f32.
  for (uint16_t a = 0; a < 0x7BFF; ++a) {
    const double lo = f16_by_definition(a), hi = f16_by_definition(uint16_t(a + 1));
    const float mid = float((lo + hi) / 2);
    ASSERT_EQ(double(mid), (lo + hi) / 2);
    const uint16_t even = (a % 2 == 0) ? a : uint16_t(a + 1);
    ASSERT_EQ(f32_to_f16(mid), even) << std::hex << a;
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, 0.0f)), a) << std::hex << a;
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, 1e9f)), a + 1) << std::hex << a;
    ASSERT_EQ(f32_to_f16(-mid), 0x8000 | even) << std::hex << a;
  }
  // Above the largest finite value 65504 (0x7BFF, odd): the midpoint to the next power 65536 is
  // 65520, which ties to the even side -- inf.
  EXPECT_EQ(f32_to_f16(65519.996f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16(1e10f), 0x7C00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xFC00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7C00);
  // Below the smallest subnormal 2^-24: 2^-25 is the tie between 0 and 2^-24 -> 0 (even);
  // anything above it rounds up; 3 * 2^-25 ties between 1 and 2 (times 2^-24) -> 2.
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(f32_to_f16(0x1p-30f), 0x0000);
  EXPECT_EQ(f32_to_f16(from_bits(0x00000001)), 0x0000);  // f32 subnormal
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(-0x1p-26f), 0x8000);  // underflow keeps the sign
  EXPECT_EQ(f32_to_f16(0.1f), 0x2E66);       // 0.1 ~ 1.6 * 2^-4: mantissa 0.6*1024 = 614.4 -> 614
}

TEST(F16, FromF32Nan) {
  for (uint32_t u : {0x7FC00000u, 0x7F800001u, 0x7F802000u, 0xFFC00000u, 0xFF800001u}) {
    const uint16_t h = f32_to_f16(from_bits(u));
    EXPECT_EQ(h & 0x7C00, 0x7C00) << std::hex << u;
    EXPECT_NE(h & 0x03FF, 0) << std::hex << u << ": a nan must not turn into inf";
    EXPECT_EQ(h >> 15, u >> 31) << std::hex << u;
  }
}

// ---- bf16 --------------------------------------------------------------------------------------

TEST(BF16, ToF32IsTheTopHalf) {
  for (uint32_t b = 0; b < 65536; ++b) ASSERT_EQ(bits(bf16_to_f32(uint16_t(b))), b << 16);
}

TEST(BF16, FromF32RoundsToNearestEven) {
  // 1.00390625 = 1 + 2^-8 = 0x3F808000: exactly between 0x3F80 (1.0) and 0x3F81 (1 + 2^-7);
  // 0x3F80 is even.
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-1.00390625f), 0xBF80);
  // 1 + 3 * 2^-8 = 0x3F818000: between 0x3F81 and 0x3F82; 0x3F82 is even.
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3F82);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808001)), 0x3F81);  // just above the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F807FFF)), 0x3F80);  // just below it
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F80FFFF)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(3.140625f), 0x4049);  // exact
  // Largest f32 (0x7F7FFFFF) is above the midpoint between the largest bf16 0x7F7F and 2^128:
  // rounds to inf. 0x7F7F7FFF is below it.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7F7F7FFF)), 0x7F7F);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000)), 0x0000);  // subnormal tie -> even 0
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000)), 0x0002);  // subnormal tie -> even 2
}

TEST(BF16, FromF32Nan) {
  // 0x7F800001 would truncate to 0x7F80 = inf; it must stay a nan. Sign is kept.
  for (uint32_t u : {0x7FC00000u, 0x7F800001u, 0x7F80FFFFu, 0xFFC00000u, 0xFF800001u}) {
    const uint16_t b = f32_to_bf16(from_bits(u));
    EXPECT_TRUE(std::isnan(bf16_to_f32(b))) << std::hex << u;
    EXPECT_EQ(b >> 15, u >> 31) << std::hex << u;
  }
  EXPECT_EQ(f32_to_bf16(from_bits(0x7FC00000)), 0x7FC0);  // a quiet nan converts unchanged
}

TEST(BF16, FromF32RoundTripsEveryValue) {
  for (uint32_t b = 0; b < 65536; ++b) {
    if ((b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0) continue;  // nans
    ASSERT_EQ(f32_to_bf16(bf16_to_f32(uint16_t(b))), b) << std::hex << b;
  }
}

}  // namespace
}  // namespace lp
