#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "model/error.h"

namespace lp {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr int kMaxDims = 4;              // ggml tensors have at most 4 dimensions
constexpr uint64_t kMaxNesting = 4;      // arrays of arrays: GGUF allows it; bound the depth

// Sequential reader over the mapped bytes; every read is bounds-checked.
class Cursor {
 public:
  Cursor(const uint8_t* p, uint64_t size, const std::string& path) : p_(p), size_(size), path_(path) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, const char* what) const {
    if (n > remaining())
      fail("{}: truncated file: {} needs {} bytes at offset {}, only {} remain", path_, what, n, pos_,
           remaining());
  }
  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    const uint64_t n = read<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), n);
    pos_ += n;
    return s;
  }

 private:
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& path_;
};

// Smallest number of bytes one value of `t` occupies; bounds array counts before reserving.
uint64_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::BOOL:
      return 1;
    case GgufType::U16:
    case GgufType::I16:
      return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
    case GgufType::STRING:  // u64 length
      return 8;
    case GgufType::ARRAY:  // u32 type + u64 count
      return 12;
  }
  return 1;
}

bool valid_type(uint32_t t) {
  return t <= static_cast<uint32_t>(GgufType::F64);
}

GgufValue read_value(Cursor& c, GgufType t, const std::string& key, const std::string& path, uint64_t depth) {
  GgufValue out;
  out.type = t;
  switch (t) {
    case GgufType::U8:
      out.v = uint64_t{c.read<uint8_t>("u8 value")};
      break;
    case GgufType::I8:
      out.v = int64_t{c.read<int8_t>("i8 value")};
      break;
    case GgufType::U16:
      out.v = uint64_t{c.read<uint16_t>("u16 value")};
      break;
    case GgufType::I16:
      out.v = int64_t{c.read<int16_t>("i16 value")};
      break;
    case GgufType::U32:
      out.v = uint64_t{c.read<uint32_t>("u32 value")};
      break;
    case GgufType::I32:
      out.v = int64_t{c.read<int32_t>("i32 value")};
      break;
    case GgufType::U64:
      out.v = c.read<uint64_t>("u64 value");
      break;
    case GgufType::I64:
      out.v = c.read<int64_t>("i64 value");
      break;
    case GgufType::F32:
      out.v = double{c.read<float>("f32 value")};
      break;
    case GgufType::F64:
      out.v = c.read<double>("f64 value");
      break;
    case GgufType::BOOL: {
      const uint8_t b = c.read<uint8_t>("bool value");
      if (b > 1) fail("{}: metadata '{}': bool value {} is neither 0 nor 1", path, key, b);
      out.v = b == 1;
      break;
    }
    case GgufType::STRING:
      out.v = c.read_string("string value");
      break;
    case GgufType::ARRAY: {
      if (depth >= kMaxNesting) fail("{}: metadata '{}': arrays nested too deeply", path, key);
      const uint32_t et = c.read<uint32_t>("array type");
      if (!valid_type(et)) fail("{}: metadata '{}': unknown array element type {}", path, key, et);
      const uint64_t n = c.read<uint64_t>("array length");
      const auto elem = static_cast<GgufType>(et);
      if (n > c.remaining() / min_value_bytes(elem))
        fail("{}: metadata '{}': array of {} elements does not fit in the {} bytes left", path, key, n,
             c.remaining());
      GgufArray arr;
      arr.elem_type = elem;
      arr.items.reserve(n);
      for (uint64_t i = 0; i < n; ++i) arr.items.push_back(read_value(c, elem, key, path, depth + 1));
      out.v = std::move(arr);
      break;
    }
  }
  return out;
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8:
      return "u8";
    case GgufType::I8:
      return "i8";
    case GgufType::U16:
      return "u16";
    case GgufType::I16:
      return "i16";
    case GgufType::U32:
      return "u32";
    case GgufType::I32:
      return "i32";
    case GgufType::F32:
      return "f32";
    case GgufType::BOOL:
      return "bool";
    case GgufType::STRING:
      return "string";
    case GgufType::ARRAY:
      return "array";
    case GgufType::U64:
      return "u64";
    case GgufType::I64:
      return "i64";
    case GgufType::F64:
      return "f64";
  }
  return "?";
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.path_ = path;
  // Non-blocking, so a FIFO given as the model cannot hang open(); it is refused below.
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (f.fd_ < 0) fail("{}: cannot open model file: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd_, &st) != 0) fail("{}: cannot stat: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("{}: not a regular file", path);
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ < 24) fail("{}: not a GGUF file: {} bytes is shorter than the header", path, f.size_);
  void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_SHARED, f.fd_, 0);
  if (p == MAP_FAILED) fail("{}: cannot map file: {}", path, std::strerror(errno));
  f.base_ = static_cast<const uint8_t*>(p);
  f.parse();
  return f;
}

