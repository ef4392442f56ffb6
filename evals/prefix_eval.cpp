#include "evals/prefix_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "engine/model.h"
#include "engine/scheduler.h"
#include "kernels/cpu/backend.h"
#include "model/error.h"

namespace lp::eval {

namespace {

struct Answer {
  std::vector<int32_t> ids;
  RequestRecord rec;
  double ttft_s = 0;
};

// One request alone through `s`, greedy, to its end.
Answer ask(Scheduler& s, const std::vector<int32_t>& prompt, const Method& method, int max_tokens) {
  Answer a;
  RequestParams p;
  p.prompt = prompt;
  p.max_tokens = max_tokens;
  p.policy = method.policy;
  p.schedule = method.schedule;
  p.on_token = [&a](int32_t t) {
    a.ids.push_back(t);
    return true;
  };
  p.on_finish = [&a](const RequestRecord& r) { a.rec = r; };
  s.submit(std::move(p));
  while (s.step()) {
  }
  if (a.rec.finish == Finish::Error) fail("a question failed: {}", a.rec.error);
  a.ttft_s = std::chrono::duration<double>(a.rec.first_token - a.rec.arrival).count();
  return a;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

std::vector<PrefixTaskResult> run_prefix_cache_eval(CpuContext& ctx, const Model& m, const Corpus& corpus,
                                                    const PrefixEvalOptions& opt) {
  for (const Task t : opt.tasks)
    if (t != Task::KeyValue && t != Task::MultiDocQA)
      fail("eval --prefix-cache: {} asks one question of each text; kv and mdqa ask several",
           task_info(t).name);
  if (opt.methods.empty()) fail("eval --prefix-cache: no method to run");
  const auto options = [&](bool cache) {
    SchedulerOptions so;
    so.kv_budget_bytes = int64_t(4) << 30;
    so.max_batch_tokens = int64_t(1) << 20;  // a prompt is one prefill
    so.prefix_cache = cache;
    so.prefix_block_tokens = opt.block_tokens;
    so.make_backend = [&m, &ctx](int64_t n_ctx) -> std::unique_ptr<Backend> {
      return std::make_unique<CpuBackend>(ctx, m.config(), m.weights(), n_ctx);
    };
    return so;
  };
  // Every task's samples first: a length that cannot be held fails before anything runs.
  struct Work {
    Task task;
    int64_t length;
    std::vector<Sample> samples;
  };
  std::vector<Work> work;
  for (const Task t : opt.tasks)
    for (const int64_t len : opt.lengths) {
      if (len + task_info(t).max_new_tokens + 16 > m.config().n_ctx_train)
        fail("eval --prefix-cache: {} tokens do not fit the model's context of {}", len,
             m.config().n_ctx_train);
      work.push_back({t, len, make_samples(t, corpus, m.tokenizer(), len, opt.samples, opt.seed)});
    }
  std::vector<PrefixTaskResult> out;
  for (const Work& w : work) {
    const TaskInfo& info = task_info(w.task);
    PrefixTaskResult r;
    r.task = w.task;
    r.length = w.length;
    r.documents = int(w.samples.size());
    for (const Method& method : opt.methods) {
      PrefixCell c;
      c.method = method;
      std::vector<double> cold_ttft, cached_ttft;
      for (size_t si = 0; si < w.samples.size(); ++si) {
        const Sample& s = w.samples[si];
        Scheduler cold(m, options(false)), warm(m, options(true));
        for (size_t q = 0; q < s.questions.size(); ++q) {
          const Sample::Question& question = s.questions[q];
          // Cold and cached alternate question by question (the machine's drift in both alike).
          const Answer a = ask(cold, question.prompt_ids, method, info.max_new_tokens);
          const Answer b = ask(warm, question.prompt_ids, method, info.max_new_tokens);
          if (q == 0) continue;  // it fills the cache: cold either way
          const bool right_cold = answer_correct(w.task, m.tokenizer().decode(a.ids), question.answer);
          const bool right_cached = answer_correct(w.task, m.tokenizer().decode(b.ids), question.answer);
          ++c.n;
          c.cold_accuracy += right_cold;
          c.cached_accuracy += right_cached;
          c.gained += right_cached && !right_cold;
          c.lost += right_cold && !right_cached;
          c.same_answer += a.ids == b.ids;
          c.cached_share += double(b.rec.cached_tokens) / double(question.prompt_ids.size());
          c.cold_computed += a.rec.prompt_tokens_computed_fraction;
          c.cached_computed += b.rec.prompt_tokens_computed_fraction;
          cold_ttft.push_back(a.ttft_s);
          cached_ttft.push_back(b.ttft_s);
        }
        if (opt.progress)
          opt.progress(fmt::format("{} {} tokens, {}: document {}/{}", info.name, w.length, method.label(),
                                   si + 1, w.samples.size()));
      }
      if (c.n > 0)
        for (double* v : {&c.cold_accuracy, &c.cached_accuracy, &c.same_answer, &c.cached_share,
                          &c.cold_computed, &c.cached_computed})
          *v /= c.n;
      c.cold_ttft_s = median(cold_ttft);
      c.cached_ttft_s = median(cached_ttft);
      r.cells.push_back(c);
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace lp::eval
