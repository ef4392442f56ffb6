#include "admission/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>

#include "model/error.h"

namespace lp {

PrefixIndex::PrefixIndex(int64_t block_tokens) : block_(block_tokens) {
  if (block_tokens < 1 || block_tokens > (1 << 20))
    fail("the prefix cache's block must hold 1 to 1048576 tokens, got {}", block_tokens);
}

std::vector<uint64_t> PrefixIndex::keys(std::span<const int32_t> tokens, uint64_t ns) const {
  std::vector<uint64_t> out;
  out.reserve(tokens.size() / size_t(block_));
  uint64_t seed = XXH3_64bits_withSeed(&ns, sizeof ns, 0x6c617a7970726566ULL);
  for (size_t at = 0; at + size_t(block_) <= tokens.size(); at += size_t(block_)) {
    seed = XXH3_64bits_withSeed(tokens.data() + at, size_t(block_) * sizeof(int32_t), seed);
    out.push_back(seed);
  }
  return out;
}

void PrefixIndex::touch(BlockId id, Block& b) {
  if (b.children == 0) leaves_.erase({b.used, id});
  b.used = ++clock_;
  if (b.children == 0) leaves_.insert({b.used, id});
}

PrefixIndex::BlockId PrefixIndex::find(BlockId parent, uint64_t key, std::span<const int32_t> tokens) const {
  const auto it = by_key_.find(key);
  if (it == by_key_.end()) return -1;
  const Block& b = blocks_.at(it->second);
  if (b.parent != parent || !std::equal(b.tokens.begin(), b.tokens.end(), tokens.begin(), tokens.end()))
    return -1;
  return it->second;
}

std::vector<PrefixIndex::BlockId> PrefixIndex::match(std::span<const int32_t> tokens,
                                                     std::span<const uint64_t> keys, int64_t max_blocks) {
  std::vector<BlockId> chain;
  const int64_t n = std::min<int64_t>({int64_t(keys.size()), max_blocks, int64_t(tokens.size()) / block_});
  BlockId parent = -1;
  for (int64_t i = 0; i < n; ++i) {
    const BlockId id = find(parent, keys[size_t(i)], tokens.subspan(size_t(i * block_), size_t(block_)));
    if (id < 0) break;
    chain.push_back(id);
    parent = id;
  }
  for (const BlockId id : chain) touch(id, blocks_.at(id));
  return chain;
}

PrefixIndex::BlockId PrefixIndex::insert(BlockId parent, uint64_t key, std::span<const int32_t> tokens,
                                         int64_t bytes) {
  if (int64_t(tokens.size()) != block_)
    internal_fail("a prefix cache block of {} tokens, not {}", tokens.size(), block_);
  if (parent >= 0 && !contains(parent)) internal_fail("a prefix cache block after one not cached");
  if (by_key_.count(key)) return -1;
  const BlockId id = next_id_++;
  Block b;
  b.parent = parent;
  b.key = key;
  b.tokens.assign(tokens.begin(), tokens.end());
  b.bytes = bytes;
  b.used = ++clock_;
  if (parent >= 0) {
    Block& p = blocks_.at(parent);
    if (p.children++ == 0) leaves_.erase({p.used, parent});
  }
  leaves_.insert({b.used, id});
  by_key_[key] = id;
  bytes_ += bytes;
  blocks_.emplace(id, std::move(b));
  return id;
}

void PrefixIndex::set_bytes(BlockId id, int64_t bytes) {
  Block& b = blocks_.at(id);
  bytes_ += bytes - b.bytes;
  b.bytes = bytes;
}

int64_t PrefixIndex::bytes_of(BlockId id) const {
  return blocks_.at(id).bytes;
}

void PrefixIndex::pin(std::span<const BlockId> bs) {
  for (const BlockId id : bs) ++blocks_.at(id).pins;
}

void PrefixIndex::unpin(std::span<const BlockId> bs) {
  for (const BlockId id : bs) {
    const auto it = blocks_.find(id);
    if (it == blocks_.end() || it->second.pins == 0)
      internal_fail("unpinning a prefix cache block not pinned");
    --it->second.pins;
  }
}

PrefixIndex::BlockId PrefixIndex::evict_one() {
  for (auto it = leaves_.begin(); it != leaves_.end(); ++it) {
    const BlockId id = it->second;
    Block& b = blocks_.at(id);
    if (b.pins > 0) continue;
    leaves_.erase(it);
    if (b.parent >= 0) {
      Block& p = blocks_.at(b.parent);
      if (--p.children == 0) leaves_.insert({p.used, b.parent});
    }
    by_key_.erase(b.key);
    bytes_ -= b.bytes;
    blocks_.erase(id);
    ++counters_.evictions;
    return id;
  }
  return -1;
}

bool PrefixIndex::make_room(int64_t room, const std::function<void(BlockId)>& evicted) {
  while (bytes_ > room) {
    const BlockId id = evict_one();
    if (id < 0) return false;
    if (evicted) evicted(id);
  }
  return true;
}

int64_t admit_with_cache(Admission& a, PrefixIndex& ix, std::vector<PrefixIndex::BlockId>& hit,
                         int64_t hit_tokens, double reservation, int64_t T, double budget,
                         const std::function<void(PrefixIndex::BlockId)>& evicted) {
  const auto fits_evicting = [&](int64_t rows) {
    while (!a.fits(reservation, rows)) {
      const int64_t before = ix.bytes();
      const double over = a.reserved_bytes() + reservation - budget;
      const bool made = over > 0 && ix.make_room(before - int64_t(std::ceil(over)), evicted);
      a.release(double(before - ix.bytes()));
      if (!made) return false;
    }
    return true;
  };
  if (fits_evicting(T - hit_tokens)) return T - hit_tokens;
  if (hit_tokens > 0 && a.reserved_bytes() - double(ix.bytes()) + reservation <= budget) {
    ix.unpin(hit);
    hit.clear();
    if (fits_evicting(T)) return T;
  }
  return -1;
}

void PrefixIndex::clear() {
  blocks_.clear();
  by_key_.clear();
  leaves_.clear();
  bytes_ = 0;
}

}  // namespace lp
