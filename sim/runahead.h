// KV-Runahead (arXiv 2405.05329) in the simulator: one prompt's prefill split over P ranks (one
// device or process each, every one holding the whole model). Rank p computes the contiguous
// chunk [start_p, start_p + c_p) of the prompt at its own positions; at each layer it needs the
// K/V of every earlier token, which rank p - 1 hands it point to point, and it hands on the grown
// prefix [0, start_p + c_p) to rank p + 1. The last rank's last row gives the first token.
//
// The timeline, per layer l and rank p (docs/simulator.md, "KV-Runahead"):
//
//   pre_p(l)   = done_p(l - 1) + t(norm, QKV, RoPE of c_p rows)       done_p(-1) = t(embed c_p rows)
//   ready_p(l) = max(pre_p(l), arrive_p(l))                           arrive_0(l) = 0
//   done_p(l)  = ready_p(l) + t(attention of c_p rows over start_p + c_p keys) + t(the layer's rest)
//   send_p(l)  = max(ready_p(l), sent_p(l - 1)) + latency + start_{p+1} * kv_bytes_l / bandwidth
//   arrive_{p+1}(l) = send_p(l);  sent_p(l) = send_p(l)          (one link per neighbour pair, in order)
//
// so transfers overlap the compute of the layer they follow, and a rank waits only for the
// prefix's K/V of the layer it is about to attend with. TTFT = done_{P-1}(L - 1) + the final norm
// and LM head of one row on the last rank.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "hwmodels/profile.h"
#include "model/config.h"
#include "pruning/schedule.h"
#include "sim/cost.h"

namespace lp::sim {

// The point-to-point link between neighbouring ranks.
struct RunaheadLink {
  double bandwidth = 0;  // bytes/s, > 0
  double latency_s = 0;  // per message, >= 0
  std::string source;    // where the figures come from, for the output
};
// The link of `hw`: its interconnect (interconnect_bandwidth_gbs x efficiency.interconnect, its
// latency) where it has one; else ranks on one machine through shared memory: a copy reads and
// writes, so half the memory bandwidth, and the profile's dispatch overhead as latency.
RunaheadLink default_link(const hw::Profile& hw);

struct RunaheadRank {
  int64_t start = 0, tokens = 0;  // the chunk
  double done_s = 0;              // its last layer done (the last rank: before the LM head)
  double compute_s = 0;           // its ops' time, summed
  double wait_s = 0;              // waiting for the prefix's K/V, summed over layers
  double sent_bytes = 0;          // K/V it sent on, all layers
  double memory_bytes = 0;        // weights + the K/V it holds at the end + its activations
};

struct RunaheadPrediction {
  std::vector<RunaheadRank> ranks;
  double ttft_s = 0;
  double link_bandwidth = 0, link_latency_s = 0;
};

// LazyLLM on the last rank drops its own rows, the prompt's most recent, less often than the
// prefix's: the last token's attention favours recent tokens. Per token, at this rate times the
// prefix's. Measured: SmolLM2-135M on 4,091 tokens of KJV text, the default schedule, the last
// 1,890 tokens as the last rank's chunk: per stage they were dropped at 0.21, 0.63 and 0.29 times
// the rate of the 2,201 before them (`run --prune lazyllm --trace-detail`'s kept positions); 1/3.
inline constexpr double kRecentDropRate = 1.0 / 3;

// Predicts the prefill of `chunks` (their sum is the prompt; every chunk at least 1) on ranks of
// `hw` each running at `rank_share` of its compute and bandwidth (1: a device each; 1/2: two
// processes sharing one 2-core CPU, one core each). With `last_rank_prune` (resolved steps), the
// last rank prunes as engine/runahead.h does: at each step's layer it keeps tokens_kept of all the
// active tokens, its own rows dropped at kRecentDropRate times the prefix's rate (its later layers
// compute fewer rows over fewer keys); the earlier ranks compute everything. Throws lp::Error for an
// empty partition, a chunk below 1, a share outside (0, 1], a link without bandwidth or a step
// outside the model.
RunaheadPrediction predict_runahead(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                                    std::span<const int64_t> chunks, const RunaheadLink& link,
                                    double rank_share = 1, std::span<const PruneStep> last_rank_prune = {});

// N tokens over P ranks as evenly as the count allows (the first N mod P ranks one more).
std::vector<int64_t> even_partition(int64_t n, int p);
// The paper's context-level load balancing, on this cost model: the partition of N tokens over P
// ranks with the least predicted TTFT. It starts from equal work (each rank's own compute, its
// prefix's attention included, the same: a bisection on that time), then moves each boundary
// between ranks in turn to its best place for the whole timeline, waits and transfers included (a
// golden-section search over the tokens between its neighbours), sweeping until no boundary moves
// TTFT by more than a part in 10^6. (The paper builds a lookup table by a hierarchical grid search
// over measured runs; this searches the cost model.) Deterministic. Throws lp::Error when N < P.
std::vector<int64_t> optimise_partition(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                                        int64_t n, int ranks, const RunaheadLink& link, double rank_share = 1,
                                        std::span<const PruneStep> last_rank_prune = {});

// A --partition argument: "auto", "even" (any case) or chunk sizes "n1,n2,..." that must sum to
// `n` with every chunk at least 1, for `ranks` ranks. Throws lp::UsageError naming the problem.
std::vector<int64_t> parse_partition(const std::string& arg, const ModelConfig& c, const hw::Profile& hw,
                                     const Precision& p, int64_t n, int ranks, const RunaheadLink& link,
                                     double rank_share = 1, std::span<const PruneStep> last_rank_prune = {});

// KV-Runahead over `chunks` beside what else the same devices could do, as `simulate --runahead`
// reports it: the whole prompt on one device (all of it, and one rank's share of it), with
// LazyLLM (`last_rank_prune` not empty) the same pruning on one device and KV-Runahead unpruned
// over `plain_chunks`, and tensor parallelism over as many devices where the profile and the model
// allow it (rank_share 1).
struct RunaheadComparison {
  RunaheadPrediction runahead;
  double single_s = 0, single_share_s = 0;
  double lazy_single_s = 0, plain_s = 0;  // with pruning only
  std::optional<double> tp_s;             // tensor parallelism's TTFT
  std::string tp_refused;                 // why not, where asked (rank_share 1, two ranks or more)
  double most_memory_bytes = 0;           // the fullest rank's
};
RunaheadComparison compare_runahead(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                                    std::span<const int64_t> chunks, std::span<const int64_t> plain_chunks,
                                    const RunaheadLink& link, double rank_share,
                                    std::span<const PruneStep> last_rank_prune);

}  // namespace lp::sim
