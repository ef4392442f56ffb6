#include "evals/tasks.h"

#include <fstream>
#include <random>

#include "model/error.h"
#include "model/paths.h"

namespace lp::eval {

std::string default_corpus_path() {
  return lazyprefill_home() + "/text/kjv.txt";
}

Corpus load_corpus(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read the evaluation text '{}' (scripts/setup extracts it from Debian's bible-kjv)", path);
  Corpus c;
  std::string line;
  while (std::getline(in, line)) {
    const size_t tab = line.find('\t');
    if (tab != std::string::npos && tab + 1 < line.size()) c.verses.push_back(line.substr(tab + 1));
  }
  if (c.verses.size() < 1000) fail("'{}' holds {} verses; expected the KJV extract of scripts/setup", path, c.verses.size());
  return c;
}

std::vector<Sample> passkey_samples(const Corpus& c, const Tokenizer& tok, int64_t tokens, int n, uint64_t seed) {
  if (n < 1) fail("passkey: the number of samples must be positive, got {}", n);
  static constexpr double kDepths[] = {0.1, 0.3, 0.5, 0.7, 0.9};
  const std::string question = "\n\nWhat is the pass key? The pass key is";
  std::mt19937_64 rng(seed);
  std::vector<Sample> out;
  for (int i = 0; i < n; ++i) {
    const std::string key = std::to_string(10000 + rng() % 90000);
    const std::string needle = " The pass key is " + key + ". Remember it. ";
    const double depth = kDepths[i % 5];
    // Overhead tokens: the needle and the question; the rest is filler from a random start.
    const int64_t fixed = int64_t(tok.encode(needle + question, false, false).size()) + 1;
    if (tokens <= fixed + 16) fail("passkey: {} tokens leave no room for filler", tokens);
    const size_t start = size_t(rng() % (c.verses.size() / 2));
    std::vector<std::string> filler;
    int64_t have = 0;
    for (size_t v = start; have < tokens - fixed; ++v) {
      if (v >= c.verses.size()) fail("passkey: the corpus cannot fill {} tokens", tokens);
      const std::string piece = (filler.empty() ? "" : " ") + c.verses[v];
      have += int64_t(tok.encode(piece, false, false).size());
      filler.push_back(piece);
    }
    // Drop verses from the end until the whole prompt fits.
    // The needle goes before the first verse that starts past `depth` of the filler's text.
    const auto build = [&](size_t count) {
      size_t total = 0;
      for (size_t k = 0; k < count; ++k) total += filler[k].size();
      std::string text;
      bool placed = false;
      for (size_t k = 0; k < count; ++k) {
        if (!placed && double(text.size()) >= depth * double(total)) {
          text += needle;
          placed = true;
        }
        text += filler[k];
      }
      if (!placed) text += needle;
      return text + question;
    };
    size_t count = filler.size();
    std::string prompt = build(count);
    while (count > 1 && int64_t(tok.encode(prompt, true, false).size()) > tokens) prompt = build(--count);
    Sample s{"passkey", prompt, key, depth, int64_t(tok.encode(prompt, true, false).size())};
    out.push_back(std::move(s));
  }
  return out;
}

bool passkey_correct(const std::string& generated, const std::string& answer) {
  for (size_t p = generated.find(answer); p != std::string::npos; p = generated.find(answer, p + 1)) {
    const bool left = p == 0 || !std::isdigit(static_cast<unsigned char>(generated[p - 1]));
    const size_t e = p + answer.size();
    const bool right = e >= generated.size() || !std::isdigit(static_cast<unsigned char>(generated[e]));
    if (left && right) return true;
  }
  return false;
}

}  // namespace lp::eval
