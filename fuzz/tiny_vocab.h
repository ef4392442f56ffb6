// The tests' tiny byte-level BPE vocabulary (tests/gguf_writer.h) as the tokenizer's input, for the
// harnesses that need a tokenizer without a model file (fuzz_tokenizer's fallback, fuzz_openai).
#pragma once

#include "model/vocab.h"
#include "tests/gguf_writer.h"

namespace lp::fuzz {

inline VocabData tiny_vocab_data() {
  const testing::TinyVocab v = testing::tiny_vocab();
  VocabData d;
  d.model = "gpt2";
  d.pre = "gpt2";
  d.tokens = v.tokens;
  d.merges = v.merges;
  d.token_types = v.token_types;
  d.bos_id = v.bos_id;
  d.eos_id = v.eos_id;
  return d;
}

}  // namespace lp::fuzz
