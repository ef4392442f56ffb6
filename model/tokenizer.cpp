// Tokenizer: special-token partition, regex pre-tokenizer, byte-level BPE and SentencePiece
// merges, detokenization and ChatML formatting.
//
// The reference is llama.cpp (src/llama-vocab.cpp, src/unicode.cpp), which in turn follows the
// Hugging Face tokenizers; every place where this file reproduces one of its particular
// behaviours says so. All state lives in Impl and is read-only after construction, so const
// calls are safe from several threads; each call keeps its working buffers on its own stack.
#include "model/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <deque>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "model/error.h"
#include "model/unicode.h"

namespace lp {

namespace {

// Token attributes, one bit per GGUF token type (tokenizer.ggml.token_type).
enum Attr : uint8_t {
  kNormal = 1 << 0,       // type 1
  kUnknown = 1 << 1,      // type 2
  kControl = 1 << 2,      // type 3
  kUserDefined = 1 << 3,  // type 4
  kUnused = 1 << 4,       // type 5
  kByte = 1 << 5,         // type 6
};

uint8_t attr_from_type(int32_t type) {
  switch (type) {
    case 1:
      return kNormal;
    case 2:
      return kUnknown;
    case 3:
      return kControl;
    case 4:
      return kUserDefined;
    case 5:
      return kUnused;
    case 6:
      return kByte;
    default:
      return 0;  // undefined: never matched as special, renders as nothing
  }
}

// Token texts that end generation. llama.cpp decides this by name, because GGUF files carry at
// most one eos and one eot id; we use the same list so that generation stops where it stops.
// llama.cpp also marks every one of these as a control token (parsed as special, rendered).
constexpr std::string_view kEndOfGenerationNames[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
    "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
    // fill-in-the-middle pad / repo / file-separator tokens: llama.cpp ends generation on
    // these too (for SmolLM2 that makes "<reponame>" an end-of-generation token).
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
    "<reponame>", "<|file_sep|>"};

// ---- regex pre-tokenizers ----------------------------------------------------------------

// Character classes of the pre-tokenizer regexes, rewritten before compiling so that they match
// what llama.cpp's tables (Unicode 15.1) say, whatever Unicode version the installed PCRE2 has.
//  - \s, \S: the Unicode White_Space property, as llama.cpp and the Hugging Face tokenizers
//    (Oniguruma) use it. PCRE2's own \s differs (it also matches U+180E).
//  - \p{L}, \p{N}, \p{P}: PCRE2's property plus the code points that Unicode 15.0 and 15.1
//    added to it (Debian's PCRE2 10.42 has Unicode 14: CJK extensions H and I, Kawi, Nag
//    Mundari, ...). Found by comparing every code point with llama.cpp's table; there were no
//    differences in the other direction. Redundant, and harmless, with a newer PCRE2.
struct ClassRewrite {
  std::string_view escape;   // after the backslash
  std::string_view members;  // class members it stands for
  bool negated;
};

constexpr std::string_view kWhitespaceMembers =
    "\\t\\n\\x0B\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

constexpr ClassRewrite kClassRewrites[] = {
    {"s", kWhitespaceMembers, false},
    {"S", kWhitespaceMembers, true},
    {"p{L}",
     "\\p{L}\\x{1123F}-\\x{11240}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}"
     "\\x{13441}-\\x{13446}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}"
     "\\x{1E4D0}-\\x{1E4EB}\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}",
     false},
    {"p{N}", "\\p{N}\\x{11F50}-\\x{11F59}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}", false},
    {"p{P}", "\\p{P}\\x{11B00}-\\x{11B09}\\x{11F43}-\\x{11F4F}", false},
};

std::string rewrite_classes(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const std::string_view rest = pattern.substr(i + 1);
      const ClassRewrite* hit = nullptr;
      for (const ClassRewrite& r : kClassRewrites) {
        if (rest.starts_with(r.escape)) hit = &r;
      }
      if (hit == nullptr) {
        out += pattern.substr(i, 2);
      } else if (in_class && hit->negated) {
        fail("tokenizer: \\{} inside a character class is not supported: {}", hit->escape, pattern);
      } else {
        if (!in_class) out += hit->negated ? "[^" : "[";
        out += hit->members;
        if (!in_class) out += ']';
      }
      i += hit == nullptr ? 1 : hit->escape.size();
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
    } else if (c == ']' && in_class) {
      in_class = false;
    }
    out += c;
  }
  return out;
}

