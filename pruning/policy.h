// Token-pruning policies (LazyLLM and the baselines it is compared with), behind one interface
// that the engine (engine/session.h) calls at every pruning layer of a schedule (pruning/schedule.h).
//
//   none           never prunes
//   lazyllm        keeps the tokens the last token attends to most (mean over heads of its softmax
//                  row at the pruning layer), progressively, re-selected at every pruning layer and
//                  decoding step (pruned tokens can come back: revival)
//   static-paper   the LazyLLM paper's static pruning baseline: one step L:S; the last token's
//                  attention averaged over layers 0..L scores the prompt once, S of it is pruned after
//                  layer L and never computed again (no revival)
//   random-drop    the paper's random token drop baseline: a share S of the prompt's tokens (never
//                  the first or the last) is removed before the model, seeded (random_drop below);
//                  the model then runs unpruned on a shorter prompt. Not a PruningPolicy: callers
//                  shorten the prompt (engine/generate.cpp, engine/scheduler.cpp)
//   frozen         an ablation of LazyLLM: scores once, at the first pruning layer, and selects
//                  by those frozen scores at every pruning layer (was called "static")
//   random-layers  an ablation: LazyLLM's layers and rates, a uniform seeded choice, re-drawn at
//                  every decoding step, with revival (was called "random")
// The last token (the one that predicts the next) is always kept.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pruning/select.h"

namespace lp {

enum class PolicyKind { None, LazyLLM, Frozen, RandomLayers, StaticPaper, RandomDrop };
// A policy's name (policy_name's); throws lp::UsageError with check_policy_arg's line otherwise.
PolicyKind parse_policy(std::string_view name);
// A policy's name as read from a file: today's names, and the names files were written with before
// the paper's baselines existed, "static" (now frozen) and "random" (now random-layers); nullopt
// for anything else. (On the command line the old names are refused: check_policy_arg.)
std::optional<PolicyKind> policy_in_file(std::string_view name);
const char* policy_name(PolicyKind k);
// "none, lazyllm, static-paper, random-drop, frozen or random-layers", for messages.
extern const char* const kPolicyNames;
// For a command-line option: "" if `name` is a policy, else the problem in one line.
std::string check_policy_arg(std::string_view name);
// What a policy does that the engine's scheduling and the simulator's costing must agree on, as
// data: one answer per question, for every reader (the engine's PruningPolicy objects are held to
// it by a test, tests/pruning).
struct PolicyTraits {
  bool prunes = false;         // removes tokens at its pruning layers (not none, not random-drop)
  bool scores_always = false;  // scores (the last token's attention) at every pruning layer of every pass
  bool scores_once = false;    // scores at the prefill's first pruning layer only, then keeps that set
  bool scores_before = false;  // also scores the prefill's layers before its first pruning layer
  bool revives = false;        // decoding brings pruned tokens back (the Aux Cache's revival)
  bool freezes = false;        // the selection is made in the prefill and kept by every decoding step
  bool drops_prompt = false;   // drops prompt tokens before the model (no pruning inside it)
};
PolicyTraits policy_traits(PolicyKind k);
// Whether a pass computes the last token's scores at layer `l` (whose pruning step, if any, is
// `prunes_here`) when the prefill's first pruning layer is `first_prune`: the scoring that
// LazyLLM-style selection costs.
bool scores_at(const PolicyTraits& t, bool prefill, int l, bool prunes_here, int first_prune);
// Whether pruned tokens can come back while decoding (the Aux Cache's revival).
bool policy_revives(PolicyKind k);
// Whether the selection is made once, in the prefill, and kept by every later decoding step.
bool policy_freezes(PolicyKind k);

// random-drop: the indices into a prompt of n tokens that are kept when `share` of them is dropped
// (tokens_kept(n, share) kept, but never fewer than the first and the last), ascending; the first
// token (often an attention sink such as BOS) and the last are always kept; the choice is uniform
// over the others and a function of `seed` alone.
std::vector<int64_t> random_drop(int64_t n, double share, uint64_t seed);
// How many tokens random_drop keeps of n; throws lp::Error for a share outside [0, 1).
int64_t random_drop_kept(int64_t n, double share);
// The prompt the model sees under random-drop: the tokens of `ids` that random_drop keeps.
std::vector<int32_t> random_drop_ids(std::span<const int32_t> ids, double share, uint64_t seed);

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
  // The prefill's layers before the first pruning layer whose last-token scores the policy wants
  // (static-paper averages layers 0..L): the engine scores them and calls observe().
  virtual bool observes(int /*layer*/) const { return false; }
  virtual void observe(int /*layer*/, std::span<const int32_t> /*pos*/, std::span<const float> /*scores*/) {}
};

std::unique_ptr<PruningPolicy> make_policy(PolicyKind kind, uint64_t seed = 0);

}  // namespace lp
