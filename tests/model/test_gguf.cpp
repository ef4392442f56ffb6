// Tests for model/gguf (GgufFile) and model/config (config_from_gguf).
//
// Files are built by tests/gguf_writer, which writes the byte layout from the format
// description on its own; nothing here trusts the reader to check itself. Every bad file must
// give an lp::Error whose message names the problem — never a crash, a huge allocation or a
// read past the end of the mapping.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/error.h"
#include "model/gguf.h"
#include "tests/gguf_writer.h"
#include "tests/tiny_arch.h"

namespace lp {
namespace {

using testing::Bytes;
using testing::GgufLayout;
using testing::GgufWriter;
using testing::GgufWriterTensor;
using testing::GgufWriterValue;
using testing::TempDir;
using testing::TinyModelSpec;
using V = GgufWriterValue;

// Opens `path` expecting lp::Error; returns its message ("" and a test failure otherwise).
std::string open_error(const std::string& path) {
  try {
    GgufFile::open(path);
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected lp::Error, got std::exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected lp::Error opening " << path;
  return "";
}

std::string write_error(const TempDir& dir, const GgufWriter& w, const std::string& name = "bad.gguf") {
  const std::string path = dir.file(name);
  w.write(path);
  return open_error(path);
}

std::string bytes_error(const TempDir& dir, const Bytes& b, const std::string& name = "bad.gguf") {
  const std::string path = dir.file(name);
  testing::write_file(path, b);
  return open_error(path);
}

#define EXPECT_HAS(haystack, needle)                               \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "message: " << (haystack) << "\nexpected to contain: " << (needle)

// A small valid file: a few keys (string array, nested array) and three tensors.
GgufWriter small_writer() {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("answer", 42);
  w.add_array_string("names", {"alpha", "", "gamma"});
  w.add("nested", V::array(GgufType::ARRAY,
                           {V::array(GgufType::I32, {V::i32(1), V::i32(-2)}), V::array(GgufType::I32, {})}));
  w.add_f32("pi", 3.25f);
  w.add_tensor_f32("a", {3}, {1.0f, 2.0f, 3.0f});
  w.add_tensor_f32("b", {2, 2}, {4.0f, 5.0f, 6.0f, 7.0f});
  w.add_tensor("c", GgmlType::F16, {5}, Bytes(10, 0x3C));
  return w;
}

// ---- round trips -----------------------------------------------------------------------------

TEST(GgufRead, EveryScalarType) {
  TempDir dir;
  GgufWriter w;
  w.add_u8("u8", 200);
  w.add_i8("i8", -100);
  w.add_u16("u16", 60000);
  w.add_i16("i16", -30000);
  w.add_u32("u32", 4000000000u);
  w.add_i32("i32", -2000000000);
  w.add_u64("u64", (1ull << 63) + 5);
  w.add_i64("i64", -(int64_t{1} << 62) - 3);
  w.add_f32("f32", 1.5f);
  w.add_f64("f64", -2.25e100);
  w.add_bool("t", true);
  w.add_bool("f", false);
  w.add_string("s", "h\xC3\xA9llo\nworld");
  w.add_string("empty", "");
  w.write(dir.file("m.gguf"));
  const GgufFile f = GgufFile::open(dir.file("m.gguf"));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), 14u);
  EXPECT_TRUE(f.tensors().empty());

  auto type = [&](const char* k) { return f.find(k)->type; };
  EXPECT_EQ(type("u8"), GgufType::U8);
  EXPECT_EQ(type("i8"), GgufType::I8);
  EXPECT_EQ(type("u16"), GgufType::U16);
  EXPECT_EQ(type("i16"), GgufType::I16);
  EXPECT_EQ(type("u32"), GgufType::U32);
  EXPECT_EQ(type("i32"), GgufType::I32);
  EXPECT_EQ(type("u64"), GgufType::U64);
  EXPECT_EQ(type("i64"), GgufType::I64);
  EXPECT_EQ(type("f32"), GgufType::F32);
  EXPECT_EQ(type("f64"), GgufType::F64);
  EXPECT_EQ(type("t"), GgufType::BOOL);
  EXPECT_EQ(type("s"), GgufType::STRING);

