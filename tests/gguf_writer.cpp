#include "tests/gguf_writer.h"

#include <stdlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace lp::testing {

namespace {

template <class T>
void put(Bytes& b, T v) {  // little-endian: the only byte order our writer and reader use
  uint8_t tmp[sizeof(T)];
  std::memcpy(tmp, &v, sizeof(T));
  b.insert(b.end(), tmp, tmp + sizeof(T));
}

template <class T>
GgufWriterValue scalar(GgufType t, T v) {
  GgufWriterValue out;
  out.type = static_cast<uint32_t>(t);
  put(out.payload, v);
  return out;
}

uint64_t round_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

template <class T, class F>
std::vector<GgufWriterValue> map_items(const std::vector<T>& v, F f) {
  std::vector<GgufWriterValue> out;
  out.reserve(v.size());
  for (const auto& x : v) out.push_back(f(x));
  return out;
}

}  // namespace

void put_u32(Bytes& b, uint32_t v) {
  put(b, v);
}
void put_u64(Bytes& b, uint64_t v) {
  put(b, v);
}
void put_string(Bytes& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}

GgufWriterValue GgufWriterValue::u8(uint8_t v) {
  return scalar(GgufType::U8, v);
}
GgufWriterValue GgufWriterValue::i8(int8_t v) {
  return scalar(GgufType::I8, v);
}
GgufWriterValue GgufWriterValue::u16(uint16_t v) {
  return scalar(GgufType::U16, v);
}
GgufWriterValue GgufWriterValue::i16(int16_t v) {
  return scalar(GgufType::I16, v);
}
GgufWriterValue GgufWriterValue::u32(uint32_t v) {
  return scalar(GgufType::U32, v);
}
GgufWriterValue GgufWriterValue::i32(int32_t v) {
  return scalar(GgufType::I32, v);
}
GgufWriterValue GgufWriterValue::u64(uint64_t v) {
  return scalar(GgufType::U64, v);
}
GgufWriterValue GgufWriterValue::i64(int64_t v) {
  return scalar(GgufType::I64, v);
}
GgufWriterValue GgufWriterValue::f32(float v) {
  return scalar(GgufType::F32, v);
}
GgufWriterValue GgufWriterValue::f64(double v) {
  return scalar(GgufType::F64, v);
}
GgufWriterValue GgufWriterValue::boolean(bool v) {
  return scalar(GgufType::BOOL, uint8_t(v ? 1 : 0));
}

GgufWriterValue GgufWriterValue::string(const std::string& s) {
  GgufWriterValue out;
  out.type = static_cast<uint32_t>(GgufType::STRING);
  put_string(out.payload, s);
  return out;
}

GgufWriterValue GgufWriterValue::array(GgufType elem_type, const std::vector<GgufWriterValue>& items) {
  GgufWriterValue out;
  out.type = static_cast<uint32_t>(GgufType::ARRAY);
  put<uint32_t>(out.payload, static_cast<uint32_t>(elem_type));
  put<uint64_t>(out.payload, items.size());
  for (const auto& it : items) {
    if (it.type != static_cast<uint32_t>(elem_type))
      throw std::logic_error("GgufWriterValue::array: item type differs from the element type");
    out.payload.insert(out.payload.end(), it.payload.begin(), it.payload.end());
  }
  return out;
}

GgufWriterValue GgufWriterValue::array_header(uint32_t elem_type, uint64_t count, const Bytes& tail) {
  GgufWriterValue out;
  out.type = static_cast<uint32_t>(GgufType::ARRAY);
  put<uint32_t>(out.payload, elem_type);
  put<uint64_t>(out.payload, count);
  out.payload.insert(out.payload.end(), tail.begin(), tail.end());
  return out;
}

GgufWriterValue GgufWriterValue::raw(uint32_t type, Bytes payload) {
  GgufWriterValue out;
  out.type = type;
  out.payload = std::move(payload);
  return out;
}

// ---- GgufWriter ----------------------------------------------------------------------------

void GgufWriter::set(const std::string& key, GgufWriterValue v) {
  if (GgufWriterKv* kv = find(key)) {
    kv->value = std::move(v);
  } else {
    add(key, std::move(v));
  }
}

bool GgufWriter::remove(const std::string& key) {
  const auto n = std::erase_if(kvs, [&](const GgufWriterKv& kv) { return kv.key == key; });
  return n > 0;
}

