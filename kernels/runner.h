// The transformer runner: a loaded model and a session (KV cache + scratch) that runs forward
// passes over explicit token ids at explicit positions.
//
// Positions are passed in, never implied by row index: pruning (LazyLLM) computes gathered
// subsets of tokens that keep their original positions for RoPE and the causal mask.
#pragma once

#include <array>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/context.h"
#include "kernels/cpu/ops.h"
#include "kernels/pruning.h"
#include "kernels/weights.h"
#include "model/config.h"
#include "model/ops.h"
#include "model/tokenizer.h"
#include "traces/schedule.h"

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
  const OpStat& at(int layer, Op op) const { return stat[size_t(layer) * kNumOps + size_t(op)]; }
  void add(int layer, Op op, double seconds, double flops, double bytes, double rows);
  OpStat total(Op op) const;  // over all layers
  double total_seconds() const;
  double total_flops() const;
};

class Model {
 public:
  // Loads config, tokenizer and weights. Throws lp::Error on any problem with the file.
  static std::unique_ptr<Model> load(const std::string& path, DType dtype, CpuContext& ctx);

  const ModelConfig& config() const { return cfg_; }
  const Weights& weights() const { return w_; }
  const Tokenizer& tokenizer() const { return *tok_; }
  const std::string& path() const { return path_; }

  Model(ModelConfig c, Weights w, std::unique_ptr<Tokenizer> t, std::string path)
      : cfg_(std::move(c)), w_(std::move(w)), tok_(std::move(t)), path_(std::move(path)) {}

 private:
  ModelConfig cfg_;
  Weights w_;
  std::unique_ptr<Tokenizer> tok_;
  std::string path_;
};

// Pruning for one forward pass: at each step's layer the policy keeps tokens_kept(active,
// share) of the active tokens; the rest are not computed in the layers after it.
struct PruneRequest {
  std::span<const PruneStep> steps;  // resolved, strictly increasing layers
  PruningPolicy* policy = nullptr;
};

// What a forward pass computed.
struct ForwardStats {
  std::vector<int64_t> computed;     // [L] tokens computed at each layer (queries)
  std::vector<int64_t> keys;         // [L] tokens with K/V at each layer after the pass
  std::vector<int64_t> pairs;        // [L] causal (query, key) pairs attended
  std::vector<int64_t> attended;     // [L] keys the layer attended over (a decoding step: its active set)
  std::vector<int64_t> aux_written;  // [L] tokens pruned after layer l, saved to the Aux Cache
  std::vector<int64_t> revived;      // [L] tokens revived from the Aux Cache at layer l
  std::vector<std::vector<int32_t>> kept;         // per pruning step: positions kept after it
  std::vector<std::vector<float>> scores;         // per pruning step: scores of the active tokens (if any)
  std::vector<std::vector<int32_t>> revived_pos;  // [L] positions revived at layer l (decoding)
  int64_t aux_writes = 0;                         // hidden states saved to the Aux Cache
};

// Hidden states of pruned tokens: the input of the first layer at which each has no K/V.
//   h [n][D], layer [n], pos [n]
// A token pruned again later overwrites its entry (one entry per token, the latest state).
struct AuxCache {
  std::vector<int32_t> pos;
  std::vector<int32_t> layer;
  std::vector<float> h;
  std::unordered_map<int32_t, int64_t> index;  // pos -> entry
  int64_t size() const { return int64_t(pos.size()); }
  int64_t bytes() const { return int64_t(h.size() * sizeof(float) + pos.size() * 8); }
  void put(int32_t p, int32_t l, const float* x, int64_t D);
  // Entry of token p, or -1.
  int64_t find(int32_t p) const {
    auto it = index.find(p);
    return it == index.end() ? -1 : it->second;
  }
  // Revival at layer l of a decoding step (both backends): the tokens `revive` (ascending, each
  // with its state saved at layer l) merged into the ascending `rows`. `rows` becomes the merged
  // positions; the plan says where each merged row's state comes from: row x_src[i] of the current
  // states goes to merged row x_dst[i], entry aux_src[i] of this cache to merged row aux_dst[i].
  // Throws lp::Error when a token has no state for layer l.
  struct RevivalPlan {
    std::vector<int64_t> x_src, x_dst, aux_src, aux_dst;
  };
  RevivalPlan plan_revival(int l, std::vector<int32_t>& rows, const std::vector<int32_t>& revive) const;
};