  // Unsigned types keep uint64_t, signed int64_t, floats widen to double.
  EXPECT_EQ(std::get<uint64_t>(f.find("u8")->v), 200u);
  EXPECT_EQ(std::get<int64_t>(f.find("i8")->v), -100);
  EXPECT_EQ(std::get<uint64_t>(f.find("u16")->v), 60000u);
  EXPECT_EQ(std::get<int64_t>(f.find("i16")->v), -30000);
  EXPECT_EQ(std::get<uint64_t>(f.find("u32")->v), 4000000000u);
  EXPECT_EQ(std::get<int64_t>(f.find("i32")->v), -2000000000);
  EXPECT_EQ(std::get<uint64_t>(f.find("u64")->v), (1ull << 63) + 5);
  EXPECT_EQ(std::get<int64_t>(f.find("i64")->v), -(int64_t{1} << 62) - 3);
  EXPECT_EQ(std::get<double>(f.find("f32")->v), 1.5);
  EXPECT_EQ(std::get<double>(f.find("f64")->v), -2.25e100);
  EXPECT_EQ(std::get<bool>(f.find("t")->v), true);
  EXPECT_EQ(std::get<bool>(f.find("f")->v), false);
  EXPECT_EQ(std::get<std::string>(f.find("s")->v), "h\xC3\xA9llo\nworld");
  EXPECT_EQ(std::get<std::string>(f.find("empty")->v), "");
  EXPECT_EQ(f.find("missing"), nullptr);
  EXPECT_FALSE(f.has("missing"));
}

TEST(GgufRead, EveryArrayType) {
  TempDir dir;
  GgufWriter w;
  w.add_array_u8("u8", {0, 255, 7});
  w.add_array_i8("i8", {-128, 127});
  w.add_array_u16("u16", {65535});
  w.add_array_i16("i16", {-32768, 1, 2, 3});
  w.add_array_u32("u32", {1, 4294967295u});
  w.add_array_i32("i32", {-1, 0, 2147483647});
  w.add_array_u64("u64", {~0ull});
  w.add_array_i64("i64", {std::numeric_limits<int64_t>::min(), 5});
  w.add_array_f32("f32", {0.5f, -0.25f, 1e30f});
  w.add_array_f64("f64", {1e-300});
  w.add_array_bool("bool", {true, false, true});
  w.add_array_string("str", {"a", "", "\xE2\x80\x94long"});
  w.add_array_i32("empty", {});
  w.add("nested",
        V::array(GgufType::ARRAY, {V::array(GgufType::STRING, {V::string("x"), V::string("yz")}),
                                   V::array(GgufType::U8, {}), V::array(GgufType::F32, {V::f32(2.0f)})}));
  w.write(dir.file("m.gguf"));
  const GgufFile f = GgufFile::open(dir.file("m.gguf"));

  auto arr = [&](const char* k, GgufType elem, size_t n) -> const GgufArray& {
    const GgufArray& a = f.get_array(k);
    EXPECT_EQ(f.find(k)->type, GgufType::ARRAY) << k;
    EXPECT_EQ(a.elem_type, elem) << k;
    EXPECT_EQ(a.items.size(), n) << k;
    for (const auto& it : a.items) EXPECT_EQ(it.type, elem) << k;
    return a;
  };
  auto u = [](const GgufValue& v) { return std::get<uint64_t>(v.v); };
  auto i = [](const GgufValue& v) { return std::get<int64_t>(v.v); };
  auto d = [](const GgufValue& v) { return std::get<double>(v.v); };

  const auto& a_u8 = arr("u8", GgufType::U8, 3);
  EXPECT_EQ(u(a_u8.items[0]), 0u);
  EXPECT_EQ(u(a_u8.items[1]), 255u);
  EXPECT_EQ(u(a_u8.items[2]), 7u);
  const auto& a_i8 = arr("i8", GgufType::I8, 2);
  EXPECT_EQ(i(a_i8.items[0]), -128);
  EXPECT_EQ(i(a_i8.items[1]), 127);
  EXPECT_EQ(u(arr("u16", GgufType::U16, 1).items[0]), 65535u);
  const auto& a_i16 = arr("i16", GgufType::I16, 4);
  EXPECT_EQ(i(a_i16.items[0]), -32768);
  EXPECT_EQ(i(a_i16.items[3]), 3);
  EXPECT_EQ(u(arr("u32", GgufType::U32, 2).items[1]), 4294967295u);
  const auto& a_i32 = arr("i32", GgufType::I32, 3);
  EXPECT_EQ(i(a_i32.items[0]), -1);
  EXPECT_EQ(i(a_i32.items[2]), 2147483647);
  EXPECT_EQ(u(arr("u64", GgufType::U64, 1).items[0]), ~0ull);
  EXPECT_EQ(i(arr("i64", GgufType::I64, 2).items[0]), std::numeric_limits<int64_t>::min());
  const auto& a_f32 = arr("f32", GgufType::F32, 3);
  EXPECT_EQ(d(a_f32.items[0]), 0.5);
  EXPECT_EQ(d(a_f32.items[1]), -0.25);
  EXPECT_EQ(d(a_f32.items[2]), double(1e30f));
  EXPECT_EQ(d(arr("f64", GgufType::F64, 1).items[0]), 1e-300);
  const auto& a_b = arr("bool", GgufType::BOOL, 3);
  EXPECT_TRUE(std::get<bool>(a_b.items[0].v));
  EXPECT_FALSE(std::get<bool>(a_b.items[1].v));
  const auto& a_s = arr("str", GgufType::STRING, 3);
  EXPECT_EQ(std::get<std::string>(a_s.items[0].v), "a");
  EXPECT_EQ(std::get<std::string>(a_s.items[1].v), "");
  EXPECT_EQ(std::get<std::string>(a_s.items[2].v), "\xE2\x80\x94long");
  arr("empty", GgufType::I32, 0);

  const auto& n = arr("nested", GgufType::ARRAY, 3);
  const auto& n0 = std::get<GgufArray>(n.items[0].v);
  EXPECT_EQ(n0.elem_type, GgufType::STRING);
  ASSERT_EQ(n0.items.size(), 2u);
  EXPECT_EQ(std::get<std::string>(n0.items[1].v), "yz");
  const auto& n1 = std::get<GgufArray>(n.items[1].v);
  EXPECT_EQ(n1.elem_type, GgufType::U8);
  EXPECT_TRUE(n1.items.empty());
  const auto& n2 = std::get<GgufArray>(n.items[2].v);
  EXPECT_EQ(n2.elem_type, GgufType::F32);
  EXPECT_EQ(d(n2.items.at(0)), 2.0);

  // The summary shown by inspect names type and length.
  EXPECT_HAS(gguf_value_summary(*f.find("i32")), "i32[3]");
  EXPECT_HAS(gguf_value_summary(*f.find("str")), "string[3]");
}

TEST(GgufRead, StringsWithEmbeddedNulAndLongText) {
  TempDir dir;
  GgufWriter w;
  const std::string with_nul("a\0b", 3);
  const std::string long_text(100000, 'x');
  w.add("nul", V::string(with_nul));
  w.add_string("long", long_text);
  w.write(dir.file("m.gguf"));
  const GgufFile f = GgufFile::open(dir.file("m.gguf"));
  EXPECT_EQ(f.get_string("nul"), with_nul);
  EXPECT_EQ(f.get_string("long"), long_text);
}

TEST(GgufRead, NestingUpToFourLevels) {
  TempDir dir;
  auto nest = [](int levels) {
    GgufWriterValue v = V::array(GgufType::U8, {V::u8(9)});
    for (int l = 1; l < levels; ++l) v = V::array(GgufType::ARRAY, {v});
    return v;
  };
  GgufWriter ok;
  ok.add("deep", nest(4));
  ok.write(dir.file("ok.gguf"));
  const GgufFile f = GgufFile::open(dir.file("ok.gguf"));
  const GgufValue* v = f.find("deep");
  for (int l = 1; l < 4; ++l) v = &std::get<GgufArray>(v->v).items.at(0);
  EXPECT_EQ(std::get<uint64_t>(std::get<GgufArray>(v->v).items.at(0).v), 9u);

  GgufWriter bad;
  bad.add("deep", nest(5));
  EXPECT_HAS(write_error(dir, bad), "nested too deeply");
}

// ---- typed accessors ---------------------------------------------------------------------------

class GgufAccessors : public ::testing::Test {
 protected:
  void SetUp() override {
    GgufWriter w;
    w.add_u8("u8", 7);
    w.add_u16("u16", 65535);
    w.add_u32("u32", 123456);
    w.add_u64("u64_big", ~0ull);
    w.add_u64("u64_small", 5);
    w.add_i8("i8_neg", -3);
    w.add_i32("i32_pos", 99);
    w.add_i64("i64_neg", -7);
    w.add_f32("f32", 0.5f);
    w.add_f64("f64", 1e-5);
    w.add_bool("b", true);
    w.add_string("s", "text");
    w.add_array_u32("arr", {1, 2});
    path_ = dir_.file("acc.gguf");
    w.write(path_);
    f_ = std::make_unique<GgufFile>(GgufFile::open(path_));
  }
  std::string error_of(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected lp::Error";
    return "";
  }
  TempDir dir_;
  std::string path_;
  std::unique_ptr<GgufFile> f_;
};

TEST_F(GgufAccessors, UnsignedAcceptsAnyNonNegativeInteger) {
  const GgufFile& f = *f_;
  EXPECT_EQ(f.get_uint("u8"), 7u);
  EXPECT_EQ(f.get_uint("u16"), 65535u);
  EXPECT_EQ(f.get_uint("u32"), 123456u);
  EXPECT_EQ(f.get_uint("u64_big"), ~0ull);
  EXPECT_EQ(f.get_uint("i32_pos"), 99u);
  EXPECT_HAS(error_of([&] { f.get_uint("i8_neg"); }), "'i8_neg' should be a non-negative integer");
  EXPECT_HAS(error_of([&] { f.get_uint("f32"); }), "should be a non-negative integer");
  EXPECT_HAS(error_of([&] { f.get_uint("s"); }), "should be a non-negative integer");
  EXPECT_HAS(error_of([&] { f.get_uint("b"); }), "should be a non-negative integer");
}

TEST_F(GgufAccessors, SignedAcceptsIntegersThatFit) {
  const GgufFile& f = *f_;
  EXPECT_EQ(f.get_int("i8_neg"), -3);
  EXPECT_EQ(f.get_int("i64_neg"), -7);
  EXPECT_EQ(f.get_int("u64_small"), 5);
  EXPECT_EQ(f.get_int("u32"), 123456);
  EXPECT_HAS(error_of([&] { f.get_int("u64_big"); }), "'u64_big' should be an integer");
  EXPECT_HAS(error_of([&] { f.get_int("f64"); }), "should be an integer");
}

TEST_F(GgufAccessors, FloatAcceptsFloatsAndIntegers) {
  const GgufFile& f = *f_;
  EXPECT_EQ(f.get_float("f32"), 0.5);
  EXPECT_EQ(f.get_float("f64"), 1e-5);
  EXPECT_EQ(f.get_float("u32"), 123456.0);
  EXPECT_EQ(f.get_float("i64_neg"), -7.0);
  EXPECT_HAS(error_of([&] { f.get_float("s"); }), "'s' should be a number");
  EXPECT_HAS(error_of([&] { f.get_float("arr"); }), "should be a number");
}

TEST_F(GgufAccessors, BoolStringArrayAreStrict) {
  const GgufFile& f = *f_;
  EXPECT_TRUE(f.get_bool("b"));
  EXPECT_EQ(f.get_string("s"), "text");
  EXPECT_EQ(f.get_array("arr").items.size(), 2u);
  EXPECT_HAS(error_of([&] { f.get_bool("u8"); }), "'u8' should be a bool");
  EXPECT_HAS(error_of([&] { f.get_string("u32"); }), "'u32' should be a string");
  EXPECT_HAS(error_of([&] { f.get_array("s"); }), "'s' should be an array");
}

TEST_F(GgufAccessors, MissingKeysAndOptionals) {
  const GgufFile& f = *f_;
  const std::string msg = error_of([&] { f.get_uint("nope"); });
  EXPECT_HAS(msg, "missing metadata key 'nope'");
  EXPECT_HAS(msg, path_);  // errors name the file
  EXPECT_HAS(error_of([&] { f.get_string("nope"); }), "missing metadata key");
  EXPECT_HAS(error_of([&] { f.get_array("nope"); }), "missing metadata key");
  EXPECT_FALSE(f.opt_uint("nope").has_value());
  EXPECT_FALSE(f.opt_float("nope").has_value());
  EXPECT_FALSE(f.opt_bool("nope").has_value());
  EXPECT_FALSE(f.opt_string("nope").has_value());
  EXPECT_EQ(f.opt_uint("u16"), 65535u);
  EXPECT_EQ(f.opt_float("f32"), 0.5);
  EXPECT_EQ(f.opt_bool("b"), true);
  EXPECT_EQ(f.opt_string("s"), "text");
  // Present with the wrong type is an error, not "absent".
  EXPECT_HAS(error_of([&] { f.opt_uint("s"); }), "should be a non-negative integer");
  EXPECT_HAS(error_of([&] { f.opt_string("u8"); }), "should be a string");
  EXPECT_HAS(error_of([&] { f.tensor("w"); }), "missing tensor 'w'");
  EXPECT_EQ(f.find_tensor("w"), nullptr);
}

// ---- versions, alignment, tensors ------------------------------------------------------------

TEST(GgufRead, Versions2And3) {
  TempDir dir;
  for (uint32_t version : {2u, 3u}) {
    GgufWriter w = small_writer();
    w.version = version;
    const std::string path = dir.file(fmt::format("v{}.gguf", version));
    w.write(path);
    const GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.get_uint("answer"), 42u);
    EXPECT_EQ(f.tensors().size(), 3u);
    EXPECT_EQ(f.path(), path);
  }
}

