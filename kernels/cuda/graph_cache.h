// CUDA graphs' bookkeeping (cuda_ops.h, set_graphs), shared by ops.cu and the host emulation
// (tests/cuda_emu/), so that both decide alike when a capture begins and ends and count alike: the
// executables of captured segments kept by the sequence of operations each holds (ops.cu's
// cudaGraphExec_t handles, the emulation's stand-ins), and the state behind set_graphs. Plain C++.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "kernels/cuda/cuda_ops.h"

namespace lp::cuda {

// FNV-1a over 64-bit words: a segment's key, one operation at a time.
inline uint64_t mix_op(uint64_t key, uint64_t op) {
  for (int i = 0; i < 8; ++i) key = (key ^ ((op >> (8 * i)) & 0xff)) * 1099511628211ull;
  return key;
}
constexpr uint64_t kEmptySegment = 14695981039346656037ull;
// A count's size class in a key, where the kernels a library launches change only at some sizes
// (CUB's sorts: one tile, then several passes): its bit width.
inline uint64_t size_class(int64_t n) {
  uint64_t c = 0;
  for (uint64_t v = n > 0 ? uint64_t(n) : 0; v; v >>= 1) ++c;
  return c;
}

// At most kKept executables, the least recently launched dropped first (`destroy` is called on it):
// a server's steps alternate between a few sequences (a batch of 1, of 2, ..., a LazyLLM step's
// segments between its waits), each of which stays once seen.
template <class Exec>
class GraphCache {
 public:
  static constexpr size_t kKept = 64;
  explicit GraphCache(std::function<void(Exec&)> destroy) : destroy_(std::move(destroy)) {}
  ~GraphCache() { clear(); }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // The executable kept for `key`, now the most recent; null when there is none.
  Exec* find(uint64_t key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }
  // Keeps `e` for `key` (replacing one kept for it), dropping the oldest past kKept.
  Exec& put(uint64_t key, Exec e) {
    if (Exec* old = find(key)) {
      destroy_(*old);
      *old = std::move(e);
      return *old;
    }
    order_.emplace_front(key, std::move(e));
    index_[key] = order_.begin();
    if (order_.size() > kKept) {
      destroy_(order_.back().second);
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    return order_.front().second;
  }
  void clear() {
    for (auto& [k, e] : order_) destroy_(e);
    order_.clear();
    index_.clear();
  }
  size_t size() const { return order_.size(); }

 private:
  std::function<void(Exec&)> destroy_;
  std::list<std::pair<uint64_t, Exec>> order_;  // most recent first
  std::unordered_map<uint64_t, typename std::list<std::pair<uint64_t, Exec>>::iterator> index_;
};

// The bookkeeping of the captures' scratch arena (scratch_alloc), apart from its memory, which the
// implementation's device_alloc_async gives: on the device, or the host emulation's host memory, so
// that the tests run the same reuse. A launcher's scratch in a capture is a bump region; the arena starts
// again from its beginning only when none is live (a launcher holds its scratch across its
// launches, and a segment may end in between: a buffer it grows, a staging chunk); a scratch that
// does not fit asks for a larger arena, which replaces it at the next such start.
class ScratchArena {
 public:
  // At a capture's beginning: with no scratch live, the next region is the arena's start again,
  // and the size the arena should be replaced by is returned (0: keep it; then resized()).
  size_t restart() {
    if (live_ > 0) return 0;
    used_ = 0;
    return wanted_ > bytes_ ? wanted_ : 0;
  }
  void resized(void* base, size_t bytes) { base_ = static_cast<std::byte*>(base), bytes_ = bytes; }
  // A region of `bytes`, or null where the arena is full (it then asks to grow).
  void* take(size_t bytes) {
    const size_t need = (bytes + 255) & ~size_t(255);
    if (base_ && used_ + need <= bytes_) {
      void* p = base_ + used_;
      used_ += need;
      ++live_;
      return p;
    }
    wanted_ = std::max({2 * bytes_, used_ + need, size_t(1) << 20});
    return nullptr;
  }
  // A launcher's scratch given back: true when it was the arena's.
  bool give(const void* p) {
    const auto* b = static_cast<const std::byte*>(p);
    if (!base_ || b < base_ || b >= base_ + bytes_) return false;
    --live_;
    return true;
  }
  void* base() const { return base_; }

 private:
  std::byte* base_ = nullptr;
  size_t bytes_ = 0, used_ = 0, wanted_ = 0;
  int64_t live_ = 0;
};

// Whether graphs are on and for which thread, the open capture's key and operations, the counts, the
// scratch arena: the state behind set_graphs, graph_counts, queue_on and scratch_alloc (graphs.cpp,
// written once). An implementation (ops.cu, the host emulation) derives from it and says how a
// capture begins (where may_begin(), after restart_arena) and how it ends (its segment launched, from
// an executable it keeps or a new one), and returns it from graph_state(); both are called with mu
// held.
struct GraphState {
  std::recursive_mutex mu;  // a failed call inside (device_failed) takes it again
  bool on = false;
  std::thread::id owner;
  bool capturing = false;
  uint64_t key = kEmptySegment;
  int64_t ops = 0;
  GraphCounts counts;
  ScratchArena arena;  // stream-ordered memory (device_alloc_async)
  virtual ~GraphState() = default;
  virtual void begin_capture() = 0;
  virtual void end_capture() = 0;
  virtual void* stream() = 0;  // what queue_on returns (the CUDA stream)
  bool mine() const { return owner == std::this_thread::get_id(); }
  bool may_begin() const { return on && !capturing && mine(); }
  void begun() { capturing = true, key = kEmptySegment, ops = 0; }
  // A segment of ops > 0 launched, from a new executable or one kept for its key.
  void launched(bool instantiated) {
    ++counts.launched, counts.ops += ops, counts.instantiated += instantiated;
  }
};
GraphState& graph_state();
// At a capture's beginning: the arena starts again, replaced by a larger one where it was short,
// if no scratch is live (g.mu held).
void restart_arena(GraphState& g);

}  // namespace lp::cuda
