// The CPU backend: the layer ops of kernels/backend.h over the fast CPU kernels (oneDNN GEMMs in
// kernels/cpu/gemm.h, AVX-512/AVX2 row ops in elementwise.h, attention in attention.h) in a CpuContext's
// threads, on the weights as loaded (kernels/weights.h), with its K/V cache in LayerKV and the Aux Cache's
// states in host memory.
#pragma once

#include <algorithm>
#include <memory>
#include <span>

#include "kernels/backend.h"
#include "kernels/context.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kv_cache.h"
#include "kernels/cpu/moe.h"
#include "kernels/weights.h"
#include "model/config.h"

namespace lp {

class CpuBackend : public Backend {
 public:
  // Borrows the context, config and weights (they outlive the backend); K/V for n_ctx tokens.
  CpuBackend(CpuContext& ctx, const ModelConfig& c, const Weights& w, int64_t n_ctx);

  int64_t capacity() const override { return n_ctx_; }
  int kv_element_bytes() const override { return kv_type_bytes(kv_.front().type); }
  int64_t kv_block() const override { return kKeyBlock; }
  void kv_export(int layer, int64_t n, std::span<std::byte> out) override;
  void kv_import(int layer, std::span<const int32_t> pos, std::span<const std::byte> rows) override;
  bool copies_state() const override { return true; }
  void kv_read(int layer, std::span<const int32_t> slots, std::span<std::byte> out) override;
  void aux_load(std::span<const int64_t> entries, std::span<const float> states) override;
  void set_rows(std::span<const int32_t> pos) override;
  void embed(std::span<const int32_t> ids) override;
  void rmsnorm(Norm n, int layer) override;
  void post_norm(Norm n, int layer) override;
  void matmul(Proj p, int layer) override;
  void qk_norm(int layer) override;
  void rope(int layer) override;
  void kv_append(int layer) override;
  void attention(int layer, std::span<const int32_t> slots, bool scored) override;
  void swiglu() override;
  void route(int layer) override;
  void experts(int layer) override;
  std::vector<int32_t> routes() override { return routes_.ids; }
  void residual() override;
  void last_row_scores(int layer, std::span<const int32_t> slots) override;
  std::vector<float> scores(int64_t n) override;
  std::vector<int64_t> select_top(std::span<const int32_t> pos, int64_t n_keep) override;
  void gather_rows(std::span<const int64_t> rows) override;
  void aux_store(std::span<const int64_t> rows, std::span<const int64_t> entries) override;
  void merge_rows(const RowMerge& m, int64_t n_rows) override;
  void lm_head(float* logits) override;
  // One GEMM over the members' rows (CpuBackends over the same weights; lp::Error otherwise).
  void matmul_batched(Proj p, int layer, std::span<Backend* const> members) override;
  void experts_batched(int layer, std::span<Backend* const> members) override;
  void lm_head_batched(std::span<Backend* const> members, float* logits, int64_t n_vocab) override;
  // The members across the context's threads (CpuContext::side_by_side).
  void for_each_member(int64_t n, const std::function<void(int64_t)>& f) override;
  void release_activations(int64_t rows) override;
  int64_t rows() const override { return T(); }
  void write(Tensor t, std::span<const float> data) override;
  std::vector<float> read(Tensor t) override;
  void reset() override;
  std::vector<int32_t> kv_positions(int layer) override;
  std::vector<float> aux_state(int64_t entry) override;

 private:
  CpuContext& ctx_;
  const ModelConfig& c_;
  const Weights& w_;
  int64_t n_ctx_;
  int64_t D_, H_, Hkv_, Dh_, F_, QKV_, Q_;  // widths (ModelConfig)
  std::vector<LayerKV> kv_;                 // [L]
  std::vector<float> aux_;                  // [entries][D]
  std::vector<int32_t> pos_;                // [T] the rows' positions
  RopeTable rope_, rope_local_;             // for pos_: global layers', sliding-window layers' (Gemma 3)
  std::vector<float> scores_;               // [n] of the last last_row_scores
  // The last row's logits from a scored attention (kernels/cpu/attention.h), [H][held slots], kept
  // for last_row_scores of the same layer and keys. Anything that changes the rows or a cache
  // forgets them (a stale copy would score the wrong keys).
  struct LastRowLogits {
    std::vector<float> values;
    std::vector<int32_t> slots;
    int layer = -1;  // -1: none
    void forget() { layer = -1; }
    float* keep(int l, std::span<const int32_t> s, int64_t n) {
      values.resize(size_t(n));
      slots.assign(s.begin(), s.end());
      layer = l;
      return values.data();
    }
    bool for_keys(int l, std::span<const int32_t> s) const {
      return layer == l && std::equal(s.begin(), s.end(), slots.begin(), slots.end());
    }
  };
  LastRowLogits logits_;
  Gemm gemm_;
  // Activations, grown on demand (kernels/backend.h): x, xn, qkv, attn, ff, act, branch, and tmp
  // for row moves.
  Buffer<float> x_, xn_, qkv_, attn_, ff_, act_, branch_, tmp_;
  Buffer<float> batch_in_, batch_out_;  // matmul_batched: the members' rows, concatenated
  MoeRoutes routes_;                    // the rows' experts (route)
  Buffer<float> router_logits_;
  MoeScratch moe_;          // experts' scratch
  MoeRoutes batch_routes_;  // experts_batched: the members' routes, concatenated
  int64_t rows_cap_ = 0;
  int64_t T() const { return int64_t(pos_.size()); }
  Buffer<float>& tensor(Tensor t);
  void grow(int64_t T);
  void allocate_rows(int64_t T);  // every activation for T rows (x's rows kept)
  // Members as CpuBackends over this one's weights, and their total rows.
  std::vector<CpuBackend*> members_of(std::span<Backend* const> members, int64_t* total) const;
  void add_qkv_bias(int layer);  // the layer's Q/K/V biases onto qkv, where the model has them
};

}  // namespace lp
