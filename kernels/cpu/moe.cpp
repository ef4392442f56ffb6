#include "kernels/cpu/moe.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kernels/cpu/elementwise.h"
#include "kernels/weights.h"
#include "model/error.h"

namespace lp {

void route_top_k(const float* logits, int64_t T, int64_t E, int64_t k, int32_t* ids, float* w) {
  std::vector<float> p(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits + t * E;
    const float mx = *std::max_element(z, z + E);
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += p[size_t(e)] = std::exp(z[e] - mx);
    const float inv = float(1.0 / sum);
    for (auto& v : p) v *= inv;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b);
    });
    double chosen = 0;
    for (int64_t j = 0; j < k; ++j) chosen += p[size_t(order[size_t(j)])];
    const float denom = std::max(float(chosen), 6.103515625e-5f);
    for (int64_t j = 0; j < k; ++j) {
      ids[t * k + j] = order[size_t(j)];
      w[t * k + j] = p[size_t(order[size_t(j)])] / denom;
    }
  }
}

namespace {
template <class T>
void grow(Buffer<T>& b, int64_t n) {
  if (b.size() < n) b.resize(n, false);
}
}  // namespace

void moe_route(CpuContext& ctx, Gemm& gemm, const Matrix& router, int64_t k, const float* xn, int64_t T,
               int64_t D, MoeRoutes& r, Buffer<float>& logits) {
  const int64_t E = router.rows;
  r.k = k;
  r.ids.resize(size_t(T * k));
  r.w.resize(size_t(T * k));
  if (T == 0) return;
  grow(logits, T * E);
  gemm.run(ctx, xn, T, D, router, logits.data(), E);
  ctx.run([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, T, 16), [&](const tbb::blocked_range<int64_t>& b) {
      route_top_k(logits.data() + b.begin() * E, int64_t(b.size()), E, k, r.ids.data() + b.begin() * k,
                  r.w.data() + b.begin() * k);
    });
  });
}

void group_by_key(std::span<const int32_t> keys, int64_t n_keys, std::vector<int64_t>& first,
                  std::vector<int64_t>& at) {
  first.assign(size_t(n_keys + 1), 0);
  for (const int32_t key : keys) {
    if (key < 0 || key >= n_keys) internal_fail("group_by_key: key {} outside [0, {})", key, n_keys);
    ++first[size_t(key) + 1];
  }
  std::partial_sum(first.begin(), first.end(), first.begin());
  std::vector<int64_t> next(first.begin(), first.end() - 1);
  at.resize(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) at[i] = next[size_t(keys[i])]++;
}

void moe_experts(CpuContext& ctx, Gemm& gemm, const LayerWeights& L, const MoeRoutes& r, int64_t Fe,
                 bool gelu, const float* xn, int64_t T, int64_t D, float* out, MoeScratch& s) {
  const int64_t E = int64_t(L.expert_gate_up.size()), k = r.k, P = T * k;  // P: (row, expert) pairs
  if (r.rows() != T) internal_fail("moe_experts: routes for {} rows, {} rows given", r.rows(), T);
  if (T == 0) return;
  group_by_key(r.ids, E, s.first, s.at);  // the pairs grouped by expert, rows ascending within each
  grow(s.x, P * D);
  grow(s.ff, P * 2 * Fe);
  grow(s.act, P * Fe);
  grow(s.y, P * D);
  ctx.run([&] {
    tbb::parallel_for(int64_t(0), P, [&](int64_t i) {
      std::memcpy(s.x.data() + s.at[size_t(i)] * D, xn + i / k * D, size_t(D) * sizeof(float));
    });
  });
  // Each active expert over its rows.
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = s.first[size_t(e)], n = s.first[size_t(e) + 1] - r0;
    if (n > 0)
      gemm.run(ctx, s.x.data() + r0 * D, n, D, L.expert_gate_up[size_t(e)], s.ff.data() + r0 * 2 * Fe,
               2 * Fe);
  }
  (gelu ? geglu : swiglu)(ctx, s.ff.data(), 2 * Fe, s.ff.data() + Fe, 2 * Fe, s.act.data(), Fe, P, Fe);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = s.first[size_t(e)], n = s.first[size_t(e) + 1] - r0;
    if (n > 0) gemm.run(ctx, s.act.data() + r0 * Fe, n, Fe, L.expert_down[size_t(e)], s.y.data() + r0 * D, D);
  }
  // Each row's experts weighted and summed in routing order.
  ctx.run([&] {
    tbb::parallel_for(int64_t(0), T, [&](int64_t t) {
      float* o = out + t * D;
      for (int64_t j = 0; j < k; ++j) {
        const float wj = r.w[size_t(t * k + j)];
        const float* y = s.y.data() + s.at[size_t(t * k + j)] * D;
        if (j == 0)
          for (int64_t i = 0; i < D; ++i) o[i] = wj * y[i];
        else
          for (int64_t i = 0; i < D; ++i) o[i] += wj * y[i];
      }
    });
  });
}

}  // namespace lp
