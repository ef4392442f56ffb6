#include "model/vocab.h"

#include "model/error.h"
#include "model/gguf.h"

namespace lp {

namespace {
std::vector<std::string> strings(const GgufFile& f, const std::string& key) {
  const GgufArray& a = f.get_array(key);
  if (a.elem_type != GgufType::STRING) fail("{}: '{}' should be an array of strings", f.path(), key);
  std::vector<std::string> out;
  out.reserve(a.items.size());
  for (const auto& v : a.items) out.push_back(std::get<std::string>(v.v));
  return out;
}

int32_t token_id(const GgufFile& f, const std::string& key, size_t n_vocab) {
  if (!f.has(key)) return -1;
  const uint64_t v = f.get_uint(key);
  if (v >= n_vocab) fail("{}: '{}' = {} is outside the vocabulary of {} tokens", f.path(), key, v, n_vocab);
  return static_cast<int32_t>(v);
}
}  // namespace

VocabData vocab_from_gguf(const GgufFile& f) {
  VocabData d;
  d.model = f.get_string("tokenizer.ggml.model");
  d.pre = f.opt_string("tokenizer.ggml.pre").value_or("");
  d.tokens = strings(f, "tokenizer.ggml.tokens");
  const size_t V = d.tokens.size();
  if (V == 0) fail("{}: tokenizer.ggml.tokens is empty", f.path());
  if (f.has("tokenizer.ggml.scores")) {
    const GgufArray& a = f.get_array("tokenizer.ggml.scores");
    if (a.items.size() != V)
      fail("{}: tokenizer.ggml.scores has {} entries for {} tokens", f.path(), a.items.size(), V);
    d.scores.reserve(V);
    for (const auto& v : a.items) {
      const double* x = std::get_if<double>(&v.v);
      if (!x) fail("{}: tokenizer.ggml.scores should hold floats", f.path());
      d.scores.push_back(float(*x));
    }
  }
  if (f.has("tokenizer.ggml.token_type")) {
    const GgufArray& a = f.get_array("tokenizer.ggml.token_type");
    if (a.items.size() != V)
      fail("{}: tokenizer.ggml.token_type has {} entries for {} tokens", f.path(), a.items.size(), V);
    d.token_types.reserve(V);
    for (const auto& v : a.items) {
      if (auto* i = std::get_if<int64_t>(&v.v))
        d.token_types.push_back(int32_t(*i));
      else if (auto* u = std::get_if<uint64_t>(&v.v))
        d.token_types.push_back(int32_t(*u));
      else
        fail("{}: tokenizer.ggml.token_type should hold integers", f.path());
    }
  }
  if (f.has("tokenizer.ggml.merges")) d.merges = strings(f, "tokenizer.ggml.merges");
  // Byte-level BPE merges pieces by rank; without merges every text splits into single bytes
  // ("Hi" became 2 tokens), which is a broken file, not a tokenizer.
  if (d.model == "gpt2" && d.merges.empty())
    fail("{}: a byte-level BPE vocabulary (tokenizer.ggml.model gpt2) without tokenizer.ggml.merges",
         f.path());
  d.bos_id = token_id(f, "tokenizer.ggml.bos_token_id", V);
  d.eos_id = token_id(f, "tokenizer.ggml.eos_token_id", V);
  d.eot_id = token_id(f, "tokenizer.ggml.eot_token_id", V);
  d.unk_id = token_id(f, "tokenizer.ggml.unknown_token_id", V);
  d.pad_id = token_id(f, "tokenizer.ggml.padding_token_id", V);
  // llama.cpp's defaults when the keys are absent: SentencePiece vocabularies add BOS and a
  // space prefix, byte-level BPE vocabularies do neither.
  const bool spm = d.model == "llama";
  d.add_bos = f.opt_bool("tokenizer.ggml.add_bos_token").value_or(spm);
  d.add_eos = f.opt_bool("tokenizer.ggml.add_eos_token").value_or(false);
  d.add_space_prefix = f.opt_bool("tokenizer.ggml.add_space_prefix").value_or(spm);
  d.chat_template = f.opt_string("tokenizer.chat_template").value_or("");
  return d;
}

}  // namespace lp
