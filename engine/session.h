// The LazyLLM engine, written once over the ops of a backend (kernels/backend.h): a session holds
// one sequence's per-layer K/V index, the Aux Cache's index and the at-most-once record, and runs
// forward passes over explicit token ids at explicit positions, with pruning in the prefill and
// re-selection and revival in every decoding step. The backend (CPU or CUDA) holds the weights,
// the activations, the K/V and the Aux Cache's states.
//
// Positions are passed in, never implied by row index: pruning computes gathered subsets of tokens
// that keep their original positions for RoPE and the causal mask.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/model.h"
#include "kernels/backend.h"
#include "kernels/context.h"
#include "model/config.h"
#include "model/ops.h"
#include "pruning/policy.h"
#include "pruning/schedule.h"
#include "traces/trace.h"

namespace lp {

// Wall time and counted work of one op kind, summed over calls.
struct OpStat {
  double seconds = 0, flops = 0, bytes = 0;
  double rows = 0;  // the OpShape::tokens of every call, summed
  int64_t calls = 0;
  void add(const OpStat& o);
};

// Per-op timings of forward passes: one OpStat per (layer, op), FLOPs and bytes from the shared
// op_flops / op_bytes (model/ops.h). Sized by the first pass that records into it.
struct OpTimers {
  int n_layer = 0;
  OpDtypes dtypes;
  std::vector<OpStat> stat;  // [n_layer + 1][kNumOps]; row n_layer: ops outside the layers
  void init(int layers, const OpDtypes& d);
  bool empty() const { return stat.empty(); }
  void zero() { std::fill(stat.begin(), stat.end(), OpStat{}); }  // every stat 0, the shape kept
  const OpStat& at(int layer, Op op) const { return stat[size_t(layer) * kNumOps + size_t(op)]; }
  void add(int layer, Op op, double seconds, double flops, double bytes, double rows);
  void add(const OpTimers& o);  // o's stats added to these (initialised like o if empty)
  OpStat total(Op op) const;    // over all layers
  double total_seconds() const;
  double total_flops() const;
};

// Pruning for one forward pass: at each step's layer the policy keeps tokens_kept(active,
// share) of the active tokens; the rest are not computed in the layers after it.
struct PruneRequest {
  std::span<const PruneStep> steps;  // resolved, strictly increasing layers
  PruningPolicy* policy = nullptr;
};

// Which tokens a layer holds K/V for: slots in arrival order (as the backend fills them).
// Prefill and plain decoding append in position order, so the slots stay sorted and attention
// reads them as one causal prefix; revived tokens are appended at their old positions wherever
// they fall, and from then on attention and scores take an explicit list of slots.
struct KvIndex {
  std::vector<int32_t> pos;      // [n] position of each slot
  std::vector<int32_t> slot_of;  // [max position + 1] slot of each position, -1: no K/V here
  bool sorted = true;            // slot positions ascending
  int64_t n() const { return int64_t(pos.size()); }
  int64_t find(int32_t p) const { return p >= 0 && size_t(p) < slot_of.size() ? slot_of[size_t(p)] : -1; }
  // Appends rows at positions `rows` (ascending). A position that already has K/V here breaks
  // the at-most-once rule: lp::Error naming it and `layer`.
  void append(std::span<const int32_t> rows, int layer);
  std::vector<int32_t> slots_in_order() const;  // every slot, in position order
};

// The index of the hidden states of pruned tokens: for each token, the layer whose input its
// state is (the first layer at which it has no K/V). The states are in the backend, by entry.
// A token pruned again later overwrites its entry (one entry per token, the latest state).
struct AuxCache {
  std::vector<int32_t> pos;                    // [entries]
  std::vector<int32_t> layer;                  // [entries]
  std::unordered_map<int32_t, int64_t> index;  // pos -> entry
  int64_t width = 0;                           // D: floats per state
  int64_t size() const { return int64_t(pos.size()); }
  int64_t bytes() const { return size() * (width * 4 + 8); }  // f32 states + position and layer
  int64_t put(int32_t p, int32_t l);                          // the entry now holding p's state at l
  // Entry of token p, or -1.
  int64_t find(int32_t p) const {
    auto it = index.find(p);
    return it == index.end() ? -1 : it->second;
  }
  // Revival at layer l of a decoding step: the tokens `revive` (ascending, each with its state
  // saved at layer l) merged into the ascending `rows`, which becomes the merged positions; the
  // plan says where each merged row's state comes from. Throws lp::Error when a token has no
  // state for layer l.
  RowMerge plan_revival(int l, std::vector<int32_t>& rows, const std::vector<int32_t>& revive) const;
};

// What a session holds for tokens [first, first + n): a prefix cache block's payload
// (engine/prefix_cache.h). Every token's K/V covers a run of layers from the first, [0, depth):
// a prefill prunes a token at some layer and keeps its state (the input of the next layer) in the
// Aux Cache, and a revival computes it from there on until a later pruning layer drops it again,
// its state saved one layer deeper. So a token is its depth, its K/V at the layers below it and,
// below the last layer, its Aux Cache state at that depth; a prefix computed in full is every
// token at depth L. The K/V of layer l: the rows of the tokens deeper than l, in position order,
// all of K then all of V (Backend::kv_read's rows).
struct TokenStates {
  int32_t first = 0;
  std::vector<uint16_t> depth;             // [n]
  std::vector<std::vector<std::byte>> kv;  // [L]
  std::vector<float> aux;                  // [tokens shallower than L][D], in position order
  int64_t n() const { return int64_t(depth.size()); }
  int64_t bytes() const;
  bool full(int n_layer) const;  // every token at depth L: what a pass without pruning leaves
};

class Session {
 public:
  // A session over `backend`, whose capacity is the most tokens it will hold (prompt + generated).
  Session(const Model& m, std::unique_ptr<Backend> backend);
  // On the CPU backend (kernels/cpu/backend.h) with n_ctx tokens of K/V.
  Session(CpuContext& ctx, const Model& m, int64_t n_ctx);