class Session {
 public:
  // n_ctx: the most tokens this session will hold (prompt + generated).
  Session(const Model& m, int64_t n_ctx);

  // Runs tokens ids[T] at positions pos[T] (ascending, after every position already cached)
  // through all layers, appending their K/V. Writes logits [R][V] for the rows listed in
  // logit_rows (indices into ids) to `logits`. Throws lp::Error on a bad id or a full cache.
  //
  // With `prune` (only on an empty cache, with logits for the last row only): at each pruning
  // step's layer the last token's attention scores the active tokens and the policy keeps some;
  // the others are not computed in later layers, so each layer's KV cache holds exactly the
  // tokens computed there, and each pruned token's hidden state goes to the Aux Cache.
  void forward(CpuContext& ctx, std::span<const int32_t> ids, std::span<const int32_t> pos,
               std::span<const int64_t> logit_rows, float* logits, OpTimers* timers = nullptr,
               const PruneRequest* prune = nullptr, ForwardStats* stats = nullptr);

  // One decoding step with LazyLLM-style re-selection (lazyllm, random) or the static set:
  // every step starts from all tokens; at each pruning layer the new token's attention selects;
  // a selected token without K/V at a layer is revived from the Aux Cache and computed from
  // there on; keys at each layer are exactly the step's active set. Every (token, layer) pair is
  // computed at most once over the session (checked: a violation throws).
  void decode_step(CpuContext& ctx, int32_t id, int32_t pos, float* logits, OpTimers* timers,
                   const PruneRequest& prune, ForwardStats* stats = nullptr);

  int64_t n_cached() const { return kv_.empty() ? 0 : kv_[0].n; }
  int64_t n_ctx() const { return n_ctx_; }
  void reset();
  int64_t kv_bytes() const;       // allocated
  int64_t kv_bytes_used() const;  // held by the tokens cached at each layer
  const LayerKV& layer_kv(int l) const { return kv_[size_t(l)]; }
  // Whether position p was computed at layer l (its (token, layer) pair).
  bool computed(int l, int32_t p) const {
    const auto& d = done_[size_t(l)];
    return p >= 0 && size_t(p) < d.size() && d[size_t(p)];
  }
  const AuxCache& aux() const { return aux_; }

 private:
  const Model& m_;
  int64_t n_ctx_;
  std::vector<LayerKV> kv_;  // [L]
  AuxCache aux_;
  std::vector<std::vector<uint8_t>> done_;  // [L][n_ctx] (token, layer) computed: at most once
  void mark_computed(int l, int32_t p);
  // One layer over the rows of x_ (T tokens at positions rows, ascending): attention block and
  // MLP with their residuals. The rows' K/V are appended to the layer's cache first; they attend
  // to the keys at positions `keys` (ascending, all holding K/V once the rows are appended) or,
  // when `keys` is empty, to every key the layer holds. Leaves the key slots in slots_ and the
  // rows' q in qkv_ (for scoring).
  void run_layer(CpuContext& ctx, int l, std::span<const int32_t> rows, const RopeTable& rope,
                 std::span<const int32_t> keys, OpTimers* timers, ForwardStats* stats);
  // The pruning step at layer l (after run_layer): scores the keys by the last row's attention if
  // the policy wants them and returns the indices of the keys to keep (ascending, the last one
  // included).
  std::vector<int64_t> select(int l, std::span<const int32_t> keys, double share, PruningPolicy& policy,
                              OpTimers* timers, ForwardStats* stats);
  size_t last_rows_ = 0;          // rows of the last run_layer (the scoring row is the last)
  std::vector<int32_t> key_pos_;  // scratch: key positions when run_layer was given none
  std::vector<int32_t> slots_;    // key slots of the last run_layer (empty: all held, in order)
  Gemm gemm_;
  // Scratch, grown on demand: x [T][D], xn [T][D], qkv [T][(H+2Hkv)Dh], attn [T][H Dh],
  // ff [T][2F], act [T][F], tmp [T][D].
  Buffer<float> x_, xn_, qkv_, attn_, ff_, act_, tmp_;
};

// Peak resident set size of this process so far, in MiB.
double peak_rss_mib();

}  // namespace lp
