// The ops a transformer layer needs, as one interface that every backend implements (the CPU in
// kernels/cpu/backend.h, CUDA in kernels/cuda/cuda_backend.h). The LazyLLM engine
// (engine/session.h) is written once over it: it decides which tokens are computed, which keys
// each row attends to and where pruned states go; a backend only runs ops on memory it owns.
//
// A backend holds, for one model and a capacity of n_ctx tokens:
//   weights                            in its own layout and dtype
//   the rows: T tokens at positions pos[T], set by set_rows, with activations
//     x      [T][D]                    the residual stream
//     xn     [T][D]                    rmsnorm(x)
//     qkv    [T][(H + 2 Hkv) Dh]       q, k and v of the rows (RoPE applied in place)
//     attn   [T][H Dh]                 attention output
//     ff     [T][2F]                   gate | up
//     act    [T][F]                    silu(gate) * up
//     branch [T][D]                    the output of o_proj or down, added back into x
//   K/V per layer [n_ctx][Hkv Dh]      filled in arrival order: slot i is the i-th row appended
//   scores [n]                         the last row's attention over a key set
//   Aux Cache states [entries][D]      hidden states of pruned tokens, by entry number
// The engine keeps every index (which position each slot and entry holds); a backend is told slots
// and entries, never asked which tokens exist.
//
// Dimension names as everywhere: T rows, D width, H heads, Hkv KV heads, Dh head width, F FFN width,
// V vocabulary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/config.h"

namespace lp {

enum class Tensor { X, XN, QKV, Attn, FF, Act, Branch };  // the activations above
enum class Proj {
  QKV,
  O,
  GateUp,
  Down
};  // qkv = xn Wqkv^T, branch = attn Wo^T, ff = xn Wgu^T, branch = act Wd^T
// Which weight a norm scales by: rmsnorm's input norms (x -> xn), post_norm's output norms
// (branch -> branch, Gemma 3).
enum class Norm { Attn, Ffn, Output, PostAttn, PostFfn };
// The ops of a layer that work row by row on the rows' own activations, which a batch's members can
// run in one launch (Backend::rows_batched): the norms, Qwen3's q/k norms, RoPE, the residual
// (x += branch) and the FFN's activation.
enum class RowOp { AttnNorm, FfnNorm, PostAttnNorm, PostFfnNorm, QkNorm, Rope, Residual, Act };

// How a set of rows is rebuilt from the current rows and Aux Cache entries (a decoding step's
// revival): new row x_dst[i] = current row x_src[i]; new row aux_dst[i] = entry aux_src[i].
struct RowMerge {
  std::vector<int64_t> x_src, x_dst, aux_src, aux_dst;
};

// Floats per row of an activation.
inline int64_t tensor_width(const ModelConfig& c, Tensor t) {
  switch (t) {
    case Tensor::QKV:
      return int64_t(c.n_head + 2 * c.n_head_kv) * c.head_dim;
    case Tensor::Attn:
      return int64_t(c.n_head) * c.head_dim;
    case Tensor::FF:  // none in a mixture-of-experts model: experts() keeps its own
      return c.moe() ? 0 : 2 * int64_t(c.n_ff);
    case Tensor::Act:
      return c.moe() ? 0 : c.n_ff;
    default:
      return c.n_embd;
  }
}

// The rows of activations a request keeps between a server's iterations (Backend::release_activations).
inline constexpr int64_t kHeldRows = 16;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual int64_t capacity() const = 0;  // tokens the K/V cache and the Aux Cache hold
  // Bytes of one cached K or V value: 4 (f32) unless the backend stores them narrower (the CPU
  // backend's f16 cache: kernels/cpu/kv_cache.h).
  virtual int kv_element_bytes() const { return 4; }
  // The K/V capacity's granularity: a cache for n tokens holds n rounded up to a multiple of this
  // (the CPU backend's 64-slot key blocks; 1 where the capacity is exact). Reservations count it.
  virtual int64_t kv_block() const { return 1; }
  // What the backend holds beside K and V, for reservations where the K/V budget is the device's
  // memory (KvLayout::token_bytes): bytes per token of capacity and whatever the capacity (after
  // release_activations), and whether the first count holds an Aux Cache state for every token.
  // None by default: the CPU backend's budget counts K/V and the Aux Cache alone.
  struct Held {
    double token_bytes = 0, request_bytes = 0;
    bool aux_in_token_bytes = false;
  };
  virtual Held held_bytes() const { return {}; }