TEST(GgufRead, TensorShapesTypesAndSizes) {
  TempDir dir;
  GgufWriter w;
  struct Case {
    const char* name;
    GgmlType type;
    std::vector<int64_t> ne;
    int64_t n_bytes;  // worked out from docs/gguf.md: blocks * bytes per block
  };
  const std::vector<Case> cases = {
      {"f32", GgmlType::F32, {4, 3}, 4 * 3 * 4},
      {"f16", GgmlType::F16, {7}, 7 * 2},
      {"bf16", GgmlType::BF16, {3, 5, 2}, 30 * 2},
      {"q8_0", GgmlType::Q8_0, {64, 3}, 2 * 3 * 34},
      {"q4_0", GgmlType::Q4_0, {32, 1, 1, 2}, 2 * 18},
      {"q4_k", GgmlType::Q4_K, {256, 2}, 2 * 144},
      {"q6_k", GgmlType::Q6_K, {512}, 2 * 210},
      {"q3_k", GgmlType::Q3_K, {256}, 110},
      {"i32", GgmlType::I32, {3}, 12},
  };
  std::vector<Bytes> data;
  for (size_t i = 0; i < cases.size(); ++i) {
    Bytes b(size_t(cases[i].n_bytes));
    for (size_t k = 0; k < b.size(); ++k) b[k] = uint8_t(i * 31 + k * 7);
    data.push_back(b);
    w.add_tensor(cases[i].name, cases[i].type, cases[i].ne, b);
  }
  GgufLayout lay;
  w.write(dir.file("t.gguf"), &lay);
  const GgufFile f = GgufFile::open(dir.file("t.gguf"));
  ASSERT_EQ(f.tensors().size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const GgufTensor& t = f.tensors()[i];  // file order is kept
    SCOPED_TRACE(cases[i].name);
    EXPECT_EQ(t.name, cases[i].name);
    EXPECT_EQ(&f.tensor(cases[i].name), &t);
    EXPECT_EQ(t.type, cases[i].type);
    EXPECT_EQ(t.ne, cases[i].ne);
    int64_t n = 1;
    for (int64_t d : cases[i].ne) n *= d;
    EXPECT_EQ(t.n_elems, n);
    EXPECT_EQ(t.rows(), n / cases[i].ne[0]);
    EXPECT_EQ(t.n_bytes, cases[i].n_bytes);
    EXPECT_EQ(t.offset, lay.tensor_offsets[i]);
    EXPECT_EQ(0, std::memcmp(t.data, data[i].data(), data[i].size()));
  }
  EXPECT_EQ(f.file_size(), lay.size);
}

TEST(GgufRead, AlignmentPlacesTensorData) {
  TempDir dir;
  for (uint64_t align : {1ull, 8ull, 32ull, 64ull, 256ull, 4096ull}) {
    SCOPED_TRACE(align);
    GgufWriter w;
    w.add_string("general.name", "aligned");
    w.set_alignment(align);
    // Sizes that are not multiples of the alignment, so every tensor after the first needs padding.
    const std::vector<Bytes> data = {Bytes(12, 0x11), Bytes(30, 0x22), Bytes(68, 0x33), Bytes(4, 0x44)};
    w.add_tensor("a", GgmlType::F32, {3}, data[0]);
    w.add_tensor("b", GgmlType::F16, {5, 3}, data[1]);
    w.add_tensor("c", GgmlType::Q8_0, {32, 2}, data[2]);
    w.add_tensor("d", GgmlType::I8, {2, 2}, data[3]);
    GgufLayout lay;
    const std::string path = dir.file(fmt::format("a{}.gguf", align));
    w.write(path, &lay);
    const GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.alignment(), align);
    ASSERT_EQ(f.tensors().size(), 4u);
    const uint8_t* first = f.tensors()[0].data;
    // The mapping starts on a page boundary and the data section at a multiple of the
    // alignment, so every tensor's address is aligned too.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % align, 0u);
    EXPECT_EQ(lay.data_start % align, 0u);
    for (size_t i = 0; i < 4; ++i) {
      const GgufTensor& t = f.tensors()[i];
      EXPECT_EQ(t.offset, lay.tensor_offsets[i]);
      EXPECT_EQ(t.offset % align, 0u);
      EXPECT_EQ(uint64_t(t.data - first), t.offset);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % align, 0u);
      EXPECT_EQ(Bytes(t.data, t.data + t.n_bytes), data[i]);
    }
    // Where the bytes are in the file, counted independently of the reader.
    const Bytes raw = testing::read_file(path);
    EXPECT_EQ(raw.at(lay.data_start + lay.tensor_offsets[2]), 0x33);
  }
}

TEST(GgufRead, DefaultAlignmentIs32) {
  TempDir dir;
  GgufWriter w = small_writer();  // no general.alignment key
  GgufLayout lay;
  w.write(dir.file("m.gguf"), &lay);
  const GgufFile f = GgufFile::open(dir.file("m.gguf"));
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.tensors()[1].offset, 32u);  // "a" is 12 bytes, padded to 32
  EXPECT_EQ(f.tensors()[2].offset, 64u);
  const float* b = reinterpret_cast<const float*>(f.tensor("b").data);
  EXPECT_EQ(b[0], 4.0f);
  EXPECT_EQ(b[3], 7.0f);
}