// The split regexes of each supported pre-tokenizer, applied in order: each one splits every
// piece left by the previous one, and the text between matches is kept as a piece of its own
// (llama.cpp unicode_regex_split; the Hugging Face "Split" pre-tokenizer with the "Isolated"
// behaviour does the same). A lookahead therefore never sees past the end of its piece.
constexpr std::string_view kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
constexpr std::string_view kLlama3Regex =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kQwen2Regex =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

struct PreTokenizerSpec {
  std::vector<std::string_view> regexes;
  bool ignore_merges = false;  // a piece that is itself a token is emitted without merging
};

// Names as they appear in tokenizer.ggml.pre (llama.cpp accepts these aliases).
bool pre_tokenizer_spec(const std::string& pre, PreTokenizerSpec& spec) {
  if (pre == "smollm" || pre == "starcoder") {
    spec.regexes = {"\\p{N}", kGpt2Regex};  // every digit is a piece of its own
  } else if (pre == "gpt-2" || pre == "gpt2") {
    spec.regexes = {kGpt2Regex};
  } else if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") {
    spec.regexes = {kLlama3Regex};
    spec.ignore_merges = true;
  } else if (pre == "qwen2") {
    spec.regexes = {kQwen2Regex};
  } else if (pre == "default" || pre.empty()) {
    // What llama.cpp uses when a GGUF names no pre-tokenizer.
    spec.regexes = {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2Regex, "\\p{N}+", "[0-9][0-9][0-9]"};
  } else {
    return false;
  }
  return true;
}

constexpr std::string_view kSupportedPre = "smollm, starcoder, gpt-2, llama-bpe (llama3), qwen2, default";

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
using RegexPtr = std::unique_ptr<pcre2_code, CodeDeleter>;

struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
using MatchDataPtr = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

RegexPtr compile_regex(std::string_view pattern) {
  const std::string expanded = rewrite_classes(pattern);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  RegexPtr re(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(expanded.data()), expanded.size(),
                            PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr));
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("tokenizer: cannot compile pre-tokenizer regex '{}' at offset {}: {}", expanded, err_offset,
         reinterpret_cast<const char*>(msg));
  }
  // JIT is an optimisation only; without it pcre2_match interprets the same pattern.
  pcre2_jit_compile(re.get(), PCRE2_JIT_COMPLETE);
  return re;
}

// ---- merge tables --------------------------------------------------------------------------

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Merge {
  int32_t rank;
  int32_t result;  // symbol id of the merged string
};

// One symbol of a word being merged: a run of bytes [start, start + len) of the word. len == 0
// marks a symbol that was merged into its left neighbour.
struct Symbol {
  int32_t id;  // BPE: symbol id (a token id when < n_vocab); SPM: unused
  int32_t prev, next;
  uint32_t start, len;
};

struct BpeBigram {
  int32_t rank;
  int32_t left, right;
  int32_t left_id, right_id;
  int32_t result;  // symbol id of the merged pair
};

