#include "evals/eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "engine/generate.h"
#include "model/error.h"

namespace lp::eval {

std::pair<double, double> wilson_interval(double k, int n) {
  if (n <= 0) return {0.0, 1.0};
  const double z = 1.96, p = std::clamp(k / n, 0.0, 1.0), z2n = z * z / n;
  const double centre = (p + z2n / 2) / (1 + z2n);
  const double half = z * std::sqrt(p * (1 - p) / n + z2n / (4.0 * n)) / (1 + z2n);
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

bool is_baseline(PolicyKind p) {
  return p != PolicyKind::None && p != PolicyKind::LazyLLM;
}

namespace {

RunResult run_once(CpuContext& ctx, const Model& m, const Sample& s, const TaskInfo& info,
                   const Method& method, uint64_t seed, uint64_t prune_seed) {
  GenerateOptions g;
  g.max_new_tokens = info.max_new_tokens;
  g.sampler = {0.0f, 1.0f, seed};  // greedy
  g.policy = method.policy;
  if (method.policy != PolicyKind::None) g.schedule = method.schedule;
  g.prune_seed = prune_seed;
  g.forced_ids = s.continuation_ids;
  const GenerateResult r = generate(ctx, m, s.prompt_ids, g);
  RunResult out;
  out.ttft_s = r.ttft_s;
  out.share = r.prompt_tokens_computed_fraction;
  out.share_after = r.prompt_tokens_computed_fraction_after_generation;
  if (!is_qa(info.task)) {
    double sum = 0;
    for (const double lp : r.forced_logprobs) sum -= lp;
    out.nll = sum / double(std::max<size_t>(1, r.forced_logprobs.size()));
    out.compared_ids = r.forced_argmax;
  } else {
    out.generated = r.text;
    out.correct = answer_correct(info.task, r.text, s.answer);
    out.score = out.correct ? 1 : 0;
    out.compared_ids = r.generated_ids;
  }
  return out;
}

// One method on one sample: random-drop over `drop_seeds` seeds, averaged (the agreement is
// averaged by the caller's agreement() over each seed's tokens: see run_eval).
std::vector<RunResult> run_seeds(CpuContext& ctx, const Model& m, const Sample& s, const TaskInfo& info,
                                 const Method& method, uint64_t seed, int drop_seeds) {
  if (method.policy != PolicyKind::RandomDrop) return {run_once(ctx, m, s, info, method, seed, seed)};
  std::vector<RunResult> runs;
  for (int k = 0; k < drop_seeds; ++k)
    runs.push_back(run_once(ctx, m, s, info, method, seed, seed * 1000 + uint64_t(k)));
  return runs;
}

RunResult run_one(CpuContext& ctx, const Model& m, const Sample& s, const TaskInfo& info,
                  const Method& method, uint64_t seed) {
  return run_once(ctx, m, s, info, method, seed, seed);
}

// QA: common prefix of the first k generated tokens / the tokens compared; nll: share of
// positions with the same argmax.
double agreement(const RunResult& base, const RunResult& run, Task task, int k) {
  const auto& a = base.compared_ids;
  const auto& b = run.compared_ids;
  if (!is_qa(task)) {
    const size_t n = std::min(a.size(), b.size());
    if (n == 0) return 1;
    size_t same = 0;
    for (size_t i = 0; i < n; ++i) same += a[i] == b[i];
    return double(same) / double(n);
  }
  const size_t n = std::min<size_t>(size_t(k), std::max(a.size(), b.size()));
  if (n == 0) return 1;
  size_t p = 0;
  while (p < n && p < a.size() && p < b.size() && a[p] == b[p]) ++p;
  return double(p) / double(n);
}

Cell summarize(const Method& method, const std::vector<const RunResult*>& runs,
               const std::vector<const RunResult*>& base, Task task) {
  Cell c;
  c.method = method;
  c.n = int(runs.size());
  double right = 0;
  int base_right = 0;
  double agreement = 0, nll = 0, nll_change = 0, share = 0, share_after = 0, ttft = 0, base_ttft = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const RunResult& r = *runs[i];
    const RunResult& b = *base[i];
    right += r.score;
    base_right += b.correct;
    c.gained += r.correct && !b.correct;
    c.lost += !r.correct && b.correct;
    agreement += r.agreement;
    nll += r.nll;
    nll_change += r.nll - b.nll;
    share += r.share;
    share_after += r.share_after;
    ttft += r.ttft_s;
    base_ttft += b.ttft_s;
  }
  const double n = std::max(1, c.n);
  c.agreement = agreement / n;
  c.nll = nll / n;
  c.nll_change = nll_change / n;
  c.share = share / n;
  c.share_after = share_after / n;
  c.ttft_s = ttft / n;
  c.speedup = ttft > 0 ? base_ttft / ttft : 1;
  if (is_qa(task)) {
    c.accuracy = right / n;
    std::tie(c.accuracy_lo, c.accuracy_hi) = wilson_interval(right, c.n);
    c.accuracy_change = (right - base_right) / n;
  }
  return c;
}

}  // namespace

std::vector<TaskResult> run_eval(CpuContext& ctx, const Model& m, const Corpus& corpus,
                                 const EvalOptions& opt) {
  const ModelConfig& cfg = m.config();
  if (opt.tasks.empty()) usage_fail("no task to evaluate");
  if (opt.lengths.empty()) usage_fail("no prompt length to evaluate");
  if (opt.samples < 1) usage_fail("an evaluation needs at least 1 sample per task, got {}", opt.samples);
  if (opt.drop_seeds < 1) usage_fail("an evaluation needs at least 1 drop seed, got {}", opt.drop_seeds);
  for (const Task t : opt.tasks)
    for (const int64_t len : opt.lengths) {
      const int64_t need = len + task_info(t).max_new_tokens;
      if (len < 1 || need > cfg.n_ctx_train)
        usage_fail("a prompt of {} tokens plus {} new tokens does not fit the model's context of {} tokens",
                   len, task_info(t).max_new_tokens, cfg.n_ctx_train);
    }
  for (const Method& me : opt.methods)
    if (me.policy != PolicyKind::None) {
      try {
        resolve_method(me.policy, me.schedule, cfg.n_layer, cfg.global_layers());
      } catch (const Error& e) {
        usage_fail("schedule '{}' does not fit this {}-layer model: {}", me.schedule.to_string(), cfg.n_layer,
                   e.what());
      }
    }

  const Tokenizer& tok = m.tokenizer();
  const Method none{};
  std::vector<TaskResult> out;
  bool warmed = !opt.warm_up;
  for (const Task task : opt.tasks) {
    const TaskInfo& info = task_info(task);
    for (const int64_t len : opt.lengths) {
      const std::vector<Sample> samples = make_samples(task, corpus, tok, len, opt.samples, opt.seed);
      if (!warmed) {
        run_one(ctx, m, samples[0], info, none, opt.seed);
        warmed = true;
      }
      TaskResult tr;
      tr.task = task;
      tr.length = len;
      tr.chance = chance_accuracy(info);
      for (size_t i = 0; i < samples.size(); ++i) {
        const Sample& s = samples[i];
        const uint64_t seed = opt.seed + i;
        SampleResult sr;
        sr.index = int(i);
        sr.tokens = s.tokens();
        sr.depth = s.depth;
        if (is_qa(task)) sr.answer = s.answer;
        if (opt.keep_prompts) sr.prompt = s.prompt;
        sr.baseline = run_one(ctx, m, s, info, none, seed);
        std::string line = fmt::format("{} {} tokens, sample {}/{}: none {} {:.2f} s", info.name, sr.tokens,
                                       i + 1, samples.size(),
                                       !is_qa(task) ? fmt::format("nll {:.3f}", sr.baseline.nll)
                                                    : (sr.baseline.correct ? "right" : "wrong"),
                                       sr.baseline.ttft_s);
        for (const Method& me : opt.methods) {
          const std::vector<RunResult> runs = run_seeds(ctx, m, s, info, me, seed, opt.drop_seeds);
          RunResult r = runs.front();
          if (runs.size() > 1) {  // random-drop: the seeds' mean
            const double k = double(runs.size());
            double agree = 0, score = 0, ttft = 0, nll = 0, share = 0, after = 0;
            for (const RunResult& x : runs) {
              agree += agreement(sr.baseline, x, task, opt.agreement_tokens);
              score += x.score, ttft += x.ttft_s, nll += x.nll, share += x.share, after += x.share_after;
            }
            r.agreement = agree / k, r.score = score / k, r.ttft_s = ttft / k, r.nll = nll / k;
            r.share = share / k, r.share_after = after / k;
            r.correct = r.score >= 0.5;
          } else {
            r.agreement = agreement(sr.baseline, r, task, opt.agreement_tokens);
          }
          line += fmt::format(" | {} {} {:.2f} s", me.label(),
                              !is_qa(task) ? fmt::format("nll {:+.3f}", r.nll - sr.baseline.nll)
                                           : (r.correct ? "right" : "wrong"),
                              r.ttft_s);
          sr.methods.push_back(std::move(r));
        }
        if (opt.progress) opt.progress(line);
        tr.samples.push_back(std::move(sr));
      }
      std::vector<const RunResult*> base;
      for (const auto& sr : tr.samples) base.push_back(&sr.baseline);
      tr.baseline = summarize(none, base, base, task);
      for (size_t k = 0; k < opt.methods.size(); ++k) {
        std::vector<const RunResult*> runs;
        for (const auto& sr : tr.samples) runs.push_back(&sr.methods[k]);
        tr.cells.push_back(summarize(opt.methods[k], runs, base, task));
      }
      tr.counts = !is_qa(task) || tr.baseline.accuracy >= tr.chance + 0.2;
      for (auto& sr : tr.samples) {  // the token lists only served the agreement
        sr.baseline.compared_ids.clear();
        for (auto& r : sr.methods) r.compared_ids.clear();
      }
      out.push_back(std::move(tr));
    }
  }
  return out;
}

std::vector<TargetCheck> check_targets(const std::vector<TaskResult>& results, double min_speedup,
                                       double max_loss) {
  std::vector<int64_t> lengths;
  for (const auto& r : results)
    if (std::find(lengths.begin(), lengths.end(), r.length) == lengths.end()) lengths.push_back(r.length);
  std::vector<TargetCheck> out;
  for (const int64_t len : lengths) {
    TargetCheck t;
    t.length = len;
    std::vector<const TaskResult*> counted;
    for (const auto& r : results)
      if (r.length == len && r.counts && is_qa(r.task)) counted.push_back(&r);
    t.counted_tasks = int(counted.size());
    if (counted.empty()) {
      out.push_back(t);
      continue;
    }
    const auto& methods = counted[0]->cells;
    for (size_t k = 0; k < methods.size(); ++k) {
      const Method& me = methods[k].method;
      if (me.policy != PolicyKind::LazyLLM) continue;
      double worst_speedup = 1e300, worst_change = 1e300;
      for (const TaskResult* r : counted) {
        worst_speedup = std::min(worst_speedup, r->cells[k].speedup);
        worst_change = std::min(worst_change, r->cells[k].accuracy_change);
      }
      // Matched share: the same schedule under the baselines.
      for (size_t j = 0; j < methods.size(); ++j) {
        const Method& other = methods[j].method;
        if (other.policy != PolicyKind::Frozen && other.policy != PolicyKind::RandomLayers) continue;
        if (other.schedule.to_string() != me.schedule.to_string()) continue;
        for (const TaskResult* r : counted) {
          ++t.matched_comparisons;
          t.lazyllm_at_or_above += r->cells[k].accuracy >= r->cells[j].accuracy;
        }
      }
      if (worst_change < -max_loss - 1e-12) continue;
      if (!t.found || worst_speedup > t.best_speedup) {
        t.found = true;
        t.best = me;
        t.best_speedup = worst_speedup;
        t.best_worst_change = worst_change;
      }
    }
    t.speedup_met = t.found && t.best_speedup >= min_speedup;
    for (const TaskResult* r : counted)
      for (const Cell& c : r->cells) {
        if (!is_baseline(c.method.policy)) continue;
        // The best LazyLLM cell of the task at least as fast as the baseline cell.
        const Cell* best = nullptr;
        for (const Cell& l : r->cells)
          if (l.method.policy == PolicyKind::LazyLLM && l.speedup >= c.speedup &&
              (!best || l.accuracy > best->accuracy ||
               (l.accuracy == best->accuracy && l.speedup > best->speedup)))
            best = &l;
        if (!best) continue;  // faster than every LazyLLM cell: no extrapolation
        t.ttft_matched.push_back(
            {r->task, c.method, c.speedup, c.accuracy, best->accuracy, best->method, best->speedup});
        t.lazyllm_at_or_above_ttft += best->accuracy >= c.accuracy - 1e-12;
      }
    out.push_back(t);
  }
  return out;
}

}  // namespace lp::eval
