// Synthetic traces: the counts a policy's run would record, made from a schedule without running
// a model, so the simulator can cost prompt lengths and models nobody ran. Assumptions
// (docs/simulator.md):
//   - Prefill: exactly the engine's counts. At each pruning layer tokens_kept() of the active
//     tokens stay; a layer's queries and keys are its active tokens; its causal pairs are
//     T_l (T_l + 1) / 2 whichever tokens were kept (pairs within a set depend only on its size);
//     pruned tokens are written to the Aux Cache once.
//   - Decoding: every step re-selects with the same shares from all tokens (static keeps the
//     prefill's set plus the new tokens), the new token runs through every layer and attends to
//     the step's active set, and `revival_share` of the tokens active after each pruning layer
//     are revived there (0 by default: the steady state, when the selected tokens already have
//     K/V). Measured traces replace this guess where they exist.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "traces/schedule.h"
#include "traces/trace.h"

namespace lp::trace {

// policy: none | lazyllm | static | random. Throws lp::Error for a bad argument.
Trace synthetic_trace(const ModelConfig& c, const std::string& policy, const std::vector<PruneStep>& steps,
                      int64_t prompt_tokens, int64_t new_tokens, double revival_share = 0);

}  // namespace lp::trace
