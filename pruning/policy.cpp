#include "pruning/policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "model/error.h"
#include "pruning/schedule.h"

namespace lp {

const char* const kPolicyNames = "none, lazyllm, static-paper, random-drop, frozen or random-layers";

namespace {

constexpr PolicyKind kAll[] = {PolicyKind::None,         PolicyKind::LazyLLM,     PolicyKind::Frozen,
                               PolicyKind::RandomLayers, PolicyKind::StaticPaper, PolicyKind::RandomDrop};

}  // namespace

std::string check_policy_arg(std::string_view name) {
  for (const PolicyKind k : kAll)
    if (name == policy_name(k)) return "";
  if (name == "static")
    return "'static' was renamed: 'frozen' is the old policy (LazyLLM's layers, scores frozen at the first), "
           "'static-paper' the LazyLLM paper's static pruning";
  if (name == "random")
    return "'random' was renamed: 'random-layers' is the old policy (LazyLLM's layers, a random choice), "
           "'random-drop' the LazyLLM paper's random token drop before the model";
  return fmt::format("unknown pruning policy '{}' (expected {})", name, kPolicyNames);
}

PolicyKind parse_policy(std::string_view name) {
  for (const PolicyKind k : kAll)
    if (name == policy_name(k)) return k;
  usage_fail("{}", check_policy_arg(name));
}

std::optional<PolicyKind> policy_in_file(std::string_view name) {
  for (const PolicyKind k : kAll)
    if (name == policy_name(k)) return k;
  if (name == "static") return PolicyKind::Frozen;
  if (name == "random") return PolicyKind::RandomLayers;
  return std::nullopt;
}

const char* policy_name(PolicyKind k) {
  switch (k) {
    case PolicyKind::None:
      return "none";
    case PolicyKind::LazyLLM:
      return "lazyllm";
    case PolicyKind::Frozen:
      return "frozen";
    case PolicyKind::RandomLayers:
      return "random-layers";
    case PolicyKind::StaticPaper:
      return "static-paper";
    case PolicyKind::RandomDrop:
      return "random-drop";
  }
  return "?";
}

PolicyTraits policy_traits(PolicyKind k) {
  PolicyTraits t;
  switch (k) {
    case PolicyKind::None:
      break;
    case PolicyKind::LazyLLM:
      t.prunes = t.scores_always = t.revives = true;
      break;
    case PolicyKind::RandomLayers:  // LazyLLM's layers and revival, a random choice: no scores
      t.prunes = t.revives = true;
      break;
    case PolicyKind::Frozen:
      t.prunes = t.scores_once = t.freezes = true;
      break;
    case PolicyKind::StaticPaper:  // its scores average the layers up to its one pruning layer
      t.prunes = t.scores_once = t.scores_before = t.freezes = true;
      break;
    case PolicyKind::RandomDrop:
      t.drops_prompt = true;
      break;
  }
  return t;
}

bool scores_at(const PolicyTraits& t, bool prefill, int l, bool prunes_here, int first_prune) {
  if (prunes_here) return t.scores_always || (t.scores_once && prefill && l == first_prune);
  return t.scores_before && prefill && l < first_prune;
}

bool policy_revives(PolicyKind k) {
  return policy_traits(k).revives;
}
bool policy_freezes(PolicyKind k) {
  return policy_traits(k).freezes;
}

int64_t random_drop_kept(int64_t n, double share) {
  if (n < 1) fail("random-drop: a prompt of {} tokens", n);
  if (!(share >= 0 && share < 1)) fail("random-drop: drop share {} must be in [0, 1)", share);
  return std::max<int64_t>(std::min<int64_t>(n, 2), tokens_kept(n, share));
}

std::vector<int64_t> random_drop(int64_t n, double share, uint64_t seed) {
  const int64_t keep = random_drop_kept(n, share);
  std::vector<int64_t> middle;  // the droppable ones: neither the first nor the last
  for (int64_t i = 1; i + 1 < n; ++i) middle.push_back(i);
  std::vector<int64_t> kept;
  kept.reserve(size_t(keep));
  std::mt19937_64 rng(seed);
  // Selection sampling (Knuth's algorithm S): each subset of the middle equally likely, in order.
  int64_t need = keep - std::min<int64_t>(n, 2), left = int64_t(middle.size());
  kept.push_back(0);
  for (const int64_t i : middle) {
    if (std::uniform_int_distribution<int64_t>(0, left - 1)(rng) < need) {
      kept.push_back(i);
      --need;
    }
    --left;
  }
  if (n > 1) kept.push_back(n - 1);
  return kept;
}

std::vector<int32_t> random_drop_ids(std::span<const int32_t> ids, double share, uint64_t seed) {
  std::vector<int32_t> out;
  for (const int64_t i : random_drop(int64_t(ids.size()), share, seed)) out.push_back(ids[size_t(i)]);
  return out;
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

// Frozen: the prefill's first pruning layer scores once; every pruning layer of the prefill then
// keeps the best by those scores, and later steps keep exactly that set (plus the tokens
// generated after the prefill, which every layer computes): nothing pruned ever comes back.
// static-paper is the same with one pruning layer and scores averaged over the layers up to it.
class FrozenPolicy : public PruningPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::Frozen; }
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
    if (score_of_.empty()) first_scores(pos, scores);
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

 protected:
  virtual void first_scores(std::span<const int32_t> pos, std::span<const float> scores) {
    for (size_t i = 0; i < pos.size(); ++i) score_of_[pos[i]] = scores[i];
  }
  std::unordered_map<int32_t, float> score_of_;

 private:
  std::map<int, std::unordered_set<int32_t>> kept_;
  int32_t last_prefill_pos_ = -1;
};

// The paper's static pruning: the last token's attention (mean over heads) at every layer up to
// and including the one pruning layer, averaged over those layers, scores the prompt once.
class StaticPaperPolicy final : public FrozenPolicy {
 public:
  PolicyKind kind() const override { return PolicyKind::StaticPaper; }
  bool observes(int) const override { return score_of_.empty(); }
  void observe(int, std::span<const int32_t> pos, std::span<const float> scores) override {
    if (sum_.empty()) sum_.assign(pos.size(), 0.0);
    if (sum_.size() != pos.size())
      fail("static-paper: the layers before its pruning layer saw different tokens");
    for (size_t i = 0; i < pos.size(); ++i) sum_[i] += scores[i];
    ++layers_;
  }

 private:
  void first_scores(std::span<const int32_t> pos, std::span<const float> scores) override {
    if (!sum_.empty() && sum_.size() != pos.size())
      fail("static-paper: its pruning layer saw other tokens than the layers before it");
    for (size_t i = 0; i < pos.size(); ++i)
      score_of_[pos[i]] = float(((sum_.empty() ? 0.0 : sum_[i]) + scores[i]) / double(layers_ + 1));
  }
  std::vector<double> sum_;
  int layers_ = 0;
};

class RandomLayersPolicy final : public PruningPolicy {
 public:
  explicit RandomLayersPolicy(uint64_t seed) : rng_(seed) {}
  PolicyKind kind() const override { return PolicyKind::RandomLayers; }
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
    case PolicyKind::Frozen:
      return std::make_unique<FrozenPolicy>();
    case PolicyKind::StaticPaper:
      return std::make_unique<StaticPaperPolicy>();
    case PolicyKind::RandomLayers:
      return std::make_unique<RandomLayersPolicy>(seed);
    case PolicyKind::RandomDrop:
      fail("random-drop shortens the prompt before the model; it has no pruning policy inside it");
  }
  fail("unknown pruning policy");
}

}  // namespace lp