GgufWriterKv* GgufWriter::find(const std::string& key) {
  for (auto& kv : kvs)
    if (kv.key == key) return &kv;
  return nullptr;
}

void GgufWriter::set_alignment(uint64_t a) {
  alignment = a;
  set("general.alignment", GgufWriterValue::u32(static_cast<uint32_t>(a)));
}

void GgufWriter::add_array_u8(const std::string& k, const std::vector<uint8_t>& v) {
  add(k, GgufWriterValue::array(GgufType::U8, map_items(v, GgufWriterValue::u8)));
}
void GgufWriter::add_array_i8(const std::string& k, const std::vector<int8_t>& v) {
  add(k, GgufWriterValue::array(GgufType::I8, map_items(v, GgufWriterValue::i8)));
}
void GgufWriter::add_array_u16(const std::string& k, const std::vector<uint16_t>& v) {
  add(k, GgufWriterValue::array(GgufType::U16, map_items(v, GgufWriterValue::u16)));
}
void GgufWriter::add_array_i16(const std::string& k, const std::vector<int16_t>& v) {
  add(k, GgufWriterValue::array(GgufType::I16, map_items(v, GgufWriterValue::i16)));
}
void GgufWriter::add_array_u32(const std::string& k, const std::vector<uint32_t>& v) {
  add(k, GgufWriterValue::array(GgufType::U32, map_items(v, GgufWriterValue::u32)));
}
void GgufWriter::add_array_i32(const std::string& k, const std::vector<int32_t>& v) {
  add(k, GgufWriterValue::array(GgufType::I32, map_items(v, GgufWriterValue::i32)));
}
void GgufWriter::add_array_u64(const std::string& k, const std::vector<uint64_t>& v) {
  add(k, GgufWriterValue::array(GgufType::U64, map_items(v, GgufWriterValue::u64)));
}
void GgufWriter::add_array_i64(const std::string& k, const std::vector<int64_t>& v) {
  add(k, GgufWriterValue::array(GgufType::I64, map_items(v, GgufWriterValue::i64)));
}
void GgufWriter::add_array_f32(const std::string& k, const std::vector<float>& v) {
  add(k, GgufWriterValue::array(GgufType::F32, map_items(v, GgufWriterValue::f32)));
}
void GgufWriter::add_array_f64(const std::string& k, const std::vector<double>& v) {
  add(k, GgufWriterValue::array(GgufType::F64, map_items(v, GgufWriterValue::f64)));
}
void GgufWriter::add_array_bool(const std::string& k, const std::vector<bool>& v) {
  add(k, GgufWriterValue::array(GgufType::BOOL, map_items(v, GgufWriterValue::boolean)));
}
void GgufWriter::add_array_string(const std::string& k, const std::vector<std::string>& v) {
  add(k, GgufWriterValue::array(GgufType::STRING, map_items(v, GgufWriterValue::string)));
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, const std::vector<int64_t>& ne,
                            Bytes data) {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  const auto need = type_bytes(type, n);
  if (ne.empty() || !need || static_cast<uint64_t>(*need) != data.size())
    throw std::logic_error("GgufWriter::add_tensor: '" + name + "' data size does not match its shape");
  GgufWriterTensor t;
  t.name = name;
  t.type = static_cast<uint32_t>(type);
  for (int64_t d : ne) t.ne.push_back(static_cast<uint64_t>(d));
  t.data = std::move(data);
  tensors.push_back(std::move(t));
}

void GgufWriter::add_tensor_f32(const std::string& name, const std::vector<int64_t>& ne,
                                const std::vector<float>& v) {
  Bytes b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  add_tensor(name, GgmlType::F32, ne, std::move(b));
}

