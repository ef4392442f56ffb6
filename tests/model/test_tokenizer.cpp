// Tokenizer tests. Tiny hand-built vocabularies check each mechanism with ids worked out by
// hand; TokenizerRealModel checks SmolLM2's tokenizer against ids that llama.cpp produced
// (tests/fixtures/smollm2_tokens.json) and needs the default model file.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "model/error.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/unicode.h"
#include "model/vocab.h"
#include "tests/test_util.h"

#ifndef LP_SOURCE_DIR
#define LP_SOURCE_DIR "."
#endif

namespace {

using lp::Tokenizer;
using lp::VocabData;
using Ids = std::vector<int32_t>;

// ---- tiny vocabularies ---------------------------------------------------------------------

// GPT-2 byte-level spelling of raw text ("a b" -> "aĠb").
std::string byte_level(std::string_view raw) {
  std::string out;
  for (const char c : raw) {
    lp::unicode::append_utf8(out, lp::unicode::gpt2_byte_to_cpt(static_cast<uint8_t>(c)));
  }
  return out;
}

// A byte-level BPE vocabulary: the control tokens first, then one token per byte (in byte
// order), then `extra` tokens given in raw text. Merges are given in raw text as well.
struct BpeVocab {
  VocabData data;

  BpeVocab(std::string pre, std::vector<std::string> extra, std::vector<std::string> merges,
           std::vector<std::string> control = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    data.model = "gpt2";
    data.pre = std::move(pre);
    for (const auto& c : control) {
      data.tokens.push_back(c);
      data.token_types.push_back(3);
    }
    for (int b = 0; b < 256; ++b) {
      data.tokens.push_back(byte_level(std::string(1, static_cast<char>(b))));
      data.token_types.push_back(1);
    }
    for (const auto& e : extra) {
      data.tokens.push_back(byte_level(e));
      data.token_types.push_back(1);
    }
    for (const auto& m : merges) {
      const size_t sep = m.find('|');
      data.merges.push_back(byte_level(m.substr(0, sep)) + " " + byte_level(m.substr(sep + 1)));
    }
    data.bos_id = 1;
    data.eos_id = 2;
    data.unk_id = 0;
    data.add_space_prefix = false;
  }

