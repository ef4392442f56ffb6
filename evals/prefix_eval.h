// The prefix cache's accuracy (engine/prefix_cache.h): several questions over one document, as a
// server meets them, each question answered cold (a scheduler without the cache) and cached (one
// with it, where the document's first question left its blocks), per method. Without pruning a
// cached answer is the cold one bit for bit; with LazyLLM a cached question inherits the
// document's state as the first question's selection left it and revives what it needs, so its
// answers may differ: this measures by how much. docs/eval.md, "Cached against cold".
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "evals/tasks.h"
#include "kernels/context.h"
#include "pruning/method.h"

namespace lp {
class Model;
}

namespace lp::eval {

struct PrefixEvalOptions {
  std::vector<Task> tasks;  // kv, mdqa: the tasks that ask several questions of one text
  std::vector<int64_t> lengths;
  int samples = 10;  // documents per task and length
  uint64_t seed = 1;
  std::vector<Method> methods;  // each run cold and cached (the none method too, when listed)
  int64_t block_tokens = 16;
  std::function<void(const std::string&)> progress;
};

// One method over a task's documents: the second and later questions of each (the first fills the
// cache and is cold either way).
struct PrefixCell {
  Method method;
  int n = 0;  // questions scored
  double cold_accuracy = 0, cached_accuracy = 0;
  int gained = 0, lost = 0;    // right only cached, right only cold
  double same_answer = 0;      // share whose generated tokens are the same cached and cold
  double cached_share = 0;     // mean share of the prompt's tokens found in the cache
  double cold_computed = 0;    // mean share of the prompt's (token, layer) pairs computed, cold
  double cached_computed = 0;  // the same cached (what the cache did not hold, and the revivals)
  double cold_ttft_s = 0, cached_ttft_s = 0;  // medians
};

struct PrefixTaskResult {
  Task task = Task::KeyValue;
  int64_t length = 0;
  int documents = 0;
  std::vector<PrefixCell> cells;  // parallel to PrefixEvalOptions::methods
};

// Throws lp::Error for a task with one question per text (passkey, nll), a length the model
// cannot hold, or a corpus too short, before any question runs.
std::vector<PrefixTaskResult> run_prefix_cache_eval(CpuContext& ctx, const Model& m, const Corpus& corpus,
                                                    const PrefixEvalOptions& opt);

}  // namespace lp::eval
