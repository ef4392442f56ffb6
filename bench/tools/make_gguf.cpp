// lp_make_gguf: a GGUF of a preset's shape with random weights in a quantized file type, written
// by the tests' GGUF writer (tests/gguf_writer.h) and streamed to disk tensor by tensor, so an
// 8B-shaped file takes seconds and little memory to make. For speed and memory measurements only:
// random weights say nothing about accuracy (docs/quantized.md).
//
// Usage: lp_make_gguf OUT.gguf [--shape llama-3.1-8b] [--type q4_k_m|q8_0|q4_0|q4_1|q4_k]
//                              [--layers N] [--seed S]
//
// --type q4_k_m follows llama.cpp's Q4_K_M recipe (llama_tensor_get_type, read for the types
// only): Q4_K everywhere except output.weight in Q6_K, and attn_v and ffn_down in Q6_K on the
// layers use_more_bits picks (the first and last eighth, and every third layer between). The
// vocabulary is the tests' tiny BPE padded with control tokens to the shape's n_vocab.
#include <fcntl.h>
#include <fmt/format.h>
#include <tbb/parallel_for.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "model/error.h"
#include "model/presets.h"
#include "model/quant.h"
#include "tests/gguf_writer.h"
#include "tests/random_blocks.h"

namespace lp {
namespace {

struct Planned {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;  // ne[0] fastest
  uint64_t offset = 0;      // in the data section
  uint64_t bytes = 0;
  uint64_t seed = 0;
};

// llama.cpp's use_more_bits(i_layer, n_layer).
bool more_bits(int i, int n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

int run(int argc, char** argv) {
  CLI::App app{"A GGUF of a preset's shape with random quantized weights (speed and memory only)"};
  std::string out, shape = "llama-3.1-8b", type = "q4_k_m";
  int layers = 0;
  uint64_t seed = 1;
  app.add_option("out", out, "The GGUF to write")->required();
  app.add_option("--shape", shape, "Model preset")->check(CLI::IsMember(preset_names()));
  app.add_option("--type", type, "File type")
      ->check(CLI::IsMember({"q4_k_m", "q8_0", "q4_0", "q4_1", "q4_k"}));
  app.add_option("--layers", layers, "Keep the first N layers (0: all)")->check(CLI::Range(0, 1024));
  app.add_option("--seed", seed, "Random seed");
  CLI11_PARSE(app, argc, argv);

  ModelConfig c = preset_config(shape);
  if (layers > 0) c.n_layer = std::min(c.n_layer, layers);
  const GgmlType base = type == "q8_0"   ? GgmlType::Q8_0
                        : type == "q4_0" ? GgmlType::Q4_0
                        : type == "q4_1" ? GgmlType::Q4_1
                                         : GgmlType::Q4_K;
  const bool k_m = type == "q4_k_m";
  const int64_t D = c.n_embd, F = c.n_ff, Q = c.q_dim(), KV = c.kv_dim(), V = c.n_vocab;

  testing::GgufWriter w;
  const std::string a = "llama.";
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", fmt::format("{} shape, random {} weights (lp_make_gguf)", shape, type));
  w.set_alignment(32);
  w.add_u32(a + "block_count", uint32_t(c.n_layer));
  w.add_u32(a + "context_length", uint32_t(c.n_ctx_train));
  w.add_u32(a + "embedding_length", uint32_t(D));
  w.add_u32(a + "feed_forward_length", uint32_t(F));
  w.add_u32(a + "attention.head_count", uint32_t(c.n_head));
  w.add_u32(a + "attention.head_count_kv", uint32_t(c.n_head_kv));
  w.add_u32(a + "attention.key_length", uint32_t(c.head_dim));
  w.add_u32(a + "rope.dimension_count", uint32_t(c.rope_dim));
  w.add_f32(a + "rope.freq_base", c.rope_theta);
  w.add_f32(a + "attention.layer_norm_rms_epsilon", c.rms_eps);
  w.add_u32(a + "vocab_size", uint32_t(V));
  testing::add_tiny_tokenizer(w);
  {  // the tiny vocabulary padded with control tokens to V
    testing::TinyVocab v = testing::tiny_vocab();
    if (int64_t(v.tokens.size()) > V)
      fail("{}: the shape's vocabulary ({}) is smaller than the tiny one", out, V);
    for (int64_t i = int64_t(v.tokens.size()); i < V; ++i) {
      v.tokens.push_back(fmt::format("<|reserved_{}|>", i));
      v.token_types.push_back(3);
    }
    w.set("tokenizer.ggml.tokens", testing::GgufWriterValue::array(GgufType::STRING, [&] {
            std::vector<testing::GgufWriterValue> items;
            for (const auto& t : v.tokens) items.push_back(testing::GgufWriterValue::string(t));
            return items;
          }()));
    w.remove("tokenizer.ggml.token_type");
    w.add_array_i32("tokenizer.ggml.token_type", v.token_types);
  }

  std::vector<Planned> plan;
  uint64_t at = 0;
  const auto add = [&](const std::string& name, GgmlType t, std::vector<int64_t> ne) {
    int64_t n = 1;
    for (int64_t e : ne) n *= e;
    const uint64_t bytes = uint64_t(*type_bytes(t, n));
    plan.push_back({name, t, ne, at, bytes, seed * 1000003 + plan.size()});
    at = (at + bytes + 31) / 32 * 32;
  };
  const auto mat = [&](const std::string& name, int64_t in, int64_t out_rows, bool six) {
    add(name, k_m && six ? GgmlType::Q6_K : base, {in, out_rows});
  };
  add("token_embd.weight", base, {D, V});
  add("output_norm.weight", GgmlType::F32, {D});
  mat("output.weight", D, V, true);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const bool more = more_bits(l, c.n_layer);
    add(p + "attn_norm.weight", GgmlType::F32, {D});
    mat(p + "attn_q.weight", D, Q, false);
    mat(p + "attn_k.weight", D, KV, false);
    mat(p + "attn_v.weight", D, KV, more);
    mat(p + "attn_output.weight", Q, D, false);
    add(p + "ffn_norm.weight", GgmlType::F32, {D});
    mat(p + "ffn_gate.weight", D, F, false);
    mat(p + "ffn_up.weight", D, F, false);
    mat(p + "ffn_down.weight", F, D, more);
  }
  for (const Planned& t : plan) {
    testing::GgufWriterTensor wt;
    wt.name = t.name;
    wt.type = uint32_t(t.type);
    wt.ne.assign(t.ne.begin(), t.ne.end());
    wt.offset = t.offset;
    w.add_tensor_raw(std::move(wt));  // no bytes here: streamed below
  }
  w.pad_after_last_tensor = false;
  testing::GgufLayout layout;
  const testing::Bytes header = w.bytes(&layout);

  const std::string tmp = out + ".partial";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("{}: cannot create: {}", tmp, std::strerror(errno));
  const auto put = [&](const void* p, size_t n, uint64_t off) {
    for (size_t done = 0; done < n;) {
      const ssize_t k = ::pwrite(fd, static_cast<const uint8_t*>(p) + done, n - done, off_t(off + done));
      if (k <= 0) fail("{}: write failed: {}", tmp, std::strerror(errno));
      done += size_t(k);
    }
  };
  put(header.data(), header.size(), 0);
  for (const Planned& t : plan) {
    std::vector<uint8_t> buf(t.bytes);
    if (t.type == GgmlType::F32) {
      for (uint64_t i = 0; i < t.bytes / 4; ++i) {
        const float one = 1.0f;
        std::memcpy(buf.data() + 4 * i, &one, 4);
      }
    } else {
      const TypeInfo info = *type_info(uint32_t(t.type));
      const int64_t blocks = int64_t(t.bytes) / info.block_bytes, chunk = 4096;
      tbb::parallel_for(int64_t(0), (blocks + chunk - 1) / chunk, [&](int64_t i) {
        const int64_t b0 = i * chunk, n = std::min(chunk, blocks - b0);
        testing::fill_random_blocks(t.type, buf.data() + b0 * info.block_bytes, n,
                                    t.seed * 65537 + uint64_t(i), 1e-3f);
      });
    }
    put(buf.data(), buf.size(), layout.data_start + t.offset);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) fail("{}: cannot finish: {}", tmp, std::strerror(errno));
  if (std::rename(tmp.c_str(), out.c_str()) != 0) fail("{}: cannot rename: {}", out, std::strerror(errno));
  fmt::print("{}: {} shape ({} layers), {} weights, {:.2f} GiB\n", out, shape, c.n_layer, type,
             double(layout.data_start + at) / (1 << 30));
  return 0;
}

}  // namespace
}  // namespace lp

int main(int argc, char** argv) {
  try {
    return lp::run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "lp_make_gguf: {}\n", e.what());
    return 1;
  }
}
