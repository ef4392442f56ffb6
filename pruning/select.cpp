#include "pruning/select.h"

#include <algorithm>
#include <numeric>

namespace lp {

std::vector<int64_t> select_top(std::span<const int32_t> pos, std::span<const float> scores, int64_t n_keep) {
  const int64_t n = int64_t(pos.size());
  if (n_keep >= n) {
    std::vector<int64_t> all(static_cast<size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    return all;
  }
  std::vector<int64_t> cand(static_cast<size_t>(n - 1));
  std::iota(cand.begin(), cand.end(), 0);
  std::partial_sort(cand.begin(), cand.begin() + (n_keep - 1), cand.end(), [&](int64_t a, int64_t b) {
    return scores[a] != scores[b] ? scores[a] > scores[b] : pos[a] > pos[b];
  });
  cand.resize(static_cast<size_t>(n_keep - 1));
  cand.push_back(n - 1);
  std::sort(cand.begin(), cand.end());
  return cand;
}

}  // namespace lp