// Lowest rank first; equal ranks go left to right (llama.cpp and Hugging Face agree).
struct BpeBigramAfter {
  bool operator()(const BpeBigram& a, const BpeBigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

struct SpmBigram {
  float score;
  int32_t left, right;
  uint32_t len;
};

// Highest score first; equal scores go left to right (llama.cpp llm_tokenizer_spm).
struct SpmBigramAfter {
  bool operator()(const SpmBigram& a, const SpmBigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

// A piece of input after special-token partitioning: either a token or raw text.
struct Fragment {
  int32_t token;  // -1 for text
  std::string_view text;
};

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

std::string hex_byte_token(uint8_t b) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
}

// Reads the body of a Jinja string literal starting at `pos` (just after the opening quote)
// up to `stop`. Returns false if the literal closes before `stop` appears.
bool read_jinja_literal(std::string_view s, size_t pos, char quote, std::string_view stop, std::string& out) {
  out.clear();
  while (pos < s.size()) {
    if (s.substr(pos, stop.size()) == stop) return true;
    const char c = s[pos];
    if (c == quote) return false;
    if (c == '\\' && pos + 1 < s.size()) {
      const char e = s[pos + 1];
      out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
      pos += 2;
      continue;
    }
    out += c;
    ++pos;
  }
  return false;
}

}  // namespace

// ---- Impl ----------------------------------------------------------------------------------

struct Tokenizer::Impl {
  enum class Kind { Bpe, Spm };

  VocabData d;
  Kind kind = Kind::Bpe;
  int32_t n_vocab = 0;
  std::vector<uint8_t> attr;                                 // [V]
  std::unordered_map<std::string_view, int32_t> text_to_id;  // views into d.tokens
  std::vector<int32_t> specials;  // control/user-defined/unknown ids, longest text first
  std::unordered_set<int32_t> end_of_generation;
  std::vector<std::string> pieces;  // [V] token_bytes of every token

  // BPE. Symbols are strings that can occur while merging a word: ids < V are tokens, ids >= V
  // name merge operands or results that are not tokens themselves (kept so that merging
  // follows the merge list exactly even then).
  std::vector<RegexPtr> regexes;
  bool ignore_merges = false;
  std::deque<std::string> extra_symbols;  // deque: views into it stay valid as it grows
  std::unordered_map<std::string_view, int32_t> extra_to_symbol;
  std::unordered_map<uint64_t, Merge> merges;  // (left symbol, right symbol) -> merge
  std::array<int32_t, 256> byte_symbol{};      // initial symbol of each raw byte
  std::array<int32_t, 256> byte_token{};       // token of a lone raw byte, -1 if none

  // Chat template.
  bool chatml = false;
  std::string default_system;  // inserted when the first message is not a system message

  int32_t lookup(std::string_view s) const {
    const auto it = text_to_id.find(s);
    return it == text_to_id.end() ? -1 : it->second;
  }

  int32_t symbol_id(std::string_view s) {
    if (const int32_t id = lookup(s); id >= 0) return id;
    if (const auto it = extra_to_symbol.find(s); it != extra_to_symbol.end()) return it->second;
    const int32_t id = n_vocab + static_cast<int32_t>(extra_symbols.size());
    extra_symbols.emplace_back(s);
    extra_to_symbol.emplace(extra_symbols.back(), id);
    return id;
  }

  void init_common();
  void init_bpe();
  void init_spm();
  void init_chat_template();
  std::string make_piece(int32_t id) const;

  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;
  void pre_tokenize(std::string_view text, std::vector<std::string_view>& words) const;
  void bpe_word(std::string_view word, std::vector<Symbol>& syms, std::vector<BpeBigram>& heap,
                std::vector<int32_t>& out) const;
  void spm_text(std::string_view text, std::vector<Symbol>& syms, std::vector<SpmBigram>& heap,
                std::vector<int32_t>& out) const;
};

void Tokenizer::Impl::init_common() {
  const size_t V = d.tokens.size();
  if (V == 0) fail("tokenizer: vocabulary is empty");
  if (V > static_cast<size_t>(INT32_MAX / 2)) fail("tokenizer: vocabulary too large ({})", V);
  n_vocab = static_cast<int32_t>(V);
  if (!d.scores.empty() && d.scores.size() != V) {
    fail("tokenizer: {} scores for {} tokens", d.scores.size(), V);
  }
  if (!d.token_types.empty() && d.token_types.size() != V) {
    fail("tokenizer: {} token types for {} tokens", d.token_types.size(), V);
  }
  for (auto [name, id] : {std::pair{"bos", d.bos_id},
                          {"eos", d.eos_id},
                          {"eot", d.eot_id},
                          {"unk", d.unk_id},
                          {"pad", d.pad_id}}) {
    if (id < -1 || id >= n_vocab) {
      fail("tokenizer: {} token id {} is outside the vocabulary of {} tokens", name, id, V);
    }
  }
  if (d.add_bos && d.bos_id < 0) fail("tokenizer: add_bos_token is set but there is no bos id");
  if (d.add_eos && d.eos_id < 0) fail("tokenizer: add_eos_token is set but there is no eos id");

  // llama.cpp renames empty tokens so that every text is unique; so do we.
  for (size_t i = 0; i < V; ++i) {
    if (d.tokens[i].empty()) d.tokens[i] = fmt::format("[EMPTY_{}]", i);
  }
  text_to_id.reserve(V);
  for (size_t i = 0; i < V; ++i) {
    const auto [it, inserted] = text_to_id.emplace(d.tokens[i], static_cast<int32_t>(i));
    if (!inserted) {
      fail("tokenizer: duplicate token '{}' (ids {} and {})", d.tokens[i], it->second, i);
    }
  }

  attr.assign(V, kNormal);
  if (!d.token_types.empty()) {
    for (size_t i = 0; i < V; ++i) attr[i] = attr_from_type(d.token_types[i]);
  }

  for (std::string_view name : kEndOfGenerationNames) {
    if (const int32_t id = lookup(name); id >= 0) {
      end_of_generation.insert(id);
      attr[id] |= kControl;
    }
  }
  for (int32_t id : {d.eos_id, d.eot_id}) {
    if (id >= 0) end_of_generation.insert(id);
  }

  for (int32_t id = 0; id < n_vocab; ++id) {
    if (attr[id] & (kControl | kUserDefined | kUnknown)) specials.push_back(id);
  }
  // Longest first, so that a special token containing another one wins; ties by id so the
  // order (and the result) does not depend on the sort implementation.
  std::sort(specials.begin(), specials.end(), [&](int32_t a, int32_t b) {
    const size_t la = d.tokens[a].size(), lb = d.tokens[b].size();
    return la != lb ? la > lb : a < b;
  });
}

void Tokenizer::Impl::init_bpe() {
  PreTokenizerSpec spec;
  if (!pre_tokenizer_spec(d.pre, spec)) {
    fail("tokenizer: unsupported pre-tokenizer '{}' (tokenizer.ggml.pre); supported: {}", d.pre,
         kSupportedPre);
  }
  for (std::string_view re : spec.regexes) regexes.push_back(compile_regex(re));
  ignore_merges = spec.ignore_merges;

  std::string s;
  for (int b = 0; b < 256; ++b) {
    s.clear();
    unicode::append_utf8(s, unicode::gpt2_byte_to_cpt(static_cast<uint8_t>(b)));
    byte_symbol[b] = symbol_id(s);
    byte_token[b] = lookup(s);
  }

  merges.reserve(d.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < d.merges.size(); ++rank) {
    const std::string& m = d.merges[rank];
    // "left right"; the first space from position 1 separates them (llama.cpp), so a left
    // operand may itself start with a space.
    const size_t sep = m.find(' ', 1);
    if (sep == std::string::npos) continue;  // malformed: llama.cpp ignores it as well
    const std::string_view left(m.data(), sep);
    const std::string_view right(m.data() + sep + 1, m.size() - sep - 1);
    const int32_t l = symbol_id(left);
    const int32_t r = symbol_id(right);
    joined.assign(left);
    joined += right;
    const int32_t result = symbol_id(joined);
    // Duplicates keep their first (best) rank.
    merges.emplace(pair_key(l, r), Merge{static_cast<int32_t>(rank), result});
  }
}

void Tokenizer::Impl::init_spm() {
  for (int b = 0; b < 256; ++b) {
    // Byte fallback: "<0xXX>", else a token made of the single byte (llama.cpp byte_to_token).
    int32_t id = lookup(hex_byte_token(static_cast<uint8_t>(b)));
    if (id < 0) id = lookup(std::string(1, static_cast<char>(b)));
    byte_token[b] = id;
  }
}

void Tokenizer::Impl::init_chat_template() {
  const std::string& t = d.chat_template;
  chatml = t.find("<|im_start|>") != std::string::npos;
  if (!chatml) return;
  // A default system message is a string literal "<|im_start|>system\n...<|im_end|>" in a
  // template that looks at the first message's role (SmolLM2, Qwen2). The literal may hold a
  // real newline or the escape "\n".
  if (t.find("messages[0]") == std::string::npos) return;
  constexpr std::string_view kOpen = "<|im_start|>system";
  for (size_t pos = t.find(kOpen); pos != std::string::npos; pos = t.find(kOpen, pos + 1)) {
    if (pos == 0) continue;
    const char quote = t[pos - 1];
    if (quote != '\'' && quote != '"') continue;
    size_t body = pos + kOpen.size();
    if (t.compare(body, 1, "\n") == 0) {
      body += 1;
    } else if (t.compare(body, 2, "\\n") == 0) {
      body += 2;
    } else {
      continue;
    }
    std::string content;
    if (read_jinja_literal(t, body, quote, "<|im_end|>", content) && !content.empty()) {
      default_system = std::move(content);
      return;
    }
  }
}

std::string Tokenizer::Impl::make_piece(int32_t id) const {
  const std::string& text = d.tokens[id];
  const uint8_t a = attr[id];
  if (a & (kControl | kUserDefined | kUnknown)) return text;
  if (a & kByte) {
    // "<0xXX>"
    if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') {
      return std::string(1, static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
    }
    return text;
  }
  if (!(a & kNormal)) return {};  // unused and undefined tokens render as nothing (llama.cpp)
  std::string out;
  if (kind == Kind::Spm) {
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, kSpmSpace.size(), kSpmSpace) == 0) {
        out += ' ';
        i += kSpmSpace.size();
      } else {
        out += text[i++];
      }
    }
    return out;
  }
  // Byte-level BPE: every code point stands for one byte. A code point outside the table
  // (not produced by a GPT-2 style converter) is kept as its UTF-8 bytes; llama.cpp writes a
  // diagnostic "[UNK_BYTE_...]" string there instead.
  for (size_t i = 0; i < text.size();) {
    const int n = unicode::valid_seq_len(text, i);
    if (n == 0) {  // ill-formed token text: pass the byte through
      out += text[i++];
      continue;
    }
    const int b = unicode::gpt2_cpt_to_byte(unicode::decode_at(text, i, n));
    if (b >= 0) {
      out += static_cast<char>(b);
    } else {
      out.append(text, i, n);
    }
    i += n;
  }
  return out;
}

