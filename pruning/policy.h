// Token-pruning policies (LazyLLM and the baselines it is compared with), behind one interface
// that the engine (engine/session.h) calls at every pruning layer of a schedule (pruning/schedule.h).
//
//   none     never prunes
//   lazyllm  keeps the tokens the last token attends to most (mean over heads of its softmax
//            row at the pruning layer), progressively, re-selected at every pruning layer
//   static   scores once, at the first pruning layer it sees, and keeps selecting by those
//            scores afterwards (the tokens dropped early never come back)
//   random   same layers and rates, uniform choice, seeded
// The last token (the one that predicts the next) is always kept.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pruning/select.h"

namespace lp {

enum class PolicyKind { None, LazyLLM, Static, Random };
PolicyKind parse_policy(std::string_view name);  // throws lp::Error for an unknown name
const char* policy_name(PolicyKind k);

class PruningPolicy {
 public:
  virtual ~PruningPolicy() = default;
  virtual PolicyKind kind() const = 0;
  // Whether select() needs the last token's attention scores (computing them costs a little).
  virtual bool needs_scores() const = 0;
  // Whether select() is exactly select_top of the scores it is given (pruning/select.h): then a
  // backend may select where the scores are (on a GPU) instead of reading them back.
  virtual bool keeps_top_scores() const { return false; }
  // Chooses n_keep of the active tokens (positions pos, ascending; the last one is the last
  // token) and returns their indices into pos, ascending, always including pos.size() - 1.
  // scores[i] is the last token's mean attention probability on token i (empty if not needed).
  virtual std::vector<int64_t> select(int layer, std::span<const int32_t> pos, std::span<const float> scores,
                                      int64_t n_keep) = 0;
};

std::unique_ptr<PruningPolicy> make_policy(PolicyKind kind, uint64_t seed = 0);

}  // namespace lp