  // A backend that queues work (a GPU) returns true; op timers then synchronise around every op,
  // so its wall time is its own (and the overlap between ops is lost while timing).
  virtual bool asynchronous() const { return false; }
  virtual void synchronize() {}

  // The rows from now on: their count and positions (RoPE angles, the causal mask). Room for them
  // in every activation; x keeps its first rows when it grows.
  virtual void set_rows(std::span<const int32_t> pos) = 0;
  // x[t] = embedding of ids[t], times ModelConfig::embed_scale
  virtual void embed(std::span<const int32_t> ids) = 0;
  virtual void rmsnorm(Norm n, int layer) = 0;  // xn = rmsnorm(x) * w  (Attn, Ffn, Output: layer unused)
  // branch = rmsnorm(branch) * w (PostAttn, PostFfn: Gemma 3's norms of the attention and FFN
  // outputs; the engine calls it only for a model with ModelConfig::post_norms).
  virtual void post_norm(Norm n, int layer) = 0;
  // The projection; Proj::QKV adds the layer's Q/K/V biases where the model has them (Qwen2).
  virtual void matmul(Proj p, int layer) = 0;
  // q and k heads of qkv replaced by their RMSNorm times the layer's q_norm / k_norm (Qwen3's
  // per-head norms, before RoPE; the engine calls it only for a model with ModelConfig::qk_norm).
  virtual void qk_norm(int layer) = 0;
  // q and k heads of qkv, at the rows' positions, with the layer's base and scale
  // (ModelConfig::rope_base / rope_scale: Gemma 3's local and global layers differ).
  virtual void rope(int layer) = 0;
  virtual void kv_append(int layer) = 0;  // the rows' k, v into the next slots of the layer's cache
  // attn = causal attention of the rows' q over the keys in `slots` (ascending positions); empty:
  // every slot the layer holds, which are then in position order. The layer's sliding window
  // (ModelConfig::window) hides older keys; logits scaled by ModelConfig::attention_scale. scored:
  // last_row_scores(layer, slots) follows before the rows change, so a backend may keep the last
  // row's logits from this pass for it (the CPU's does: scoring then reads no keys).
  virtual void attention(int layer, std::span<const int32_t> slots, bool scored) = 0;
  virtual void swiglu() = 0;  // act = silu(gate) * up, or gelu(gate) * up (ModelConfig::gelu)
  // A long prefill's dense FFN in chunks of rows, so that its gate|up and activation buffers (the
  // largest of a layer: 3 F floats a row) hold a chunk rather than the prompt: where
  // ffn_chunk_rows() > 0 and the rows outnumber it, the engine calls ffn_chunked(layer) (branch =
  // Down(act(GateUp(xn))), row by row what the three calls give) in place of GateUp, swiglu and
  // Down, in a pass alone and untimed (engine/batch.cpp); else the three, over every row.
  virtual int64_t ffn_chunk_rows() const { return 0; }
  virtual void ffn_chunked(int layer);
  // The mixture-of-experts FFN (ModelConfig::moe: Qwen3-MoE, Mixtral), in place of GateUp, swiglu and
  // Down (kernels/cpu/moe.h): route() takes the router's softmax over xn and keeps each row's
  // n_expert_used most probable experts with their probabilities renormalized; experts() sets
  // branch = those experts' outputs, weighted and summed, each expert's GEMMs run once over the rows
  // routed to it. A row not computed (a pruned token) is not routed.
  virtual void route(int layer) = 0;
  virtual void experts(int layer) = 0;
  // The experts each row goes through, as the last route() chose: [T][n_expert_used], most probable
  // first.
  virtual std::vector<int32_t> routes() = 0;
  // A backend may keep a decoding step's routes where its experts run (a GPU): routes_deferred()
  // after route() says so, and routes_of(layer) reads that layer's routes after the pass's wait (the
  // LM head's), for a trace, where routes() would wait in the middle of the pass.
  virtual bool routes_deferred() const { return false; }
  virtual std::vector<int32_t> routes_of(int /*layer*/) { return routes(); }
  virtual void residual() = 0;  // x += branch
  // scores[i] = the last row's attention on key i of `slots` (as attention, its window included:
  // a key outside it scores 0), averaged over heads.
  virtual void last_row_scores(int layer, std::span<const int32_t> slots) = 0;
  virtual std::vector<float> scores(int64_t n) = 0;  // the scores, read back
  // LazyLLM's selection run where the scores are (select_top in pruning/policy.h): the n_keep best
  // of the n = pos.size() scored keys, the last always kept; indices ascending.
  virtual std::vector<int64_t> select_top(std::span<const int32_t> pos, int64_t n_keep) = 0;
  // select_top in two halves, so that a batch's members queue their selections before the first
  // of them waits for its result (engine/batch.h): select_queue starts the selection of the scores
  // last_row_scores left; select_top, called next with the same arguments, returns it. The default
  // does nothing (select_top does all of it).
  virtual void select_queue(std::span<const int32_t> /*pos*/, int64_t /*n_keep*/) {}
  // Deferred selection (Session::decode_step: a LazyLLM decoding step that does not wait for its
  // pruning layers' selections). A backend that defers keeps the step's active set on the device:
  //  - deferred_log(kept, scores) before a step's first deferred selection: room in the step's log
  //    for that many kept positions and scores;
  //  - select_deferred: the n_keep best of the n keys last_row_scores scored, the last kept; the
  //    keys are the positions `pos`, or (empty) the device's active set; the kept positions become
  //    the active set and are copied into the log from `kept_at` (the scores from `scores_at`, when
  //    not -1), behind the selection, without waiting;
  //  - device_keys(layer, n): after the rows' K/V append, the layer's keys are the active set (its n
  //    positions' cache slots); the attention and scores at that layer are then called without slots;
  //  - deferred_kept / deferred_scores: the log, read after a wait (the step's logits);
  //  - kv_truncate: a layer's cache back to its first n slots (a step computed again).
  virtual bool defers_selection() const { return false; }
  virtual void deferred_log(int64_t kept, int64_t scores);
  virtual void select_deferred(std::span<const int32_t> pos, int64_t n, int64_t n_keep, int64_t kept_at,
                               int64_t scores_at);
  virtual void device_keys(int layer, int64_t n);
  virtual std::span<const int32_t> deferred_kept(int64_t at, int64_t n);
  virtual std::span<const float> deferred_scores(int64_t at, int64_t n);
  virtual void kv_truncate(int layer, int64_t n);
  virtual void gather_rows(std::span<const int64_t> rows) = 0;  // x = x[rows] (x only)
  // Aux Cache states: entry entries[i] = x[rows[i]]; entries grow the cache as needed.
  virtual void aux_store(std::span<const int64_t> rows, std::span<const int64_t> entries) = 0;
  virtual void merge_rows(const RowMerge& m, int64_t n_rows) = 0;  // x = the merge, n_rows rows
  virtual void lm_head(float* logits) = 0;  // logits [T][V] = xn Wlm^T, on the host when it returns

