// The prefix cache's policy (admission/prefix_cache.h) on typed inputs: chained keys, the longest
// match, a collision costing a miss, least-recently-used leaves evicted first, pins, the bytes.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "admission/prefix_cache.h"
#include "model/error.h"

namespace lp {
namespace {

std::vector<int32_t> seq(int32_t from, int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

// Caches the full blocks of `t` (as a request that computed them would), each of `bytes`.
std::vector<PrefixIndex::BlockId> cache(PrefixIndex& ix, const std::vector<int32_t>& t, uint64_t ns,
                                        int64_t bytes = 100) {
  const auto keys = ix.keys(t, ns);
  std::vector<PrefixIndex::BlockId> chain;
  PrefixIndex::BlockId parent = -1;
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto part = std::span(t).subspan(i * size_t(ix.block_tokens()), size_t(ix.block_tokens()));
    PrefixIndex::BlockId id = ix.find(parent, keys[i], part);
    if (id < 0) id = ix.insert(parent, keys[i], part, bytes);
    chain.push_back(parent = id);
  }
  return chain;
}

TEST(PrefixIndex, KeysNameTheWholePrefixAndItsNamespace) {
  PrefixIndex ix(4);
  const std::vector<int32_t> a = seq(0, 10), b = {0, 1, 2, 3, 4, 5, 6, 99, 8, 9, 10, 11};
  const auto ka = ix.keys(a, 1), kb = ix.keys(b, 1);
  ASSERT_EQ(ka.size(), 2u);  // full blocks only
  ASSERT_EQ(kb.size(), 3u);
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_NE(ka[1], kb[1]);  // one token differs in the second block
  EXPECT_NE(ix.keys(a, 2)[0], ka[0]);
  // The same block after a different prefix is another key.
  std::vector<int32_t> c = a;
  c[0] = 50;
  EXPECT_NE(ix.keys(c, 1)[1], ka[1]);
}

TEST(PrefixIndex, TheLongestCachedRunFromTheStart) {
  PrefixIndex ix(4);
  const std::vector<int32_t> doc = seq(0, 12);
  cache(ix, doc, 1);
  EXPECT_EQ(ix.blocks(), 3);
  EXPECT_EQ(ix.bytes(), 300);
  std::vector<int32_t> q = seq(0, 8);
  q.insert(q.end(), {7, 7, 7, 7, 7});
  EXPECT_EQ(ix.match(q, ix.keys(q, 1), 100).size(), 2u);
  EXPECT_EQ(ix.match(doc, ix.keys(doc, 1), 1).size(), 1u);    // at most max_blocks
  EXPECT_EQ(ix.match(doc, ix.keys(doc, 2), 100).size(), 0u);  // another namespace
  std::vector<int32_t> other = doc;
  other[1] = 40;
  EXPECT_EQ(ix.match(other, ix.keys(other, 1), 100).size(), 0u);
}

TEST(PrefixIndex, ACollisionIsAMissNeverAWrongPrefix) {
  PrefixIndex ix(2);
  const std::vector<int32_t> a = {1, 2}, b = {3, 4};
  const auto key = ix.keys(a, 1)[0];
  const auto id = ix.insert(-1, key, a, 10);
  ASSERT_GE(id, 0);
  EXPECT_EQ(ix.find(-1, key, b), -1);        // the same key, other tokens
  EXPECT_EQ(ix.find(id, key, a), -1);        // the same key and tokens after another parent
  EXPECT_EQ(ix.insert(-1, key, b, 10), -1);  // the key is taken: nothing cached
  EXPECT_EQ(ix.blocks(), 1);
  EXPECT_THROW(ix.insert(-1, 5, std::vector<int32_t>{1}, 10), Error);  // not a block's tokens
}

TEST(PrefixIndex, LeastRecentlyUsedLeavesGoFirstAndPinsStay) {
  PrefixIndex ix(2);
  const auto x = cache(ix, {1, 2, 3, 4}, 1);  // x0 -> x1
  const auto y = cache(ix, {1, 2, 5, 6}, 1);  // x0 -> y1
  const auto z = cache(ix, {7, 8}, 1);        // z0
  ASSERT_EQ(y[0], x[0]);
  EXPECT_EQ(ix.blocks(), 4);
  // x's chain used again: y1 is now the oldest leaf, then z0, then x1; x0 goes after its children.
  std::vector<int32_t> xs = {1, 2, 3, 4};
  ix.match(xs, ix.keys(xs, 1), 10);
  ix.pin(std::span(&z[0], 1));
  EXPECT_EQ(ix.evict_one(), y[1]);
  EXPECT_EQ(ix.evict_one(), x[1]);  // z0 is pinned
  EXPECT_EQ(ix.evict_one(), x[0]);  // a leaf now
  EXPECT_EQ(ix.evict_one(), -1);    // only the pinned one is left
  ix.unpin(std::span(&z[0], 1));
  EXPECT_EQ(ix.evict_one(), z[0]);
  EXPECT_EQ(ix.blocks(), 0);
  EXPECT_EQ(ix.bytes(), 0);
  EXPECT_EQ(ix.counters().evictions, 4);
  EXPECT_THROW(ix.unpin(std::span(&z[0], 1)), Error);
}

TEST(PrefixIndex, RefusesABlockSizeOutOfRange) {
  EXPECT_THROW(PrefixIndex(0), Error);
  EXPECT_THROW(PrefixIndex(int64_t(1) << 40), Error);
}

}  // namespace
}  // namespace lp
