// A request's greedy output alone and batched (engine/batch.h, engine/scheduler.h), on any backend:
// the CPU suite (tests/engine/test_batch.cpp) and the CUDA backend's host emulation
// (tests/gpu/test_gpu_ops.cpp) share it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/generate.h"
#include "engine/scheduler.h"
#include "pruning/schedule.h"

namespace lp::testing {

struct BatchCase {
  std::vector<int32_t> prompt;
  PolicyKind policy;
  std::string schedule = "";   // its own schedule (inline); empty: the one all cases share
  SamplerParams sampler = {};  // greedy unless given (a sampled member's logits come back)
};

// Each case alone through generate(), then all through the scheduler: the first `at_once` submitted
// together, the others one per iteration while those decode (prefills batched with decoding rows).
// Both on backends from `make_backend`.
inline void expect_same_alone_and_batched(const Model& m, const std::vector<BatchCase>& cases,
                                          const Schedule& schedule, int64_t max_tokens, size_t at_once,
                                          const BackendFactory& make_backend) {
  const auto schedule_of = [&](const BatchCase& c) {
    return c.schedule.empty() ? schedule : parse_schedule(c.schedule);
  };
  std::vector<std::vector<int32_t>> alone;
  std::vector<double> alone_share;
  for (const BatchCase& c : cases) {
    GenerateOptions opt;
    opt.max_new_tokens = int(max_tokens);
    opt.stop_at_end_of_generation = false;
    opt.policy = c.policy;
    opt.schedule = schedule_of(c);
    opt.prune_seed = 5;
    opt.sampler = c.sampler;
    const GenerateResult r = generate(m, c.prompt, opt, make_backend);
    alone.push_back(r.generated_ids);
    alone_share.push_back(r.prompt_tokens_computed_fraction);
  }
  SchedulerOptions so;
  so.kv_budget_bytes = int64_t(1) << 32;
  so.max_batch_tokens = 4096;
  so.make_backend = make_backend;
  Scheduler s(m, so);
  std::vector<std::vector<int32_t>> got(cases.size());
  std::vector<RequestRecord> records(cases.size());
  int64_t most_running = 0;
  const auto submit = [&](size_t i) {
    RequestParams p;
    p.prompt = cases[i].prompt;
    p.max_tokens = max_tokens;
    p.stop_at_end_of_generation = false;
    p.policy = cases[i].policy;
    p.schedule = schedule_of(cases[i]);
    p.prune_seed = 5;
    p.sampler = cases[i].sampler;
    p.on_token = [&got, i](int32_t t) {
      got[i].push_back(t);
      return true;
    };
    p.on_finish = [&records, i](const RequestRecord& r) { records[i] = r; };
    s.submit(std::move(p));
  };
  size_t next = 0;
  for (; next < at_once && next < cases.size(); ++next) submit(next);
  while (true) {
    if (next < cases.size()) submit(next++);
    if (!s.step()) break;
    most_running = std::max(most_running, s.running() + 1);
  }
  EXPECT_GE(most_running, 3) << "the requests never ran together";
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(got[i], alone[i]) << "request " << i << " (" << policy_name(cases[i].policy) << ", "
                                << cases[i].prompt.size() << " prompt tokens)";
    EXPECT_EQ(records[i].finish, Finish::Length) << records[i].error;
    EXPECT_EQ(records[i].output_tokens, max_tokens);
    // The prompt as sent (random-drop: before the drop) and the share of its pairs computed.
    EXPECT_EQ(records[i].prompt_tokens, int64_t(cases[i].prompt.size()));
    EXPECT_EQ(records[i].policy, cases[i].policy);
    EXPECT_DOUBLE_EQ(records[i].prompt_tokens_computed_fraction, alone_share[i]);
  }
  EXPECT_EQ(s.kv_bytes_reserved(), 0);
}

}  // namespace lp::testing