// Splits `text` around special tokens, longest token first, each token at every occurrence
// (llama.cpp tokenizer_st_partition). Without parse_special only user-defined tokens are
// split out, as in llama.cpp and Hugging Face.
std::vector<Fragment> Tokenizer::Impl::partition(std::string_view text, bool parse_special) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, text});
  std::vector<Fragment> next;
  for (const int32_t id : specials) {
    if (!parse_special && (attr[id] & (kControl | kUnknown))) continue;
    const std::string_view tok = d.tokens[id];
    next.clear();
    bool found = false;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t pos = 0;
      for (size_t m = f.text.find(tok); m != std::string_view::npos; m = f.text.find(tok, pos)) {
        if (m > pos) next.push_back({-1, f.text.substr(pos, m - pos)});
        next.push_back({id, {}});
        pos = m + tok.size();
        found = true;
      }
      if (pos < f.text.size()) next.push_back({-1, f.text.substr(pos)});
    }
    if (found) frags.swap(next);
  }
  return frags;
}

void Tokenizer::Impl::pre_tokenize(std::string_view text, std::vector<std::string_view>& words) const {
  words.clear();
  words.push_back(text);
  std::vector<std::string_view> next;
  for (const RegexPtr& re : regexes) {
    MatchDataPtr md(pcre2_match_data_create_from_pattern(re.get(), nullptr));
    if (!md) fail("tokenizer: out of memory for regex match data");
    next.clear();
    for (const std::string_view piece : words) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t pos = 0;    // where the next search starts
      size_t taken = 0;  // end of the last piece emitted
      while (pos < piece.size()) {
        // The subject is the piece alone, so a lookahead cannot see into the next piece.
        const int rc =
            pcre2_match(re.get(), subject, piece.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof msg);
          fail("tokenizer: pre-tokenizer regex failed: {}", reinterpret_cast<const char*>(msg));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        const size_t begin = ov[0], end = ov[1];
        if (end == begin) {  // none of our patterns matches empty; never loop on one
          pos = end + 1;
          while (pos < piece.size() && (static_cast<uint8_t>(piece[pos]) & 0xC0) == 0x80) ++pos;
          continue;
        }
        if (begin > taken) next.push_back(piece.substr(taken, begin - taken));
        next.push_back(piece.substr(begin, end - begin));
        taken = pos = end;
      }
      if (taken < piece.size()) next.push_back(piece.substr(taken));
    }
    words.swap(next);
  }
}

