// The CPU backend's K/V storage, one per layer, and the key sets attention reads from it. Storage
// only: which positions a layer holds, and the at-most-once rule, are the engine's (KvIndex in
// engine/session.h), which passes explicit slot lists once the slots leave position order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/buffer.h"

namespace lp {

// One layer's K/V. Slots are filled in arrival order. Prefill and plain decoding append in
// position order, so the slots stay sorted and attention reads them as one causal prefix; revived
// tokens are appended at their old positions wherever they fall, and from then on attention and
// scores take an explicit list of slots in position order (`KeySet`).
//   kt  [Hkv][Dh][kt_ld]   keys, transposed so a key tile is contiguous per dimension; the row
//                        stride kt_ld = cap + 16 is never a multiple of 4 KiB, so the Dh rows a
//                        tile reads do not all fall into the same L1 set
//   v   [Hkv][cap][Dh]
//   pos [cap]            position of each slot
struct LayerKV {
  int64_t cap = 0, kt_ld = 0, n = 0, Hkv = 0, Dh = 0;
  Buffer<float> kt, v;
  std::vector<int32_t> pos;
  bool sorted = true;  // slot positions ascending (else attention needs a slot list)
  void init(int64_t capacity, int64_t n_kv_heads, int64_t head_dim);
  void clear();
  // Appends T rows of k, v [T][Hkv*Dh] (row strides ldk/ldv) at positions pos[T] (ascending
  // within the call). Positions before held ones are allowed (revival) and clear `sorted`; that a
  // position is held at most once is the caller's index's rule (KvIndex).
  void append(const float* k, int64_t ldk, const float* v, int64_t ldv, const int32_t* pos, int64_t T);
};

// The keys a query block may see: slots of a LayerKV in ascending position order. An empty
// `slots` means every held slot, which must then be sorted (the common, gather-free case).
struct KeySet {
  const LayerKV& kv;
  std::span<const int32_t> slots = {};
  int64_t size() const { return slots.empty() ? kv.n : int64_t(slots.size()); }
  int32_t slot(int64_t i) const { return slots.empty() ? int32_t(i) : slots[size_t(i)]; }
};

}  // namespace lp
