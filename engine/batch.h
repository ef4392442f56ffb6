// One iteration of continuous batching (iteration-level scheduling, as Orca and vLLM run it): the
// forward passes of several sessions, prefills and decoding steps alike, run layer by layer
// together. Each GEMM runs once over the rows of every member (Backend::matmul_batched), so
// decoding rows stop being one GEMV per request; attention, pruning, revival and the K/V and
// Aux Cache stay each session's own, over its own key set. A member's numbers are those of its
// pass run alone wherever a GEMM row does not depend on the other rows (the int8 kernels, whose
// activations are quantized per row: `Batch.GreedyOutputIsTheSameAloneOrBatched`).
#pragma once

#include <functional>
#include <span>

#include "engine/session.h"

namespace lp {

struct BatchMember {
  Session* session = nullptr;
  Session::Pass* pass = nullptr;  // begun (Session::begin_forward / begin_decode), not yet run
  float* logits = nullptr;        // [rows that get logits][V], as forward / decode_step write them
  // Not null: the member samples greedily without log-probabilities, and needs only its rows' greedy
  // tokens (lp::argmax of each row's logits, one int a row that gets logits), written here; its logits
  // may not be (Backend::lm_head_greedy: a GPU keeps them).
  int32_t* greedy = nullptr;
};

// What a pass adds around a layer's attention, given the layer (KV-Runahead: the earlier ranks'
// K/V taken in before it, the grown prefix handed on after it).
struct LayerHooks {
  std::function<void(int l)> before_attention, after_attention;
};

// The layers of the members' passes (begun, not yet run), in the one order a layer's parts run
// (Session::Pass): each GEMM once over every member's rows (alone: the member's own, timed),
// attention and the end of the layer (pruning, re-selection) side by side, the row ops in turn.
void run_layers(std::span<const BatchMember> members, const LayerHooks& hooks = {});
inline void run_layers(const BatchMember& alone, const LayerHooks& hooks = {}) {
  run_layers(std::span<const BatchMember>(&alone, 1), hooks);
}

// Runs the members' passes to the end. Their sessions' backends must share one model's weights
// (the same backend factory). Throws lp::Error as the passes alone would.
void run_batch(std::span<const BatchMember> members);

}  // namespace lp
