// The prefix cache of `serve`'s scheduler: the blocks of earlier sequences' state (TokenStates in
// engine/session.h), chosen, matched and evicted by the policy shared with the serving simulation
// (PrefixIndex, admission/prefix_cache.h). docs/serving.md, "Prefix caching", says what a cached
// block means with and without pruning.
//
// Copies, not shared pages: each session owns its K/V in the backend's layout (attention reads a
// layer's slots as one array), so a request that hits copies its prefix's blocks into its own
// session (Session::load_states) and the cache keeps its own copy of what a request saves. The copy
// is a memory pass over the prefix's K/V, where recomputing it is the prefill's GEMMs and
// attention (bench/bench_serving.cpp measures both). llama.cpp's server keeps prompts in host memory
// the same way. A running request never holds a cache block, so eviction cannot reach a running
// request: blocks are pinned only while a request copies them in or saves them.
//
// Two kinds of state, never mixed (the index's namespaces): Full, every (token, layer) pair
// computed (no pruning: a hit's output is bitwise the cold run's), and Pruned, what LazyLLM left
// (a token's K/V up to its depth, its Aux Cache state there). A LazyLLM request that hits runs its
// prompt's new tokens as one decoding step of several rows (Session::begin_extend): its selection
// at each pruning layer revives the cached tokens it needs from their states, and when it ends, a
// cached block it extended takes each token's deeper state (a (token, layer) pair computed once
// stays computed: the at-most-once rule over the cache's lifetime, except for two requests running
// at once that revive the same pair, each in its own copy).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "admission/prefix_cache.h"
#include "engine/session.h"

namespace lp {

enum class CacheKind : uint8_t { Full = 1, Pruned = 2 };

class PrefixCache {
 public:
  using BlockId = PrefixIndex::BlockId;
  PrefixCache(int n_layer, int64_t width, int64_t block_tokens);

  // A lookup's result: the cached blocks of the prompt's longest prefix, pinned until release().
  struct Hit {
    std::vector<BlockId> blocks;
    int64_t tokens = 0;
  };
  // The longest cached prefix of `tokens` of this kind, at most max_tokens tokens.
  Hit lookup(std::span<const int32_t> tokens, CacheKind kind, int64_t max_tokens);
  void release(Hit& h);
  // The hit's blocks into an empty session.
  void load(Session& s, const Hit& h) const;

  // Saves the full blocks of the sequence `tokens` whose first s.n_cached() tokens `s` holds,
  // within `room` bytes for the whole cache (evicting what it must). `lineage`: the blocks this
  // request loaded or saved, extended here; a block of the lineage is brought up to the session's
  // state (Pruned: each token's deeper state), a block of another lineage is adopted when its kind
  // is Full (the same numbers) and ends the save when it is Pruned (another run's state). Stops at
  // the first block that does not fit. Returns the blocks added.
  int64_t save(Session& s, std::span<const int32_t> tokens, CacheKind kind, std::vector<BlockId>& lineage,
               int64_t room);
  // Evicts least recently used blocks until the cache holds at most `room` bytes; false when the
  // pinned blocks alone hold more.
  bool make_room(int64_t room);

  // The index, for admission (admit_with_cache), and the payload of an evicted block dropped.
  PrefixIndex& index() { return index_; }
  void forget(BlockId id) { states_.erase(id); }
  int64_t bytes() const { return index_.bytes(); }
  int64_t blocks() const { return index_.blocks(); }
  int64_t block_tokens() const { return index_.block_tokens(); }
  const PrefixIndex::Counters& counters() const { return index_.counters(); }
  void count_query(int64_t tokens, int64_t hit) { index_.count_query(tokens, hit); }

 private:
  int n_layer_;
  int64_t width_;  // D: floats of an Aux Cache state
  PrefixIndex index_;
  std::unordered_map<BlockId, TokenStates> states_;
};

// Each token's deeper state of two saves of the same block (`a` and `b`: the same first token and
// size, one session's state before and after it revived some of them); nullopt when `b` deepens
// none of them.
std::optional<TokenStates> deeper_states(const TokenStates& a, const TokenStates& b, int n_layer,
                                         int64_t width);

}  // namespace lp
