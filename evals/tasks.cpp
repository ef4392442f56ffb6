#include "evals/tasks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "model/error.h"
#include "model/io.h"
#include "model/paths.h"

namespace lp::eval {
namespace {

// Nouns for the kv keys and the mdqa document titles; names for the mdqa answers. None of the
// names occurs in the extracted text, so the only place a name appears is its fact.
constexpr const char* kNouns[] = {"lion",    "eagle",    "river",   "garden", "lamp",     "tower",
                                  "harbour", "orchard",  "mill",    "bridge", "forest",   "valley",
                                  "lantern", "anchor",   "meadow",  "castle", "chariot",  "vineyard",
                                  "compass", "fountain", "granary", "bell",   "workshop", "library"};
constexpr const char* kNames[] = {"Edmund",   "Harriet",  "Percival", "Rosalind",   "Ambrose", "Beatrice",
                                  "Cedric",   "Winifred", "Oswald",   "Marguerite", "Leopold", "Imogen",
                                  "Reginald", "Philippa", "Horace",   "Cordelia"};
constexpr int kKvPairs = 4;
constexpr int kDocuments = 5;
constexpr int kContinuation = 64;

const std::vector<TaskInfo> kTasks = {
    {Task::Passkey, "passkey", "a five-digit pass key hidden once in the text, asked at the end",
     "exact match", 0, 8},
    {Task::KeyValue, "kv", "four secret numbers of named things spread through the text, one asked",
     "exact match", kKvPairs, 8},
    {Task::MultiDocQA, "mdqa", "five titled documents, each naming a keeper; the keeper of one asked",
     "exact match", kDocuments, 8},
    {Task::ContinuationNLL, "nll", "loss of the next 64 tokens of the text, teacher-forced", "NLL", 0,
     kContinuation},
};

// n distinct words in a seeded order. std::shuffle's algorithm is the standard library's own: the
// samples (and the results in docs/results/) are those of libstdc++, which is what we build with.
template <size_t N>
std::vector<std::string> pick(const char* const (&words)[N], int n, std::mt19937_64& rng) {
  std::vector<std::string> all(std::begin(words), std::end(words));
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(size_t(n));
  return all;
}

int64_t count_tokens(const Tokenizer& tok, const std::string& text) {
  return int64_t(tok.encode(text, false, false).size());
}

// Consecutive verses from a random start until they hold about `budget` tokens (counted verse by
// verse; the caller trims the whole prompt to size). The first has no leading space.
std::vector<std::string> verse_run(const Corpus& c, const Tokenizer& tok, std::mt19937_64& rng,
                                   int64_t budget, int64_t total_tokens) {
  std::vector<std::string> out;
  int64_t have = 0;
  for (size_t v = size_t(rng() % (c.verses.size() / 2)); have < budget; ++v) {
    if (v >= c.verses.size()) fail("the evaluation text cannot fill {} tokens", total_tokens);
    std::string piece = (out.empty() ? "" : " ") + c.verses[v];
    have += count_tokens(tok, piece);
    out.push_back(std::move(piece));
  }
  return out;
}

// Text placed before the first verse that starts at or past `at` (a share of the verses' text).
struct Insert {
  double at;
  std::string text;
};

std::string join_with_inserts(const std::vector<std::string>& verses, size_t count,
                              std::vector<Insert> inserts) {
  std::sort(inserts.begin(), inserts.end(), [](const Insert& a, const Insert& b) { return a.at < b.at; });
  size_t total = 0;
  for (size_t k = 0; k < count; ++k) total += verses[k].size();
  std::string text;
  size_t next = 0, done = 0;
  for (size_t k = 0; k < count; ++k) {
    while (next < inserts.size() && double(done) >= inserts[next].at * double(total))
      text += inserts[next++].text;
    text += verses[k];
    done += verses[k].size();
  }
  while (next < inserts.size()) text += inserts[next++].text;
  return text;
}

void check_room(int64_t tokens, int64_t fixed, const char* task) {
  if (tokens <= fixed + 16)
    fail("{}: {} tokens leave no room for the text around the question (it needs {})", task, tokens,
         fixed + 17);
}

// Drops verses (through `build(count)`) until the prompt fits `tokens`; fills the sample's ids.
template <class Build>
std::string fit(const Tokenizer& tok, int64_t tokens, size_t count, Build build, std::vector<int32_t>& ids) {
  std::string prompt = build(count);
  ids = tok.encode(prompt, true, false);
  while (count > 0 && int64_t(ids.size()) > tokens) {
    // Drop about as many verses as the overshoot needs (a verse is ~30 tokens), then one at a time.
    const size_t drop = std::max<size_t>(1, std::min(count, size_t((int64_t(ids.size()) - tokens) / 60)));
    count -= drop;
    prompt = build(count);
    ids = tok.encode(prompt, true, false);
  }
  if (int64_t(ids.size()) > tokens)
    fail("{} tokens are too few for this task's text (the question and facts alone take {})", tokens,
         ids.size());
  return prompt;
}

double share_of(const std::string& prompt, const std::string& needle) {
  const size_t at = prompt.find(needle);
  return at == std::string::npos ? 0.0 : double(at) / double(prompt.size());
}

Sample passkey(const Corpus& c, const Tokenizer& tok, int64_t tokens, int i, std::mt19937_64& rng) {
  static constexpr double kDepths[] = {0.1, 0.3, 0.5, 0.7, 0.9};
  const std::string key = std::to_string(10000 + rng() % 90000);
  const std::string needle = " The pass key is " + key + ". Remember it. ";
  const std::string question = "\n\nWhat is the pass key? The pass key is";
  const int64_t fixed = count_tokens(tok, needle + question) + 1;
  check_room(tokens, fixed, "passkey");
  const auto verses = verse_run(c, tok, rng, tokens - fixed, tokens);
  const double depth = kDepths[i % 5];
  Sample s;
  s.task = Task::Passkey;
  s.answer = key;
  s.prompt = fit(
      tok, tokens, verses.size(),
      [&](size_t n) {
        return join_with_inserts(verses, n, {{depth, needle}}) + question;
      },
      s.prompt_ids);
  s.depth = share_of(s.prompt, needle);
  return s;
}

Sample key_value(const Corpus& c, const Tokenizer& tok, int64_t tokens, std::mt19937_64& rng) {
  const auto keys = pick(kNouns, kKvPairs, rng);
  std::vector<Insert> facts;
  std::string all_facts;
  std::vector<std::string> values;
  for (const auto& k : keys) {
    values.push_back(std::to_string(1000 + rng() % 9000));
    facts.push_back({0.05 + 0.9 * double(rng() % 1000) / 1000.0,
                     " The secret number of the " + k + " is " + values.back() + ". "});
    all_facts += facts.back().text;
  }
  const size_t q = size_t(rng() % kKvPairs);
  const std::string question =
      "\n\nWhat is the secret number of the " + keys[q] + "? The secret number of the " + keys[q] + " is";
  const int64_t fixed = count_tokens(tok, all_facts + question) + 1;
  check_room(tokens, fixed, "kv");
  const auto verses = verse_run(c, tok, rng, tokens - fixed, tokens);
  Sample s;
  s.task = Task::KeyValue;
  s.answer = values[q];
  s.prompt = fit(
      tok, tokens, verses.size(), [&](size_t n) { return join_with_inserts(verses, n, facts) + question; },
      s.prompt_ids);
  s.depth = share_of(s.prompt, facts[q].text);
  const std::string text = s.prompt.substr(0, s.prompt.size() - question.size());
  for (size_t j = 0; j < keys.size(); ++j)
    s.questions.push_back({tok.encode(text + "\n\nWhat is the secret number of the " + keys[j] +
                                          "? The secret number of the " + keys[j] + " is",
                                      true, false),
                           values[j]});
  return s;
}

Sample multi_doc(const Corpus& c, const Tokenizer& tok, int64_t tokens, std::mt19937_64& rng) {
  const auto titles = pick(kNouns, kDocuments, rng);
  const auto names = pick(kNames, kDocuments, rng);
  std::vector<std::string> heads, facts;
  std::string fixed_text;
  for (int d = 0; d < kDocuments; ++d) {
    heads.push_back(fmt::format("{}Document {}: The {}\n", d == 0 ? "" : "\n\n", d + 1, titles[size_t(d)]));
    facts.push_back(" The keeper of the " + titles[size_t(d)] + " was named " + names[size_t(d)] + ". ");
    fixed_text += heads.back() + facts.back();
  }
  const size_t q = size_t(rng() % kDocuments);
  const std::string question = "\n\nQuestion: According to the documents, who was the keeper of the " +
                               titles[q] + "?\nAnswer: The keeper of the " + titles[q] + " was named";
  const int64_t fixed = count_tokens(tok, fixed_text + question) + 1;
  check_room(tokens, fixed, "mdqa");
  std::vector<std::vector<std::string>> docs;
  std::vector<double> at;
  for (int d = 0; d < kDocuments; ++d) {
    docs.push_back(verse_run(c, tok, rng, (tokens - fixed) / kDocuments + 1, tokens));
    at.push_back(0.1 + 0.8 * double(rng() % 1000) / 1000.0);
  }
  // Trimming drops a verse from the end of the longest document, so they stay about equal.
  std::vector<size_t> count;
  for (const auto& d : docs) count.push_back(d.size());
  const auto build = [&] {
    std::string text;
    for (size_t d = 0; d < docs.size(); ++d)
      text += heads[d] + join_with_inserts(docs[d], count[d], {{at[d], facts[d]}});
    return text + question;
  };
  Sample s;
  s.task = Task::MultiDocQA;
  s.answer = names[q];
  s.prompt = build();
  s.prompt_ids = tok.encode(s.prompt, true, false);
  while (int64_t(s.prompt_ids.size()) > tokens) {
    const auto longest = std::max_element(count.begin(), count.end());
    if (*longest <= 1) break;
    --*longest;
    s.prompt = build();
    s.prompt_ids = tok.encode(s.prompt, true, false);
  }
  if (s.tokens() > tokens)
    fail("mdqa: {} tokens are too few for five documents and the question (they take {})", tokens,
         s.tokens());
  s.depth = share_of(s.prompt, facts[q]);
  const std::string text = s.prompt.substr(0, s.prompt.size() - question.size());
  for (size_t d = 0; d < titles.size(); ++d)
    s.questions.push_back(
        {tok.encode(text + "\n\nQuestion: According to the documents, who was the keeper of the " +
                        titles[d] + "?\nAnswer: The keeper of the " + titles[d] + " was named",
                    true, false),
         names[d]});
  return s;
}

Sample continuation(const Corpus& c, const Tokenizer& tok, int64_t tokens, std::mt19937_64& rng) {
  if (tokens < 16) fail("nll: {} tokens leave no room for the text", tokens);
  const auto verses = verse_run(c, tok, rng, tokens + kContinuation + 32, tokens);
  std::string text;
  for (const auto& v : verses) text += v;
  const std::vector<int32_t> ids = tok.encode(text, true, false);
  if (int64_t(ids.size()) < tokens + kContinuation) fail("the evaluation text cannot fill {} tokens", tokens);
  Sample s;
  s.task = Task::ContinuationNLL;
  s.prompt_ids.assign(ids.begin(), ids.begin() + tokens);
  s.continuation_ids.assign(ids.begin() + tokens, ids.begin() + tokens + kContinuation);
  s.prompt = tok.decode(s.prompt_ids);
  s.answer = tok.decode(s.continuation_ids);
  s.depth = 1;
  return s;
}

}  // namespace

std::string default_corpus_path() {
  return lazyprefill_home() + "/text/kjv.txt";
}

Corpus load_corpus(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    fail("{}: no such file (scripts/setup extracts the evaluation text from Debian's bible-kjv)", path);
  std::istringstream in(read_input_file(path, "evaluation text", input_cap::kCorpus));
  Corpus c;
  std::string line;
  while (std::getline(in, line)) {
    const size_t tab = line.find('\t');
    if (tab != std::string::npos && tab + 1 < line.size()) c.verses.push_back(line.substr(tab + 1));
  }
  if (c.verses.size() < 1000)
    fail("'{}' holds {} verses; expected the KJV extract of scripts/setup", path, c.verses.size());
  return c;
}

const std::vector<TaskInfo>& tasks() {
  return kTasks;
}

const TaskInfo& task_info(std::string_view name) {
  std::string known;
  for (const auto& t : kTasks) {
    if (t.name == name) return t;
    known += (known.empty() ? "" : ", ") + std::string(t.name);
  }
  usage_fail("unknown task '{}' (known: {})", name, known);
}

const TaskInfo& task_info(Task t) {
  for (const auto& i : kTasks)
    if (i.task == t) return i;
  fail("unknown task");
}

double chance_accuracy(const TaskInfo& t) {
  if (t.task == Task::Passkey) return 1e-5;
  return t.choices > 0 ? 1.0 / t.choices : 0.0;
}

std::vector<Sample> make_samples(Task task, const Corpus& c, const Tokenizer& tok, int64_t tokens, int n,
                                 uint64_t seed) {
  if (n < 1) fail("the number of samples must be positive, got {}", n);
  // One stream per (task, length, seed), so adding a length does not change the others' samples.
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + uint64_t(tokens) * 1000003ull + uint64_t(task));
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) {
    switch (task) {
      case Task::Passkey:
        out.push_back(passkey(c, tok, tokens, i, rng));
        break;
      case Task::KeyValue:
        out.push_back(key_value(c, tok, tokens, rng));
        break;
      case Task::MultiDocQA:
        out.push_back(multi_doc(c, tok, tokens, rng));
        break;
      case Task::ContinuationNLL:
        out.push_back(continuation(c, tok, tokens, rng));
        break;
    }
  }
  return out;
}

bool answer_correct(Task task, std::string_view generated, std::string_view answer) {
  using Pred = bool (*)(unsigned char);
  const Pred is_word = task == Task::MultiDocQA
                           ? Pred([](unsigned char ch) { return std::isalpha(ch) != 0; })
                           : Pred([](unsigned char ch) { return std::isdigit(ch) != 0; });
  size_t b = 0;
  while (b < generated.size() && !is_word(static_cast<unsigned char>(generated[b]))) ++b;
  size_t e = b;
  while (e < generated.size() && is_word(static_cast<unsigned char>(generated[e]))) ++e;
  if (b == e) return false;
  const std::string_view first = generated.substr(b, e - b);
  if (first.size() != answer.size()) return false;
  for (size_t k = 0; k < first.size(); ++k)
    if (std::tolower(static_cast<unsigned char>(first[k])) !=
        std::tolower(static_cast<unsigned char>(answer[k])))
      return false;
  return true;
}

}  // namespace lp::eval
