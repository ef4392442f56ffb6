#include "engine/batch.h"

#include <algorithm>
#include <vector>

#include "model/error.h"

namespace lp {

void run_layers(std::span<const BatchMember> ms, const LayerHooks& hooks) {
  if (ms.empty()) return;
  const ModelConfig& c = ms[0].session->model().config();
  std::vector<Backend*> bes;
  for (const BatchMember& m : ms) {
    if (&m.session->model() != &ms[0].session->model()) internal_fail("a batch mixes models");
    bes.push_back(&m.session->backend());
  }
  Backend& lead = *bes[0];
  const bool alone = ms.size() == 1;
  // Each member's own part of the layer: attention and the pruning steps' scoring, which read each
  // member's K/V, side by side (Backend::for_each_member); the row ops in turn, as they take less
  // than a task's start.
  using Part = void (Session::*)(Session::Pass&, int);
  const auto in_turn = [&](Part part, int l) {
    for (const BatchMember& m : ms) (m.session->*part)(*m.pass, l);
  };
  const auto side_by_side = [&](Part part, int l) {
    if (alone) return (ms[0].session->*part)(*ms[0].pass, l);
    lead.for_each_member(int64_t(ms.size()),
                         [&](int64_t i) { (ms[size_t(i)].session->*part)(*ms[size_t(i)].pass, l); });
  };
  const auto gemm = [&](Proj p, int l) {
    if (alone) return ms[0].session->matmul(*ms[0].pass, p, l);
    lead.matmul_batched(p, l, bes);
  };
  // A row op: each member's own, timed, when one is alone or timed (the timers' synchronisations
  // cost more than the launches saved); else one call over every member's rows.
  bool timed = false;
  for (const BatchMember& m : ms) timed = timed || m.pass->timers;
  const auto row = [&](RowOp op, int l) {
    if (alone || timed) {
      for (const BatchMember& m : ms) m.session->row_op(*m.pass, op, l);
      return;
    }
    lead.rows_batched(op, l, bes);
  };
  for (int l = 0; l < c.n_layer; ++l) {
    in_turn(&Session::revive, l);
    for (const BatchMember& m : ms) m.session->rows_in(*m.pass);
    row(RowOp::AttnNorm, l);
    gemm(Proj::QKV, l);
    if (c.qk_norm) row(RowOp::QkNorm, l);
    row(RowOp::Rope, l);
    if (hooks.before_attention) hooks.before_attention(l);
    in_turn(&Session::index_kv, l);
    lead.kv_append_batched(l, bes);  // untimed: the Attention op's bytes count this write
    if (alone || timed) {
      side_by_side(&Session::attend, l);
    } else {  // each member's key set, then one call over all of them
      in_turn(&Session::attention_keys, l);
      std::vector<std::span<const int32_t>> slots;
      std::vector<char> scored;
      for (const BatchMember& m : ms) {
        slots.push_back(m.session->attention_slots());
        scored.push_back(char(m.session->scored(*m.pass, l)));
      }
      lead.attention_batched(l, bes, slots, scored);
    }
    if (hooks.after_attention) hooks.after_attention(l);
    gemm(Proj::O, l);
    if (c.post_norms) row(RowOp::PostAttnNorm, l);
    row(RowOp::Residual, l);
    row(RowOp::FfnNorm, l);
    if (c.moe()) {
      if (alone || timed) {
        in_turn(&Session::route, l);
      } else {  // every member's routes queued, then one wait for all of them
        lead.route_batched(l, bes);
        in_turn(&Session::routed, l);
      }
      if (alone)
        ms[0].session->experts(*ms[0].pass, l);
      else
        lead.experts_batched(l, bes);
    } else {
      gemm(Proj::GateUp, l);
      row(RowOp::Act, l);
      gemm(Proj::Down, l);
    }
    if (c.post_norms) row(RowOp::PostFfnNorm, l);
    row(RowOp::Residual, l);
    // The members' selections queued first: the first member's end_layer waits for all of them.
    if (!alone) in_turn(&Session::queue_selection, l);
    side_by_side(&Session::end_layer, l);
  }
}

void run_batch(std::span<const BatchMember> ms) {
  if (ms.empty()) return;
  run_layers(ms);
  const ModelConfig& c = ms[0].session->model().config();
  // The LM head once over every member's rows that get logits.
  std::vector<Backend*> heads;
  std::vector<const BatchMember*> with_logits;
  int64_t total = 0;
  for (const BatchMember& m : ms)
    if (const int64_t R = m.session->head(*m.pass); R > 0) {
      heads.push_back(&m.session->backend());
      with_logits.push_back(&m);
      total += R;
    }
  if (heads.empty()) return;
  if (heads.size() == 1)
    return with_logits[0]->session->lm_head(*with_logits[0]->pass, with_logits[0]->logits);
  const int64_t V = c.n_vocab;
  std::vector<float> logits(size_t(total * V));
  heads[0]->lm_head_batched(heads, logits.data(), V);
  const float* src = logits.data();
  for (size_t i = 0; i < heads.size(); ++i) {
    const int64_t n = heads[i]->rows() * V;
    std::copy_n(src, n, with_logits[i]->logits);
    src += n;
  }
}

}  // namespace lp
