// Accuracy under pruning: runs every sample of a task through the engine (lp::generate, the path
// `run` takes) once unpruned and once per method (policy x schedule), and compares them.
// docs/eval.md describes the tasks, the metrics and what the figures mean.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/session.h"
#include "evals/tasks.h"
#include "kernels/context.h"
#include "pruning/method.h"

namespace lp::eval {

struct EvalOptions {
  std::vector<Task> tasks;
  std::vector<int64_t> lengths;  // target prompt lengths in tokens
  int samples = 20;
  uint64_t seed = 1;
  // Evaluated against the unpruned baseline, which always runs first on every sample.
  std::vector<Method> methods;
  int agreement_tokens = 8;  // k: the first k greedy tokens are compared with the baseline's
  // random-drop runs each sample this many times, with drop seeds seed * 1000 + 0, 1, ..., and
  // averages (the paper averages its random token drop over 5 seeds). At least 1.
  int drop_seeds = 5;
  bool warm_up = true;        // one untimed unpruned prefill before the first sample
  bool keep_prompts = false;  // keep each sample's prompt text in its SampleResult
  // Called with one line per sample (progress), may be empty.
  std::function<void(const std::string&)> progress;
};

// One method on one sample.
struct RunResult {
  std::string generated;  // QA: the generated text (random-drop: its first seed's)
  bool correct = false;   // QA: answer_correct (random-drop: right in at least half of its seeds)
  double score = 0;       // QA: 1 right, 0 wrong; random-drop: the share of its seeds right
  double ttft_s = 0;
  double share = 1;        // prompt (token, layer) pairs computed
  double share_after = 1;  // the same by the end of generation, revivals included (the paper's figure)
  double nll = 0;          // nll: mean negative log-likelihood per continuation token (nats)
  double agreement = 1;    // QA: common prefix of the first k tokens with the baseline's / k;
                           // nll: share of continuation positions whose argmax equals the baseline's
  std::vector<int32_t> compared_ids;  // what the agreement compares; cleared once it is computed
};

struct SampleResult {
  int index = 0;
  int64_t tokens = 0;
  double depth = 0;
  std::string answer;  // QA only
  std::string prompt;  // the prompt text, when EvalOptions::keep_prompts
  RunResult baseline;
  std::vector<RunResult> methods;  // parallel to EvalOptions::methods
};

// A method's figures over the samples of one task and length.
struct Cell {
  Method method;
  int n = 0;
  // QA: mean score (share correct; random-drop's averaged over its seeds), Wilson 95% interval over
  // the samples
  double accuracy = 0, accuracy_lo = 0, accuracy_hi = 0;
  double accuracy_change = 0;      // QA: accuracy - baseline accuracy (paired: same samples)
  int gained = 0, lost = 0;        // QA: samples right (RunResult::correct) only here / only in the baseline
  double agreement = 1;            // mean RunResult::agreement
  double nll = 0, nll_change = 0;  // nll: mean over samples, and minus the baseline's
  double share = 1;                // mean share of prompt (token, layer) pairs computed
  double share_after = 1;          // the same by the end of generation (the paper's Table 2 figure)
  double ttft_s = 0;               // mean
  double speedup = 1;              // baseline TTFT summed over samples / this method's, same run
};

struct TaskResult {
  Task task = Task::Passkey;
  int64_t length = 0;
  double chance = 0;
  Cell baseline;
  // QA: whether the unpruned model is clearly above chance (accuracy >= chance + 0.2); a task
  // that is not says nothing about pruning and is reported as failed at baseline. nll: always.
  bool counts = true;
  std::vector<Cell> cells;  // parallel to EvalOptions::methods
  std::vector<SampleResult> samples;
};

// Throws lp::Error for a length the model cannot hold, a schedule that does not fit it, or a
// corpus too short for a length; before any sample runs.
std::vector<TaskResult> run_eval(CpuContext& ctx, const Model& m, const Corpus& corpus,
                                 const EvalOptions& opt);

// Wilson score interval for k successes in n trials (z = 1.96); k may be fractional (a mean score
// times n: random-drop's seeds averaged per sample).
std::pair<double, double> wilson_interval(double k, int n);

// Whether a policy is one LazyLLM is compared with: the paper's baselines (static-paper,
// random-drop) and the ablations (frozen, random-layers).
bool is_baseline(PolicyKind p);

// The targets, read off the results for one length.
struct TargetCheck {
  int64_t length = 0;
  int counted_tasks = 0;  // QA tasks at this length where the unpruned model is above chance
  // The fastest lazyllm method (by its smallest speedup over the counted tasks) whose accuracy
  // falls by at most `max_loss` on every counted QA task; none if no method qualifies.
  bool found = false;
  Method best;
  double best_speedup = 0;       // smallest over the counted tasks
  double best_worst_change = 0;  // largest accuracy loss (negative change) over the counted tasks
  bool speedup_met = false;      // best_speedup >= min_speedup
  // At every schedule where lazyllm and an ablation (frozen, random-layers) both ran: per counted
  // QA task, whether lazyllm's accuracy is at or above the ablation's (same share computed).
  int matched_comparisons = 0, lazyllm_at_or_above = 0;
  // At matched measured TTFT, as the paper's Table 1 compares: per counted QA task and baseline
  // cell (is_baseline, any schedule), the most accurate LazyLLM cell of that task whose measured
  // speedup is at least the baseline's (the schedule a deployer would pick for that speed; the
  // faster on a tie), against the baseline. A baseline faster than every LazyLLM cell is left out.
  // (Choosing the best of several cells on the same samples favours LazyLLM a little; the cells
  // are few and named, so the choice can be checked.)
  struct TtftMatch {
    Task task;
    Method baseline;
    double speedup = 0, baseline_accuracy = 0, lazyllm_accuracy = 0;
    Method lazyllm;              // the LazyLLM cell compared
    double lazyllm_speedup = 0;  // its measured speedup, >= speedup
  };
  std::vector<TtftMatch> ttft_matched;
  int lazyllm_at_or_above_ttft = 0;
};
std::vector<TargetCheck> check_targets(const std::vector<TaskResult>& results, double min_speedup = 1.8,
                                       double max_loss = 0.01);

}  // namespace lp::eval
