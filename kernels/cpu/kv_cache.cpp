#include "kernels/cpu/kv_cache.h"

#include "model/error.h"

namespace lp {

void LayerKV::init(int64_t capacity, int64_t n_kv_heads, int64_t head_dim) {
  // Capacity rounded up to the key tile so tiles may read (zeroed) slots past n.
  cap = (capacity + 31) / 32 * 32;
  kt_ld = cap + 16;
  Hkv = n_kv_heads;
  Dh = head_dim;
  kt.resize(Hkv * Dh * kt_ld);
  v.resize(Hkv * cap * Dh);
  pos.assign(size_t(cap), 0);
  clear();
}

void LayerKV::clear() {
  n = 0;
  sorted = true;
}

void LayerKV::append(const float* k, int64_t ldk, const float* vv, int64_t ldv, const int32_t* p, int64_t T) {
  if (n + T > cap) fail("KV cache full: {} + {} tokens exceed its capacity {}", n, T, cap);
  for (int64_t t = 0; t < T; ++t) {
    if (p[t] < 0) fail("KV append: negative position {}", p[t]);
    if (t > 0 && p[t] <= p[t - 1]) fail("KV append: positions must increase within a call");
  }
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = n + t;
    if (s > 0 && p[t] < pos[size_t(s - 1)]) sorted = false;
    pos[size_t(s)] = p[t];
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t d = 0; d < Dh; ++d) {
        kt[(g * Dh + d) * kt_ld + s] = k[t * ldk + g * Dh + d];
        v[(g * cap + s) * Dh + d] = vv[t * ldv + g * Dh + d];
      }
  }
  n += T;
}

}  // namespace lp