TEST(GgufRead, NoPaddingAfterLastTensorIsFine) {
  TempDir dir;
  GgufWriter w = small_writer();
  w.pad_after_last_tensor = false;
  GgufLayout lay;
  w.write(dir.file("m.gguf"), &lay);
  EXPECT_EQ(lay.size, lay.data_end);
  const GgufFile f = GgufFile::open(dir.file("m.gguf"));
  EXPECT_EQ(f.tensors().size(), 3u);
}

TEST(GgufRead, MoveKeepsMappingAlive) {
  TempDir dir;
  small_writer().write(dir.file("m.gguf"));
  GgufFile a = GgufFile::open(dir.file("m.gguf"));
  GgufFile b = std::move(a);
  const float* p = reinterpret_cast<const float*>(b.tensor("a").data);
  EXPECT_EQ(p[2], 3.0f);
  GgufFile c = GgufFile::open(dir.file("m.gguf"));
  c = std::move(b);
  EXPECT_EQ(reinterpret_cast<const float*>(c.tensor("b").data)[1], 5.0f);
}

// ---- bad files -------------------------------------------------------------------------------

TEST(GgufBad, MissingFileAndDirectory) {
  TempDir dir;
  EXPECT_HAS(open_error(dir.file("nope.gguf")), "cannot open model file");
  EXPECT_HAS(open_error(dir.file("nope.gguf")), "No such file");
  EXPECT_HAS(open_error(dir.path()), "not a regular file");
}

TEST(GgufBad, EmptyAndTinyFiles) {
  TempDir dir;
  EXPECT_HAS(bytes_error(dir, {}), "not a GGUF file");
  EXPECT_HAS(bytes_error(dir, {'G', 'G', 'U', 'F'}), "shorter than the header");
}

TEST(GgufBad, EveryTruncationIsAnError) {
  TempDir dir;
  GgufWriter w = small_writer();
  w.pad_after_last_tensor = false;  // so every shorter length cuts into something
  GgufLayout lay;
  const Bytes full = w.bytes(&lay);
  ASSERT_EQ(full.size(), lay.data_end);
  const std::string path = dir.file("trunc.gguf");
  for (size_t len = 0; len < full.size(); ++len) {
    testing::write_file(path, Bytes(full.begin(), full.begin() + len));
    try {
      GgufFile::open(path);
      ADD_FAILURE() << "no error for a file truncated to " << len << " of " << full.size() << " bytes";
    } catch (const Error&) {
    }
  }
  testing::write_file(path, full);
  EXPECT_NO_THROW(GgufFile::open(path));
}

TEST(GgufBad, TruncationMessagesNameWhere) {
  TempDir dir;
  GgufWriter w = small_writer();
  w.pad_after_last_tensor = false;
  GgufLayout lay;
  const Bytes full = w.bytes(&lay);
  auto cut = [&](uint64_t len) { return bytes_error(dir, Bytes(full.begin(), full.begin() + len)); };
  EXPECT_HAS(cut(10), "shorter than the header");
  // Inside the third key's name ("names"); the counts are checked against the remaining bytes
  // first, so either message is acceptable as long as it says the file is short.
  const std::string in_key = cut(lay.kv_starts[2] + 10);
  EXPECT_TRUE(in_key.find("truncated") != std::string::npos || in_key.find("impossible") != std::string::npos)
      << in_key;
  // Inside the string array: past its header, in the middle of its items.
  const std::string in_array = cut(lay.kv_starts[2] + 8 + 5 + 4 + 4 + 8 + 3);
  EXPECT_TRUE(in_array.find("truncated") != std::string::npos ||
              in_array.find("does not fit") != std::string::npos)
      << in_array;
  EXPECT_HAS(cut(lay.tensor_info_starts[1] + 8), "truncated file: tensor name");
  EXPECT_HAS(cut(lay.tensor_info_starts[1] + 9), "truncated file: tensor dims");
  EXPECT_HAS(cut(lay.tensor_info_starts[2] + 8 + 1 + 4 + 3), "truncated file: tensor dim");
  EXPECT_HAS(cut(lay.data_start + lay.tensor_offsets[2] + 3), "tensor 'c'");
  EXPECT_HAS(cut(lay.data_start + lay.tensor_offsets[2] + 3), "extends beyond the end of the file");
  EXPECT_HAS(cut(lay.data_start + 5), "tensor 'a'");
}

TEST(GgufBad, WrongMagic) {
  TempDir dir;
  GgufWriter w = small_writer();
  w.magic = 0x4C4D4747;  // "GGML"
  EXPECT_HAS(write_error(dir, w), "not a GGUF file");
  Bytes b = small_writer().bytes();
  b[3] = 'f';
  EXPECT_HAS(bytes_error(dir, b), "expected 'GGUF'");
}

TEST(GgufBad, UnsupportedVersions) {
  TempDir dir;
  GgufWriter w = small_writer();
  w.version = 1;
  EXPECT_HAS(write_error(dir, w), "GGUF version 1 is not supported");
  w.version = 4;
  EXPECT_HAS(write_error(dir, w), "unsupported GGUF version 4");
  w.version = 0;
  EXPECT_HAS(write_error(dir, w), "unsupported GGUF version 0");
  w.version = 0xFFFFFFFF;
  EXPECT_HAS(write_error(dir, w), "unsupported GGUF version");
}

TEST(GgufBad, BigEndianHeader) {
  TempDir dir;
  for (uint32_t version : {2u, 3u}) {
    Bytes b = small_writer().bytes();
    // A big-endian writer stores the version (and every other number) most significant byte first.
    b[4] = 0;
    b[5] = 0;
    b[6] = 0;
    b[7] = uint8_t(version);
    EXPECT_HAS(bytes_error(dir, b), "big-endian");
  }
}

TEST(GgufBad, AbsurdCounts) {
  TempDir dir;
  GgufWriter w = small_writer();
  w.kv_count_override = 1ull << 60;
  EXPECT_HAS(write_error(dir, w), "metadata count");
  w = small_writer();
  w.tensor_count_override = 1ull << 60;
  EXPECT_HAS(write_error(dir, w), "tensor count");
  w = small_writer();
  w.tensor_count_override = ~0ull;
  EXPECT_HAS(write_error(dir, w), "tensor count");
}

TEST(GgufBad, AbsurdArrayCount) {
  TempDir dir;
  for (GgufType elem : {GgufType::U8, GgufType::U64, GgufType::STRING, GgufType::ARRAY}) {
    GgufWriter w = small_writer();
    w.add("huge", V::array_header(uint32_t(elem), 1ull << 60, Bytes(16, 0)));
    const std::string msg = write_error(dir, w);
    EXPECT_HAS(msg, "'huge'");
    EXPECT_HAS(msg, "does not fit");
  }
  // A count that fits the file but not the elements that follow: runs out of bytes.
  GgufWriter w;
  w.add("short", V::array_header(uint32_t(GgufType::U32), 4, Bytes(12, 0)));
  w.add_u8("after", 1);
  EXPECT_NE(write_error(dir, w), "");
}

TEST(GgufBad, AbsurdStringLengths) {
  TempDir dir;
  Bytes payload;
  testing::put_u64(payload, 1ull << 62);
  payload.resize(payload.size() + 16, 'x');
  GgufWriter w = small_writer();
  w.add_raw("s", uint32_t(GgufType::STRING), payload);
  EXPECT_HAS(write_error(dir, w), "string value needs 4611686018427387904 bytes");

  // The key's own length.
  GgufLayout lay;
  Bytes b = small_writer().bytes(&lay);
  for (int k = 0; k < 8; ++k) b[lay.kv_starts[1] + k] = 0xFF;
  EXPECT_HAS(bytes_error(dir, b), "metadata key needs");

  // A tensor name's length.
  b = small_writer().bytes(&lay);
  for (int k = 0; k < 8; ++k) b[lay.tensor_info_starts[0] + k] = k == 7 ? 0x10 : 0;
  EXPECT_HAS(bytes_error(dir, b), "tensor name needs");

  // A string inside an array.
  Bytes arr;
  testing::put_u32(arr, uint32_t(GgufType::STRING));
  testing::put_u64(arr, 1);
  testing::put_u64(arr, ~0ull);
  w = small_writer();
  w.add_raw("strs", uint32_t(GgufType::ARRAY), arr);
  EXPECT_HAS(write_error(dir, w), "truncated file: string value");
}