GgufFile::GgufFile(GgufFile&& o) noexcept {
  *this = std::move(o);
}

GgufFile& GgufFile::operator=(GgufFile&& o) noexcept {
  if (this != &o) {
    // Release what this one holds. Not via this->~GgufFile(): that also destroys the members
    // assigned below (use after destruction; a double free once kv_ held anything).
    if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    version_ = o.version_;
    alignment_ = o.alignment_;
    kv_ = std::move(o.kv_);
    tensors_ = std::move(o.tensors_);
    tensor_index_ = std::move(o.tensor_index_);
  }
  return *this;
}

void GgufFile::drop_pages(const uint8_t* p, uint64_t n) const {
  const uint64_t page = uint64_t(::sysconf(_SC_PAGESIZE));
  if (!base_ || p < base_ || n == 0) return;
  const uint64_t from = (uint64_t(p - base_) + page - 1) / page * page,
                 to = std::min<uint64_t>(uint64_t(p - base_) + n, size_) / page * page;
  if (to > from) ::madvise(const_cast<uint8_t*>(base_ + from), to - from, MADV_DONTNEED);  // advice only
}

GgufFile::~GgufFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
  base_ = nullptr;
  fd_ = -1;
}

void GgufFile::parse() {
  Cursor c(base_, size_, path_);
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kMagic) {
    fail("{}: not a GGUF file (magic {:02x} {:02x} {:02x} {:02x}, expected 'GGUF')", path_, base_[0],
         base_[1], base_[2], base_[3]);
  }
  version_ = c.read<uint32_t>("version");
  if (version_ == 1) fail("{}: GGUF version 1 is not supported (only 2 and 3)", path_);
  if (version_ != 2 && version_ != 3) {
    if (version_ == 0x02000000 || version_ == 0x03000000)  // 2 or 3 written most significant byte first
      fail("{}: big-endian GGUF files are not supported", path_);
    fail("{}: unsupported GGUF version {} (only 2 and 3)", path_, version_);
  }
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Each key/value pair takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info
  // at least 8 + 4 + 4 + 8. Bound the counts by the file size before looping.
  if (n_kv > c.remaining() / 13) fail("{}: metadata count {} is impossible for the file size", path_, n_kv);
  if (n_tensors > c.remaining() / 24)
    fail("{}: tensor count {} is impossible for the file size", path_, n_tensors);

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string("metadata key");
    const uint32_t t = c.read<uint32_t>("metadata type");
    if (!valid_type(t)) fail("{}: metadata '{}': unknown value type {}", path_, key, t);
    GgufValue v = read_value(c, static_cast<GgufType>(t), key, path_, 0);
    if (kv_.count(key)) fail("{}: duplicate metadata key '{}'", path_, key);
    kv_.emplace(std::move(key), std::move(v));
  }

  if (auto a = opt_uint("general.alignment")) {
    if (*a == 0 || (*a & (*a - 1)) != 0 || *a > 1u << 20)
      fail("{}: general.alignment {} is not a power of two (up to 1 MiB)", path_, *a);
    alignment_ = *a;
  }

  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.read_string("tensor name");
    const uint32_t nd = c.read<uint32_t>("tensor dims");
    if (nd == 0 || nd > kMaxDims)
      fail("{}: tensor '{}' has {} dimensions (1 to {} allowed)", path_, t.name, nd, kMaxDims);
    int64_t n = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t dim = c.read<uint64_t>("tensor dim");
      if (dim == 0 || dim > (1ull << 40) ||
          static_cast<uint64_t>(n) > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / dim)
        fail("{}: tensor '{}' has an absurd dimension {}", path_, t.name, dim);
      t.ne.push_back(static_cast<int64_t>(dim));
      n *= static_cast<int64_t>(dim);
    }
    t.n_elems = n;
    const uint32_t type_id = c.read<uint32_t>("tensor type");
    const auto info = type_info(type_id);
    if (!info) fail("{}: tensor '{}' has unknown type id {}", path_, t.name, type_id);
    t.type = static_cast<GgmlType>(type_id);
    if (t.ne[0] % info->block_elems != 0)
      fail("{}: tensor '{}': row length {} is not a multiple of the {} block size {}", path_, t.name, t.ne[0],
           info->name, info->block_elems);
    const auto bytes = type_bytes(t.type, n);
    if (!bytes) fail("{}: tensor '{}': size overflows", path_, t.name);
    t.n_bytes = *bytes;
    t.offset = c.read<uint64_t>("tensor offset");
    if (t.offset % alignment_ != 0)
      fail("{}: tensor '{}': offset {} is not aligned to {}", path_, t.name, t.offset, alignment_);
    if (tensor_index_.count(t.name)) fail("{}: duplicate tensor name '{}'", path_, t.name);
    tensor_index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }

  const uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  for (auto& t : tensors_) {
    if (data_start > size_ || t.offset > size_ - data_start ||
        static_cast<uint64_t>(t.n_bytes) > size_ - data_start - t.offset)
      fail("{}: tensor '{}' ({} bytes at offset {}) extends beyond the end of the file ({} bytes)", path_,
           t.name, t.n_bytes, data_start + t.offset, size_);
    t.data = base_ + data_start + t.offset;
  }
  // Tensors whose data ranges overlap would load and run on each other's bytes.
  std::vector<const GgufTensor*> by_offset;
  for (const auto& t : tensors_)
    if (t.n_bytes > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensor& a = *by_offset[i - 1];
    const GgufTensor& b = *by_offset[i];
    if (a.offset + static_cast<uint64_t>(a.n_bytes) > b.offset)
      fail("{}: tensors '{}' (offset {}, {} bytes) and '{}' (offset {}) overlap", path_, a.name, a.offset,
           a.n_bytes, b.name, b.offset);
  }
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {
const GgufValue& must(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (!v) fail("{}: missing metadata key '{}'", f.path(), key);
  return *v;
}
}  // namespace

