// Evaluation tasks: samples are reproducible, hit their token length, hold the needle where
// they say, and the answer check accepts the key only as a whole number.
#include <gtest/gtest.h>

#include "evals/tasks.h"
#include "model/error.h"
#include "model/gguf.h"
#include "model/vocab.h"
#include "tests/test_util.h"

namespace lp {
namespace {

const Tokenizer& real_tokenizer() {
  static const Tokenizer tok(vocab_from_gguf(GgufFile::open(testing::real_model_path())));
  return tok;
}

const eval::Corpus& corpus() {
  static const eval::Corpus c = eval::load_corpus(eval::default_corpus_path());
  return c;
}

TEST(EvalTasks, PasskeySamplesAreReproducibleAndHitTheirLength) {
  const Tokenizer& tok = real_tokenizer();
  const auto a = eval::passkey_samples(corpus(), tok, 2048, 5, 7);
  const auto b = eval::passkey_samples(corpus(), tok, 2048, 5, 7);
  const auto other = eval::passkey_samples(corpus(), tok, 2048, 5, 8);
  ASSERT_EQ(a.size(), 5u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].prompt, b[i].prompt);
    EXPECT_NE(a[i].prompt, other[i].prompt);
    EXPECT_EQ(a[i].answer.size(), 5u);
    // Within a verse of the target, never over it.
    EXPECT_LE(a[i].tokens, 2048);
    EXPECT_GT(a[i].tokens, 2048 - 120);
    EXPECT_EQ(int64_t(tok.encode(a[i].prompt, true, false).size()), a[i].tokens);
    // The key is stated once, at about the stated depth of the prompt.
    const std::string needle = "The pass key is " + a[i].answer + ".";
    const size_t at = a[i].prompt.find(needle);
    ASSERT_NE(at, std::string::npos);
    EXPECT_EQ(a[i].prompt.find(needle, at + 1), std::string::npos);
    EXPECT_NEAR(double(at) / double(a[i].prompt.size()), a[i].depth, 0.05) << i;
    EXPECT_TRUE(a[i].prompt.ends_with("What is the pass key? The pass key is"));
  }
  EXPECT_THROW(eval::passkey_samples(corpus(), tok, 20, 1, 1), Error);
  EXPECT_THROW(eval::passkey_samples(corpus(), tok, 2048, 0, 1), Error);
}

TEST(EvalTasks, PasskeyAnswerCheck) {
  EXPECT_TRUE(eval::passkey_correct(" 40172. Remember", "40172"));
  EXPECT_TRUE(eval::passkey_correct("40172", "40172"));
  EXPECT_FALSE(eval::passkey_correct(" 401723", "40172"));
  EXPECT_FALSE(eval::passkey_correct(" 140172", "40172"));
  EXPECT_FALSE(eval::passkey_correct(" 4017", "40172"));
  EXPECT_TRUE(eval::passkey_correct("140172 or 40172", "40172"));
}

TEST(EvalTasks, CorpusErrorsNameTheFile) {
  try {
    eval::load_corpus("/no/such/kjv.txt");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/no/such/kjv.txt"), std::string::npos);
  }
}

}  // namespace
}  // namespace lp