  // Runs tokens ids[T] at positions pos[T] (ascending, after every position already cached)
  // through all layers, appending their K/V. Writes logits [R][V] for the rows listed in
  // logit_rows (indices into ids) to `logits`. Throws lp::Error on a bad id or a full cache.
  //
  // With `prune` (only on an empty cache, with logits for the last row only): at each pruning
  // step's layer the last token's attention scores the active tokens and the policy keeps some;
  // the others are not computed in later layers, so each layer's KV cache holds exactly the
  // tokens computed there, and each pruned token's hidden state goes to the Aux Cache.
  //
  // With `stats`, the pass's trace step (traces/trace.h: "prefill" on an empty cache, else
  // "decode"): per layer the rows computed, keys held and attended, pairs, Aux Cache writes, and
  // the detail (kept positions and scores per pruning step). With `timers`, every op's wall time
  // is recorded with its FLOPs and bytes; on an asynchronous backend the device is synchronised
  // around each op.
  void forward(std::span<const int32_t> ids, std::span<const int32_t> pos,
               std::span<const int64_t> logit_rows, float* logits, const PruneRequest* prune = nullptr,
               trace::Step* stats = nullptr, OpTimers* timers = nullptr);

  // One decoding step. Without `prune` (null), a plain pass of the one new row over every cached
  // token. With it, re-selection (lazyllm, random-layers) or the static set (frozen, static-paper):
  // every step starts from all tokens; at each pruning layer the new token's attention selects;
  // a selected token without K/V at a layer is revived from the Aux Cache and computed from
  // there on; keys at each layer are exactly the step's active set. Every (token, layer) pair is
  // computed at most once over the session (checked: a violation throws). `stats` receives the
  // step's trace step, with the positions revived at each layer.
  void decode_step(int32_t id, int32_t pos, float* logits, const PruneRequest* prune,
                   trace::Step* stats = nullptr, OpTimers* timers = nullptr);

