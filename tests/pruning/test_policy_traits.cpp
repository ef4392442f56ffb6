// The policies' traits (pruning/policy.h: PolicyTraits), which the simulator's costing reads, held
// to what the engine's PruningPolicy objects do: whether they want scores and when, whether the
// layers before the first pruning layer are scored, whether a later step keeps the prefill's set
// (frozen) or chooses again (and so revives), and which policy has no pruning inside the model.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "model/error.h"
#include "pruning/policy.h"

namespace lp {
namespace {

TEST(PolicyTraits, SayWhatThePoliciesDo) {
  const std::vector<int32_t> pos = {0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<float> favour_low = {8, 7, 6, 5, 4, 3, 2, 1}, favour_high = {1, 2, 3, 4, 5, 6, 7, 8};
  for (const PolicyKind k : {PolicyKind::None, PolicyKind::LazyLLM, PolicyKind::Frozen,
                             PolicyKind::RandomLayers, PolicyKind::StaticPaper, PolicyKind::RandomDrop}) {
    SCOPED_TRACE(policy_name(k));
    const PolicyTraits t = policy_traits(k);
    EXPECT_EQ(t.revives, policy_revives(k));
    EXPECT_EQ(t.freezes, policy_freezes(k));
    if (k == PolicyKind::RandomDrop) {  // before the model: nothing to run inside it
      EXPECT_TRUE(t.drops_prompt);
      EXPECT_FALSE(t.prunes);
      EXPECT_THROW((void)make_policy(k, 1), Error);
      continue;
    }
    EXPECT_FALSE(t.drops_prompt);
    EXPECT_EQ(t.prunes, k != PolicyKind::None);
    const auto p = make_policy(k, 1);
    // The prefill: scores wanted at the first pruning layer by whatever scores at all; the layers
    // before it observed by what averages them.
    EXPECT_EQ(p->needs_scores(), t.scores_always || t.scores_once);
    EXPECT_EQ(p->observes(0), t.scores_before);
    if (p->observes(0)) p->observe(0, pos, favour_low);
    const std::vector<int64_t> first = p->select(3, pos, favour_low, 4);
    // A later step: still scoring only if it scores always; nothing before the pruning layer.
    EXPECT_EQ(p->needs_scores(), t.scores_always);
    EXPECT_FALSE(p->observes(0));
    std::vector<int32_t> later = pos;
    later.push_back(8);  // a generated token
    std::vector<float> later_scores = favour_high;
    later_scores.push_back(9);
    const std::vector<int64_t> second = p->select(3, later, later_scores, 5);
    std::vector<int64_t> again = first;
    again.push_back(8);
    if (k == PolicyKind::None) {
      EXPECT_EQ(second.size(), later.size());
    } else if (t.freezes) {
      EXPECT_EQ(second, again);  // the prefill's set, and the new token
    } else if (k == PolicyKind::LazyLLM) {
      EXPECT_NE(second, again);  // chosen again: what it drops may come back (revival)
    }
    // The costing's view (scores_at), for a prefill with its first pruning layer at 3.
    EXPECT_EQ(scores_at(t, true, 3, t.prunes, 3), t.scores_always || t.scores_once);
    EXPECT_EQ(scores_at(t, true, 1, false, 3), t.scores_before);
    EXPECT_EQ(scores_at(t, false, 3, t.prunes, 3), t.scores_always);
    EXPECT_FALSE(scores_at(t, false, 1, false, 3));
  }
}

}  // namespace
}  // namespace lp