GgufWriterTensor raw_tensor(const std::string& name, uint32_t type, std::vector<uint64_t> ne,
                            Bytes data = Bytes(64, 0)) {
  GgufWriterTensor t;
  t.name = name;
  t.type = type;
  t.ne = std::move(ne);
  t.data = std::move(data);
  return t;
}

TEST(GgufBad, AbsurdTensorDims) {
  TempDir dir;
  const uint32_t f32 = uint32_t(GgmlType::F32);
  auto with = [&](GgufWriterTensor t) {
    GgufWriter w = small_writer();
    w.add_tensor_raw(std::move(t));
    return write_error(dir, w);
  };
  EXPECT_HAS(with(raw_tensor("x", f32, {1ull << 62})),
             "tensor 'x' has an absurd dimension 4611686018427387904");
  EXPECT_HAS(with(raw_tensor("x", f32, {4, ~0ull})), "absurd dimension");
  // Each dimension alone is allowed (2^40), their product overflows int64.
  EXPECT_HAS(with(raw_tensor("x", f32, {1ull << 40, 1ull << 40})), "absurd dimension");
  EXPECT_HAS(with(raw_tensor("x", f32, {1ull << 31, 1ull << 31, 1ull << 31})), "absurd dimension");
  // Elements fit int64 (2^62), bytes do not (8 * 2^62).
  EXPECT_HAS(with(raw_tensor("x", uint32_t(GgmlType::F64), {1ull << 31, 1ull << 31})), "size overflows");
  // A zero dimension.
  EXPECT_HAS(with(raw_tensor("x", f32, {4, 0})), "absurd dimension 0");
  // Plausible per dimension, far larger than the file.
  EXPECT_HAS(with(raw_tensor("x", f32, {1ull << 40})), "extends beyond the end of the file");
}

TEST(GgufBad, DimensionCount) {
  TempDir dir;
  for (const auto& ne : {std::vector<uint64_t>{}, std::vector<uint64_t>{1, 1, 1, 1, 2}}) {
    GgufWriter w = small_writer();
    w.add_tensor_raw(raw_tensor("x", uint32_t(GgmlType::F32), ne));
    EXPECT_HAS(write_error(dir, w), fmt::format("tensor 'x' has {} dimensions", ne.size()));
  }
  GgufWriter w = small_writer();
  w.add_tensor_raw(raw_tensor("x4", uint32_t(GgmlType::F32), {2, 2, 2, 2}));
  w.write(dir.file("ok.gguf"));
  EXPECT_EQ(GgufFile::open(dir.file("ok.gguf")).tensor("x4").n_elems, 16);
}

TEST(GgufBad, UnknownTensorType) {
  TempDir dir;
  // 4 and 5 are retired ids, 31-33 retired repacked types, 43+ not defined.
  for (uint32_t id : {4u, 5u, 31u, 36u, 43u, 99u, 0xFFFFFFFFu}) {
    GgufWriter w = small_writer();
    w.add_tensor_raw(raw_tensor("x", id, {32}));
    EXPECT_HAS(write_error(dir, w), fmt::format("tensor 'x' has unknown type id {}", id));
  }
}

TEST(GgufBad, RowNotMultipleOfBlock) {
  TempDir dir;
  GgufWriter w = small_writer();
  w.add_tensor_raw(raw_tensor("x", uint32_t(GgmlType::Q4_0), {33, 2}));
  EXPECT_HAS(write_error(dir, w), "row length 33 is not a multiple of the Q4_0 block size 32");
}

TEST(GgufBad, UnknownMetadataType) {
  TempDir dir;
  GgufWriter w = small_writer();
  w.add_raw("weird", 13, Bytes(8, 0));
  EXPECT_HAS(write_error(dir, w), "metadata 'weird': unknown value type 13");
  w = small_writer();
  w.add_raw("weird", 0x80000000u, Bytes(8, 0));
  EXPECT_HAS(write_error(dir, w), "unknown value type 2147483648");
  w = small_writer();
  w.add("weird_arr", V::array_header(13, 1, Bytes(8, 0)));
  EXPECT_HAS(write_error(dir, w), "metadata 'weird_arr': unknown array element type 13");
}

TEST(GgufBad, BoolOutOfRange) {
  TempDir dir;
  GgufWriter w = small_writer();
  w.add_raw("flag", uint32_t(GgufType::BOOL), {2});
  EXPECT_HAS(write_error(dir, w), "'flag': bool value 2 is neither 0 nor 1");
}

TEST(GgufBad, TensorOffsets) {
  TempDir dir;
  GgufWriter w = small_writer();
  w.tensors[1].offset = 36;  // not a multiple of 32
  EXPECT_HAS(write_error(dir, w), "tensor 'b': offset 36 is not aligned to 32");
  w = small_writer();
  w.tensors[2].offset = 1ull << 40;
  EXPECT_HAS(write_error(dir, w), "tensor 'c' (10 bytes");
  EXPECT_HAS(write_error(dir, w), "extends beyond the end of the file");
  w = small_writer();
  w.tensors[2].offset = ~0ull << 5;  // aligned, and data_start + offset would wrap around
  EXPECT_HAS(write_error(dir, w), "extends beyond the end of the file");
}

TEST(GgufBad, TensorDataBeyondEof) {
  TempDir dir;
  GgufWriter w = small_writer();
  // Declares 1024 floats, carries 16 bytes.
  w.add_tensor_raw(raw_tensor("big", uint32_t(GgmlType::F32), {1024}, Bytes(16, 0)));
  const std::string msg = write_error(dir, w);
  EXPECT_HAS(msg, "tensor 'big' (4096 bytes");
  EXPECT_HAS(msg, "extends beyond the end of the file");
}

TEST(GgufBad, DuplicateKeyAndTensor) {
  TempDir dir;
  GgufWriter w = small_writer();
  w.add_u32("answer", 43);
  EXPECT_HAS(write_error(dir, w), "duplicate metadata key 'answer'");
  w = small_writer();
  w.add_tensor_f32("a", {1}, {0.0f});
  EXPECT_HAS(write_error(dir, w), "duplicate tensor name 'a'");
}

TEST(GgufBad, Alignment) {
  TempDir dir;
  for (uint64_t a : {0ull, 3ull, 48ull, 1ull << 21}) {
    GgufWriter w = small_writer();
    w.set("general.alignment", V::u64(a));
    EXPECT_HAS(write_error(dir, w), fmt::format("general.alignment {} is not a power of two", a));
  }
  GgufWriter w = small_writer();
  w.set("general.alignment", V::string("32"));
  EXPECT_HAS(write_error(dir, w), "'general.alignment' should be a non-negative integer");
}

TEST(GgufBad, ErrorsNameTheFile) {
  TempDir dir;
  GgufWriter w = small_writer();
  w.version = 7;
  const std::string path = dir.file("named.gguf");
  w.write(path);
  EXPECT_HAS(open_error(path), path + ":");
}