  // One forward pass in progress, layer by layer. The order of a layer's parts is written once,
  // in run_layers (engine/batch.h), for a pass alone (forward(), decode_step()), several sessions'
  // passes together (each GEMM and each row op once over all their rows) and KV-Runahead's
  // (engine/runahead.h): revive, rows_in, (AttnNorm), [QKV], (QkNorm), (Rope), index_kv, <K/V
  // append>, attend, [O],
  // (PostAttnNorm), (Residual), (FfnNorm), [GateUp], (Act), [Down] (a mixture-of-experts layer:
  // route, [experts]), (PostFfnNorm), (Residual), end_layer; after the last layer head, then
  // [LM head] when it returns rows. The bracketed GEMMs, the parenthesised row ops and the K/V
  // append are the loop's (matmul and row_op below alone, Backend::matmul_batched, rows_batched and
  // kv_append_batched over the members).
  struct Pass {
    bool decode = false;
    int32_t new_pos = 0;              // decode: the new token's position
    std::vector<int32_t> rows;        // positions of the backend's rows, ascending
    std::vector<int32_t> active;      // decode: the step's active set, the keys of each layer
    std::vector<int64_t> logit_rows;  // forward: the input rows that get logits
    // forward: positions before the pass's own rows whose K/V another process computed and this
    // session imported (KV-Runahead's last rank, engine/runahead.h) and that are still active.
    // With `keyed_prefix`, each layer's keys are these and the pass's rows, and a pruning step
    // scores and keeps or drops them with the rows (a dropped one stays in the cache, unattended
    // by this pass).
    std::vector<int32_t> prefix;
    bool keyed_prefix = false;
    const PruneRequest* prune = nullptr;
    bool pruning = false;           // forward: prune has steps and a policy
    size_t next_step = 0;           // the next pruning step
    bool rows_changed = true;       // the backend needs set_rows before the next layer
    bool selection_queued = false;  // queue_selection scored this layer's keys and queued their selection
    int64_t attn_pairs = 0, attn_keys = 0;  // attention_keys: the layer's causal pairs and keys
    trace::Step* stats = nullptr;
    OpTimers* timers = nullptr;
    int64_t revived = 0;  // decode: rows revived so far
    // Deferred selection (decode_step): the step's new tokens, whether its selections may be deferred,
    // and once one was, the size of the active set the backend holds, each deferred selection, and
    // the room they take in the backend's log.
    std::vector<int32_t> ids;
    bool may_defer = false;
    bool deferred = false;  // ps.active is the active set before the first deferred selection
    int64_t n_active = 0;
    struct Deferral {
      int layer = 0;
      int64_t n = 0, n_keep = 0, kept_at = 0, scores_at = -1;
      size_t trace_entry = 0;  // its stats->pruning entry
    };
    std::vector<Deferral> deferrals;
    int64_t log_kept = 0, log_scores = 0;
    std::vector<int> routes_pending;  // layers whose routes the trace reads after the pass's wait
  };
  // forward()'s and decode_step()'s checks, then the rows embedded.
  Pass begin_forward(std::span<const int32_t> ids, std::span<const int32_t> pos,
                     std::span<const int64_t> logit_rows, const PruneRequest* prune, trace::Step* stats,
                     OpTimers* timers);
  Pass begin_decode(int32_t id, int32_t pos, const PruneRequest* prune, trace::Step* stats, OpTimers* timers);
  // A decoding step's revival: the step's active tokens without K/V at layer l that are not rows
  // yet come back from the Aux Cache (their saved state is this layer's input). Nothing in a
  // forward pass.
  void revive(Pass& ps, int l);
  void rows_in(Pass& ps);                  // the rows set on the backend if they changed
  void row_op(Pass& ps, RowOp op, int l);  // one row op on this pass's rows, timed
  // The rows' (token, layer) pairs recorded as computed (the at-most-once rule: lp::Error when one was
  // already); the backend's kv_append (or kv_append_batched) follows.
  void index_kv(Pass& ps, int l);
  void attend(Pass& ps, int l);  // attention over the layer's key set, the rows' K/V appended
  // attend() in two halves, for a batch's one attention launch: the layer's key set chosen (and the
  // trace's counts), then the backend's attention over attention_slots() (Backend::attention_batched).
  void attention_keys(Pass& ps, int l);
  std::span<const int32_t> attention_slots() const { return slots_; }
  bool scored(const Pass& ps, int l) const;  // layer l's attention is scored
  // A mixture-of-experts layer's FFN in place of [GateUp], (Act), [Down]: the rows routed, then
  // their experts (experts alone; Backend::experts_batched over the members).
  void route(Pass& ps, int l);
  void routed(Pass& ps, int l);  // route()'s trace record, after Backend::route_batched
  void experts(Pass& ps, int l);
  // A batch member's pruning step started before any member's end_layer (engine/batch.h): at a
  // pruning layer whose policy keeps the top scores, the keys scored and their selection queued on
  // the backend, so that the members' selections wait for the device once, not once each.
  void queue_selection(Pass& ps, int l);
  // After the layer's last residual, a forward pass prunes (at a pruning layer: the rows the policy
  // drops leave, their states to the Aux Cache) and a decoding step re-selects (at a pruning layer:
  // the active set chosen again; rows not selected, or with K/V at the next layer, leave).
  void end_layer(Pass& ps, int l);
  // The rows that get logits gathered and normed; returns their count (0: no LM head to run).
  int64_t head(Pass& ps);
  // After a pass's LM head (whose logits made the host wait): the trace's routes that the backend kept
  // where its experts ran (Backend::routes_deferred) are read; a decoding step whose selections were
  // deferred replays them on the host's index. Where one kept a token that has no K/V at a layer
  // that attended it (a revival the device did not make), the step is undone and computed again
  // without deferring, its logits written to `logits` again. Decoding steps of one token defer
  // (where the backend defers_selection, the policy keeps the top scores and no op is timed) after
  // defer_after() steps in a row that revived nothing; a step computed again doubles that number (up
  // to kMaxDeferAfter): a step costs more than the waits deferring saves, so deferring must seldom
  // miss, and on a real model's first hundreds of steps revivals come every few steps (docs/cuda.md).
  // Returns true when the step was computed again (its logits written again).
  bool settle(Pass& ps, float* logits);
  static constexpr int64_t kMaxDeferAfter = 64;
  int64_t defer_after() const { return defer_after_; }
  int64_t steps_redone() const { return redone_; }      // settle's computed again
  int64_t steps_deferred() const { return deferred_; }  // and those that stood
  // The alone path's GEMM of one part, timed.
  void matmul(Pass& ps, Proj p, int l);
  void lm_head(Pass& ps, float* logits);