GgufWriterTensor* GgufWriter::find_tensor(const std::string& name) {
  for (auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

bool GgufWriter::remove_tensor(const std::string& name) {
  return std::erase_if(tensors, [&](const GgufWriterTensor& t) { return t.name == name; }) > 0;
}

Bytes GgufWriter::bytes(GgufLayout* layout) const {
  if (alignment == 0) throw std::logic_error("GgufWriter: alignment 0");
  GgufLayout lay;
  Bytes b;
  put<uint32_t>(b, magic);
  put<uint32_t>(b, version);
  put<uint64_t>(b, tensor_count_override.value_or(tensors.size()));
  put<uint64_t>(b, kv_count_override.value_or(kvs.size()));
  for (const auto& kv : kvs) {
    lay.kv_starts.push_back(b.size());
    put_string(b, kv.key);
    put<uint32_t>(b, kv.value.type);
    b.insert(b.end(), kv.value.payload.begin(), kv.value.payload.end());
  }
  // Offsets: each tensor starts at a multiple of the alignment from the data section start.
  uint64_t off = 0;
  for (const auto& t : tensors) {
    lay.tensor_info_starts.push_back(b.size());
    put_string(b, t.name);
    put<uint32_t>(b, static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) put<uint64_t>(b, d);
    put<uint32_t>(b, t.type);
    const uint64_t written = t.offset.value_or(off);
    put<uint64_t>(b, written);
    lay.tensor_offsets.push_back(written);
    off = round_up(off + t.data.size(), alignment);
  }
  lay.data_start = round_up(b.size(), alignment);
  b.resize(lay.data_start, 0);
  lay.data_end = lay.data_start;
  off = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    // Data goes where the computed offset says, even when the info carries an override.
    b.resize(lay.data_start + off, 0);
    b.insert(b.end(), tensors[i].data.begin(), tensors[i].data.end());
    lay.data_end = b.size();
    off = round_up(off + tensors[i].data.size(), alignment);
    if (i + 1 < tensors.size() || pad_after_last_tensor) b.resize(lay.data_start + off, 0);
  }
  lay.size = b.size();
  if (layout) *layout = std::move(lay);
  return b;
}

void GgufWriter::write(const std::string& path, GgufLayout* layout) const {
  write_file(path, bytes(layout));
}

void write_file(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!out) throw std::runtime_error("write_file: cannot write " + path);
}

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("read_file: cannot read " + path);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string make_temp_dir() {
  std::string tmpl = "/tmp/lp_test_XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("make_temp_dir: mkdtemp failed");
  return tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;  // best effort: a leftover directory in /tmp is harmless
  std::filesystem::remove_all(path_, ec);
}

// ---- tiny model ----------------------------------------------------------------------------

namespace {

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// Merges in rank order; "Ġ" is the GPT-2 stand-in for a space (byte 0x20 -> U+0120). Each
// merge's parts exist before it (byte tokens or earlier merges).
const char* const kTinyMerges[] = {
    "Ġ t",  "h e",   "Ġt he", "i n",  "a n", "e r",  "Ġ a",  "o n",  "r e",  "a t",
    "Ġ c",  "Ġc at", "Ġ s",   "o r",  "e n", "Ġ w",  "i s",  "Ġ o",  "i t",  "Ġ b",
    "e s",  "Ġ f",   "a r",   "Ġ m",  "Ġ p", "o u",  "l e",  "Ġ d",  "a l",  "Ġt o",
    "Ġa n", "Ġan d", "n g",   "i ng", "Ġ i", "Ġi n", "Ġo f", "c at", "t he", "Ġ h",
};

const char* const kChatMlTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
    "}}{% endif %}";

}  // namespace

std::vector<std::string> gpt2_byte_tokens() {
  std::vector<std::string> out(256);
  uint32_t next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    out[b] = utf8(printable ? uint32_t(b) : 0x100 + next++);
  }
  return out;
}

TinyVocab tiny_vocab() {
  TinyVocab v;
  v.tokens = gpt2_byte_tokens();
  for (const char* m : kTinyMerges) {
    std::string s = m;
    const size_t sp = s.find(' ');
    v.merges.push_back(s);
    v.tokens.push_back(s.substr(0, sp) + s.substr(sp + 1));
  }
  v.token_types.assign(v.tokens.size(), 1);
  for (const char* sp : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    v.tokens.push_back(sp);
    v.token_types.push_back(3);
  }
  const int32_t V = static_cast<int32_t>(v.tokens.size());
  v.bos_id = V - 2;
  v.eos_id = V - 1;
  return v;
}

int tiny_vocab_size() {
  return static_cast<int>(tiny_vocab().tokens.size());
}

