// Long-context evaluation tasks made from public-domain text (issue 6; plan in docs/eval-plan.md).
// A task turns the corpus and a seed into samples: a prompt of about a given number of tokens
// and the answer the model should give. Samples are reproducible: the same corpus, tokenizer,
// length, count and seed give the same prompts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace lp::eval {

// The King James text scripts/setup extracts: one verse per line, "Book C:V<TAB>text".
struct Corpus {
  std::vector<std::string> verses;  // the text of each verse, in order
};
std::string default_corpus_path();  // <LAZYPREFILL_HOME>/text/kjv.txt
// Throws lp::Error naming the file when it is missing, unreadable or too short.
Corpus load_corpus(const std::string& path);

struct Sample {
  std::string task;
  std::string prompt;  // plain text (the caller applies a chat template if it wants one)
  std::string answer;
  double depth = 0;    // where the needle sits, as a share of the filler (passkey)
  int64_t tokens = 0;  // the prompt's length in tokens (with BOS)
};

// Passkey retrieval: a five-digit key stated once ("The pass key is 40172. Remember it.") at
// depth d of about `tokens` tokens of consecutive verses, then the question. Depths cycle
// through 10%, 30%, 50%, 70% and 90% over the samples; the filler's start and the keys come from
// `seed`. Throws lp::Error if the corpus cannot fill `tokens`.
std::vector<Sample> passkey_samples(const Corpus& c, const Tokenizer& tok, int64_t tokens, int n, uint64_t seed);

// Whether the generated text answers: the key's five digits appear as a whole number in it.
bool passkey_correct(const std::string& generated, const std::string& answer);

}  // namespace lp::eval
