// Tokenizer built from GGUF metadata (tokenizer.ggml.*).
//
// Two vocabulary kinds:
//  - "gpt2": byte-level BPE. Text is split by the pre-tokenizer named in tokenizer.ggml.pre
//    (smollm, llama-bpe, gpt2, ...), each piece is mapped bytes -> unicode code points
//    (the GPT-2 byte table) and merged by merge rank (tokenizer.ggml.merges).
//  - "llama": SentencePiece-style. Spaces become U+2581, an optional leading space is added,
//    pieces are merged greedily by score (tokenizer.ggml.scores); unknown bytes fall back to
//    <0xXX> byte tokens.
// Special tokens (token type CONTROL / USER_DEFINED) are matched verbatim in the text when
// `parse_special` is set, before pre-tokenization.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lp {

// What the tokenizer needs from a GGUF, without knowing about GGUF.
struct VocabData {
  std::string model;                 // tokenizer.ggml.model: "gpt2" or "llama"
  std::string pre;                   // tokenizer.ggml.pre ("" if absent)
  std::vector<std::string> tokens;   // [V] token text as stored
  std::vector<float> scores;         // [V] or empty (SentencePiece scores)
  std::vector<int32_t> token_types;  // [V] or empty: 1 normal, 2 unknown, 3 control,
                                     //   4 user defined, 5 unused, 6 byte
  std::vector<std::string> merges;   // BPE merges "a b", rank = index (gpt2 only)
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t eot_id = -1;  // end of turn, if the model has one (e.g. <|im_end|>)
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;          // tokenizer.ggml.add_bos_token
  bool add_eos = false;          // tokenizer.ggml.add_eos_token
  bool add_space_prefix = true;  // tokenizer.ggml.add_space_prefix (llama model only)
  std::string chat_template;     // tokenizer.chat_template ("" if absent)
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

class Tokenizer {
 public:
  // Throws lp::Error on an unsupported model or pre-tokenizer, or inconsistent data.
  explicit Tokenizer(VocabData data);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Text -> ids. `add_bos` prepends BOS when the vocabulary asks for it (add_bos_token).
  // `parse_special` recognises special-token text such as "<|im_start|>".
  // Throws lp::Error if `text` is not valid UTF-8.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const;

  // Bytes of one token as they appear in text (byte-level BPE pieces are mapped back to raw
  // bytes, "<0x0A>" byte tokens to their byte, U+2581 to a space). May be a partial UTF-8
  // sequence. Special tokens render as their text.
  std::string token_bytes(int32_t id) const;

  // Ids -> text. Concatenates token bytes and repairs the result into valid UTF-8 (invalid
  // or truncated sequences become U+FFFD). For llama vocabularies the leading space that
  // add_space_prefix introduced is removed.
  std::string decode(std::span<const int32_t> ids) const;

  // Formats a conversation with the model's chat template. Supported: ChatML
  // (templates containing "<|im_start|>"), including a default system message that the
  // template inserts when the first message is not a system message (SmolLM2 does this).
  // Ends with the assistant prompt when add_generation_prompt. Throws lp::Error for a template
  // it does not recognise.
  std::string apply_chat_template(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

  int32_t n_vocab() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  // True for tokens that end generation (eos, eot, <|im_end|>, <|endoftext|>, ...).
  bool is_end_of_generation(int32_t id) const;
  const std::string& model() const;
  const std::string& pre() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Checks that `s` is valid UTF-8; returns the byte offset of the first invalid sequence or -1.
int64_t find_invalid_utf8(std::string_view s);

}  // namespace lp
