// The prefix cache's policy, written once: which blocks of earlier sequences are kept, which prefix
// a new prompt reuses, and what goes when room is needed. `serve`'s scheduler keeps the K/V of
// each block beside it (engine/prefix_cache.h) and the serving simulation only its bytes
// (sim/serving.h); both decide with this index.
//
// As vLLM's automatic prefix caching and SGLang's radix cache: a sequence is cut into blocks of B
// tokens, each keyed by a hash chained over the blocks before it (XXH3 over the block's tokens,
// seeded by its parent's key), so a key names the whole prefix up to its block's end. Only full
// blocks are kept. A prompt reuses the longest run of cached blocks from its start; a block's
// tokens and parent are compared on every match, so a hash collision costs a miss, never a wrong
// prefix. Keys are salted by a namespace (the state a block holds: computed in full, or what
// LazyLLM's pruning left), so the two never mix.
//
// The blocks form a tree (a parent, its children). Eviction takes the least recently used leaf
// that no request has pinned (SGLang's rule: a block goes only after every longer prefix through
// it), so what is cached is always reachable from the start. A match refreshes its whole chain.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "admission/admission.h"

namespace lp {

class PrefixIndex {
 public:
  using BlockId = int64_t;  // never reused; -1: none (the parent of a first block)

  explicit PrefixIndex(int64_t block_tokens = 16);
  int64_t block_tokens() const { return block_; }

  // The chained keys of the full blocks of `tokens`, salted by `ns`.
  std::vector<uint64_t> keys(std::span<const int32_t> tokens, uint64_t ns) const;

  // The longest run of cached blocks matching the start of `tokens` (keys from keys()), at most
  // max_blocks; the chain is refreshed as the most recently used.
  std::vector<BlockId> match(std::span<const int32_t> tokens, std::span<const uint64_t> keys,
                             int64_t max_blocks);

  // The block after `parent` with this key and these tokens, or -1.
  BlockId find(BlockId parent, uint64_t key, std::span<const int32_t> tokens) const;
  // A new block (none with its key may be cached: find() first) holding `bytes`; the most recently
  // used. Returns -1, caching nothing, when its key is taken by another prefix (a hash collision).
  BlockId insert(BlockId parent, uint64_t key, std::span<const int32_t> tokens, int64_t bytes);
  bool contains(BlockId b) const { return blocks_.count(b) > 0; }
  void set_bytes(BlockId b, int64_t bytes);
  int64_t bytes_of(BlockId b) const;

  // A pinned block is never evicted (a request copying it, or a chain being extended).
  void pin(std::span<const BlockId> bs);
  void unpin(std::span<const BlockId> bs);
  // Evicts the least recently used unpinned leaf: its id, or -1 when every block is pinned or has
  // a child.
  BlockId evict_one();
  // Evicts (evict_one) until the index holds at most `room` bytes, telling `evicted` each block;
  // false when what is pinned, and every block under it, holds more.
  bool make_room(int64_t room, const std::function<void(BlockId)>& evicted = {});

  int64_t bytes() const { return bytes_; }
  int64_t blocks() const { return int64_t(blocks_.size()); }
  void clear();

  // Counters for metrics (vLLM's prefix_cache_queries and _hits count tokens): count_query() is
  // the caller's, once per request whose prompt was looked up.
  struct Counters {
    int64_t queries = 0, hits = 0;  // tokens looked up, tokens found
    int64_t evictions = 0;          // blocks
  };
  void count_query(int64_t tokens, int64_t hit) {
    counters_.queries += tokens;
    counters_.hits += hit;
  }
  const Counters& counters() const { return counters_; }

 private:
  struct Block {
    BlockId parent = -1;
    uint64_t key = 0;
    std::vector<int32_t> tokens;
    int64_t bytes = 0;
    int64_t children = 0;
    int64_t pins = 0;
    uint64_t used = 0;  // the clock at its last use
  };
  int64_t block_;
  std::unordered_map<BlockId, Block> blocks_;
  std::unordered_map<uint64_t, BlockId> by_key_;
  std::set<std::pair<uint64_t, BlockId>> leaves_;  // (used, id) of blocks without children
  BlockId next_id_ = 0;
  uint64_t clock_ = 0;
  int64_t bytes_ = 0;
  Counters counters_;

  void touch(BlockId id, Block& b);
};

// The queue's head against an iteration's admission (admission.h) when a prefix cache shares the
// budget: `a` was built with the reservations and the cache's bytes. The head has found `hit`
// (pinned in `ix`), covering hit_tokens of its T-token prompt. It fits with its hit (T - hit_tokens
// rows), evicting unpinned blocks, least recently used first, while bytes are what is short; when
// only its own pinned hit stands in the way (its reservation alone would fit), it drops the hit
// (unpinned, cleared) and fits without it, computing its prompt in full rather than waiting on the
// cache. Returns the rows its prefill computes now, or -1 when it does not fit (its hit stays
// pinned for the caller to release).
int64_t admit_with_cache(Admission& a, PrefixIndex& ix, std::vector<PrefixIndex::BlockId>& hit,
                         int64_t hit_tokens, double reservation, int64_t T, double budget,
                         const std::function<void(PrefixIndex::BlockId)>& evicted = {});

}  // namespace lp
