#include "pruning/policy.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "model/error.h"

namespace lp {

PolicyKind parse_policy(std::string_view name) {
  if (name == "none") return PolicyKind::None;
  if (name == "lazyllm") return PolicyKind::LazyLLM;
  if (name == "static") return PolicyKind::Static;
  if (name == "random") return PolicyKind::Random;
  usage_fail("unknown pruning policy '{}' (expected none, lazyllm, static or random)", name);
}

const char* policy_name(PolicyKind k) {
  switch (k) {
    case PolicyKind::None:
      return "none";
    case PolicyKind::LazyLLM:
      return "lazyllm";
    case PolicyKind::Static:
      return "static";
    case PolicyKind::Random:
      return "random";
  }
  return "?";
}

namespace {

class NonePolicy final : public PruningPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::None; }
  bool needs_scores() const override { return false; }
  std::vector<int64_t> select(int, std::span<const int32_t> pos, std::span<const float>, int64_t) override {
    std::vector<int64_t> all(pos.size());
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
};

class LazyPolicy final : public PruningPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::LazyLLM; }
  bool needs_scores() const override { return true; }
  bool keeps_top_scores() const override { return true; }
  std::vector<int64_t> select(int, std::span<const int32_t> pos, std::span<const float> scores,
                              int64_t n_keep) override {
    return select_top(pos, scores, n_keep);
  }
};

// Static: the prefill's first pruning layer scores once; every pruning layer of the prefill then
// keeps the best by those scores, and later steps keep exactly that set (plus the tokens
// generated after the prefill, which every layer computes): nothing pruned ever comes back.
class StaticPolicy final : public PruningPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::Static; }
  bool needs_scores() const override { return score_of_.empty(); }
  std::vector<int64_t> select(int layer, std::span<const int32_t> pos, std::span<const float> scores,
                              int64_t n_keep) override {
    auto it = kept_.find(layer);
    if (it != kept_.end()) {  // a later step: the set chosen in the prefill, and newer tokens
      std::vector<int64_t> keep;
      for (size_t i = 0; i < pos.size(); ++i)
        if (pos[i] > last_prefill_pos_ || it->second.count(pos[i])) keep.push_back(int64_t(i));
      if (keep.empty() || keep.back() != int64_t(pos.size()) - 1) keep.push_back(int64_t(pos.size()) - 1);
      return keep;
    }
    if (score_of_.empty())
      for (size_t i = 0; i < pos.size(); ++i) score_of_[pos[i]] = scores[i];
    if (!pos.empty()) last_prefill_pos_ = std::max(last_prefill_pos_, pos.back());
    std::vector<float> s(pos.size());
    for (size_t i = 0; i < pos.size(); ++i) {
      auto f = score_of_.find(pos[i]);
      s[i] = f == score_of_.end() ? 0.0f : f->second;
    }
    std::vector<int64_t> keep = select_top(pos, s, n_keep);
    auto& set = kept_[layer];
    for (int64_t i : keep) set.insert(pos[size_t(i)]);
    return keep;
  }

 private:
  std::unordered_map<int32_t, float> score_of_;
  std::map<int, std::unordered_set<int32_t>> kept_;
  int32_t last_prefill_pos_ = -1;
};

class RandomPolicy final : public PruningPolicy {
 public:
  explicit RandomPolicy(uint64_t seed) : rng_(seed) {}
  PolicyKind kind() const override { return PolicyKind::Random; }
  bool needs_scores() const override { return false; }
  std::vector<int64_t> select(int, std::span<const int32_t> pos, std::span<const float>,
                              int64_t n_keep) override {
    std::vector<float> s(pos.size());
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (auto& x : s) x = u(rng_);
    return select_top(pos, s, n_keep);
  }

 private:
  std::mt19937_64 rng_;
};

}  // namespace

std::unique_ptr<PruningPolicy> make_policy(PolicyKind kind, uint64_t seed) {
  switch (kind) {
    case PolicyKind::None:
      return std::make_unique<NonePolicy>();
    case PolicyKind::LazyLLM:
      return std::make_unique<LazyPolicy>();
    case PolicyKind::Static:
      return std::make_unique<StaticPolicy>();
    case PolicyKind::Random:
      return std::make_unique<RandomPolicy>(seed);
  }
  fail("unknown pruning policy");
}

}  // namespace lp