  // Continuous batching (engine/batch.h): the rows of several backends over one set of weights
  // multiplied together, as matmul and lm_head would each member's. `members` hold this backend's
  // model and weights (made by the same factory), this one usually among them; their input rows
  // are taken in order, and each member's output rows land in its own activation (lm_head: logits
  // [sum of T][V], members in order). The default runs each member's own product, which gives the
  // same numbers; a backend overrides it to run one GEMM over all the rows.
  virtual void matmul_batched(Proj p, int layer, std::span<Backend* const> members) {
    for (Backend* m : members) m->matmul(p, layer);
  }
  // experts() over the members' rows together (each routed), so each expert's weights are read once
  // for all of them.
  virtual void experts_batched(int layer, std::span<Backend* const> members) {
    for (Backend* m : members) m->experts(layer);
  }
  // Whether the *_batched calls below run one launch over all the members (a device, where each
  // launch costs the host more than its work on a decoding row), so a batch's passes call them
  // op by op; otherwise (the CPU) each member's attention part runs whole, side by side.
  virtual bool launches_batched() const { return false; }
  // A row op of every member (their rows at `layer`), as each member's own call would run it
  // (row_op). The default runs them side by side (for_each_member); a device overrides it to run one
  // launch over all the rows.
  virtual void rows_batched(RowOp op, int layer, std::span<Backend* const> members) {
    for_each_member(int64_t(members.size()), [&](int64_t i) { members[size_t(i)]->row_op(op, layer); });
  }
  void row_op(RowOp op, int layer);  // the one backend call `op` names
  // route() of every member; a device queues all of them before it waits for their routes once.
  virtual void route_batched(int layer, std::span<Backend* const> members) {
    for (Backend* m : members) m->route(layer);
  }
  // attention() of every member, member i over its key slots slots[i] (scored[i] as attention takes
  // it), as each member's own call would; the default runs them side by side (for_each_member), a
  // device in one launch.
  virtual void attention_batched(int layer, std::span<Backend* const> members,
                                 std::span<const std::span<const int32_t>> slots,
                                 std::span<const char> scored) {
    for_each_member(int64_t(members.size()), [&](int64_t i) {
      members[size_t(i)]->attention(layer, slots[size_t(i)], scored[size_t(i)] != 0);
    });
  }
  // kv_append of every member (their rows at `layer`), as each member's own call would; side by side.
  virtual void kv_append_batched(int layer, std::span<Backend* const> members) {
    for_each_member(int64_t(members.size()), [&](int64_t i) { members[size_t(i)]->kv_append(layer); });
  }
  virtual void lm_head_batched(std::span<Backend* const> members, float* logits, int64_t n_vocab) {
    for (Backend* m : members) {
      m->lm_head(logits);
      logits += m->rows() * n_vocab;
    }
  }
  // lm_head_batched for members of which some need only their rows' greedy tokens (sampling at
  // temperature 0 without log-probabilities: lp::argmax of each row, kernels/argmax.h): ids[r] for
  // every row r of the members, in order, and member i's logits [its rows][V] into logits[i] where
  // that is not null. The default computes every member's logits on the host's side; a GPU leaves
  // the unwanted ones where they are, so that a greedy member's decoding step brings back a token,
  // not its vocabulary of logits.
  virtual void lm_head_greedy(std::span<Backend* const> members, std::span<float* const> logits, int32_t* ids,
                              int64_t n_vocab);
  // Runs f(0), ..., f(n - 1), each one batch member's own work between the GEMMs (its attention,
  // norms, selection: engine/batch.h), side by side where the backend can; the members' states are
  // disjoint. The default runs them one after another (an asynchronous device queues them anyway).
  virtual void for_each_member(int64_t n, const std::function<void(int64_t)>& f) {
    for (int64_t i = 0; i < n; ++i) f(i);
  }
  virtual int64_t rows() const = 0;  // T: the rows set by set_rows