// Random bit flips in a valid file: whatever they hit, the reader returns or throws lp::Error.
TEST(GgufBad, RandomCorruptionNeverCrashes) {
  TempDir dir;
  GgufLayout lay;
  const Bytes full = small_writer().bytes(&lay);
  std::mt19937 rng(7);
  const std::string path = dir.file("fuzz.gguf");
  int errors = 0;
  for (int iter = 0; iter < 400; ++iter) {
    Bytes b = full;
    const int flips = 1 + int(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      // Mostly in the header and metadata, where the structure is.
      const size_t pos = rng() % lay.data_start;
      b[pos] ^= uint8_t(1u << (rng() % 8));
    }
    testing::write_file(path, b);
    try {
      GgufFile::open(path);
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
}

// ---- ModelConfig ---------------------------------------------------------------------------

std::string config_error(const TempDir& dir, const GgufWriter& w) {
  const std::string path = dir.file("cfg.gguf");
  w.write(path);
  try {
    const GgufFile f = GgufFile::open(path);
    config_from_gguf(f);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected lp::Error from config_from_gguf";
  return "";
}

int64_t total_elems(const GgufFile& f) {
  int64_t n = 0;
  for (const auto& t : f.tensors()) n += t.n_elems;
  return n;
}

TEST(ConfigFromGguf, TinyModel) {
  TempDir dir;
  const std::string path = testing::write_tiny_model(dir.file("tiny.gguf"));
  const GgufFile f = GgufFile::open(path);
  const ModelConfig c = config_from_gguf(f);
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.name, "tiny-test-model");
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.n_ff, 96);
  EXPECT_EQ(c.n_vocab, testing::tiny_vocab_size());
  EXPECT_EQ(c.n_vocab, 256 + 40 + 3);
  EXPECT_EQ(c.n_ctx_train, 512);
  EXPECT_EQ(c.rope_dim, 16);
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.rms_eps, 1e-5f);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.has_rope_freqs);
  EXPECT_EQ(c.q_dim(), 64);
  EXPECT_EQ(c.kv_dim(), 32);
  // Per layer: q 64*64 + k,v 2*64*32 + o 64*64 + gate/up/down 3*64*96 + 2 norms of 64 = 30848.
  // Two layers, embedding 299*64 = 19136, output norm 64.
  EXPECT_EQ(c.n_params(), 2 * 30848 + 19136 + 64);
  EXPECT_EQ(c.n_params(), total_elems(f));
  const auto names = required_tensor_names(c);
  EXPECT_EQ(names.size(), 2u + 9 * 2);
  for (const auto& n : names) EXPECT_NE(f.find_tensor(n), nullptr) << n;
  EXPECT_EQ(names.size(), f.tensors().size());
}

TEST(ConfigFromGguf, UntiedEmbeddings) {
  TempDir dir;
  TinyModelSpec s;
  s.tied = false;
  const GgufFile f = GgufFile::open(testing::write_tiny_model(dir.file("untied.gguf"), s));
  const ModelConfig c = config_from_gguf(f);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.n_params(), total_elems(f));
  const auto names = required_tensor_names(c);
  EXPECT_EQ(names.size(), 3u + 9 * 2);
  EXPECT_NE(std::find(names.begin(), names.end(), "output.weight"), names.end());
}

TEST(ConfigFromGguf, WeightTypesAndShapes) {
  TempDir dir;
  for (GgmlType wt : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
    TinyModelSpec s;
    s.weight_type = wt;
    s.n_layer = 3;
    s.n_embd = 48;
    s.n_head = 6;
    s.n_head_kv = 1;
    s.n_ff = 40;
    s.n_ctx = 77;
    s.rope_theta = 500000.0f;
    s.seed = 11;
    const GgufFile f = GgufFile::open(testing::write_tiny_model(dir.file("m.gguf"), s));
    const ModelConfig c = config_from_gguf(f);
    EXPECT_EQ(c.n_layer, 3);
    EXPECT_EQ(c.head_dim, 8);
    EXPECT_EQ(c.n_head_kv, 1);
    EXPECT_EQ(c.kv_dim(), 8);
    EXPECT_EQ(c.n_ctx_train, 77);
    EXPECT_EQ(c.rope_theta, 500000.0f);
    EXPECT_EQ(f.tensor("blk.2.attn_q.weight").type, wt);
    EXPECT_EQ(f.tensor("blk.2.attn_norm.weight").type, GgmlType::F32);
    EXPECT_EQ(f.tensor("blk.2.ffn_down.weight").ne, (std::vector<int64_t>{40, 48}));
  }
}

TEST(ConfigFromGguf, MistralIsLlamaFamily) {
  TempDir dir;
  TinyModelSpec s;
  s.arch = "mistral";
  const GgufFile f = GgufFile::open(testing::write_tiny_model(dir.file("m.gguf"), s));
  EXPECT_EQ(config_from_gguf(f).arch, "mistral");
}

TEST(ConfigFromGguf, IntegerKeysOfAnyWidth) {
  TempDir dir;
  GgufWriter w = testing::tiny_model_writer();
  w.set("llama.block_count", V::i32(2));
  w.set("llama.embedding_length", V::u64(64));
  w.set("llama.attention.head_count", V::u8(4));
  w.set("llama.rope.freq_base", V::f64(20000.0));
  w.write(dir.file("m.gguf"));
  const ModelConfig c = config_from_gguf(GgufFile::open(dir.file("m.gguf")));
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.rope_theta, 20000.0f);
}

TEST(ConfigFromGguf, HeadCountKvDefaultsToHeadCount) {
  TempDir dir;
  TinyModelSpec s;
  s.n_head_kv = s.n_head;
  GgufWriter w = testing::tiny_model_writer(s);
  ASSERT_TRUE(w.remove("llama.attention.head_count_kv"));
  w.write(dir.file("m.gguf"));
  EXPECT_EQ(config_from_gguf(GgufFile::open(dir.file("m.gguf"))).n_head_kv, 4);
}

// The later architectures' own metadata and tensors, broken one at a time in the files llama.cpp's
// references were made on (tests/tiny_arch.h): one line naming the file and the field.
TEST(ConfigBad, QwenTensorsAndMetadata) {
  TempDir dir;
  GgufWriter w = testing::tiny_arch_writer("qwen2", false);
  w.remove_tensor("blk.1.attn_k.bias");
  EXPECT_HAS(config_error(dir, w), "tensor 'blk.1.attn_k.bias' is missing where blk.0 has Q/K/V biases");
  w = testing::tiny_arch_writer("qwen2", false);
  w.find_tensor("blk.0.attn_v.bias")->ne = {7};
  EXPECT_HAS(config_error(dir, w), "tensor 'blk.0.attn_v.bias' has shape [7], expected [32]");
  w = testing::tiny_arch_writer("qwen3", false);
  w.remove_tensor("blk.0.attn_q_norm.weight");
  EXPECT_HAS(config_error(dir, w), "blk.0.attn_q_norm.weight");
  w = testing::tiny_arch_writer("qwen3", false);
  w.find_tensor("blk.1.attn_k_norm.weight")->ne = {16};
  EXPECT_HAS(config_error(dir, w), "tensor 'blk.1.attn_k_norm.weight' has shape [16], expected [32]");
  // A head width that does not tile the model width is Qwen3's normal case (key_length given) ...
  w = testing::tiny_arch_writer("qwen3", false);
  w.write(dir.file("q3.gguf"));
  const ModelConfig c = config_from_gguf(GgufFile::open(dir.file("q3.gguf")));
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.q_dim(), 128);
  EXPECT_TRUE(c.qk_norm && c.rope_neox && !c.attention_bias);
  // ... and an absurd one is refused like any dimension.
  w.set("qwen3.attention.key_length", testing::GgufWriterValue::u32(1u << 20));
  EXPECT_HAS(config_error(dir, w), "attention.key_length");
}