  // KV-Runahead (engine/runahead.h): K/V computed in another process for positions `pos`
  // (ascending, none held here) taken in at layer l, as rows in the backend's layout
  // (Backend::kv_import); and the layer's first n held positions' K/V out. Bytes of one token's K
  // and V at layer l.
  // `anywhere`: the positions may fall before held ones (a pruned prefix's K/V taken in after the
  // pass that skipped it, as revival appends out of order); else they must follow every held one.
  void import_kv(int l, std::span<const int32_t> pos, std::span<const std::byte> rows, bool anywhere = false);
  void export_kv(int l, int64_t n, std::span<std::byte> out);
  int64_t kv_token_bytes(int l) const;

  // The prefix cache's copies. save_states: the tokens [first, first + n) as TokenStates; nullopt
  // when one of them is not held in the shape TokenStates describes (a policy that leaves gaps).
  // load_states: blocks of consecutive tokens from position 0 into an empty session, K/V and Aux
  // Cache both, as if this session had computed them (the at-most-once rule counts them as done).
  std::optional<TokenStates> save_states(int32_t first, int64_t n);
  // save_states of `count` blocks of `block` tokens from `first`, each its own TokenStates (nullopt
  // where save_states would give it), read from the backend together: one K/V read a layer and one
  // Aux Cache read for all of them (on a GPU each read is a wait).
  std::vector<std::optional<TokenStates>> save_blocks(int32_t first, int64_t block, int64_t count);
  // Each token's depth (the layers from the first that hold its K/V), as save_states counts it.
  std::vector<uint16_t> depths(int32_t first, int64_t n) const;
  void load_states(std::span<const TokenStates* const> blocks);
  // A pass over new tokens after a loaded prefix, with LazyLLM's decoding semantics for all of them
  // at once (a decoding step of several new rows): every held token starts active, each pruning
  // step's selection is the last new token's, a selected token without K/V at a layer is revived
  // from the Aux Cache, the new tokens not selected leave with their states saved (as a prefill
  // prunes). Logits for the last new token only. On an empty session it is the pruned prefill.
  Pass begin_extend(std::span<const int32_t> ids, std::span<const int32_t> pos, const PruneRequest& prune,
                    trace::Step* stats, OpTimers* timers);
  // begin_extend's pass run alone; logits [V] of the last new token.
  void extend(std::span<const int32_t> ids, std::span<const int32_t> pos, float* logits,
              const PruneRequest& prune, trace::Step* stats = nullptr, OpTimers* timers = nullptr);

