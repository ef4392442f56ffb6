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
#include <vector>

#include "kernels/context.h"
#include "kernels/cpu/ops.h"
#include "kernels/pruning.h"
#include "kernels/schedule.h"
#include "kernels/weights.h"
#include "model/config.h"
#include "model/ops.h"
#include "model/tokenizer.h"

namespace lp {

// Wall time and counted work per op, summed over calls. FLOPs come from op_flops.
struct OpTimers {
  std::array<double, kNumOps> seconds{};
  std::array<double, kNumOps> flops{};
  std::array<int64_t, kNumOps> calls{};
  void add(Op op, double s, double fl) {
    seconds[int(op)] += s;
    flops[int(op)] += fl;
    calls[int(op)] += 1;
  }
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
  std::vector<int64_t> computed;           // [L] tokens computed at each layer (queries)
  std::vector<int64_t> keys;               // [L] tokens with K/V at each layer after the pass
  std::vector<int64_t> pairs;              // [L] causal (query, key) pairs attended
  std::vector<int64_t> aux_written;        // [L] tokens pruned after layer l, saved to the Aux Cache
  std::vector<std::vector<int32_t>> kept;  // per pruning step: positions kept after it
  std::vector<std::vector<float>> scores;  // per pruning step: scores of the active tokens
  int64_t aux_writes = 0;                  // hidden states saved to the Aux Cache
};

// Hidden states of pruned tokens: the input of the first layer at which each has no K/V.
//   h [n][D], layer [n], pos [n]
struct AuxCache {
  std::vector<int32_t> pos;
  std::vector<int32_t> layer;
  std::vector<float> h;
  int64_t size() const { return int64_t(pos.size()); }
  int64_t bytes() const { return int64_t(h.size() * sizeof(float) + pos.size() * 8); }
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

  int64_t n_cached() const { return kv_.empty() ? 0 : kv_[0].n; }
  int64_t n_ctx() const { return n_ctx_; }
  void reset();
  int64_t kv_bytes() const;       // allocated
  int64_t kv_bytes_used() const;  // held by the tokens cached at each layer
  const LayerKV& layer_kv(int l) const { return kv_[size_t(l)]; }
  const AuxCache& aux() const { return aux_; }

 private:
  const Model& m_;
  int64_t n_ctx_;
  std::vector<LayerKV> kv_;  // [L]
  AuxCache aux_;
  Gemm gemm_;
  // Scratch, grown on demand: x [T][D], xn [T][D], qkv [T][(H+2Hkv)Dh], attn [T][H Dh],
  // ff [T][2F], act [T][F], tmp [T][D].
  Buffer<float> x_, xn_, qkv_, attn_, ff_, act_, tmp_;
};

// Peak resident set size of this process so far, in MiB.
double peak_rss_mib();

}  // namespace lp