uint64_t GgufFile::get_uint(const std::string& key) const {
  const GgufValue& v = must(*this, key);
  if (auto* u = std::get_if<uint64_t>(&v.v)) return *u;
  if (auto* i = std::get_if<int64_t>(&v.v); i && *i >= 0) return static_cast<uint64_t>(*i);
  fail("{}: metadata '{}' should be a non-negative integer, is {}", path_, key, gguf_value_summary(v));
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = must(*this, key);
  if (auto* i = std::get_if<int64_t>(&v.v)) return *i;
  if (auto* u = std::get_if<uint64_t>(&v.v);
      u && *u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return static_cast<int64_t>(*u);
  fail("{}: metadata '{}' should be an integer, is {}", path_, key, gguf_value_summary(v));
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = must(*this, key);
  if (auto* d = std::get_if<double>(&v.v)) return *d;
  if (auto* u = std::get_if<uint64_t>(&v.v)) return static_cast<double>(*u);
  if (auto* i = std::get_if<int64_t>(&v.v)) return static_cast<double>(*i);
  fail("{}: metadata '{}' should be a number, is {}", path_, key, gguf_value_summary(v));
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = must(*this, key);
  if (auto* b = std::get_if<bool>(&v.v)) return *b;
  fail("{}: metadata '{}' should be a bool, is {}", path_, key, gguf_value_summary(v));
}

const std::string& GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = must(*this, key);
  if (auto* s = std::get_if<std::string>(&v.v)) return *s;
  fail("{}: metadata '{}' should be a string, is {}", path_, key, gguf_value_summary(v));
}

const GgufArray& GgufFile::get_array(const std::string& key) const {
  const GgufValue& v = must(*this, key);
  if (auto* a = std::get_if<GgufArray>(&v.v)) return *a;
  fail("{}: metadata '{}' should be an array, is {}", path_, key, gguf_value_summary(v));
}

std::optional<uint64_t> GgufFile::opt_uint(const std::string& key) const {
  return has(key) ? std::optional(get_uint(key)) : std::nullopt;
}
std::optional<double> GgufFile::opt_float(const std::string& key) const {
  return has(key) ? std::optional(get_float(key)) : std::nullopt;
}
std::optional<bool> GgufFile::opt_bool(const std::string& key) const {
  return has(key) ? std::optional(get_bool(key)) : std::nullopt;
}
std::optional<std::string> GgufFile::opt_string(const std::string& key) const {
  return has(key) ? std::optional(get_string(key)) : std::nullopt;
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  const GgufTensor* t = find_tensor(name);
  if (!t) fail("{}: missing tensor '{}'", path_, name);
  return *t;
}

std::string gguf_value_summary(const GgufValue& v, size_t max_items) {
  return std::visit(
      [&](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          std::string s = x.size() > 80 ? x.substr(0, 77) + "..." : x;
          for (char& ch : s)
            if (ch == '\n') ch = ' ';
          return fmt::format("\"{}\"", s);
        } else if constexpr (std::is_same_v<T, GgufArray>) {
          std::string s = fmt::format("{}[{}] [", gguf_type_name(x.elem_type), x.items.size());
          for (size_t i = 0; i < x.items.size() && i < max_items; ++i)
            s += (i ? ", " : "") + gguf_value_summary(x.items[i], max_items);
          if (x.items.size() > max_items) s += ", ...";
          return s + "]";
        } else if constexpr (std::is_same_v<T, bool>) {
          return x ? "true" : "false";
        } else {
          return fmt::format("{}", x);
        }
      },
      v.v);
}

}  // namespace lp
