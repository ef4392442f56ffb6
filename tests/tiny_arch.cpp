#include "tests/tiny_arch.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "model/digest.h"
#include "model/quant.h"

namespace lp::testing {

namespace {

uint32_t fnv1a32(std::string_view s) {
  uint32_t h = 0x811C9DC5u;
  for (unsigned char c : s) h = (h ^ c) * 0x01000193u;
  return h;
}

struct Shape {
  int L = 2, D = 64, H = 4, Hkv = 2, Dh = 16, F = 128, E = 0, k = 0, Fe = 0, window = 0;
};

// The script's shape(arch).
Shape shape(const std::string& arch) {
  Shape s;
  if (arch == "qwen3" || arch == "qwen3moe") s.Dh = 32;
  if (arch == "gemma3") s.L = 6, s.Dh = 32, s.window = 6;
  if (arch == "qwen3moe") s.E = 8, s.k = 3, s.Fe = 32;
  if (arch == "mixtral") s.E = 4, s.k = 2, s.F = 64;
  return s;
}

struct TensorSpec {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] the row width
  float scale, offset;
};

// The script's tensors(arch), in file order (its numpy shapes reversed into ne).
std::vector<TensorSpec> tensors(const std::string& arch) {
  const Shape s = shape(arch);
  const int64_t D = s.D, H = s.H, Hkv = s.Hkv, Dh = s.Dh, F = s.F, E = s.E, V = 260;
  std::vector<TensorSpec> out = {{"token_embd.weight", {D, V}, 0.5f, 0.f},
                                 {"output_norm.weight", {D}, 0.125f, 1.f},
                                 {"output.weight", {D, V}, 0.5f, 0.f}};
  const bool qk_norm = arch == "qwen3" || arch == "qwen3moe" || arch == "gemma3";
  for (int l = 0; l < s.L; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    out.push_back({p + "attn_norm.weight", {D}, 0.125f, 1.f});
    out.push_back({p + "attn_q.weight", {D, H * Dh}, 0.25f, 0.f});
    out.push_back({p + "attn_k.weight", {D, Hkv * Dh}, 0.25f, 0.f});
    out.push_back({p + "attn_v.weight", {D, Hkv * Dh}, 0.25f, 0.f});
    if (arch == "qwen2") {
      out.push_back({p + "attn_q.bias", {H * Dh}, 0.125f, 0.f});
      out.push_back({p + "attn_k.bias", {Hkv * Dh}, 0.125f, 0.f});
      out.push_back({p + "attn_v.bias", {Hkv * Dh}, 0.125f, 0.f});
    }
    out.push_back({p + "attn_output.weight", {H * Dh, D}, 0.25f, 0.f});
    if (qk_norm) {
      out.push_back({p + "attn_q_norm.weight", {Dh}, 0.125f, 1.f});
      out.push_back({p + "attn_k_norm.weight", {Dh}, 0.125f, 1.f});
    }
    if (arch == "gemma3") out.push_back({p + "post_attention_norm.weight", {D}, 0.125f, 1.f});
    out.push_back({p + "ffn_norm.weight", {D}, 0.125f, 1.f});
    if (E) {
      const int64_t Fx = arch == "qwen3moe" ? s.Fe : F;
      out.push_back({p + "ffn_gate_inp.weight", {D, E}, 0.5f, 0.f});
      out.push_back({p + "ffn_gate_exps.weight", {D, Fx, E}, 0.25f, 0.f});
      out.push_back({p + "ffn_up_exps.weight", {D, Fx, E}, 0.25f, 0.f});
      out.push_back({p + "ffn_down_exps.weight", {Fx, D, E}, 0.5f, 0.f});
    } else {
      out.push_back({p + "ffn_gate.weight", {D, F}, 0.25f, 0.f});
      out.push_back({p + "ffn_up.weight", {D, F}, 0.25f, 0.f});
      out.push_back({p + "ffn_down.weight", {F, D}, 0.5f, 0.f});
    }
    if (arch == "gemma3") out.push_back({p + "post_ffw_norm.weight", {D}, 0.125f, 1.f});
  }
  return out;
}

// One row as llama.cpp's reference quantizer writes Q8_0 weights (quantize_row_q8_0_ref, and
// gguf-py's Q8_0.quantize_blocks after it): d = max|x| / 127 and x * (1 / d) rounded half away from
// zero. (kernels/cpu/qgemm.h's quantize_q8_0 follows the activation path instead: 127 / max|x|,
// ties to even.)
void quantize_row_q8_0_ref(const float* x, int64_t K, uint8_t* out) {
  for (int64_t b = 0; b < K / 32; ++b, x += 32, out += 34) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f, id = d != 0 ? 1.f / d : 0.f;
    const uint16_t h = f32_to_f16(d);
    out[0] = uint8_t(h & 255);
    out[1] = uint8_t(h >> 8);
    for (int j = 0; j < 32; ++j) out[2 + j] = uint8_t(int8_t(std::round(x[j] * id)));
  }
}

}  // namespace