  // For tests and checks (the op harness, tests/backend_ops.h): an activation of the rows,
  // [T][tensor_width] on the host, written or read back.
  virtual void write(Tensor t, std::span<const float> data) = 0;
  virtual std::vector<float> read(Tensor t) = 0;

  virtual void reset() = 0;  // empty K/V and Aux Cache (the weights stay)
  // Between passes: gives back the activations of more than `rows` rows (a prefill's, or a
  // decoding step's that revived more), which the next pass grows again if it needs them; nothing
  // when it holds no more. K/V and Aux Cache stay. A server calls it after each of a request's
  // passes with kHeldRows, so a decoding request holds its K/V and that many rows, not its prompt's
  // activations, and its reservation counts what it holds (KvLayout::request_bytes).
  virtual void release_activations(int64_t /*rows*/) {}
  // For checks: the positions whose K/V layer `layer` holds, ascending, as the backend's own record
  // says (the CPU's slot table, the GPU's has-KV bits); and one Aux Cache state.
  virtual std::vector<int32_t> kv_positions(int layer) = 0;
  // KV-Runahead (engine/runahead.h): the layer's first n held tokens' K/V as rows, all of K then
  // all of V, in the cache's element type (kv_element_bytes() each, Hkv * Dh per row), into
  // `out` (2 * n * Hkv * Dh * kv_element_bytes() bytes); and such rows appended at positions
  // `pos`. A backend without them refuses.
  virtual void kv_export(int layer, int64_t n, std::span<std::byte> out);
  virtual void kv_import(int layer, std::span<const int32_t> pos, std::span<const std::byte> rows);
  virtual std::vector<float> aux_state(int64_t entry) = 0;
  // The prefix cache (engine/prefix_cache.h) copies a sequence's state out and into another
  // session: the K/V of the listed slots as kv_export's rows, and Aux Cache states [n][D] written
  // to entries. Whether this backend can (a backend without them refuses, and serves uncached).
  virtual bool copies_state() const { return false; }
  virtual void kv_read(int layer, std::span<const int32_t> slots, std::span<std::byte> out);
  virtual void aux_load(std::span<const int64_t> entries, std::span<const float> states);
  // The Aux Cache states of `entries` [n][D] into out, as aux_state reads each (a device: in one copy).
  virtual void aux_read(std::span<const int64_t> entries, std::span<float> out);
};

}  // namespace lp
