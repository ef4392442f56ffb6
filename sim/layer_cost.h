// One engine step's ops, costed: what Replayer (sim/replay.h) charges for a step of one trace and
// the serving simulation (sim/serving.h) for an iteration of many requests. A layer's work is the
// sum over the sequences the step runs: GEMMs read their weights once for all rows, attention
// reads each sequence's own keys (so keys add up), and each sequence that scores or selects at a
// pruning layer does so in a call of its own.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "model/ops.h"
#include "sim/cost.h"

namespace lp::sim {

// One layer of a step, summed over its sequences.
struct LayerWork {
  int64_t rows = 0;   // queries computed
  int64_t pairs = 0;  // (query, key) pairs attended
  int64_t keys = 0;   // keys attended
  // The part of rows, pairs and keys that decoding steps bring (their new rows and revived ones),
  // which attention prices apart when the profile gives decoding its own share (CostContext).
  int64_t decode_rows = 0, decode_pairs = 0, decode_keys = 0;
  // The part of those decoding rows whose keys are a listed set (add_decoding), in the same causal
  // counts (listed_rows, listed_pairs, listed_keys) and as the engine computes them: each row over
  // every held key (listed_row_keys, the sum of rows x held per sequence), the held keys read once
  // per sequence (listed_held), in `listed_seqs` calls.
  int64_t listed_rows = 0, listed_pairs = 0, listed_keys = 0, listed_row_keys = 0, listed_held = 0,
          listed_seqs = 0;
  int64_t scorers = 0, score_keys = 0;   // sequences scoring here (LazyLLM) and the keys they score
  int64_t selects = 0, select_keys = 0;  // selections made here and the keys they choose from
  int64_t moved = 0;                     // rows gathered (compacted, saved to or read from the Aux Cache)
  // A MoE layer's routing where a run recorded it (a trace's routes): the distinct experts this GPU
  // runs and the (row, expert) pairs it computes; 0: expected under uniform routing.
  int64_t experts = 0;
  double routed = 0;
};

// One sequence's decoding step at a layer into `w`, `scale` times (a batch of equal sequences):
// `q` rows (its new token and the rows it revives) attending `attended` of the `held` keys of
// the layer's cache in `pairs` causal (query, key) pairs. A set smaller than the cache is a listed
// set, which the engine attends by reading every held key (LayerWork::listed_row_keys), counted
// where `listed` (CostContext::listed_attention_own: where the profile prices it).
inline void add_decoding(LayerWork& w, int64_t q, int64_t held, int64_t attended, int64_t pairs, bool listed,
                         int64_t scale = 1) {
  w.rows += scale * q, w.pairs += scale * pairs, w.keys += scale * attended;
  w.decode_rows += scale * q, w.decode_pairs += scale * pairs, w.decode_keys += scale * attended;
  if (listed && attended < held) {
    w.listed_rows += scale * q, w.listed_pairs += scale * pairs, w.listed_keys += scale * attended;
    w.listed_row_keys += scale * q * held, w.listed_held += scale * held, w.listed_seqs += scale;
  }
}

// Pipeline parallelism (docs/simulator.md "Pipeline parallelism"): the layers in `stages`
// contiguous stages (pipeline_starts), each on its own tp GPUs, a step's rows handed from stage to
// stage over a link of `link_bytes_per_s` with `latency_s` a hand-off. The defaults are one
// 400 Gb/s NIC a GPU (InfiniBand NDR, an HGX node's), the stages being on different nodes.
// `microbatches` > 1 (simulate's prefill): the prompt's rows split into that many chunks of
// consecutive tokens that follow one another through the stages (Replayer: a pruning layer is a
// barrier every chunk must pass before any goes on, since it selects by the last token's scores).
struct Pipeline {
  int stages = 1;
  double link_bytes_per_s = 50e9;
  double latency_s = 5e-6;
  int microbatches = 1;
};
// The first layer of each of `stages` stages over n_layer layers: as equal as they divide, the
// earlier stages one layer more. Throws lp::UsageError for stages < 1 or more stages than layers.
std::vector<int> pipeline_starts(int n_layer, int stages);
// One hand-off between pipeline stages: `bytes` (the rows entering the next stage) over the link.
inline OpCost handoff_cost(const Pipeline& p, double bytes) {
  OpCost r;
  r.calls = 1;
  r.bytes = bytes;
  r.memory_s = bytes / p.link_bytes_per_s;
  r.overhead_s = p.latency_s;
  r.time_s = r.memory_s + r.overhead_s;
  return r;
}

// Ring collectives over `tp` GPUs of `hw` (docs/simulator.md): all-reduce of `bytes`, and
// all-gather of `bytes` in total. Zero for tp 1.
OpCost allreduce_cost(const hw::Profile& hw, int tp, double bytes);
OpCost allgather_cost(const hw::Profile& hw, int tp, double bytes);
// An all-to-all over `gpus` GPUs in which each sends `bytes` spread evenly over the others: the
// share on its own node (max_tp GPUs a node) over the interconnect, the rest over the scale-out
// network, in parallel (the slower sets the time), plus a latency per peer on the node and one
// for the network. Zero for one GPU; lp::UsageError when the GPUs span nodes of a profile without
// a network.
OpCost alltoall_cost(const hw::Profile& hw, int gpus, double bytes);
// The bytes one GPU dispatches to other GPUs' experts for `rows` rows of width D at `elem` bytes:
// each row goes once to every other GPU holding a slice of one of its k experts. The experts are in
// ep groups of gpus / ep GPUs (each expert split over its group's GPUs); a group is hit with
// probability 1 - (1 - 1/ep)^k, and then all its GPUs are (the own group's others included):
// (gpus - 1)(1 - (1 - 1/ep)^k) other GPUs.
inline double dispatch_bytes(const ModelConfig& cfg, int gpus, double rows, double D, double elem) {
  const double ep = std::max(cfg.ep, 1), k = cfg.n_expert_used;
  return rows * double(gpus - 1) * (1 - std::pow(1 - 1 / ep, k)) * D * elem;
}

// Which of a layer's ops cost_layer prices: all of them, only those whose cost depends on the
// rows alone (norms, GEMMs, RoPE, SwiGLU, residuals and their collectives: what a serving
// simulation caches per row count), or the rest (attention, scoring, selection, gathers).
enum class LayerPart { All, RowsOnly, Rest };

// Costs layer work `w` on one GPU's layer shape `cfg` (the model width D for the collectives):
// op(Op, const OpCost&) for each op, comm(const OpCost&) for each tensor-parallel collective.
// Inlined into its callers: the serving simulation calls it for every run of layers of every
// iteration, where a call costs more than the few ops a decoding batch's layer prices.
template <class OpSink, class CommSink>
[[gnu::always_inline]] inline void cost_layer(const CostContext& cc, const hw::Profile& hw, int tp,
                                              const ModelConfig& cfg, double D, const LayerWork& w,
                                              OpSink&& op, CommSink&& comm, LayerPart part = LayerPart::All) {
  if (w.rows <= 0) return;
  const double el = cc.dtypes.elem_bytes;  // activations, the Aux Cache and collectives (the engine's)
  const OpShape rows{w.rows, 0, 0};
  const bool by_rows = part != LayerPart::Rest, rest = part != LayerPart::RowsOnly;
  if (by_rows) {
    op(Op::AttnNorm, op_cost(cc, cfg, Op::AttnNorm, rows));
    op(Op::QKV, op_cost(cc, cfg, Op::QKV, rows));
    if (cfg.qk_norm) op(Op::QKNorm, op_cost(cc, cfg, Op::QKNorm, rows));
    op(Op::Rope, op_cost(cc, cfg, Op::Rope, rows));
  }
  if (rest) {
    // Decoding rows over listed key sets where the profile prices them apart (a call per
    // sequence); the other decoding rows where it gives decoding its own share; the rest in one
    // kernel at attention's share.
    const bool listed = cc.listed_attention_own && w.listed_rows > 0;
    const int64_t l_rows = listed ? w.listed_rows : 0, l_pairs = listed ? w.listed_pairs : 0,
                  l_keys = listed ? w.listed_keys : 0;
    const OpShape all{w.rows - l_rows, w.pairs - l_pairs, w.keys - l_keys};
    // Decoding rows apart where the profile prices them apart, or where latent attention
    // decodes in its own form (OpShape::decoding).
    const OpShape dec{w.decode_rows - l_rows, w.decode_pairs - l_pairs, w.decode_keys - l_keys, 0, true};
    const bool dec_apart = (cc.decode_attention_own || cfg.mla()) && dec.tokens > 0;
    if (!listed && !dec_apart) {
      op(Op::Attention, op_cost(cc, cfg, Op::Attention, all));
    } else {
      OpCost oc = listed ? listed_attention_cost(cc, cfg, w.listed_rows, w.listed_row_keys, w.listed_held,
                                                 w.listed_seqs)
                         : OpCost{};
      if (dec_apart) {
        oc.add(op_cost(cc, cfg, Op::Attention, dec, 1, cc.decode_attention_own));
        if (all.tokens > dec.tokens)
          oc.add(op_cost(
              cc, cfg, Op::Attention,
              {all.tokens - dec.tokens, all.attn_pairs - dec.attn_pairs, all.kv_tokens - dec.kv_tokens}));
      } else if (all.tokens > 0) {
        oc.add(op_cost(cc, cfg, Op::Attention, all));
      }
      op(Op::Attention, oc);
    }
  }
  if (by_rows) {
    op(Op::OProj, op_cost(cc, cfg, Op::OProj, rows));
    comm(allreduce_cost(hw, tp, double(w.rows) * D * el));
    op(Op::Residual, op_cost(cc, cfg, Op::Residual, rows, 2));
    if (cfg.post_norms) op(Op::PostNorm, op_cost(cc, cfg, Op::PostNorm, rows, 2));
    op(Op::FfnNorm, op_cost(cc, cfg, Op::FfnNorm, rows));
    if (cfg.moe()) {  // the experts each run reads: as many as the rows reach at random (expected_experts)
      op(Op::Router, op_cost(cc, cfg, Op::Router, rows));
      // Data-parallel attention: each GPU dispatches its share of the group's rows to the GPUs of
      // their experts and gets their outputs back (combine), all-to-all over every group's GPUs.
      const int gpus = cfg.dp > 1 ? cfg.dp * tp : 1;
      const double own = gpus > 1 ? std::ceil(double(w.rows) / tp) : 0;
      if (gpus > 1) comm(alltoall_cost(hw, gpus, dispatch_bytes(cfg, gpus, own, D, cc.dtypes.act_bytes)));
      op(Op::Experts, op_cost(cc, cfg, Op::Experts, {w.rows, 0, 0, w.experts, false, w.routed}));
      if (gpus > 1) comm(alltoall_cost(hw, gpus, dispatch_bytes(cfg, gpus, own, D, el)));
    } else {
      op(Op::GateUp, op_cost(cc, cfg, Op::GateUp, rows));
      op(Op::SwiGLU, op_cost(cc, cfg, Op::SwiGLU, rows));
      op(Op::Down, op_cost(cc, cfg, Op::Down, rows));
    }
    comm(allreduce_cost(hw, tp, double(w.rows) * D * el));
  }
  if (!rest) return;
  // Calls beyond the first of a summed op: each sequence's own launch overhead.
  const auto more_calls = [&](OpCost oc, Op o, int64_t n) {
    const double extra = double(n - 1) * cc.eff[size_t(op_family(o))].overhead_s;
    oc.calls += n - 1;
    oc.overhead_s += extra;
    oc.time_s += extra;
    return oc;
  };
  if (w.scorers > 0) {
    op(Op::Score, more_calls(op_cost(cc, cfg, Op::Score, {1, 0, w.score_keys}), Op::Score, w.scorers));
    comm(allreduce_cost(hw, tp, double(w.score_keys) * 4));  // each GPU summed its own heads
  }
  if (w.selects > 0) {
    // A stage's fixed cost (synchronisation, the selection's small kernels) rides on each select.
    OpCost oc = more_calls(op_cost(cc, cfg, Op::Select, {0, 0, w.select_keys}), Op::Select, w.selects);
    const double fixed = double(w.selects) * hw.pruning_stage_s + double(w.select_keys) * hw.pruning_key_s;
    oc.overhead_s += fixed;
    oc.time_s += fixed;
    op(Op::Select, oc);
  }
  if (w.moved > 0) op(Op::Gather, op_cost(cc, cfg, Op::Gather, {w.moved, 0, 0}));
}

// The embedding of a step's `new_rows` rows, before its layers.
template <class OpSink, class CommSink>
void cost_embed(const CostContext& cc, const hw::Profile& hw, int tp, const ModelConfig& g, int64_t new_rows,
                double D, OpSink&& op, CommSink&& comm) {
  op(Op::Embed, op_cost(cc, g, Op::Embed, {new_rows, 0, 0}));
  comm(allreduce_cost(hw, tp, double(new_rows) * D * cc.dtypes.elem_bytes));
}
// The final norm and LM head over `logit_rows`, after the layers (the logits of the whole
// vocabulary V gathered).
template <class OpSink, class CommSink>
void cost_head(const CostContext& cc, const hw::Profile& hw, int tp, const ModelConfig& g, int64_t logit_rows,
               double V, OpSink&& op, CommSink&& comm) {
  op(Op::OutputNorm, op_cost(cc, g, Op::OutputNorm, {logit_rows, 0, 0}));
  op(Op::LmHead, op_cost(cc, g, Op::LmHead, {logit_rows, 0, 0}));
  comm(allgather_cost(hw, tp, double(logit_rows) * V * 4));
}

}  // namespace lp::sim