const std::vector<std::string>& tiny_archs() {
  static const std::vector<std::string> a = {"qwen2", "qwen3", "gemma3", "qwen3moe", "mixtral"};
  return a;
}

std::vector<float> tiny_arch_weight(const std::string& name, int64_t n, float scale, float offset) {
  const uint64_t h = uint64_t(fnv1a32(name)) << 32;
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = (h | uint64_t(i)) + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = float(z >> 40) / float(1 << 23) - 1.0f;
    out[size_t(i)] = offset + scale * u;
  }
  return out;
}

GgufWriter tiny_arch_writer(const std::string& arch, bool q8_0, std::string* sha256) {
  const Shape s = shape(arch);
  const std::string ga = arch == "mixtral" ? "llama" : arch, a = ga + ".";
  GgufWriter w;
  w.add_string("general.architecture", ga);
  w.add_string("general.name", "tiny-" + arch);
  w.add_u32(a + "context_length", 512);
  w.add_u32(a + "embedding_length", uint32_t(s.D));
  w.add_u32(a + "block_count", uint32_t(s.L));
  w.add_u32(a + "feed_forward_length", uint32_t(s.F));
  w.add_u32(a + "attention.head_count", uint32_t(s.H));
  w.add_u32(a + "attention.head_count_kv", uint32_t(s.Hkv));
  if (s.Dh * s.H != s.D || arch == "gemma3") {
    w.add_u32(a + "attention.key_length", uint32_t(s.Dh));
    w.add_u32(a + "attention.value_length", uint32_t(s.Dh));
  }
  if (arch != "mixtral") w.add_f32(a + "rope.freq_base", 1e6f);
  w.add_f32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  if (s.window) w.add_u32(a + "attention.sliding_window", uint32_t(s.window));
  if (s.E) {
    w.add_u32(a + "expert_count", uint32_t(s.E));
    w.add_u32(a + "expert_used_count", uint32_t(s.k));
    if (arch == "qwen3moe") w.add_u32(a + "expert_feed_forward_length", uint32_t(s.Fe));
  }
  std::vector<std::string> toks = gpt2_byte_tokens();
  for (const char* t : {"\u0120t", "<|endoftext|>", "<|im_start|>", "<|im_end|>"}) toks.push_back(t);
  std::vector<int32_t> types(257, 1);
  types.insert(types.end(), {3, 3, 3});
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "qwen2");
  w.add_array_string("tokenizer.ggml.tokens", toks);
  w.add_array_i32("tokenizer.ggml.token_type", types);
  w.add_array_string("tokenizer.ggml.merges", {"\u0120 t"});
  w.add_u32("tokenizer.ggml.bos_token_id", 257);
  w.add_u32("tokenizer.ggml.eos_token_id", 259);
  w.add_bool("tokenizer.ggml.add_bos_token", false);

  std::string all;
  for (const TensorSpec& t : tensors(arch)) {
    int64_t n = 1;
    for (int64_t d : t.ne) n *= d;
    const std::vector<float> v = tiny_arch_weight(t.name, n, t.scale, t.offset);
    Bytes bytes;
    GgmlType type = GgmlType::F32;
    if (q8_0 && t.ne.size() >= 2 && t.name.find("ffn_gate_inp") == std::string::npos) {
      type = GgmlType::Q8_0;
      const int64_t K = t.ne[0], rows = n / K, row_bytes = K / 32 * 34;
      bytes.resize(size_t(rows * row_bytes));
      for (int64_t r = 0; r < rows; ++r)
        quantize_row_q8_0_ref(v.data() + r * K, K, bytes.data() + r * row_bytes);
    } else {
      bytes.resize(v.size() * 4);
      std::memcpy(bytes.data(), v.data(), bytes.size());
    }
    all.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    w.add_tensor(t.name, type, t.ne, std::move(bytes));
  }
  if (sha256) *sha256 = sha256_hex(all, "tiny " + arch + " tensors");
  return w;
}

}  // namespace lp::testing
