// Long-context evaluation tasks made from public-domain text (docs/eval.md).
// A task turns the corpus and a seed into samples: a prompt of about a given number of tokens
// and the answer the model should give. Samples are reproducible: the same corpus, tokenizer,
// length, count and seed give the same prompts.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
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

enum class Task { Passkey, KeyValue, MultiDocQA, ContinuationNLL };
// Whether a task is scored by its answer (accuracy) rather than by a loss (nll).
inline bool is_qa(Task t) {
  return t != Task::ContinuationNLL;
}

struct TaskInfo {
  Task task;
  const char* name;         // on the command line: passkey, kv, mdqa, nll
  const char* description;  // one line
  const char* metric;       // "exact match" or "NLL"
  int choices;              // candidate answers in the prompt (chance = 1 / choices); 0: not a choice
  int max_new_tokens;       // generated for the answer (QA) or forced (nll)
};
const std::vector<TaskInfo>& tasks();
// Throws lp::UsageError listing the known tasks.
const TaskInfo& task_info(std::string_view name);
const TaskInfo& task_info(Task t);
// Accuracy a model guessing among the task's candidates would get; passkey: 1e-5 (five digits).
double chance_accuracy(const TaskInfo& t);

struct Sample {
  Task task = Task::Passkey;
  std::string prompt;  // plain text (no chat template)
  std::string answer;  // QA: what the model must say first; nll: the continuation's text
  double depth = 0;  // where the needle, the asked pair or the asked fact starts: share of the prompt's bytes
  std::vector<int32_t> prompt_ids;        // with BOS; its size is the prompt's length in tokens
  std::vector<int32_t> continuation_ids;  // nll: the tokens scored with teacher forcing
  // kv and mdqa: every question the text can be asked (each fact's), over the same text: the
  // prompt with its question replaced, and the answer. The sample's own is among them. Several
  // questions over one document, as the prefix cache serves them (eval --prefix-cache).
  struct Question {
    std::vector<int32_t> prompt_ids;
    std::string answer;
  };
  std::vector<Question> questions;
  int64_t tokens() const { return int64_t(prompt_ids.size()); }
};

// Samples of at most `tokens` tokens (and within a verse of it). Throws lp::Error if the corpus
// cannot fill `tokens`, if `tokens` leaves no room for the filler, or if n < 1.
//
// passkey  a five-digit key stated once ("The pass key is 40172. Remember it.") at depth 10%,
//          30%, 50%, 70%, 90% (cycling) of consecutive verses, then "What is the pass key?".
// kv       four "The secret number of the <noun> is <4 digits>." statements at random places in
//          the verses; the question asks one of them.
// mdqa     five titled documents ("Document 3: The mill"), each a passage from its own place in
//          the text holding one fact ("The keeper of the mill was named Tabitha."); the question
//          asks the keeper of one of them.
// nll      `tokens` tokens of consecutive verses; the next 64 tokens are the continuation.
std::vector<Sample> make_samples(Task task, const Corpus& c, const Tokenizer& tok, int64_t tokens, int n,
                                 uint64_t seed);

// Whether generated text answers: the first number (passkey, kv) or the first word (mdqa) in it is
// the answer. Repeating several candidates does not count.
bool answer_correct(Task task, std::string_view generated, std::string_view answer);

}  // namespace lp::eval