// Mixture-of-experts files (qwen3moe; llama with expert_count: Mixtral): the counts read and checked
// against each other and against the 3-D expert tensors and the router, one line naming the field.
TEST(ConfigBad, ExpertCountsAndTensors) {
  TempDir dir;
  const auto config = [&](const GgufWriter& w) {
    w.write(dir.file("moe.gguf"));
    return config_from_gguf(GgufFile::open(dir.file("moe.gguf")));
  };
  ModelConfig c = config(testing::tiny_arch_writer("qwen3moe", false));
  EXPECT_TRUE(c.moe() && c.qk_norm && c.rope_neox);
  EXPECT_EQ(c.n_expert, 8);
  EXPECT_EQ(c.n_expert_used, 3);
  EXPECT_EQ(c.n_ff_exp, 32);  // expert_feed_forward_length, not feed_forward_length
  c = config(testing::tiny_arch_writer("mixtral", false));
  EXPECT_TRUE(c.moe() && !c.qk_norm && !c.rope_neox);
  EXPECT_EQ(c.n_ff_exp, c.n_ff);  // Mixtral's experts are feed_forward_length wide
  using V = testing::GgufWriterValue;
  const auto bad = [&](const char* arch, const std::function<void(GgufWriter&)>& edit) {
    GgufWriter w = testing::tiny_arch_writer(arch, false);
    edit(w);
    return config_error(dir, w);
  };
  EXPECT_HAS(bad("qwen3moe", [](GgufWriter& w) { w.set("qwen3moe.expert_used_count", V::u32(9)); }),
             "qwen3moe.expert_used_count 9 is outside [1, expert_count 8]");
  EXPECT_HAS(bad("qwen3moe", [](GgufWriter& w) { w.set("qwen3moe.expert_used_count", V::u32(0)); }),
             "qwen3moe.expert_used_count 0 is outside [1, expert_count 8]");
  EXPECT_HAS(bad("qwen3moe", [](GgufWriter& w) { w.remove("qwen3moe.expert_used_count"); }),
             "qwen3moe.expert_used_count is missing");
  EXPECT_HAS(bad("qwen3moe", [](GgufWriter& w) { w.remove("qwen3moe.expert_count"); }),
             "missing metadata key 'qwen3moe.expert_count'");
  EXPECT_HAS(bad("qwen3moe", [](GgufWriter& w) { w.set("qwen3moe.expert_count", V::u32(1u << 30)); }),
             "'qwen3moe.expert_count' = 1073741824 is outside the plausible range [1, 1024]");
  // The counts disagree with the tensors: more experts than the 3-D tensors hold, a wider expert.
  EXPECT_HAS(bad("qwen3moe", [](GgufWriter& w) { w.set("qwen3moe.expert_count", V::u32(16)); }),
             "tensor 'blk.0.ffn_gate_inp.weight' has shape [64, 8], expected [64, 16]");
  EXPECT_HAS(bad("qwen3moe", [](GgufWriter& w) { w.set("qwen3moe.expert_feed_forward_length", V::u32(64)); }),
             "tensor 'blk.0.ffn_gate_exps.weight' has shape [64, 32, 8], expected [64, 64, 8]");
  EXPECT_HAS(bad("mixtral",
                 [](GgufWriter& w) {
                   w.find_tensor("blk.1.ffn_down_exps.weight")->ne = {64, 64, 3};
                 }),
             "tensor 'blk.1.ffn_down_exps.weight' has shape [64, 64, 3], expected [64, 64, 4]");
  // The router of the wrong shape, or missing; experts one tensor each (an old layout).
  EXPECT_HAS(bad("mixtral",
                 [](GgufWriter& w) {
                   w.find_tensor("blk.0.ffn_gate_inp.weight")->ne = {32, 4};
                 }),
             "tensor 'blk.0.ffn_gate_inp.weight' has shape [32, 4], expected [64, 4]");
  EXPECT_HAS(bad("qwen3moe", [](GgufWriter& w) { w.remove_tensor("blk.1.ffn_gate_inp.weight"); }),
             "blk.1.ffn_gate_inp.weight");
  EXPECT_HAS(bad("qwen3moe", [](GgufWriter& w) { w.set("qwen3moe.expert_shared_count", V::u32(1)); }),
             "qwen3moe.expert_shared_count 1: shared experts are not supported");
  // A llama file with expert_count 0 is dense, and then needs the dense tensors.
  EXPECT_HAS(bad("mixtral", [](GgufWriter& w) { w.set("llama.expert_count", V::u32(0)); }),
             "blk.0.ffn_gate.weight");
}

// Gemma 3's keys: the window and which layers slide (a period, 6 by default, or one flag per layer),
// the scales, and what is refused.
TEST(ConfigGemma3, LayersWindowsAndScales) {
  TempDir dir;
  const auto config = [&](const GgufWriter& w) {
    w.write(dir.file("g.gguf"));
    return config_from_gguf(GgufFile::open(dir.file("g.gguf")));
  };
  GgufWriter w = testing::tiny_arch_writer("gemma3", false);
  ModelConfig c = config(w);
  EXPECT_EQ(c.layer_window, (std::vector<int>{6, 6, 6, 6, 6, 0}));  // the sixth layer of every six is global
  EXPECT_EQ(c.global_layers(), std::vector<int>{5});
  EXPECT_EQ(c.embed_scale, 8.0f);  // sqrt(64)
  EXPECT_TRUE(c.post_norms && c.gelu && c.qk_norm && c.rope_neox);
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.0f / std::sqrt(32.0f));
  EXPECT_EQ(c.rope_base(0), 10000.0f);  // local layers: 10000 unless rope.freq_base_swa says
  EXPECT_EQ(c.rope_base(5), 1e6f);
  w.set("gemma3.attention.sliding_window_pattern", testing::GgufWriterValue::u32(3));
  EXPECT_EQ(config(w).layer_window, (std::vector<int>{6, 6, 0, 6, 6, 0}));
  EXPECT_EQ(config(w).global_layers(), (std::vector<int>{2, 5}));
  EXPECT_TRUE(config(testing::tiny_arch_writer("qwen3", false)).global_layers().empty());  // no windows
  std::vector<testing::GgufWriterValue> flags;
  for (bool b : {true, false, true, false, true, false})
    flags.push_back(testing::GgufWriterValue::boolean(b));
  w.set("gemma3.attention.sliding_window_pattern", testing::GgufWriterValue::array(GgufType::BOOL, flags));
  EXPECT_EQ(config(w).layer_window, (std::vector<int>{6, 0, 6, 0, 6, 0}));
  w.set("gemma3.rope.freq_base_swa", testing::GgufWriterValue::f32(500.f));
  w.set("gemma3.rope.scaling.type", testing::GgufWriterValue::string("linear"));
  w.set("gemma3.rope.scaling.factor", testing::GgufWriterValue::f32(8.f));
  c = config(w);
  EXPECT_EQ(c.rope_base(0), 500.f);
  EXPECT_EQ(c.rope_scale(0), 1.f);  // linear scaling is the global layers'
  EXPECT_EQ(c.rope_scale(1), 0.125f);
  // No window key: every layer global.
  w = testing::tiny_arch_writer("gemma3", false);
  w.remove("gemma3.attention.sliding_window");
  EXPECT_TRUE(config(w).layer_window.empty());
}

TEST(ConfigBad, Gemma3Metadata) {
  TempDir dir;
  GgufWriter w = testing::tiny_arch_writer("gemma3", false);
  for (const uint32_t bad : {0u, 513u}) {
    w.set("gemma3.attention.sliding_window", testing::GgufWriterValue::u32(bad));
    EXPECT_HAS(config_error(dir, w), "gemma3.attention.sliding_window " + std::to_string(bad) +
                                         " is outside [1, context_length 512]");
  }
  w = testing::tiny_arch_writer("gemma3", false);
  w.set("gemma3.attention.sliding_window_pattern",
        testing::GgufWriterValue::array(GgufType::BOOL, {testing::GgufWriterValue::boolean(true)}));
  EXPECT_HAS(config_error(dir, w),
             "gemma3.attention.sliding_window_pattern must be 6 booleans, one per layer");
  w.set("gemma3.attention.sliding_window_pattern", testing::GgufWriterValue::u32(0));
  EXPECT_HAS(config_error(dir, w), "gemma3.attention.sliding_window_pattern 0 is outside [1, 7]");
  w = testing::tiny_arch_writer("gemma3", false);
  w.set("gemma3.final_logit_softcapping", testing::GgufWriterValue::f32(30.f));
  EXPECT_HAS(config_error(dir, w), "gemma3.final_logit_softcapping 30 is not supported");
  w = testing::tiny_arch_writer("gemma3", false);
  w.remove_tensor("blk.3.post_ffw_norm.weight");
  EXPECT_HAS(config_error(dir, w), "blk.3.post_ffw_norm.weight");
}

