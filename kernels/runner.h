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

class Session {
 public:
  // n_ctx: the most tokens this session will hold (prompt + generated).
  Session(const Model& m, int64_t n_ctx);

  // Runs tokens ids[T] at positions pos[T] (ascending, after every position already cached)
  // through all layers, appending their K/V. Writes logits [R][V] for the rows listed in
  // logit_rows (indices into ids) to `logits`. Throws lp::Error on a bad id or a full cache.
  void forward(CpuContext& ctx, std::span<const int32_t> ids, std::span<const int32_t> pos,
               std::span<const int64_t> logit_rows, float* logits, OpTimers* timers = nullptr);

  int64_t n_cached() const { return kv_.empty() ? 0 : kv_[0].n; }
  int64_t n_ctx() const { return n_ctx_; }
  void reset();
  int64_t kv_bytes() const;

 private:
  const Model& m_;
  int64_t n_ctx_;
  std::vector<LayerKV> kv_;  // [L]
  Gemm gemm_;
  // Scratch, grown on demand: x [T][D], xn [T][D], qkv [T][(H+2Hkv)Dh], attn [T][H Dh],
  // ff [T][2F], act [T][F], tmp [T][D].
  Buffer<float> x_, xn_, qkv_, attn_, ff_, act_, tmp_;
};

// Peak resident set size of this process so far, in MiB.
double peak_rss_mib();

}  // namespace lp
