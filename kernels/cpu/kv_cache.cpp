#include "kernels/cpu/kv_cache.h"

#include <immintrin.h>

#include <algorithm>

#include "model/error.h"
#include "model/quant.h"

namespace lp {

void f16_to_f32_n(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void f32_to_f16_n(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(dst + i),
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

void LayerKV::init(int64_t capacity, int64_t n_kv_heads, int64_t head_dim, KvType t) {
  // Capacity rounded up to the key block so blocks may read (zeroed) slots past n.
  cap = (capacity + kKeyBlock - 1) / kKeyBlock * kKeyBlock;
  Hkv = n_kv_heads;
  Dh = head_dim;
  type = t;
  const int64_t nk = Hkv * Dh * cap, nv = Hkv * cap * Dh;
  kt.resize(t == KvType::F32 ? nk : 0);
  v.resize(t == KvType::F32 ? nv : 0);
  kt16.resize(t == KvType::F16 ? nk : 0);
  v16.resize(t == KvType::F16 ? nv : 0);
  pos.assign(size_t(cap), 0);
  clear();
}

void LayerKV::clear() {
  n = 0;
  sorted = true;
}

namespace {
// What append and import_rows require of T new positions p: room, and ascending, non-negative.
void check_room(const LayerKV& kv, const int32_t* p, int64_t T, const char* what) {
  if (kv.n + T > kv.cap) fail("KV cache full: {} + {} tokens exceed its capacity {}", kv.n, T, kv.cap);
  for (int64_t t = 0; t < T; ++t) {
    if (p[t] < 0) fail("KV {}: negative position {}", what, p[t]);
    if (t > 0 && p[t] <= p[t - 1]) fail("KV {}: positions must increase within a call", what);
  }
}
}  // namespace

void LayerKV::append(const float* k, int64_t ldk, const float* vv, int64_t ldv, const int32_t* p, int64_t T) {
  check_room(*this, p, T, "append");
  thread_local std::vector<uint16_t> k16;  // one token's keys, converted together
  k16.resize(size_t(Hkv * Dh));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = n + t;
    if (s > 0 && p[t] < pos[size_t(s - 1)]) sorted = false;
    pos[size_t(s)] = p[t];
    if (type == KvType::F32) {
      for (int64_t g = 0; g < Hkv; ++g)
        for (int64_t d = 0; d < Dh; ++d) {
          kt[kt_index(g, d, s)] = k[t * ldk + g * Dh + d];
          v[v_index(g, s) + d] = vv[t * ldv + g * Dh + d];
        }
      continue;
    }
    f32_to_f16_n(k + t * ldk, k16.data(), Hkv * Dh);
    for (int64_t g = 0; g < Hkv; ++g) {
      for (int64_t d = 0; d < Dh; ++d) kt16[kt_index(g, d, s)] = k16[size_t(g * Dh + d)];
      f32_to_f16_n(vv + t * ldv + g * Dh, v16.data() + v_index(g, s), Dh);
    }
  }
  n += T;
}

namespace {
// n slots' K then V as rows [n][Hkv*Dh] (slot i: `slots[i]`, or i when `slots` is empty), from
// (and back into) a storage of elements T.
template <class T>
void export_as(const LayerKV& kv, const T* kt, const T* v, std::span<const int32_t> slots, int64_t n,
               T* out) {
  const int64_t W = kv.Hkv * kv.Dh;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = slots.empty() ? i : slots[size_t(i)];
    for (int64_t g = 0; g < kv.Hkv; ++g)
      for (int64_t d = 0; d < kv.Dh; ++d) out[i * W + g * kv.Dh + d] = kt[kv.kt_index(g, d, s)];
    for (int64_t g = 0; g < kv.Hkv; ++g)
      std::copy_n(v + kv.v_index(g, s), kv.Dh, out + (n + i) * W + g * kv.Dh);
  }
}
template <class T>
void import_as(LayerKV& kv, T* kt, T* v, const T* in, int64_t T_rows) {
  const int64_t W = kv.Hkv * kv.Dh;
  for (int64_t t = 0; t < T_rows; ++t) {
    const int64_t s = kv.n + t;
    for (int64_t g = 0; g < kv.Hkv; ++g)
      for (int64_t d = 0; d < kv.Dh; ++d) {
        kt[kv.kt_index(g, d, s)] = in[t * W + g * kv.Dh + d];
        v[kv.v_index(g, s) + d] = in[(T_rows + t) * W + g * kv.Dh + d];
      }
  }
}
}  // namespace

void LayerKV::export_rows(int64_t n_slots, std::byte* out) const {
  if (n_slots < 0 || n_slots > n) fail("KV export: {} slots asked, {} held", n_slots, n);
  if (type == KvType::F32)
    export_as(*this, kt.data(), v.data(), {}, n_slots, reinterpret_cast<float*>(out));
  else
    export_as(*this, kt16.data(), v16.data(), {}, n_slots, reinterpret_cast<uint16_t*>(out));
}

void LayerKV::export_slots(std::span<const int32_t> slots, std::byte* out) const {
  for (const int32_t s : slots)
    if (s < 0 || s >= n) fail("KV export: slot {} of {} held", s, n);
  const int64_t m = int64_t(slots.size());
  if (m == 0) return;
  if (type == KvType::F32)
    export_as(*this, kt.data(), v.data(), slots, m, reinterpret_cast<float*>(out));
  else
    export_as(*this, kt16.data(), v16.data(), slots, m, reinterpret_cast<uint16_t*>(out));
}

void LayerKV::import_rows(const std::byte* in, const int32_t* p, int64_t T) {
  check_room(*this, p, T, "import");
  if (type == KvType::F32)
    import_as(*this, kt.data(), v.data(), reinterpret_cast<const float*>(in), T);
  else
    import_as(*this, kt16.data(), v16.data(), reinterpret_cast<const uint16_t*>(in), T);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = n + t;
    if (s > 0 && p[t] < pos[size_t(s - 1)]) sorted = false;
    pos[size_t(s)] = p[t];
  }
  n += T;
}

}  // namespace lp