void add_tiny_tokenizer(GgufWriter& w) {
  const TinyVocab v = tiny_vocab();
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "gpt-2");  // llama.cpp knows "gpt-2", not "gpt2"
  w.add_array_string("tokenizer.ggml.tokens", v.tokens);
  w.add_array_i32("tokenizer.ggml.token_type", v.token_types);
  w.add_array_string("tokenizer.ggml.merges", v.merges);
  w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(v.bos_id));
  w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(v.eos_id));
  w.add_bool("tokenizer.ggml.add_bos_token", false);
  w.add_string("tokenizer.chat_template", kChatMlTemplate);
}

Bytes random_weights(GgmlType type, int64_t n, float mean, float std, std::mt19937& rng) {
  std::normal_distribution<float> dist(mean, std);
  Bytes b;
  if (type == GgmlType::F32) {
    b.resize(size_t(n) * 4);
    for (int64_t i = 0; i < n; ++i) {
      const float x = dist(rng);
      std::memcpy(b.data() + 4 * i, &x, 4);
    }
  } else if (type == GgmlType::F16 || type == GgmlType::BF16) {
    b.resize(size_t(n) * 2);
    for (int64_t i = 0; i < n; ++i) {
      const float x = dist(rng);
      const uint16_t h = type == GgmlType::F16 ? f32_to_f16(x) : f32_to_bf16(x);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  } else {
    throw std::logic_error("random_weights: only F32, F16 and BF16");
  }
  return b;
}

GgufWriter tiny_model_writer(const TinyModelSpec& s) {
  const int64_t D = s.n_embd, H = s.n_head, Hkv = s.n_head_kv, F = s.n_ff;
  const int64_t Dh = D / H, V = tiny_vocab_size();
  const std::string a = s.arch + ".";
  GgufWriter w;
  w.version = 3;
  w.add_string("general.architecture", s.arch);
  w.add_string("general.name", "tiny-test-model");
  w.set_alignment(32);
  w.add_u32(a + "block_count", static_cast<uint32_t>(s.n_layer));
  w.add_u32(a + "context_length", static_cast<uint32_t>(s.n_ctx));
  w.add_u32(a + "embedding_length", static_cast<uint32_t>(D));
  w.add_u32(a + "feed_forward_length", static_cast<uint32_t>(F));
  w.add_u32(a + "attention.head_count", static_cast<uint32_t>(H));
  w.add_u32(a + "attention.head_count_kv", static_cast<uint32_t>(Hkv));
  w.add_f32(a + "rope.freq_base", s.rope_theta);
  w.add_f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_u32(a + "rope.dimension_count", static_cast<uint32_t>(Dh));
  w.add_u32(a + "vocab_size", static_cast<uint32_t>(V));
  add_tiny_tokenizer(w);

  std::mt19937 rng(s.seed);
  const GgmlType wt = s.weight_type;
  // Norm weights stay F32, as in released GGUFs; matrices use the requested type.
  auto norm = [&](const std::string& name) {
    std::uniform_real_distribution<float> u(0.9f, 1.1f);
    std::vector<float> v(static_cast<size_t>(D));
    for (float& x : v) x = u(rng);
    w.add_tensor_f32(name, {D}, v);
  };
  auto mat = [&](const std::string& name, int64_t in, int64_t out, float std) {
    w.add_tensor(name, wt, {in, out}, random_weights(wt, in * out, 0.0f, std, rng));
  };
  mat("token_embd.weight", D, V, 0.1f);            // [V][D]
  norm("output_norm.weight");                      // [D]
  if (!s.tied) mat("output.weight", D, V, 0.05f);  // [V][D]
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight");                     // [D]
    mat(p + "attn_q.weight", D, H * Dh, 0.05f);       // [H*Dh][D]
    mat(p + "attn_k.weight", D, Hkv * Dh, 0.05f);     // [Hkv*Dh][D]
    mat(p + "attn_v.weight", D, Hkv * Dh, 0.05f);     // [Hkv*Dh][D]
    mat(p + "attn_output.weight", H * Dh, D, 0.05f);  // [D][H*Dh]
    norm(p + "ffn_norm.weight");                      // [D]
    mat(p + "ffn_gate.weight", D, F, 0.05f);          // [F][D]
    mat(p + "ffn_up.weight", D, F, 0.05f);            // [F][D]
    mat(p + "ffn_down.weight", F, D, 0.05f);          // [D][F]
  }
  return w;
}

std::string write_tiny_model(const std::string& path, const TinyModelSpec& spec) {
  tiny_model_writer(spec).write(path);
  return path;
}

}  // namespace lp::testing
