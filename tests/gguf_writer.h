// Test utility: a GGUF writer and a tiny random Llama-family model.
//
// The writer emits exactly what it is told, in insertion order, so tests can also build broken
// files: duplicate keys, unknown type ids, absurd counts, misaligned offsets, tensors whose
// declared shape needs more bytes than they carry. Layout written (docs/gguf.md, version 2 and 3
// share it): magic, u32 version, u64 tensor count, u64 metadata count, key/value pairs, tensor
// infos, zero padding to `alignment`, tensor data (each tensor starts at a multiple of
// `alignment` from the start of the data section).
//
// Nothing here is checked against our reader: the byte layout is written from the format
// description, so reader tests compare two independent readings of the spec.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/quant.h"

namespace lp::testing {

using Bytes = std::vector<uint8_t>;

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" as a little-endian u32

// One encoded metadata value: its type id and the bytes that follow the type field on disk
// (for an array: element type, count, then the elements without their own type fields).
struct GgufWriterValue {
  uint32_t type = 0;  // a GgufType id; any u32 may be written, valid or not
  Bytes payload;

  static GgufWriterValue u8(uint8_t v);
  static GgufWriterValue i8(int8_t v);
  static GgufWriterValue u16(uint16_t v);
  static GgufWriterValue i16(int16_t v);
  static GgufWriterValue u32(uint32_t v);
  static GgufWriterValue i32(int32_t v);
  static GgufWriterValue u64(uint64_t v);
  static GgufWriterValue i64(int64_t v);
  static GgufWriterValue f32(float v);
  static GgufWriterValue f64(double v);
  static GgufWriterValue boolean(bool v);
  static GgufWriterValue string(const std::string& s);
  // Items must all have type `elem_type` (checked; a nested array passes elem_type ARRAY).
  static GgufWriterValue array(GgufType elem_type, const std::vector<GgufWriterValue>& items);
  // An array header claiming `count` elements of `elem_type`, followed by `tail` as is.
  static GgufWriterValue array_header(uint32_t elem_type, uint64_t count, const Bytes& tail = {});
  static GgufWriterValue raw(uint32_t type, Bytes payload);
};

struct GgufWriterKv {
  std::string key;
  GgufWriterValue value;
};

struct GgufWriterTensor {
  std::string name;
  uint32_t type = 0;               // a GgmlType id; any u32 may be written
  std::vector<uint64_t> ne;        // ne[0] fastest; written as is (any count, any value)
  Bytes data;                      // written as is, whatever the shape says
  std::optional<uint64_t> offset;  // overrides the computed (aligned) offset in the info
};

// Where things landed in the last bytes() output.
struct GgufLayout {
  std::vector<uint64_t> kv_starts;  // file offset of each key/value pair
  std::vector<uint64_t> tensor_info_starts;
  uint64_t data_start = 0;               // file offset of the data section
  std::vector<uint64_t> tensor_offsets;  // offsets written in the infos (from data_start)
  uint64_t data_end = 0;                 // end of the last tensor's bytes
  uint64_t size = 0;
};

class GgufWriter {
 public:
  uint32_t magic = kGgufMagic;
  uint32_t version = 3;
  // Padding unit for the data section. Does not add general.alignment by itself: call
  // set_alignment() for a consistent file, or set this field alone to build a mismatched one.
  uint64_t alignment = 32;
  bool pad_after_last_tensor = true;  // gguf-py pads the file end too; the reader must not care
  std::optional<uint64_t> tensor_count_override;
  std::optional<uint64_t> kv_count_override;

  std::vector<GgufWriterKv> kvs;          // written in this order
  std::vector<GgufWriterTensor> tensors;  // written in this order

  // Appends (duplicates allowed, for tests of duplicate keys).
  void add(const std::string& key, GgufWriterValue v) { kvs.push_back({key, std::move(v)}); }
  // Replaces the first pair with this key, or appends.
  void set(const std::string& key, GgufWriterValue v);
  bool remove(const std::string& key);  // removes every pair with this key; false if none
  GgufWriterKv* find(const std::string& key);

  void set_alignment(uint64_t a);  // sets `alignment` and general.alignment (u32)

