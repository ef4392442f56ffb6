// The trace: what a run computed, step by step and layer by layer. It is the contract between
// engine/ (whose runs write it, through the CLI) and sim/ (which replays it); it knows
// nothing of either. Format: traces/README.md.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/io.h"

namespace lp::trace {

inline constexpr int kVersion = 1;

// One pruning step of a generation step, in detail (run --trace-detail).
struct Pruning {
  int layer = 0;              // the pruning layer (schedule_layers[i].layer for the step's i-th entry)
  std::vector<int32_t> kept;  // positions kept after the layer, ascending
  // Scores of the tokens active before the selection, in ascending position order (the
  // previous entry's kept, or every token in the context for the first); empty when the policy
  // does not score (random, and static after its first scoring).
  std::vector<float> scores;
};

// The experts a mixture-of-experts layer sent its computed rows to (run --trace-detail).
struct Routes {
  std::vector<int32_t> positions;  // the rows computed at the layer, ascending
  std::vector<int32_t> experts;    // [positions][n_expert_used]: each row's experts, most probable first
};

// Per-layer counts for one generation step (prefill is step 0). Every vector has n_layer entries.
struct Step {
  std::string kind;                 // "prefill" or "decode"
  int64_t new_tokens = 0;           // tokens this step appends (prompt length, then 1)
  std::vector<int64_t> queries;     // tokens computed at the layer
  std::vector<int64_t> keys;        // tokens with K/V at the layer after the step
  std::vector<int64_t> pairs;       // causal (query, key) pairs attended
  std::vector<int64_t> revived;     // tokens revived (recomputed from the Aux Cache) at the layer
  std::vector<int64_t> aux_reads;   // Aux Cache reads at the layer (one per revival)
  std::vector<int64_t> aux_writes;  // tokens pruned after the layer whose hidden state was saved
  // Keys attended at the layer: in a decoding step its active set there (fewer than `keys` once
  // tokens are pruned, and not `pairs` once revived rows add theirs). Optional in a file (traces
  // written before it existed): empty, and readers fall back to min(keys, pairs).
  std::vector<int64_t> attended;
  // Optional detail, written by run --trace-detail (absent otherwise):
  std::optional<std::vector<Pruning>> pruning;  // one entry per schedule_layers entry, in order
  std::optional<std::vector<std::vector<int32_t>>> revived_positions;  // [L] positions revived (decode)
  std::optional<std::vector<Routes>> routes;  // [L] a mixture-of-experts model's routing
};

struct Header {
  int version = kVersion;
  nlohmann::json model;           // ModelConfig fields: n_layer, n_embd, n_head, ...
  std::string policy = "none";    // a policy_name (pruning/policy.h); files' old names read as today's
  std::string schedule = "none";  // inline form
  std::vector<std::pair<int, double>> schedule_layers;  // resolved (layer, share)
  int64_t prompt_tokens = 0;                            // the tokens the model saw
  // random-drop: the prompt's tokens dropped before the model (prompt_tokens + these were given).
  int64_t prompt_tokens_dropped = 0;
  int n_layer = 0;
  std::string dtype, tool_version, git_commit;
  uint64_t seed = 0;
};

struct Trace {
  Header header;
  std::vector<Step> steps;
};

// Writes JSON Lines (a header line, then one line per step) to a temporary file beside `path`
// and renames it into place: a failed write leaves no partial trace. Throws lp::Error.
void write_trace(const Trace& t, const std::string& path);

// A trace file read one step at a time (memory: one step, whatever the file's length), each line
// validated as it is read: the header's names, model and schedule; per step its kind and counts
// against the context (no layer computes, holds or attends more tokens than exist), the optional
// detail; at the end, the step count against the header's `steps` (a truncated trace is refused).
// Throws lp::Error naming the file, line and field.
class TraceReader {
 public:
  explicit TraceReader(const std::string& path);
  const Header& header() const { return header_; }
  // The header's step count, -1 when the file predates it.
  int64_t declared_steps() const { return declared_; }
  // The next step into `out`; false after the last (having checked the count).
  bool next(Step& out);

 private:
  InputLines in_;
  Header header_;
  int64_t declared_ = -1, steps_ = 0, context_ = 0, line_no_ = 1;
};

// Reads and validates a whole trace file (TraceReader), the optional detail included.
Trace read_trace(const std::string& path);

// What `inspect --trace` prints.
struct Summary {
  std::vector<double> prompt_share_per_layer;  // share of prompt tokens computed at each layer (prefill)
  double prompt_tokens_computed_fraction = 1;  // the prefill: over all prompt (token, layer) pairs
  // The paper's "% of prompt tokens computed": prompt (token, layer) pairs computed by the last
  // step, in the prefill or revived while decoding, over all of them.
  double prompt_tokens_computed_fraction_after_generation = 1;
  double all_share = 1;         // all steps: pairs computed / pairs of a dense run
  bool at_most_once = true;     // no layer computed more tokens than exist
  int64_t kv_tokens_final = 0;  // (token, layer) pairs holding K/V at the end
  int64_t aux_writes = 0, revivals = 0;
  bool detail = false;  // the steps carry the optional detail (pruning, revived_positions)
};
Summary summarize(const Trace& t);
// The same a step at a time (a TraceReader's steps), O(layers) memory.
class Summarizer {
 public:
  explicit Summarizer(const Header& h);
  void add(const Step& s);
  Summary finish() const;
  int64_t steps() const { return steps_; }

 private:
  int L_;
  int64_t prompt_tokens_, dropped_, steps_ = 0, tokens_ = 0;
  double all_ = 0, dense_ = 0, prompt_pairs_ = 0, prompt_dense_ = 0;
  std::vector<int64_t> per_layer_;
  Summary s_;
};

// Share of the prompt's (token, layer) pairs the prefill computed: its queries over
// prompt tokens x layers (Summary::prompt_tokens_computed_fraction).
double prompt_computed_fraction(const Trace& t);
// The same from the prefill step alone (its queries over its new tokens x layers).
double prefill_computed_fraction(const Step& prefill, int64_t prompt_tokens, int64_t dropped = 0);

}  // namespace lp::trace
