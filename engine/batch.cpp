#include "engine/batch.h"

#include <algorithm>
#include <vector>

#include "kernels/argmax.h"
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
  // The parts of the layer that are each member's own (revival, the end of the layer's pruning or
  // re-selection) in turn or side by side (Backend::for_each_member).
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
  // How the members' other parts run. In one launch over all members where the backend batches its
  // launches (a GPU: Backend::rows_batched and the other *_batched calls) and no member is timed;
  // else each member's own calls (timed where it has timers), the row ops in turn, as they take less
  // than a task's start. A batch without such a backend (the CPU) runs each member's attention part
  // whole, side by side (one task per member), unless KV-Runahead's hook goes inside it.
  bool timed = false;
  for (const BatchMember& m : ms) timed = timed || m.pass->timers;
  const bool one_launch = !alone && !timed && lead.launches_batched();
  const bool whole_parts = !alone && !one_launch && !hooks.before_attention;
  const auto row = [&](RowOp op, int l) {
    if (!one_launch) {
      for (const BatchMember& m : ms) m.session->row_op(*m.pass, op, l);
      return;
    }
    lead.rows_batched(op, l, bes);
  };
  // A member's attention part: its q/k norms and RoPE, its (token, layer) pairs recorded, its K/V
  // appended, its attention. The other path runs the same steps, each over all members.
  const auto attention_part = [&](Session& s, Session::Pass& ps, int l) {
    if (c.qk_norm) s.row_op(ps, RowOp::QkNorm, l);
    s.row_op(ps, RowOp::Rope, l);
    s.index_kv(ps, l);
    s.backend().kv_append(l);  // untimed: the Attention op's bytes count this write
    s.attend(ps, l);
  };
  for (int l = 0; l < c.n_layer; ++l) {
    in_turn(&Session::revive, l);
    for (const BatchMember& m : ms) m.session->rows_in(*m.pass);
    row(RowOp::AttnNorm, l);
    gemm(Proj::QKV, l);
    if (whole_parts) {
      lead.for_each_member(int64_t(ms.size()), [&](int64_t i) {
        attention_part(*ms[size_t(i)].session, *ms[size_t(i)].pass, l);
      });
    } else {
      if (c.qk_norm) row(RowOp::QkNorm, l);
      row(RowOp::Rope, l);
      if (hooks.before_attention) hooks.before_attention(l);  // KV-Runahead: earlier ranks' K/V first
      in_turn(&Session::index_kv, l);
      if (one_launch) {
        lead.kv_append_batched(l, bes);
        in_turn(&Session::attention_keys, l);  // each member's key set, then one call over all of them
        std::vector<std::span<const int32_t>> slots;
        std::vector<char> scored;
        for (const BatchMember& m : ms) {
          slots.push_back(m.session->attention_slots());
          scored.push_back(char(m.session->scored(*m.pass, l)));
        }
        lead.attention_batched(l, bes, slots, scored);
      } else {
        for (const BatchMember& m : ms) m.session->backend().kv_append(l);
        side_by_side(&Session::attend, l);
      }
    }
    if (hooks.after_attention) hooks.after_attention(l);
    gemm(Proj::O, l);
    if (c.post_norms) row(RowOp::PostAttnNorm, l);
    row(RowOp::Residual, l);
    row(RowOp::FfnNorm, l);
    if (c.moe()) {
      if (one_launch) {  // every member's routes queued, then one wait for all of them
        lead.route_batched(l, bes);
        in_turn(&Session::routed, l);
      } else {
        in_turn(&Session::route, l);
      }
      if (alone)
        ms[0].session->experts(*ms[0].pass, l);
      else
        lead.experts_batched(l, bes);
    } else {
      // A member with more rows than its backend's FFN chunk (a long prefill) runs its FFN in chunks,
      // so its buffers hold a chunk, not the prompt; the others together (untimed: a timed pass runs
      // the three ops whole, each timed).
      std::vector<Backend*> whole;
      for (Backend* b : bes)
        if (!timed && b->ffn_chunk_rows() > 0 && b->rows() > b->ffn_chunk_rows())
          b->ffn_chunked(l);
        else
          whole.push_back(b);
      if (whole.size() == bes.size()) {
        gemm(Proj::GateUp, l);
        row(RowOp::Act, l);
        gemm(Proj::Down, l);
      } else if (!whole.empty()) {  // untimed, so each member's own calls need no session
        whole[0]->matmul_batched(Proj::GateUp, l, whole);
        if (one_launch)
          lead.rows_batched(RowOp::Act, l, whole);
        else
          for (Backend* b : whole) b->row_op(RowOp::Act, l);
        whole[0]->matmul_batched(Proj::Down, l, whole);
      }
    }
    if (c.post_norms) row(RowOp::PostFfnNorm, l);
    row(RowOp::Residual, l);
    // The members' selections queued first: the first member's end_layer waits for all of them.
    if (one_launch) in_turn(&Session::queue_selection, l);
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
  // (Op timers time the LM head through each member's own.)
  const bool greedy = std::any_of(with_logits.begin(), with_logits.end(),
                                  [](const BatchMember* m) { return m->greedy != nullptr; }) &&
                      std::none_of(with_logits.begin(), with_logits.end(),
                                   [](const BatchMember* m) { return m->pass->timers != nullptr; });
  if (greedy) {  // tokens for the greedy members, logits for the others
    std::vector<float*> outs;
    for (const BatchMember* m : with_logits) outs.push_back(m->greedy ? nullptr : m->logits);
    std::vector<int32_t> ids(static_cast<size_t>(total));
    heads[0]->lm_head_greedy(heads, outs, ids.data(), c.n_vocab);
    const int32_t* id = ids.data();
    for (size_t i = 0; i < heads.size(); ++i) {
      if (with_logits[i]->greedy) std::copy_n(id, heads[i]->rows(), with_logits[i]->greedy);
      id += heads[i]->rows();
    }
  } else if (heads.size() == 1) {
    with_logits[0]->session->lm_head(*with_logits[0]->pass, with_logits[0]->logits);
  } else if (!heads.empty()) {
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
  // A greedy member's tokens from the logits it got (op timers kept the path above that writes them).
  const auto tokens_from_logits = [&](const BatchMember& m) {
    for (int64_t r = 0; r < m.session->backend().rows(); ++r)
      m.greedy[r] = argmax({m.logits + r * c.n_vocab, size_t(c.n_vocab)});
  };
  if (!greedy)
    for (const BatchMember* m : with_logits)
      if (m->greedy) tokens_from_logits(*m);
  // The logits waited for the device: each decoding step's deferred selections are replayed (a member
  // that missed a revival is computed again, alone: its logits are new, and so is a greedy token).
  for (const BatchMember& m : ms)
    if (m.session->settle(*m.pass, m.logits) && m.greedy) tokens_from_logits(m);
}

}  // namespace lp