  void add_u8(const std::string& k, uint8_t v) { add(k, GgufWriterValue::u8(v)); }
  void add_i8(const std::string& k, int8_t v) { add(k, GgufWriterValue::i8(v)); }
  void add_u16(const std::string& k, uint16_t v) { add(k, GgufWriterValue::u16(v)); }
  void add_i16(const std::string& k, int16_t v) { add(k, GgufWriterValue::i16(v)); }
  void add_u32(const std::string& k, uint32_t v) { add(k, GgufWriterValue::u32(v)); }
  void add_i32(const std::string& k, int32_t v) { add(k, GgufWriterValue::i32(v)); }
  void add_u64(const std::string& k, uint64_t v) { add(k, GgufWriterValue::u64(v)); }
  void add_i64(const std::string& k, int64_t v) { add(k, GgufWriterValue::i64(v)); }
  void add_f32(const std::string& k, float v) { add(k, GgufWriterValue::f32(v)); }
  void add_f64(const std::string& k, double v) { add(k, GgufWriterValue::f64(v)); }
  void add_bool(const std::string& k, bool v) { add(k, GgufWriterValue::boolean(v)); }
  void add_string(const std::string& k, const std::string& v) { add(k, GgufWriterValue::string(v)); }
  void add_raw(const std::string& k, uint32_t type, Bytes payload) {
    add(k, GgufWriterValue::raw(type, std::move(payload)));
  }
  void add_array_u8(const std::string& k, const std::vector<uint8_t>& v);
  void add_array_i8(const std::string& k, const std::vector<int8_t>& v);
  void add_array_u16(const std::string& k, const std::vector<uint16_t>& v);
  void add_array_i16(const std::string& k, const std::vector<int16_t>& v);
  void add_array_u32(const std::string& k, const std::vector<uint32_t>& v);
  void add_array_i32(const std::string& k, const std::vector<int32_t>& v);
  void add_array_u64(const std::string& k, const std::vector<uint64_t>& v);
  void add_array_i64(const std::string& k, const std::vector<int64_t>& v);
  void add_array_f32(const std::string& k, const std::vector<float>& v);
  void add_array_f64(const std::string& k, const std::vector<double>& v);
  void add_array_bool(const std::string& k, const std::vector<bool>& v);
  void add_array_string(const std::string& k, const std::vector<std::string>& v);

  // A well-formed tensor: ne as int64 (ne[0] fastest), data must hold exactly the bytes the
  // type and shape need (checked, so a test cannot build a broken file by accident).
  void add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne, Bytes data);
  void add_tensor_f32(const std::string& name, const std::vector<int64_t>& ne, const std::vector<float>& v);
  // Anything goes: for broken files.
  void add_tensor_raw(GgufWriterTensor t) { tensors.push_back(std::move(t)); }
  GgufWriterTensor* find_tensor(const std::string& name);
  bool remove_tensor(const std::string& name);

  Bytes bytes(GgufLayout* layout = nullptr) const;
  void write(const std::string& path, GgufLayout* layout = nullptr) const;
};

// Little-endian helpers for building payloads and patching files.
void put_u32(Bytes& b, uint32_t v);
void put_u64(Bytes& b, uint64_t v);
void put_string(Bytes& b, const std::string& s);  // u64 length + bytes
void write_file(const std::string& path, const Bytes& b);
Bytes read_file(const std::string& path);

// A fresh directory under /tmp (mkdtemp); never reused.
std::string make_temp_dir();

// Owns a temporary directory and removes it, with everything in it, when destroyed.
class TempDir {
 public:
  TempDir() : path_(make_temp_dir()) {}
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// ---- tiny Llama-family model -------------------------------------------------------------

struct TinyModelSpec {
  int n_layer = 2;    // L
  int n_embd = 64;    // D
  int n_head = 4;     // H
  int n_head_kv = 2;  // Hkv
  int n_ff = 96;      // F
  int n_ctx = 512;
  uint32_t seed = 1;
  bool tied = true;                      // no output.weight: the LM head reuses token_embd
  GgmlType weight_type = GgmlType::F32;  // of the matrices and token_embd: F32, F16 or BF16
  float rope_theta = 10000.f;
  std::string arch = "llama";  // key prefix and general.architecture
};

// The tokenizer of the tiny model: byte-level BPE, 256 byte tokens, kTinyMerges merged tokens,
// then <|endoftext|>, <|im_start|> (BOS), <|im_end|> (EOS).
struct TinyVocab {
  std::vector<std::string> tokens;   // [V]
  std::vector<std::string> merges;   // "a b", rank = index
  std::vector<int32_t> token_types;  // [V]: 1 normal, 3 control
  int32_t bos_id = -1, eos_id = -1;
};
TinyVocab tiny_vocab();
int tiny_vocab_size();  // V

// The GPT-2 byte -> unicode table as UTF-8 strings ([256]).
std::vector<std::string> gpt2_byte_tokens();

// Adds every tokenizer.* key of the tiny vocabulary.
void add_tiny_tokenizer(GgufWriter& w);

// The complete model, not yet written: tests edit it (drop a tensor, change a key) to build a
// broken one. Tensor names and shapes follow llama.cpp: token_embd [D, V], output_norm [D],
// output [D, V] when untied, blk.N.{attn_norm [D], attn_q [D, H*Dh], attn_k [D, Hkv*Dh],
// attn_v [D, Hkv*Dh], attn_output [H*Dh, D], ffn_norm [D], ffn_gate [D, F], ffn_up [D, F],
// ffn_down [F, D]}.
GgufWriter tiny_model_writer(const TinyModelSpec& spec = {});

// Writes tiny_model_writer(spec) to `path` and returns `path`.
std::string write_tiny_model(const std::string& path, const TinyModelSpec& spec = {});

// `n` weights drawn from N(mean, std), encoded as `type` (F32, F16 or BF16).
Bytes random_weights(GgmlType type, int64_t n, float mean, float std, std::mt19937& rng);

}  // namespace lp::testing