// Byte-level BPE on one pre-tokenized word: start from one symbol per byte, repeatedly merge
// the adjacent pair with the lowest merge rank (leftmost first), then emit tokens. A final
// symbol that is not a token falls back to the tokens of its single bytes.
void Tokenizer::Impl::bpe_word(std::string_view word, std::vector<Symbol>& syms, std::vector<BpeBigram>& heap,
                               std::vector<int32_t>& out) const {
  if (ignore_merges) {
    std::string encoded;
    for (const char c : word) {
      unicode::append_utf8(encoded, unicode::gpt2_byte_to_cpt(static_cast<uint8_t>(c)));
    }
    if (const int32_t id = lookup(encoded); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  const auto n = static_cast<int32_t>(word.size());
  if (n == 0) return;
  syms.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    syms[i] = {byte_symbol[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1,
               static_cast<uint32_t>(i), 1};
  }
  heap.clear();
  const BpeBigramAfter after;
  auto add_bigram = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const auto it = merges.find(pair_key(syms[l].id, syms[r].id));
    if (it == merges.end()) return;
    heap.push_back({it->second.rank, l, r, syms[l].id, syms[r].id, it->second.result});
    std::push_heap(heap.begin(), heap.end(), after);
  };
  for (int32_t i = 1; i < n; ++i) add_bigram(i - 1, i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), after);
    const BpeBigram b = heap.back();
    heap.pop_back();
    Symbol& l = syms[b.left];
    Symbol& r = syms[b.right];
    // Stale if either side has been merged since: symbols only grow, so unchanged ids mean
    // unchanged strings and the two are still neighbours.
    if (l.len == 0 || r.len == 0 || l.id != b.left_id || r.id != b.right_id) continue;
    l.id = b.result;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = b.left;
    add_bigram(l.prev, b.left);
    add_bigram(b.left, l.next);
  }
  for (int32_t i = 0; i != -1; i = syms[i].next) {
    const Symbol& s = syms[i];
    if (s.id < n_vocab) {
      out.push_back(s.id);
      continue;
    }
    for (uint32_t k = s.start; k < s.start + s.len; ++k) {
      const int32_t t = byte_token[static_cast<uint8_t>(word[k])];
      if (t >= 0) out.push_back(t);  // a byte with no token is dropped, as in llama.cpp
    }
  }
}