  // Ids of tokens given by raw text (control tokens by their text).
  Ids ids(std::initializer_list<std::string_view> raw) const {
    Ids out;
    for (const auto r : raw) {
      const std::string want = r.starts_with("<|") ? std::string(r) : byte_level(r);
      const auto it = std::find(data.tokens.begin(), data.tokens.end(), want);
      if (it == data.tokens.end()) ADD_FAILURE() << "no token '" << r << "' in test vocab";
      out.push_back(static_cast<int32_t>(it - data.tokens.begin()));
    }
    return out;
  }
};

TEST(TokenizerBpe, MergesApplyInRankOrderNotLeftToRight) {
  // "b c" outranks "a b": left-to-right merging would give [ab, c], rank order gives [a, bc].
  const BpeVocab v("gpt-2", {"ab", "bc", " a", "aa", "aaaa"}, {"b|c", "a|b", " |a", "a|a", "aa|aa"});
  const Tokenizer tok(v.data);
  EXPECT_EQ(tok.encode("abc", false, false), v.ids({"a", "bc"}));
  EXPECT_EQ(tok.encode("ab", false, false), v.ids({"ab"}));
  // Two words (the second starts with its space): [a, bc] and [" a", bc].
  EXPECT_EQ(tok.encode("abc abc", false, false), v.ids({"a", "bc", " a", "bc"}));
  // Equal ranks merge leftmost first: "aaa" -> [aa, a]; then "aa aa" joins the pairs.
  EXPECT_EQ(tok.encode("aaa", false, false), v.ids({"aa", "a"}));
  EXPECT_EQ(tok.encode("aaaa", false, false), v.ids({"aaaa"}));
  EXPECT_EQ(tok.encode("aaaaa", false, false), v.ids({"aaaa", "a"}));
}

TEST(TokenizerBpe, MergeResultThatIsNotATokenFallsBackToBytes) {
  // "c d" yields "cd", which is not a token but is the left side of "cd a".
  const BpeVocab v("gpt-2", {"cda"}, {"c|d", "cd|a"});
  const Tokenizer tok(v.data);
  EXPECT_EQ(tok.encode("cda", false, false), v.ids({"cda"}));
  EXPECT_EQ(tok.encode("cd", false, false), v.ids({"c", "d"}));
}

TEST(TokenizerBpe, PreTokenizerSplitsBeforeMerging) {
  // Merges that would join across the pre-tokenizer's boundaries show where it splits.
  const BpeVocab v("gpt-2", {"a1", "12", "  ", "   ", " b", "\n\n", "'s"},
                   {"a|1", "1|2", " | ", "  | ", " |b", "\n|\n", "'|s"});
  const Tokenizer gpt2(v.data);
  // Letters and digits are separate pieces; a run of digits is one piece.
  EXPECT_EQ(gpt2.encode("a12", false, false), v.ids({"a", "12"}));
  // \s+(?!\S): the last space of a run goes with the next word; a trailing run stays whole.
  EXPECT_EQ(gpt2.encode("a   b", false, false), v.ids({"a", "  ", " b"}));
  EXPECT_EQ(gpt2.encode("a   ", false, false), v.ids({"a", "   "}));
  EXPECT_EQ(gpt2.encode("a\n\nb", false, false), v.ids({"a", "\n", "\n", "b"}));
  EXPECT_EQ(gpt2.encode("a\n\n", false, false), v.ids({"a", "\n\n"}));
  EXPECT_EQ(gpt2.encode("it's", false, false), v.ids({"i", "t", "'s"}));

  VocabData smol = v.data;
  smol.pre = "smollm";  // every digit is a piece of its own
  EXPECT_EQ(Tokenizer(smol).encode("a12", false, false), v.ids({"a", "1", "2"}));

  VocabData llama3 = v.data;
  llama3.pre = "llama-bpe";  // \s*[\r\n]+ keeps newline runs together
  EXPECT_EQ(Tokenizer(llama3).encode("a\n\nb", false, false), v.ids({"a", "\n\n", "b"}));
}

TEST(TokenizerBpe, Llama3UsesWholeWordTokensWithoutMerges) {
  // llama-bpe sets ignore_merges: a piece that is a token is taken as is.
  const BpeVocab v("llama-bpe", {"abc"}, {});
  EXPECT_EQ(Tokenizer(v.data).encode("abc", false, false), v.ids({"abc"}));
  VocabData gpt2 = v.data;
  gpt2.pre = "gpt-2";
  EXPECT_EQ(Tokenizer(gpt2).encode("abc", false, false), v.ids({"a", "b", "c"}));
}

TEST(TokenizerBpe, SpecialTokensAreParsedOnlyWhenAsked) {
  const BpeVocab v("gpt-2", {"im", " user"}, {"i|m", " |u", " u|s", " us|e", " use|r"});
  const Tokenizer tok(v.data);
  const std::string text = "<|im_start|> user";
  EXPECT_EQ(tok.encode(text, false, true), v.ids({"<|im_start|>", " user"}));
  // As plain text: "<|", "im", "_", "start", "|>", " user" (no merges for the others).
  EXPECT_EQ(tok.encode(text, false, false),
            v.ids({"<", "|", "im", "_", "s", "t", "a", "r", "t", "|", ">", " user"}));
  EXPECT_EQ(tok.encode("<|im_end|><|im_end|>", false, true), v.ids({"<|im_end|>", "<|im_end|>"}));
  EXPECT_EQ(tok.encode("", false, true), Ids{});
  EXPECT_EQ(tok.decode(tok.encode(text, false, true)), text);
  EXPECT_EQ(tok.decode(tok.encode(text, false, false)), text);
}

TEST(TokenizerBpe, LongestSpecialTokenWinsAndUserDefinedIsAlwaysSplit) {
  BpeVocab v("gpt-2", {}, {}, {"<a>", "<a><b>"});
  v.data.tokens.push_back("<u>");
  v.data.token_types.push_back(4);  // user defined
  const Tokenizer tok(v.data);
  EXPECT_EQ(tok.encode("<a><b><a>", false, true), (Ids{1, 0}));
  // User-defined tokens are split out even without parse_special (llama.cpp, HF).
  const auto u = static_cast<int32_t>(v.data.tokens.size() - 1);
  EXPECT_EQ(tok.encode("x<u>", false, false), (Ids{v.ids({"x"})[0], u}));
}

TEST(TokenizerBpe, BosIsAddedOnlyWhenTheVocabularyAsks) {
  BpeVocab v("gpt-2", {}, {});
  EXPECT_EQ(Tokenizer(v.data).encode("a", true, false), v.ids({"a"}));
  v.data.add_bos = true;
  EXPECT_EQ(Tokenizer(v.data).encode("a", true, false), (Ids{1, v.ids({"a"})[0]}));
  EXPECT_EQ(Tokenizer(v.data).encode("a", false, false), v.ids({"a"}));
}

TEST(TokenizerBpe, DecodeJoinsBytesAndRepairsUtf8) {
  const BpeVocab v("gpt-2", {}, {});
  const Tokenizer tok(v.data);
  const std::string emoji = "\xF0\x9F\x98\x80";  // U+1F600, four byte tokens
  const Ids ids = tok.encode(emoji, false, false);
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(tok.token_bytes(ids[0]), "\xF0");
  EXPECT_EQ(tok.decode(ids), emoji);
  // A truncated sequence is one U+FFFD, however many of its bytes are there.
  EXPECT_EQ(tok.decode(std::span(ids).first(3)), "\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode(std::span(ids).first(1)), "\xEF\xBF\xBD");
  const Ids mixed = {ids[0], ids[1], v.ids({"a"})[0]};
  EXPECT_EQ(tok.decode(mixed), std::string("\xEF\xBF\xBD") + "a");
  EXPECT_EQ(tok.token_bytes(v.ids({"<|im_end|>"})[0]), "<|im_end|>");
  EXPECT_THROW(tok.decode(Ids{static_cast<int32_t>(v.data.tokens.size())}), lp::Error);
  EXPECT_THROW(tok.token_bytes(-1), lp::Error);
}

TEST(TokenizerBpe, InvalidUtf8InputThrows) {
  const Tokenizer tok(BpeVocab("gpt-2", {}, {}).data);
  EXPECT_THROW(tok.encode("ok \xC3\x28", false, false), lp::Error);
  EXPECT_THROW(tok.encode("\xED\xA0\x80", false, false), lp::Error);  // surrogate
  EXPECT_THROW(tok.encode("\xE2\x82", false, false), lp::Error);      // truncated
  EXPECT_NO_THROW(tok.encode("\xE2\x82\xAC", false, false));          // "€"
}

TEST(TokenizerBpe, EndOfGeneration) {
  const BpeVocab v("gpt-2", {}, {}, {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<reponame>"});
  const Tokenizer tok(v.data);
  EXPECT_TRUE(tok.is_end_of_generation(0));   // <|endoftext|>
  EXPECT_FALSE(tok.is_end_of_generation(1));  // <|im_start|>
  EXPECT_TRUE(tok.is_end_of_generation(2));   // <|im_end|>, also eos
  EXPECT_TRUE(tok.is_end_of_generation(3));   // llama.cpp treats <reponame> as FIM end too
  EXPECT_FALSE(tok.is_end_of_generation(v.ids({"a"})[0]));
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.n_vocab(), static_cast<int32_t>(v.data.tokens.size()));
}

// ---- SentencePiece -------------------------------------------------------------------------

constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581

// <unk>, <s>, </s>, 256 byte tokens <0x00>..<0xFF> (ids 3..258), then the given pieces with
// their scores; "_" in a piece stands for U+2581.
VocabData spm_vocab(std::vector<std::pair<std::string, float>> pieces, bool byte_tokens = true) {
  VocabData d;
  d.model = "llama";
  d.pre = "default";
  auto add = [&](std::string t, float score, int32_t type) {
    d.tokens.push_back(std::move(t));
    d.scores.push_back(score);
    d.token_types.push_back(type);
  };
  add("<unk>", 0, 2);
  add("<s>", 0, 3);
  add("</s>", 0, 3);
  if (byte_tokens) {
    for (int b = 0; b < 256; ++b) add(fmt::format("<0x{:02X}>", b), 0, 6);
  }
  for (auto& [p, s] : pieces) {
    std::string t;
    for (const char c : p) {
      if (c == '_') {
        t += kSpace;
      } else {
        t += c;
      }
    }
    add(t, s, 1);
  }
  d.unk_id = 0;
  d.bos_id = 1;
  d.eos_id = 2;
  d.add_bos = true;
  d.add_space_prefix = true;
  return d;
}

int32_t spm_id(const VocabData& d, std::string piece) {
  std::string t;
  for (const char c : piece) {
    if (c == '_') {
      t += kSpace;
    } else {
      t += c;
    }
  }
  const auto it = std::find(d.tokens.begin(), d.tokens.end(), t);
  EXPECT_NE(it, d.tokens.end()) << piece;
  return static_cast<int32_t>(it - d.tokens.begin());
}

TEST(TokenizerSpm, MergesByScoreWithSpacePrefixAndByteFallback) {
  const VocabData d = spm_vocab({{"_", -10},
                                 {"a", -10},
                                 {"b", -10},
                                 {"c", -10},
                                 {"h", -10},
                                 {"i", -10},
                                 {"ab", -2},
                                 {"bc", -1},
                                 {"_h", -3},
                                 {"_hi", -1}});
  const Tokenizer tok(d);
  auto id = [&](const char* p) { return spm_id(d, p); };
  // "_abc": "bc" (-1) beats "ab" (-2) although "ab" is further left.
  EXPECT_EQ(tok.encode("abc", false, false), (Ids{id("_"), id("a"), id("bc")}));
  EXPECT_EQ(tok.encode("abc", true, false), (Ids{1, id("_"), id("a"), id("bc")}));
  EXPECT_EQ(tok.encode("hi", false, false), (Ids{id("_hi")}));
  // "é" (C3 A9) is not a piece: byte tokens <0xC3> <0xA9>.
  EXPECT_EQ(tok.encode("hi\xC3\xA9", false, false), (Ids{id("_hi"), 3 + 0xC3, 3 + 0xA9}));
  // Spaces inside the text become U+2581 too.
  EXPECT_EQ(tok.encode("hi hi", false, false), (Ids{id("_hi"), id("_hi")}));
  // decode drops the space that add_space_prefix put in front.
  EXPECT_EQ(tok.decode(tok.encode("hi\xC3\xA9 abc", false, false)), "hi\xC3\xA9 abc");
  EXPECT_EQ(tok.token_bytes(id("_hi")), " hi");
  EXPECT_EQ(tok.token_bytes(3 + 0x0A), "\n");

  VocabData no_prefix = d;
  no_prefix.add_space_prefix = false;
  EXPECT_EQ(Tokenizer(no_prefix).encode("hi", false, false), (Ids{id("h"), id("i")}));
  EXPECT_EQ(Tokenizer(no_prefix).decode(Ids{id("_hi")}), " hi");
}

TEST(TokenizerSpm, SpecialTokensAndUnknown) {
  const VocabData d = spm_vocab({{"_", -10}, {"h", -10}, {"i", -10}, {"_h", -3}, {"_hi", -1}});
  const Tokenizer tok(d);
  const int32_t hi = spm_id(d, "_hi");
  // llama.cpp puts the space prefix on the text after a special token as well.
  EXPECT_EQ(tok.encode("</s>hi", false, true), (Ids{2, hi}));
  EXPECT_EQ(tok.decode(Ids{2, hi}), "</s> hi");

  // Without byte tokens an unknown character becomes <unk>, one per byte.
  const Tokenizer no_bytes(spm_vocab({{"_", -10}, {"h", -10}}, false));
  EXPECT_EQ(no_bytes.encode("h\xC3\xA9", false, false), (Ids{3, 4, 0, 0}));
}

// ---- UTF-8 validation ----------------------------------------------------------------------

TEST(TokenizerUtf8, FindInvalid) {
  EXPECT_EQ(lp::find_invalid_utf8(""), -1);
  EXPECT_EQ(lp::find_invalid_utf8("plain ascii"), -1);
  EXPECT_EQ(lp::find_invalid_utf8("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"), -1);  // é € 😀
  EXPECT_EQ(lp::find_invalid_utf8("\xF4\x8F\xBF\xBF"), -1);                      // U+10FFFF
  EXPECT_EQ(lp::find_invalid_utf8("\xEF\xBF\xBD"), -1);                          // U+FFFD
  // Overlong forms.
  EXPECT_EQ(lp::find_invalid_utf8("\xC0\xAF"), 0);
  EXPECT_EQ(lp::find_invalid_utf8("\xC1\xBF"), 0);
  EXPECT_EQ(lp::find_invalid_utf8("a\xE0\x80\xAF"), 1);
  EXPECT_EQ(lp::find_invalid_utf8("ab\xF0\x80\x80\xAF"), 2);
  // Surrogates U+D800, U+DFFF.
  EXPECT_EQ(lp::find_invalid_utf8("\xED\xA0\x80"), 0);
  EXPECT_EQ(lp::find_invalid_utf8("x\xED\xBF\xBF"), 1);
  EXPECT_EQ(lp::find_invalid_utf8("\xED\x9F\xBF"), -1);  // U+D7FF is fine
  // Above U+10FFFF.
  EXPECT_EQ(lp::find_invalid_utf8("\xF4\x90\x80\x80"), 0);
  EXPECT_EQ(lp::find_invalid_utf8("\xF5\x80\x80\x80"), 0);
  EXPECT_EQ(lp::find_invalid_utf8("\xFF"), 0);
  // Truncated sequences and stray continuation bytes.
  EXPECT_EQ(lp::find_invalid_utf8("ab\xE2\x82"), 2);
  EXPECT_EQ(lp::find_invalid_utf8("\xF0\x9F\x98"), 0);
  EXPECT_EQ(lp::find_invalid_utf8("\xC3"), 0);
  EXPECT_EQ(lp::find_invalid_utf8(std::string("\xE2\x82") + "a"), 0);
  EXPECT_EQ(lp::find_invalid_utf8("abc\x80"), 3);
}

TEST(TokenizerUtf8, RepairReplacesMaximalSubparts) {
  using lp::unicode::repair_utf8;
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(repair_utf8("ok"), "ok");
  EXPECT_EQ(repair_utf8("\xE2\x82"), fffd);  // one subpart
  EXPECT_EQ(repair_utf8(std::string("\xE2\x82") + "a"), fffd + "a");
  EXPECT_EQ(repair_utf8("\x80\x80"), fffd + fffd);             // two stray bytes
  EXPECT_EQ(repair_utf8("\xED\xA0\x80"), fffd + fffd + fffd);  // ED A0 is not a prefix
  EXPECT_EQ(repair_utf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
}

TEST(TokenizerUtf8, Gpt2ByteTable) {
  using lp::unicode::gpt2_byte_to_cpt;
  using lp::unicode::gpt2_cpt_to_byte;
  EXPECT_EQ(gpt2_byte_to_cpt('!'), U'!');
  EXPECT_EQ(gpt2_byte_to_cpt('~'), U'~');
  EXPECT_EQ(gpt2_byte_to_cpt(0xA1), 0xA1u);
  EXPECT_EQ(gpt2_byte_to_cpt(0xAE), 0xAEu);
  EXPECT_EQ(gpt2_byte_to_cpt(0x00), 0x100u);
  EXPECT_EQ(gpt2_byte_to_cpt(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(gpt2_byte_to_cpt('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(gpt2_byte_to_cpt(0xAD), 0x143u);  // the 68th, last remapped byte
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(gpt2_cpt_to_byte(gpt2_byte_to_cpt(static_cast<uint8_t>(b))), b);
  }
  EXPECT_EQ(gpt2_cpt_to_byte(' '), -1);
  EXPECT_EQ(gpt2_cpt_to_byte(0x144), -1);
}

// ---- configuration errors and chat templates -----------------------------------------------

std::string error_of(const VocabData& d) {
  try {
    Tokenizer t(d);
  } catch (const lp::Error& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerConfig, UnsupportedModelOrPreTokenizerIsAnError) {
  VocabData bert = BpeVocab("gpt-2", {}, {}).data;
  bert.model = "bert";
  EXPECT_NE(error_of(bert).find("unsupported tokenizer model 'bert'"), std::string::npos) << error_of(bert);
  VocabData pre = BpeVocab("gpt-2", {}, {}).data;
  pre.pre = "jais-9000";
  EXPECT_NE(error_of(pre).find("unsupported pre-tokenizer 'jais-9000'"), std::string::npos) << error_of(pre);
  VocabData scores = BpeVocab("gpt-2", {}, {}).data;
  scores.scores = {1.0f};
  EXPECT_NE(error_of(scores), "");
  VocabData bos = BpeVocab("gpt-2", {}, {}).data;
  bos.bos_id = static_cast<int32_t>(bos.tokens.size());
  EXPECT_NE(error_of(bos), "");
  VocabData dup = BpeVocab("gpt-2", {}, {}).data;
  dup.tokens.push_back(dup.tokens[5]);
  dup.token_types.push_back(1);
  EXPECT_NE(error_of(dup).find("duplicate token"), std::string::npos);
}

constexpr const char* kSmolLM2Template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

constexpr const char* kSmolLM2Prompt =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n";

TEST(TokenizerChat, ChatMLWithDefaultSystemMessage) {
  VocabData d = BpeVocab("gpt-2", {}, {}).data;
  d.chat_template = kSmolLM2Template;
  const Tokenizer tok(d);
  const std::vector<lp::ChatMessage> user = {{"user", "Hello!"}};
  EXPECT_EQ(tok.apply_chat_template(user, true), kSmolLM2Prompt);
  const std::vector<lp::ChatMessage> with_system = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}};
  EXPECT_EQ(tok.apply_chat_template(with_system, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n");
  EXPECT_EQ(tok.apply_chat_template({}, true), "<|im_start|>assistant\n");
}

TEST(TokenizerChat, PlainChatMLAndUnknownTemplates) {
  VocabData d = BpeVocab("gpt-2", {}, {}).data;
  // Escaped newlines as some converters write them; no default system message.
  d.chat_template =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
  const std::vector<lp::ChatMessage> user = {{"user", "Hi"}};
  EXPECT_EQ(Tokenizer(d).apply_chat_template(user, false), "<|im_start|>user\nHi<|im_end|>\n");

  d.chat_template = "{{ bos_token }}[INST] {{ message }} [/INST]";
  EXPECT_THROW(Tokenizer(d).apply_chat_template(user, true), lp::Error);
  d.chat_template = "";
  EXPECT_THROW(Tokenizer(d).apply_chat_template(user, true), lp::Error);
}

// ---- the real model ------------------------------------------------------------------------

// Reads the tokenizer.* metadata of the model file through the project's GGUF reader.
VocabData read_tokenizer_metadata(const std::string& gguf_path) {
  return lp::vocab_from_gguf(lp::GgufFile::open(gguf_path));
}

VocabData load_smollm2_vocab() {
  const std::string path = lp::testing::real_model_path();
  if (!std::filesystem::exists(path)) {
    throw lp::Error("default model not found at " + path +
                    " (scripts/setup fetches it; LAZYPREFILL_MODEL overrides the path)");
  }
  return read_tokenizer_metadata(path);
}

// One Tokenizer for all real-model tests; construction fails the test, never skips it.
const Tokenizer& smollm2() {
  static const Tokenizer tok(load_smollm2_vocab());
  return tok;
}

nlohmann::json load_fixture() {
  const std::string path = std::string(LP_SOURCE_DIR) + "/tests/fixtures/smollm2_tokens.json";
  std::ifstream in(path);
  if (!in) throw lp::Error("cannot open fixture " + path);
  return nlohmann::json::parse(in);
}

TEST(TokenizerRealModel, VocabularyFacts) {
  const Tokenizer& tok = smollm2();
  EXPECT_EQ(tok.model(), "gpt2");
  EXPECT_EQ(tok.pre(), "smollm");
  EXPECT_EQ(tok.n_vocab(), 49152);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.token_bytes(1), "<|im_start|>");
  EXPECT_TRUE(tok.is_end_of_generation(2));
  EXPECT_TRUE(tok.is_end_of_generation(0));
  EXPECT_FALSE(tok.is_end_of_generation(1));
  // add_bos_token is false for SmolLM2: asking for BOS adds nothing.
  EXPECT_EQ(tok.encode("Hello", true, false), tok.encode("Hello", false, false));
}

TEST(TokenizerRealModel, MatchesLlamaCpp) {
  const Tokenizer& tok = smollm2();
  const nlohmann::json fixture = load_fixture();
  const auto& cases = fixture.at("cases");
  ASSERT_GE(cases.size(), 40u);
  int matched = 0;
  for (const auto& c : cases) {
    const std::string text = c.at("text");
    const Ids want = c.at("ids").get<Ids>();
    const Ids want_plain = c.at("ids_no_special").get<Ids>();
    const Ids got = tok.encode(text, false, true);
    const Ids got_plain = tok.encode(text, false, false);
    EXPECT_EQ(got, want) << "special=true, text: " << nlohmann::json(text).dump();
    EXPECT_EQ(got_plain, want_plain) << "special=false, text: " << nlohmann::json(text).dump();
    // Byte-level BPE loses nothing, and special tokens render as their text (llama.cpp's
    // detokenize with special=true, when the fixture records it).
    EXPECT_EQ(tok.decode(got), text) << nlohmann::json(text).dump();
    EXPECT_EQ(tok.decode(got), c.value("decoded_special", text)) << nlohmann::json(text).dump();
    EXPECT_EQ(tok.decode(got_plain), text) << nlohmann::json(text).dump();
    matched += got == want && got_plain == want_plain;
  }
  std::printf("fixture (%s): %d of %zu cases match\n", fixture.value("reference", std::string("?")).c_str(),
              matched, cases.size());
}

// The same vocabulary and merges under each other byte-level BPE pre-tokenizer the engine names
// (qwen2: Qwen2/2.5, Qwen3, Qwen3-MoE; llama-bpe: Llama 3; gpt-2; starcoder), against llama.cpp on
// a copy of the file with only tokenizer.ggml.pre changed (tests/fixtures/pre_tokenizers.json,
// make_pre_tokenizer_reference.py): every one of the 65 texts, newline and whitespace runs among
// them, tokenized as llama.cpp does.
TEST(TokenizerRealModel, PreTokenizersMatchLlamaCppOnTheSameVocabulary) {
  const std::string path = std::string(LP_SOURCE_DIR) + "/tests/fixtures/pre_tokenizers.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path;
  const auto fixture = nlohmann::json::parse(in);
  const VocabData base = load_smollm2_vocab();
  int checked = 0;
  for (const std::string pre : fixture.at("pre_tokenizers")) {
    VocabData v = base;
    v.pre = pre;
    const Tokenizer tok(v);
    ASSERT_EQ(tok.pre(), pre);
    for (const auto& c : fixture.at("cases")) {
      const std::string text = c.at("text");
      EXPECT_EQ(tok.encode(text, false, true), c.at("ids").at(pre).get<Ids>())
          << pre << ": " << nlohmann::json(text).dump();
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4 * 65);
}

TEST(TokenizerRealModel, ChatTemplate) {
  const Tokenizer& tok = smollm2();
  const std::vector<lp::ChatMessage> user = {{"user", "Hello!"}};
  EXPECT_EQ(tok.apply_chat_template(user, true), kSmolLM2Prompt);
  // The prompt's special tokens parse to their ids.
  const Ids ids = tok.encode(kSmolLM2Prompt, false, true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);
}

std::string long_text() {
  std::string unit =
      "The quick brown fox jumps over the lazy dog 1234567 times; it's 3.14159 x 2^10!\n"
      "    def f(x):\n        return x ** 2  # naïve café, 東京, Привет, 😀\n\n";
  std::string s;
  while (s.size() < 60000) s += unit;
  return s;
}

TEST(TokenizerRealModel, LongTextIsFastAndThreadSafe) {
  const Tokenizer& tok = smollm2();
  const std::string text = long_text();
  const auto t0 = std::chrono::steady_clock::now();
  const Ids ids = tok.encode(text, false, true);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("encoded %zu bytes into %zu tokens in %.2f ms\n", text.size(), ids.size(), ms);
  EXPECT_GE(ids.size(), 10000u);
  // The target is well under 100 ms; the bound is loose so a busy or unoptimised build passes.
  EXPECT_LT(ms, 1000.0);
  EXPECT_EQ(tok.decode(ids), text);

  std::vector<Ids> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results) threads.emplace_back([&] { r = tok.encode(text, false, true); });
  for (auto& t : threads) t.join();
  for (const auto& r : results) EXPECT_EQ(r, ids);
}

}  // namespace
