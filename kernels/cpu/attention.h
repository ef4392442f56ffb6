// Attention on the CPU: causal GQA attention over a key set of a layer's K/V, flash-style (an
// online softmax; nothing T x T stored; the causal mask a prefix length when the set is the held
// slots in position order, else a mask over the held slots read as they lie, gather-free),
// and LazyLLM's last-row importance scores. AVX-512 and AVX2 microkernels with a portable path.
// Scalar twins: ref::attention and ref::last_row_scores (kernels/cpu/ref.h).
#pragma once

#include <cstdint>

#include "kernels/context.h"
#include "kernels/cpu/kv_cache.h"

namespace lp {

// Causal GQA attention of T queries q [T][H*Dh] (row stride ldq) at positions q_pos over the
// keys of `keys` with position <= the query's; writes out [T][H*Dh] (row stride ldo). Logits are
// scaled by `scale` (0: 1/sqrt(Dh)); window > 0 also hides keys window or more positions before the
// query (a sliding-window layer: Gemma 3's local layers). last_row_logits, if given [H][keys.kv.n]:
// the last row's scaled logits per held slot, -inf for a slot it does not see (outside the set or its
// window), for last_row_scores_from_logits: LazyLLM's scores without reading the keys again.
void attention(CpuContext& ctx, const float* q, int64_t ldq, const int32_t* q_pos, int64_t T,
               const KeySet& keys, int64_t H, float* out, int64_t ldo, float scale = 0, int32_t window = 0,
               float* last_row_logits = nullptr);

// LazyLLM importance scores: scores[i] = mean over the H query heads of softmax_i(q . K^T /
// sqrt(Dh)) for one query row q [H*Dh] (the last token) over the keys of `keys` (all of them:
// the scoring row is the newest token). One extra query row: H * n * Dh multiply-adds; the full
// probability matrix is never formed.
// scale as attention's; with window > 0 the keys the query at q_pos does not see score 0.
void last_row_scores(const float* q, const KeySet& keys, int64_t H, float* scores, float scale = 0,
                     int32_t q_pos = 0, int32_t window = 0);
// The same scores from the logits attention() left for the last row over the same key set (the
// last row the newest token, as a scoring row is): the same logits, so the same scores.
void last_row_scores_from_logits(const float* logits, const KeySet& keys, int64_t H, float* scores);

}  // namespace lp