TEST(ConfigBad, UnsupportedArchitecture) {
  TempDir dir;
  for (const char* arch : {"gpt2", "bert"}) {
    TinyModelSpec s;
    s.arch = arch;
    const std::string e = config_error(dir, testing::tiny_model_writer(s));
    EXPECT_HAS(e, std::string("general.architecture '") + arch + "' is not supported");
    EXPECT_HAS(
        e, "supported: llama (Mixtral included), mistral, qwen2, qwen3, gemma3, qwen3moe");  // the list, so a
                                                                                             // user knows
                                                                                             // what runs
  }
  GgufWriter w = testing::tiny_model_writer();
  w.remove("general.architecture");
  EXPECT_HAS(config_error(dir, w), "missing metadata key 'general.architecture'");
}

TEST(ConfigBad, MissingKeys) {
  TempDir dir;
  for (const char* key : {"llama.block_count", "llama.embedding_length", "llama.feed_forward_length",
                          "llama.attention.head_count", "llama.context_length"}) {
    GgufWriter w = testing::tiny_model_writer();
    ASSERT_TRUE(w.remove(key));
    EXPECT_HAS(config_error(dir, w), std::string("missing metadata key '") + key + "'");
  }
  GgufWriter w = testing::tiny_model_writer();
  w.set("llama.block_count", V::string("2"));
  EXPECT_HAS(config_error(dir, w), "'llama.block_count' should be a non-negative integer");
}

TEST(ConfigBad, HeadCounts) {
  TempDir dir;
  GgufWriter w = testing::tiny_model_writer();
  w.set("llama.attention.head_count", V::u32(5));
  EXPECT_HAS(config_error(dir, w), "embedding_length 64 is not a multiple of head_count 5");
  w = testing::tiny_model_writer();
  w.set("llama.attention.head_count_kv", V::u32(3));
  EXPECT_HAS(config_error(dir, w), "head_count 4 is not a multiple of head_count_kv 3");
  w = testing::tiny_model_writer();
  w.set("llama.attention.head_count", V::u32(0));
  EXPECT_HAS(config_error(dir, w), "'llama.attention.head_count' = 0 is outside the plausible range");
}

TEST(ConfigBad, AbsurdValues) {
  TempDir dir;
  GgufWriter w = testing::tiny_model_writer();
  w.set("llama.embedding_length", V::u64(1ull << 40));
  EXPECT_HAS(config_error(dir, w), "'llama.embedding_length' = 1099511627776 is outside the plausible range");
  w = testing::tiny_model_writer();
  w.set("llama.block_count", V::i32(-1));
  EXPECT_HAS(config_error(dir, w), "should be a non-negative integer");
  w = testing::tiny_model_writer();
  w.set("llama.rope.dimension_count", V::u32(18));
  EXPECT_HAS(config_error(dir, w), "rope.dimension_count 18 does not fit head width 16");
  w = testing::tiny_model_writer();
  w.set("llama.attention.layer_norm_rms_epsilon", V::f32(-1.0f));
  EXPECT_HAS(config_error(dir, w), "layer_norm_rms_epsilon -1 is invalid");
  w = testing::tiny_model_writer();
  w.set("llama.vocab_size", V::u32(300));
  EXPECT_HAS(config_error(dir, w), "vocab_size 300 differs from token_embd rows 299");
}

TEST(ConfigBad, TensorShapes) {
  TempDir dir;
  GgufWriter w = testing::tiny_model_writer();
  GgufWriterTensor* k = w.find_tensor("blk.1.attn_k.weight");
  ASSERT_NE(k, nullptr);
  k->ne = {64, 48};
  k->data.resize(64 * 48 * 4);
  EXPECT_HAS(config_error(dir, w), "tensor 'blk.1.attn_k.weight' has shape [64, 48], expected [64, 32]");

  w = testing::tiny_model_writer();
  GgufWriterTensor* down = w.find_tensor("blk.0.ffn_down.weight");
  down->ne = {64, 96};  // transposed
  EXPECT_HAS(config_error(dir, w), "tensor 'blk.0.ffn_down.weight' has shape [64, 96], expected [96, 64]");

  w = testing::tiny_model_writer();
  w.find_tensor("output_norm.weight")->ne = {16, 4};
  EXPECT_HAS(config_error(dir, w), "tensor 'output_norm.weight' has shape [16, 4], expected [64]");

  w = testing::tiny_model_writer();
  w.find_tensor("token_embd.weight")->ne = {32, 598};
  EXPECT_HAS(config_error(dir, w), "token_embd.weight has shape [32, 598], expected [64, vocab]");

  TinyModelSpec s;
  s.tied = false;
  w = testing::tiny_model_writer(s);
  w.find_tensor("output.weight")->ne = {64, 13, 23};
  EXPECT_HAS(config_error(dir, w), "tensor 'output.weight' has shape [64, 13, 23], expected [64, 299]");
}

TEST(ConfigBad, MissingTensors) {
  TempDir dir;
  GgufWriter w = testing::tiny_model_writer();
  ASSERT_TRUE(w.remove_tensor("blk.1.ffn_down.weight"));
  EXPECT_HAS(config_error(dir, w), "missing tensor 'blk.1.ffn_down.weight'");
  w = testing::tiny_model_writer();
  w.remove_tensor("token_embd.weight");
  EXPECT_HAS(config_error(dir, w), "missing tensor 'token_embd.weight'");
  w = testing::tiny_model_writer();
  w.set("llama.block_count", V::u32(3));  // claims a layer the file does not have
  EXPECT_HAS(config_error(dir, w), "missing tensor 'blk.2.attn_norm.weight'");
}

}  // namespace
}  // namespace lp

namespace lp {
namespace {

// This process's resident file-backed memory (RssFile in /proc/self/status), in KiB.
int64_t rss_file_kib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("RssFile:", 0) == 0) return std::stoll(line.substr(8));
  return -1;
}

// drop_pages takes a tensor's pages out of the resident set and leaves its bytes readable and
// unchanged (the kernel reads them again); ranges outside the mapping and empty ones are ignored.
TEST(GgufRead, DroppedPagesReadTheSameBytes) {
  TempDir dir;
  testing::GgufWriter w;
  w.set_alignment(4096);
  std::vector<float> v(1 << 20);  // 4 MiB: 1,024 pages
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.5f;
  w.add_tensor_f32("t", {int64_t(v.size())}, v);
  const std::string path = dir.file("pages.gguf");
  w.write(path);
  const GgufFile f = GgufFile::open(path);
  const GgufTensor& t = f.tensor("t");
  ASSERT_EQ(std::memcmp(t.data, v.data(), v.size() * 4), 0);
  const int64_t read = rss_file_kib();
  f.drop_pages(t.data, uint64_t(t.n_bytes));
  f.drop_pages(t.data, 0);
  f.drop_pages(reinterpret_cast<const uint8_t*>(v.data()), 64);  // not in the mapping: ignored
  const int64_t dropped = rss_file_kib();
  EXPECT_EQ(std::memcmp(t.data, v.data(), v.size() * 4), 0);
  const int64_t again = rss_file_kib();
  ASSERT_GT(read, 0);
  EXPECT_GE(read - dropped, 3 * 1024) << read << " KiB resident before, " << dropped << " after";
  EXPECT_GE(again - dropped, 3 * 1024)
      << dropped << " KiB resident after the drop, " << again << " read again";
}

}  // namespace
}  // namespace lp