  int64_t n_cached() const { return kv_[0].n(); }
  int64_t n_ctx() const { return be_->capacity(); }
  void reset();
  int64_t kv_bytes_used() const;  // held by the tokens cached at each layer
  int64_t keys_held(int l) const { return kv_[size_t(l)].n(); }
  // Whether position p was computed at layer l (its (token, layer) pair).
  bool computed(int l, int32_t p) const { return kv_[size_t(l)].find(p) >= 0; }
  const AuxCache& aux() const { return aux_; }
  std::vector<float> aux_state(int32_t p);  // token p's saved state (lp::Error when it has none)
  Backend& backend() { return *be_; }
  const Model& model() const { return m_; }

 private:
  const Model& m_;
  std::unique_ptr<Backend> be_;
  std::vector<KvIndex> kv_;  // [L]
  AuxCache aux_;
  std::vector<int32_t> slots_;    // key slots of the last layer() (empty: every held slot, in order)
  std::vector<int32_t> key_pos_;  // scratch: key positions when layer() was given none
  std::vector<int32_t> keys_;     // scratch: a forward pass's prefix and rows
  int64_t clean_steps_ = 0;       // decoding steps in a row that revived nothing (none after a prefill)
  int64_t defer_after_ = 1;       // the clean steps a step needs to defer
  int64_t redone_ = 0, deferred_ = 0;

  // Records op's time (when timers), FLOPs and bytes around f.
  template <class F>
  void timed(OpTimers* t, int layer, Op op, const OpShape& shape, F&& f);
  void prune(Pass& ps, int l);                    // end_layer of a forward pass
  void reselect(Pass& ps, int l);                 // end_layer of a decoding step
  bool prunes_at(const Pass& ps, int l) const;    // layer l is the next pruning step
  bool defers_at(const Pass& ps, int l) const;    // and its selection is deferred
  void defer_selection(Pass& ps, int l);          // end_layer of a decoding step that defers
  bool observes_at(const Pass& ps, int l) const;  // the policy observes layer l (a forward pass)
  // What becomes of each backend row at the end of layer l: stays a row, leaves with its state (the
  // input of layer l + 1) saved to the Aux Cache, or leaves without (it has K/V there already, or
  // the layer is the last).
  enum class RowFate : uint8_t { Stay, Save, Drop };
  // Applies `fate` (one per row): the states saved, the staying rows gathered in order, ps.rows
  // updated. The one row-compaction of both end_layer paths.
  void compact_rows(Pass& ps, int l, std::span<const RowFate> fate);
  // The pruning step at layer l (after layer()): scores the keys by the last row's attention if
  // the policy wants them and returns the indices of the keys to keep (ascending, the last one
  // included).
  // With `queued`, queue_selection has scored the keys and queued the selection.
  std::vector<int64_t> select(int l, std::span<const int32_t> keys, double share, PruningPolicy& policy,
                              OpTimers* t, trace::Step* stats, bool queued = false);
  // The keys a pruning step at layer l selects among: the step's active set (decoding), the imported
  // prefix and the rows (keyed_prefix), or the rows.
  std::span<const int32_t> selection_keys(const Pass& ps) const;
};

}  // namespace lp
