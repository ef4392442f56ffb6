// The serving simulation's inputs (sim/serving.h): requests as they arrive, drawn from length
// distributions and arrival processes, or read from a CSV or a `serve --log-requests` file.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace lp::sim {

// One request as it arrives.
struct ServingRequest {
  double arrival_s = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  // The prefix cache (ServingConfig::prefix_cache): the request's first shared_tokens are those of
  // every request of its group (a shared document or system prompt; group -1: none), the rest its
  // own; or, replaying a measured run, the tokens its prompt found cached (-1: not given), taken
  // as they are.
  int64_t shared_group = -1, shared_tokens = 0;
  int64_t cached_tokens = -1;
  // Decoding only (a disaggregated deployment's decode instance): its prompt's K/V was handed over
  // from a prefill instance, which gave its first token; it decodes its other output tokens.
  bool prefilled = false;
};

// A length distribution: fixed N, uniform over [lo, hi], normal (rounded, clamped to [lo, hi] =
// [1, mean + 6 sd]: genai-perf's and AIPerf's --synthetic-input-tokens-mean/-stddev), or drawn
// from a list (a file's lengths: a ShareGPT-like empirical distribution).
struct LengthDist {
  enum class Kind { Fixed, Uniform, Normal, Samples } kind = Kind::Fixed;
  int64_t lo = 1, hi = 1;
  double mean = 0, sd = 0;  // Normal
  std::vector<int64_t> samples;
  // "N", "LO:HI", "normal:MEAN:SD" or "file:PATH" (one positive whole number a line, or the
  // prompt_tokens / output_tokens column named by `column` of a CSV or a serve --log-requests
  // file). Throws lp::Error naming `what` and the problem.
  static LengthDist parse(const std::string& s, const std::string& what, const std::string& column);
  // Lengths drawn uniformly from `samples` (not empty, each in [1, 2^24]; unchecked here).
  static LengthDist from_samples(std::vector<int64_t> samples);
  std::string describe() const;
  int64_t max() const;
};

// Arrivals: Poisson at `rate` requests/s, or gamma-distributed gaps of mean 1 / rate and
// coefficient of variation `cv` (1 is Poisson; above 1, burstier).
struct Arrivals {
  double rate = 1;
  double cv = 1;
};

// n requests, seeded: the gaps are drawn once as unit-mean variates and divided by the rate, so
// the same seed at a higher rate gives the same requests, each arriving earlier in proportion
// (common random numbers: a capacity search compares rates on the same draws). Boost.Random's
// generators and distributions, so the draws are the same on every platform.
std::vector<ServingRequest> make_workload(int64_t n, const Arrivals& a, const LengthDist& prompt,
                                          const LengthDist& output, uint64_t seed);
// A shared-prefix workload: request i's prompt gains a first part of `tokens` shared with every
// request of group i mod `groups` (a document many questions ask about, or a system prompt).
void share_prefixes(std::vector<ServingRequest>& reqs, int64_t tokens, int64_t groups);
// "TOKENS:GROUPS", both whole numbers from 1 (tokens at most 2^24); lp::UsageError naming `what`.
std::pair<int64_t, int64_t> parse_shared_prefix(const std::string& s, const std::string& what);
// The same requests at `rate` (scaling a workload made at rate 1); an infinite rate sends them all
// at 0 (an offline batch, or clients that send as fast as they can: ServingConfig::clients).
std::vector<ServingRequest> at_rate(std::span<const ServingRequest> unit, double rate);

// One line of a `serve --log-requests` file: its times (seconds since the server started; NaN where
// the line has none), counts, and whether it ended in an error.
struct LoggedRequest {
  double arrival_s = 0, admitted_s = 0, first_token_s = 0, finished_s = 0;
  int64_t prompt_tokens = 0, output_tokens = 0, revivals = 0;
  int64_t cached_tokens = -1;  // the prompt's prefix found in the prefix cache (-1: not logged)
  bool error = false;
  int64_t line = 0;  // in the file, for messages
};
// Every line of a request log, sorted by arrival (the server writes them as requests finish).
// Throws lp::Error naming the file, line and problem: not a JSON object, no number arrival_s,
// prompt_tokens or output_tokens, a negative or non-finite arrival, counts that are not whole.
std::vector<LoggedRequest> read_request_log(const std::string& path);

// Requests from a file: a CSV with a header naming arrival_s, prompt_tokens and output_tokens (any
// order, other columns ignored) whose arrival times are sorted and non-negative; or a `serve
// --log-requests` file (JSON lines, written as requests finish, so sorted here by arrival_s; its
// requests that ended in an error are left out). Throws lp::Error naming the file, line and
// problem.
std::vector<ServingRequest> read_requests(const std::string& path);

}  // namespace lp::sim
