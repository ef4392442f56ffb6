// GGUF reader: versions 2 and 3, little-endian, memory-mapped.
//
// Layout (docs/gguf.md): magic "GGUF", u32 version, u64 tensor count, u64 metadata count,
// metadata key/value pairs, tensor infos (name, dims, type, offset), padding to
// `general.alignment` (default 32), then tensor data. Every count and length read from the
// file is checked against the bytes that remain before anything is allocated, so a corrupt or
// hostile file gets an lp::Error, never a huge allocation or a read past the end.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "model/quant.h"

namespace lp {

enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};

const char* gguf_type_name(GgufType t);

struct GgufValue;

struct GgufArray {
  GgufType elem_type = GgufType::U8;
  std::vector<GgufValue> items;
};

// One metadata value. Integers keep their signedness; floats widen to double (exact).
struct GgufValue {
  GgufType type = GgufType::U8;
  std::variant<uint64_t, int64_t, double, bool, std::string, GgufArray> v;
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;  // ne[0] is the contiguous (fastest) dimension
  uint64_t offset = 0;      // from the start of the data section
  int64_t n_elems = 0;
  int64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping

  int64_t rows() const { return ne.empty() ? 0 : n_elems / ne[0]; }
};

class GgufFile {
 public:
  // Maps and parses `path`. Throws lp::Error naming the file and the problem.
  static GgufFile open(const std::string& path);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }

  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const GgufValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }

  // Typed accessors: throw lp::Error if the key is missing or has an incompatible type.
  // Integer accessors accept any integer type whose value fits.
  uint64_t get_uint(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;  // accepts F32/F64 and integers
  bool get_bool(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  const GgufArray& get_array(const std::string& key) const;

  std::optional<uint64_t> opt_uint(const std::string& key) const;
  std::optional<double> opt_float(const std::string& key) const;
  std::optional<bool> opt_bool(const std::string& key) const;
  std::optional<std::string> opt_string(const std::string& key) const;

  // Drops the mapping's pages inside [p, p + n) from this process's resident set (madvise
  // MADV_DONTNEED on the whole pages within): the kernel reads them from the page cache again if
  // they are touched. For tensors that were copied out, or checked and not needed yet, so that
  // loading does not hold the file's pages and their copies at once.
  void drop_pages(const uint8_t* p, uint64_t n) const;

  // Frees the metadata (the tokenizer's arrays are most of it) once the model has read it: a
  // file kept mapped for its weights need not hold it. Metadata lookups find nothing after.
  void drop_metadata() { std::map<std::string, GgufValue>().swap(kv_); }

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(const std::string& name) const;
  const GgufTensor& tensor(const std::string& name) const;  // throws if missing

 private:
  GgufFile() = default;
  void parse();

  std::string path_;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Renders a metadata value for `inspect` (arrays show their type, length and first items).
std::string gguf_value_summary(const GgufValue& v, size_t max_items = 8);

}  // namespace lp
