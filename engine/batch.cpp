#include "engine/batch.h"

#include <algorithm>
#include <vector>

#include "model/error.h"

namespace lp {

void run_batch(std::span<const BatchMember> ms) {
  if (ms.empty()) return;
  const ModelConfig& c = ms[0].session->model().config();
  std::vector<Backend*> bes;
  for (const BatchMember& m : ms) {
    if (&m.session->model() != &ms[0].session->model()) fail("internal error: a batch mixes models");
    bes.push_back(&m.session->backend());
  }
  Backend& lead = *bes[0];
  for (int l = 0; l < c.n_layer; ++l) {
    for (const BatchMember& m : ms) m.session->before_layer(*m.pass, l);
    lead.matmul_batched(Proj::QKV, l, bes);
    for (const BatchMember& m : ms) m.session->attend(*m.pass, l);
    lead.matmul_batched(Proj::O, l, bes);
    for (const BatchMember& m : ms) m.session->mlp_in(*m.pass, l);
    lead.matmul_batched(Proj::GateUp, l, bes);
    for (const BatchMember& m : ms) m.session->mlp_act(*m.pass, l);
    lead.matmul_batched(Proj::Down, l, bes);
    for (const BatchMember& m : ms) m.session->after_layer(*m.pass, l);
  }
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