// SentencePiece BPE on escaped text (spaces already U+2581): start from one symbol per UTF-8
// character, repeatedly merge the adjacent pair whose concatenation is the token with the
// highest score (leftmost first), then emit tokens; a character that is not a token becomes
// its byte tokens.
void Tokenizer::Impl::spm_text(std::string_view text, std::vector<Symbol>& syms, std::vector<SpmBigram>& heap,
                               std::vector<int32_t>& out) const {
  syms.clear();
  for (size_t i = 0; i < text.size();) {
    const int len = std::max(1, unicode::valid_seq_len(text, i));
    const auto idx = static_cast<int32_t>(syms.size());
    syms.push_back({-1, idx - 1, -1, static_cast<uint32_t>(i), static_cast<uint32_t>(len)});
    if (idx > 0) syms[idx - 1].next = idx;
    i += len;
  }
  heap.clear();
  const SpmBigramAfter after;
  auto add_bigram = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const uint32_t len = syms[l].len + syms[r].len;
    const int32_t id = lookup(text.substr(syms[l].start, len));
    if (id < 0) return;
    heap.push_back({d.scores.empty() ? 0.0f : d.scores[id], l, r, len});
    std::push_heap(heap.begin(), heap.end(), after);
  };
  for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) add_bigram(i - 1, i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), after);
    const SpmBigram b = heap.back();
    heap.pop_back();
    Symbol& l = syms[b.left];
    Symbol& r = syms[b.right];
    // Stale if either side changed since: lengths only grow, so equal total means unchanged.
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = b.left;
    add_bigram(l.prev, b.left);
    add_bigram(b.left, l.next);
  }
  for (int32_t i = syms.empty() ? -1 : 0; i != -1; i = syms[i].next) {
    const Symbol& s = syms[i];
    const std::string_view piece = text.substr(s.start, s.len);
    if (const int32_t id = lookup(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    for (const char c : piece) {
      int32_t t = byte_token[static_cast<uint8_t>(c)];
      if (t < 0) t = d.unk_id;
      if (t < 0) {
        fail("tokenizer: byte 0x{:02X} has no token and the vocabulary has no unknown token",
             static_cast<uint8_t>(c));
      }
      out.push_back(t);
    }
  }
}

// ---- Tokenizer -----------------------------------------------------------------------------

Tokenizer::Tokenizer(VocabData data) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.d = std::move(data);
  if (m.d.model == "gpt2") {
    m.kind = Impl::Kind::Bpe;
  } else if (m.d.model == "llama") {
    m.kind = Impl::Kind::Spm;
  } else {
    fail(
        "tokenizer: unsupported tokenizer model '{}' (tokenizer.ggml.model); supported: "
        "gpt2 (byte-level BPE), llama (SentencePiece)",
        m.d.model);
  }
  m.init_common();
  if (m.kind == Impl::Kind::Bpe) {
    m.init_bpe();
  } else {
    m.init_spm();
  }
  m.init_chat_template();
  m.pieces.resize(m.n_vocab);
  for (int32_t id = 0; id < m.n_vocab; ++id) m.pieces[id] = m.make_piece(id);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

// `add_bos` plays the part of llama.cpp's add_special: it adds BOS, and EOS too for the rare
// vocabulary that sets add_eos_token, each only when the vocabulary asks for it.
std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  const Impl& m = *impl_;
  if (const int64_t bad = unicode::find_invalid(text); bad >= 0) {
    fail("tokenizer: input is not valid UTF-8 (ill-formed sequence at byte {} of {})", bad, text.size());
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && m.d.add_bos) out.push_back(m.d.bos_id);

  const std::vector<Fragment> frags = m.partition(text, parse_special);
  std::vector<Symbol> syms;
  if (m.kind == Impl::Kind::Bpe) {
    std::vector<std::string_view> words;
    std::vector<BpeBigram> heap;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        out.push_back(f.token);
        continue;
      }
      m.pre_tokenize(f.text, words);
      for (const std::string_view w : words) m.bpe_word(w, syms, heap, out);
    }
  } else {
    // Every text fragment at the start or right after a special token gets the leading space
    // (llama.cpp; for text without special tokens this is SentencePiece's add_dummy_prefix).
    std::vector<SpmBigram> heap;
    std::string escaped;
    bool prev_special = true;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        out.push_back(f.token);
        prev_special = true;
        continue;
      }
      escaped.clear();
      if (m.d.add_space_prefix && prev_special) escaped += kSpmSpace;
      for (const char c : f.text) {
        if (c == ' ') {
          escaped += kSpmSpace;
        } else {
          escaped += c;
        }
      }
      m.spm_text(escaped, syms, heap, out);
      prev_special = false;
    }
  }
  if (add_bos && m.d.add_eos) out.push_back(m.d.eos_id);
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= impl_->n_vocab) {
    fail("tokenizer: token id {} is outside the vocabulary of {} tokens", id, impl_->n_vocab);
  }
  return impl_->pieces[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  const Impl& m = *impl_;
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= m.n_vocab) {
      fail("tokenizer: cannot decode token id {} (position {}): vocabulary has {} tokens", id, i, m.n_vocab);
    }
    std::string_view piece = m.pieces[id];
    // Only the first token loses its leading space, as in llama.cpp: after a leading BOS the
    // space stays.
    if (i == 0 && m.kind == Impl::Kind::Spm && m.d.add_space_prefix && !piece.empty() && piece[0] == ' ') {
      piece.remove_prefix(1);
    }
    bytes += piece;
  }
  return unicode::repair_utf8(bytes);
}

