// KV-Runahead (arXiv 2405.05329) in the engine: one prompt's prefill split over P ranks (processes
// on one machine or many), each holding the whole model. Rank p computes the contiguous chunk
// [start, start + tokens) of the prompt at its own positions; at each layer it takes the K/V of
// every earlier token from rank p - 1 before its attention and hands the grown prefix [0, start +
// tokens) on to rank p + 1 after it, so the next rank's wait overlaps this rank's remaining layer
// work. The last rank ends with the whole prompt's K/V and the logits of its last token, and can
// go on decoding as a plain session. The transport is a KvLink: an in-process one in the tests, MPI
// between processes (cli/run_runahead.cpp).
//
// Unpruned, every rank's rows are computed exactly as in one pass over the whole prompt: the same
// GEMM rows (the int8 kernels quantize activations per row), the same keys in the same slot order
// (the prefix arrives before the chunk's own), so the last token's logits are bitwise those of a
// single process (`Runahead.LogitsAreTheSingleProcessOnes`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "engine/session.h"

namespace lp {

// One direction of the link between neighbouring ranks: one message per layer, in layer order.
class KvLink {
 public:
  virtual ~KvLink() = default;
  // Starts sending layer `layer`'s bytes after the previous message on this link is delivered;
  // `bytes` must stay valid until the next send() or finish() returns.
  virtual void send(int layer, std::span<const std::byte> bytes) = 0;
  virtual void finish() = 0;  // waits for the last send
  // Receives layer `layer`'s message into `out`, whose size must be the message's. Throws lp::Error
  // when none comes within the link's bound or the sizes differ.
  virtual void recv(int layer, std::span<std::byte> out) = 0;
};

struct RunaheadPart {
  int rank = 0, ranks = 1;
  int64_t start = 0, tokens = 0;  // this rank's chunk of the prompt
};

struct RunaheadTimes {
  double total_s = 0;     // the pass, to the last rank's logits
  double wait_s = 0;      // blocked in recv, over all layers
  double export_s = 0;    // copying the prefix's K/V out for the next rank
  double sent_bytes = 0;  // K/V handed on
};

// Runs `part` of `prompt` (token ids; positions are their indices) through `s`, which must be
// empty and hold at least start + tokens tokens. `from_prev` is null on rank 0, `to_next` on the
// last rank. The last rank writes the logits [V] of the prompt's last token to `logits`. Throws
// lp::Error for a part outside the prompt or a link failure.
//
// LazyLLM (`prune`, used by the last rank only; docs/runahead.md): only the last rank has the last
// token, whose attention LazyLLM prunes by, so the earlier ranks compute every row of their chunks
// at every layer and send every prefix row on. The last rank prunes as one process would over the
// whole prompt: at each pruning layer the last token's attention scores every active key, the
// received prefix's and its own rows', and the policy keeps its share of all of them; its own rows
// not kept stop there (their states to the Aux Cache, for revival while decoding), and the prefix
// positions not kept are not attended by its later layers: their K/V still arrives, but is taken
// into the cache only after the pass (so the pass's keys stay contiguous), where decoding can
// select them again without recomputing. Where no prefix token is dropped the
// logits are exactly one process's LazyLLM logits; where some are, the prefix tokens kept were
// computed by the earlier ranks over the whole prefix, not over the kept tokens only.
RunaheadTimes runahead_prefill(Session& s, std::span<const int32_t> prompt, const RunaheadPart& part,
                               KvLink* from_prev, KvLink* to_next, float* logits,
                               const PruneRequest* prune = nullptr);

}  // namespace lp
