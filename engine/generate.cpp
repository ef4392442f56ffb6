#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>

#include "kernels/cpu/backend.h"
#include "model/error.h"
#include "pruning/method.h"

namespace lp {

GenerateResult generate(const Model& m, std::span<const int32_t> prompt_ids, const GenerateOptions& opt,
                        const BackendFactory& make_backend) {
  using Clock = std::chrono::steady_clock;
  const ModelConfig& c = m.config();
  const int64_t T = int64_t(prompt_ids.size());
  if (T == 0) fail("the prompt is empty (no tokens)");
  if (opt.max_new_tokens < 0) fail("the number of new tokens must be >= 0, got {}", opt.max_new_tokens);
  const bool forced = !opt.forced_ids.empty();
  const int64_t n_new = forced ? int64_t(opt.forced_ids.size()) : opt.max_new_tokens;
  if (T + n_new > c.n_ctx_train)
    fail("prompt of {} tokens + {} new tokens exceeds the model's context of {} tokens", T, n_new,
         c.n_ctx_train);
  for (const int32_t id : opt.forced_ids)
    if (id < 0 || id >= c.n_vocab) fail("forced token id {} is outside the vocabulary of {}", id, c.n_vocab);

  if (opt.policy == PolicyKind::RandomDrop) {
    // The paper's random token drop: a shorter prompt, then an unpruned run. Its fractions are of
    // the prompt as given: the dropped tokens were computed at no layer.
    check_method(opt.policy, opt.schedule);
    const std::vector<int32_t> kept = random_drop_ids(prompt_ids, *drop_share(opt.schedule), opt.prune_seed);
    GenerateOptions inner = opt;
    inner.policy = PolicyKind::None;
    GenerateResult r = generate(m, kept, inner, make_backend);
    const double seen = double(kept.size()), steps = double(r.decode_steps);
    r.prompt_ids.assign(prompt_ids.begin(), prompt_ids.end());
    r.prompt_tokens_dropped = T - int64_t(kept.size());
    r.prompt_tokens_computed_fraction *= seen / double(T);
    r.prompt_tokens_computed_fraction_after_generation *= seen / double(T);
    r.all_tokens_computed_fraction *= (seen + steps) / (double(T) + steps);
    return r;
  }
  check_method(opt.policy, opt.schedule);

  GenerateResult r;
  r.prompt_ids.assign(prompt_ids.begin(), prompt_ids.end());
  Session s(m, make_backend(T + std::max<int64_t>(n_new, 1)));
  // A synchronous backend always times its ops; an asynchronous one only when asked (timing
  // synchronises the device around every op).
  const bool time_ops = !s.backend().asynchronous() || opt.gpu_op_timers;
  OpTimers* prefill_ops = time_ops ? &r.prefill_ops : nullptr;
  OpTimers* decode_ops = time_ops ? &r.decode_ops : nullptr;
  Sampler sampler(opt.sampler);
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::iota(pos.begin(), pos.end(), 0);
  const int64_t last = T - 1;

  std::unique_ptr<PruningPolicy> policy;
  PruneRequest req;
  if (opt.policy != PolicyKind::None) {
    r.prune_steps = resolve_schedule(opt.schedule, c.n_layer, c.global_layers());
    policy = make_policy(opt.policy, opt.prune_seed);
    req = {r.prune_steps, policy.get()};
  }

  if (opt.warmup) {
    const auto w0 = Clock::now();
    std::unique_ptr<PruningPolicy> wp = policy ? make_policy(opt.policy, opt.prune_seed) : nullptr;
    PruneRequest wreq{r.prune_steps, wp.get()};
    trace::Step ws;
    s.forward(prompt_ids, pos, {&last, 1}, logits.data(), wp ? &wreq : nullptr, &ws, nullptr);
    if (n_new > 1) {  // the decoding kernels (key splits, re-selection, revival) too
      const int32_t tok = argmax(logits), p = int32_t(T);
      s.decode_step(tok, p, logits.data(), wp ? &wreq : nullptr, &ws, nullptr);
    }
    s.backend().synchronize();
    s.reset();
    r.warmup_s = std::chrono::duration<double>(Clock::now() - w0).count();
  }

  const auto t0 = Clock::now();
  s.forward(prompt_ids, pos, {&last, 1}, logits.data(), policy ? &req : nullptr, &r.prefill_stats,
            prefill_ops);
  const auto t1 = Clock::now();
  double computed = 0;
  for (int64_t n : r.prefill_stats.queries) computed += double(n);
  r.prompt_tokens_computed_fraction = computed / (double(T) * c.n_layer);
  r.kv_bytes_used = s.kv_bytes_used();
  r.kv_element_bytes = s.backend().kv_element_bytes();
  r.aux_cache_bytes = s.aux().bytes();
  r.last_prefill_logits = logits;
  // Under teacher forcing: record the forced token's log-probability and the greedy choice.
  const auto choose = [&](size_t i, std::span<const float> lg) {
    if (!forced) return sampler.sample(lg);
    const int32_t want = opt.forced_ids[i];
    const float mx = *std::max_element(lg.begin(), lg.end());
    double sum = 0;
    for (const float v : lg) sum += std::exp(double(v) - double(mx));
    r.forced_logprobs.push_back(double(lg[size_t(want)]) - double(mx) - std::log(sum));
    r.forced_argmax.push_back(argmax(lg));
    return want;
  };
  const int32_t first = n_new > 0 ? choose(0, logits) : -1;
  const auto t2 = Clock::now();
  r.prefill_s = std::chrono::duration<double>(t1 - t0).count();
  r.ttft_s = std::chrono::duration<double>(t2 - t0).count();

  DecodeLoop loop;
  loop.n_new = n_new;
  loop.stop_at_end_of_generation = !forced && opt.stop_at_end_of_generation;
  loop.prune = policy ? &req : nullptr;
  loop.ops = decode_ops;
  loop.steady_ops = time_ops ? &r.decode_steady_ops : nullptr;
  loop.record_steps = opt.record_steps;
  Decoded d = decode_tokens(s, m, T, first, logits, loop, choose);
  r.generated_ids = std::move(d.ids);
  r.text = std::move(d.text);
  r.decode_steps = d.steps;
  r.revivals = d.revivals;
  r.decode_s = d.seconds;
  r.decode_step_s = std::move(d.step_seconds);
  r.decode_stats = std::move(d.stats);
  r.all_tokens_computed_fraction = (computed + d.computed) / (double(T + r.decode_steps) * c.n_layer);
  r.prompt_tokens_computed_fraction_after_generation =
      (computed + d.computed - double(r.decode_steps) * c.n_layer) / (double(T) * c.n_layer);
  return r;
}

Decoded decode_tokens(Session& s, const Model& m, int64_t prompt_tokens, int32_t first,
                      std::vector<float>& logits, const DecodeLoop& o,
                      const std::function<int32_t(size_t i, std::span<const float>)>& choose) {
  using Clock = std::chrono::steady_clock;
  Decoded d;
  const auto d0 = Clock::now();
  int32_t next = first;
  OpTimers step;  // a steady-state step's timings (zeroed and reused each step)
  while (int64_t(d.ids.size()) < o.n_new) {
    d.ids.push_back(next);
    if (o.stop_at_end_of_generation && m.tokenizer().is_end_of_generation(next)) break;
    if (int64_t(d.ids.size()) == o.n_new) break;
    const int32_t p = int32_t(prompt_tokens + int64_t(d.ids.size()) - 1);
    trace::Step st;
    const auto s0 = Clock::now();
    if (o.ops && o.steady_ops && d.steps >= kSteadyAfterSteps) {
      step.zero();
      s.decode_step(next, p, logits.data(), o.prune, &st, &step);
      o.ops->add(step);
      o.steady_ops->add(step);
    } else {
      s.decode_step(next, p, logits.data(), o.prune, &st, o.ops);
    }
    d.step_seconds.push_back(std::chrono::duration<double>(Clock::now() - s0).count());
    for (size_t l = 0; l < st.queries.size(); ++l) {
      d.computed += double(st.queries[l]);
      d.revivals += st.revived[l];
    }
    if (o.record_steps) d.stats.push_back(std::move(st));
    ++d.steps;
    next = choose(d.ids.size(), logits);
  }
  d.seconds = std::chrono::duration<double>(Clock::now() - d0).count();
  std::vector<int32_t> shown = d.ids;
  if (!shown.empty() && m.tokenizer().is_end_of_generation(shown.back())) shown.pop_back();
  d.text = m.tokenizer().decode(shown);
  return d;
}

GenerateResult generate(CpuContext& ctx, const Model& m, std::span<const int32_t> prompt_ids,
                        const GenerateOptions& opt) {
  return generate(m, prompt_ids, opt, [&](int64_t n_ctx) -> std::unique_ptr<Backend> {
    return std::make_unique<CpuBackend>(ctx, m.config(), m.weights(), n_ctx);
  });
}

Rounds generate_rounds(
    CpuContext& ctx, const Model& m, const std::vector<std::vector<int32_t>>& prompts,
    const std::vector<GenerateOptions>& opts, int rounds,
    const std::function<void(int round, size_t i, const GenerateResult& fastest)>& progress) {
  if (prompts.size() != opts.size())
    fail("generate_rounds: {} prompts for {} options", prompts.size(), opts.size());
  if (rounds < 1) fail("generate_rounds: rounds must be at least 1, got {}", rounds);
  Rounds r;
  r.fastest.resize(prompts.size());
  r.prefill_s.resize(prompts.size());
  for (int round = 0; round < rounds; ++round)
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateResult g = generate(ctx, m, prompts[i], opts[i]);
      r.prefill_s[i].push_back(g.prefill_s);
      if (round == 0 || g.prefill_s < r.fastest[i].prefill_s) r.fastest[i] = std::move(g);
      if (progress) progress(round, i, r.fastest[i]);
    }
  return r;
}

}  // namespace lp