std::string Tokenizer::apply_chat_template(std::span<const ChatMessage> messages,
                                           bool add_generation_prompt) const {
  const Impl& m = *impl_;
  if (!m.chatml) {
    if (m.d.chat_template.empty()) fail("tokenizer: the model has no chat template");
    fail("tokenizer: unsupported chat template (only ChatML is supported): '{}...'",
         std::string_view(m.d.chat_template).substr(0, 80));
  }
  std::string out;
  if (!messages.empty() && messages[0].role != "system" && !m.default_system.empty()) {
    out += "<|im_start|>system\n" + m.default_system + "<|im_end|>\n";
  }
  for (const ChatMessage& msg : messages) {
    out += "<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

int32_t Tokenizer::n_vocab() const {
  return impl_->n_vocab;
}
int32_t Tokenizer::bos_id() const {
  return impl_->d.bos_id;
}
int32_t Tokenizer::eos_id() const {
  return impl_->d.eos_id;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return impl_->end_of_generation.count(id) > 0;
}

const std::string& Tokenizer::model() const {
  return impl_->d.model;
}
const std::string& Tokenizer::pre() const {
  return impl_->d.pre;
}

int64_t find_invalid_utf8(std::string_view s) {
  return unicode::find_invalid(s);
}

}  // namespace lp
