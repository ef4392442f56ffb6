// The CPU backend's K/V storage, one per layer, and the key sets attention reads from it. Storage
// only: which positions a layer holds, and the at-most-once rule, are the engine's (KvIndex in
// engine/session.h), which passes explicit slot lists once the slots leave position order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/buffer.h"
#include "kernels/kv_type.h"

namespace lp {

// n values converted; F16C's instructions where the build has them, model/quant's exact scalar
// conversions otherwise (the same results: both round to nearest even).
void f16_to_f32_n(const uint16_t* src, float* dst, int64_t n);
void f32_to_f16_n(const float* src, uint16_t* dst, int64_t n);

// One layer's K/V. Slots are filled in arrival order. Prefill and plain decoding append in
// position order, so the slots stay sorted and attention reads them as one causal prefix; revived
// tokens are appended at their old positions wherever they fall, and from then on attention and
// scores take an explicit list of slots in position order (`KeySet`). Storage of `type`: kt, v
// when F32, kt16, v16 (the same layouts) when F16.
//   kt  [Hkv][cap / 64][Dh][64]  keys in blocks of kKeyBlock slots, each block transposed (a key
//                               tile is contiguous per dimension) and each one contiguous run
//                               (16 KiB in f32 at Dh 64) read front to back, which the hardware
//                               prefetchers follow; one [Dh][cap] matrix per group made a block
//                               Dh separate streams
//   v   [Hkv][cap][Dh]
//   pos [cap]                    position of each slot
inline constexpr int64_t kKeyBlock = 64;
struct LayerKV {
  int64_t cap = 0, n = 0, Hkv = 0, Dh = 0;  // cap: a multiple of kKeyBlock
  KvType type = KvType::F32;
  Buffer<float> kt, v;
  Buffer<uint16_t> kt16, v16;
  std::vector<int32_t> pos;
  bool sorted = true;  // slot positions ascending (else attention needs a slot list)
  // Where slot s's dimension d of group g is in kt (kt16), and where its values start in v (v16).
  int64_t kt_index(int64_t g, int64_t d, int64_t s) const {
    return ((g * (cap / kKeyBlock) + s / kKeyBlock) * Dh + d) * kKeyBlock + s % kKeyBlock;
  }
  int64_t v_index(int64_t g, int64_t s) const { return (g * cap + s) * Dh; }
  void init(int64_t capacity, int64_t n_kv_heads, int64_t head_dim, KvType t = KvType::F32);
  void clear();
  // Appends T rows of k, v [T][Hkv*Dh] (row strides ldk/ldv) at positions pos[T] (ascending
  // within the call). Positions before held ones are allowed (revival) and clear `sorted`; that a
  // position is held at most once is the caller's index's rule (KvIndex).
  void append(const float* k, int64_t ldk, const float* v, int64_t ldv, const int32_t* pos, int64_t T);
  // KV-Runahead hands K/V between processes in the storage's own element type: the first n slots
  // as rows, all of K [n][Hkv*Dh] then all of V, raw (2 * n * row_bytes() bytes into `out`); and
  // such rows appended at positions pos[T] (ascending within the call, as append).
  int64_t row_bytes() const { return Hkv * Dh * kv_type_bytes(type); }
  void export_rows(int64_t n_slots, std::byte* out) const;
  // The same rows of the listed slots (the prefix cache's copy of a pruned sequence, whose slots
  // are not the first n).
  void export_slots(std::span<const int32_t> slots, std::byte* out) const;
  void import_rows(const std::byte* in, const int32_t* pos, int64_t T);
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
