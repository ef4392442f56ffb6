#include "engine/prefix_cache.h"

#include <algorithm>

#include "model/error.h"

namespace lp {

PrefixCache::PrefixCache(int n_layer, int64_t width, int64_t block_tokens)
    : n_layer_(n_layer), width_(width), index_(block_tokens) {}

PrefixCache::Hit PrefixCache::lookup(std::span<const int32_t> tokens, CacheKind kind, int64_t max_tokens) {
  const int64_t B = index_.block_tokens();
  const int64_t n = std::min<int64_t>(int64_t(tokens.size()), max_tokens) / B;
  Hit h;
  if (n <= 0) return h;
  const std::span<const int32_t> head = tokens.first(size_t(n * B));
  h.blocks = index_.match(head, index_.keys(head, uint64_t(kind)), n);
  h.tokens = int64_t(h.blocks.size()) * B;
  index_.pin(h.blocks);
  return h;
}

void PrefixCache::release(Hit& h) {
  index_.unpin(h.blocks);
  h = Hit{};
}

void PrefixCache::load(Session& s, const Hit& h) const {
  std::vector<const TokenStates*> blocks;
  blocks.reserve(h.blocks.size());
  for (const BlockId id : h.blocks) blocks.push_back(&states_.at(id));
  s.load_states(blocks);
}

bool PrefixCache::make_room(int64_t room) {
  return index_.make_room(room, [this](BlockId id) { states_.erase(id); });
}

int64_t PrefixCache::save(Session& s, std::span<const int32_t> tokens, CacheKind kind,
                          std::vector<BlockId>& lineage, int64_t room) {
  const int64_t B = index_.block_tokens();
  const int64_t n = std::min<int64_t>(int64_t(tokens.size()), s.n_cached()) / B;
  if (n <= 0) return 0;
  const std::span<const int32_t> head = tokens.first(size_t(n * B));
  const std::vector<uint64_t> keys = index_.keys(head, uint64_t(kind));
  std::vector<BlockId> chain;  // pinned while the save goes on: room is never made by evicting it
  int64_t added = 0;
  BlockId parent = -1;
  // Block states are read a window of blocks at a time from the first that needs them (on a GPU each
  // read waits for the device: one a layer for the window, not one a layer and block). Windows start
  // at 4 blocks and double, so a prompt's new blocks take a logarithmic number of reads, and a save that
  // stops early (no room, another prefix's block) has read at most about twice what it kept.
  std::vector<std::optional<TokenStates>> read;
  int64_t read_from = -1, window = 4;
  const auto states_of = [&](int64_t i) {
    if (read_from < 0 || i < read_from || i >= read_from + int64_t(read.size())) {
      const int64_t count = std::min(window, n - i);
      read = s.save_blocks(int32_t(i * B), B, count), read_from = i;
      window *= 2;
    }
    return std::move(read[size_t(i - read_from)]);
  };
  for (int64_t i = 0; i < n; ++i) {
    const std::span<const int32_t> toks = head.subspan(size_t(i * B), size_t(B));
    const bool ours_before = i < int64_t(lineage.size());
    BlockId id = index_.find(parent, keys[size_t(i)], toks);
    if (id >= 0) {
      const bool ours = ours_before && lineage[size_t(i)] == id;
      if (!ours && kind == CacheKind::Pruned) break;  // another run's state: not ours to extend
      // Bring it up to what this request computed, when it computed more of it (the depths first:
      // most blocks of a long prompt gain nothing, and their copy would cost as much as a new one).
      const auto deeper = [&] {
        const std::vector<uint16_t> now = s.depths(int32_t(i * B), B), &then = states_.at(id).depth;
        for (size_t t = 0; t < now.size(); ++t)
          if (now[t] > then[t]) return true;
        return false;
      };
      if (ours && kind == CacheKind::Pruned && deeper()) {
        const std::optional<TokenStates> now = states_of(i);
        if (!now) break;
        if (std::optional<TokenStates> deeper = deeper_states(states_.at(id), *now, n_layer_, width_)) {
          const int64_t grow = deeper->bytes() - index_.bytes_of(id);
          index_.pin(std::span(&id, 1));
          const bool fits = make_room(room - grow);
          index_.unpin(std::span(&id, 1));
          if (!fits) break;
          index_.set_bytes(id, deeper->bytes());
          states_[id] = std::move(*deeper);
        }
      }
    } else {
      std::optional<TokenStates> st = states_of(i);
      if (!st || (kind == CacheKind::Full && !st->full(n_layer_))) break;
      if (!make_room(room - st->bytes())) break;
      id = index_.insert(parent, keys[size_t(i)], toks, st->bytes());
      if (id < 0) break;  // its key is another prefix's (a collision): this prefix stays uncached
      states_.emplace(id, std::move(*st));
      ++added;
    }
    index_.pin(std::span(&id, 1));
    chain.push_back(id);
    if (ours_before)
      lineage[size_t(i)] = id;
    else
      lineage.push_back(id);
    parent = id;
  }
  index_.unpin(chain);
  return added;
}

std::optional<TokenStates> deeper_states(const TokenStates& a, const TokenStates& b, int L, int64_t D) {
  if (a.first != b.first || a.n() != b.n() || int(a.kv.size()) != L || int(b.kv.size()) != L)
    internal_fail("merging the states of two different blocks");
  const int64_t n = a.n();
  std::vector<bool> from_b(static_cast<size_t>(n));
  bool any = false;
  for (int64_t i = 0; i < n; ++i) any |= (from_b[size_t(i)] = b.depth[size_t(i)] > a.depth[size_t(i)]);
  if (!any) return std::nullopt;
  TokenStates m;
  m.first = a.first;
  m.depth.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i)
    m.depth[size_t(i)] = from_b[size_t(i)] ? b.depth[size_t(i)] : a.depth[size_t(i)];
  m.kv.resize(size_t(L));
  for (int l = 0; l < L; ++l) {
    // Rows of K, then of V: row r of a source's K is its r-th token deeper than l.
    const auto rows_of = [l](const TokenStates& t) {
      int64_t c = 0;
      for (const uint16_t d : t.depth) c += d > l;
      return c;
    };
    const int64_t na = rows_of(a), nb = rows_of(b), nm = rows_of(m);
    const std::vector<std::byte>& ka = a.kv[size_t(l)];
    const std::vector<std::byte>& kb = b.kv[size_t(l)];
    const size_t row = na > 0 ? ka.size() / size_t(2 * na) : nb > 0 ? kb.size() / size_t(2 * nb) : 0;
    std::vector<std::byte>& out = m.kv[size_t(l)];
    out.resize(size_t(2 * nm) * row);
    int64_t ra = 0, rb = 0, rm = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool in_a = a.depth[size_t(i)] > l, in_b = b.depth[size_t(i)] > l;
      if (m.depth[size_t(i)] > l) {
        const bool use_b = from_b[size_t(i)];
        const std::vector<std::byte>& src = use_b ? kb : ka;
        const int64_t r = use_b ? rb : ra, ns = use_b ? nb : na;
        std::copy_n(src.begin() + std::ptrdiff_t(size_t(r) * row), row,
                    out.begin() + std::ptrdiff_t(size_t(rm) * row));
        std::copy_n(src.begin() + std::ptrdiff_t(size_t(ns + r) * row), row,
                    out.begin() + std::ptrdiff_t(size_t(nm + rm) * row));
        ++rm;
      }
      ra += in_a;
      rb += in_b;
    }
  }
  // The Aux Cache states of the tokens shallower than L, in position order.
  int64_t ia = 0, ib = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool sa = a.depth[size_t(i)] < L, sb = b.depth[size_t(i)] < L;
    if (m.depth[size_t(i)] < L) {
      const std::vector<float>& src = from_b[size_t(i)] ? b.aux : a.aux;
      const int64_t at = from_b[size_t(i)] ? ib : ia;
      m.aux.insert(m.aux.end(), src.begin() + at * D, src.begin() + (at + 1) * D);
    }
    ia += sa;
    ib += sb;
  }
  return m;
}

}  // namespace lp
