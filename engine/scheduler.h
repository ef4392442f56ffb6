// Continuous batching's scheduler (iteration-level, as Orca and vLLM schedule): requests wait in a
// FIFO queue until their K/V fits the budget, then every iteration runs one batch (engine/batch.h)
// holding the decoding row of each running request and the whole prefills of newly admitted ones,
// under a token budget per iteration. LazyLLM (or any policy) is chosen per request and runs in
// its own session: its selection, Aux Cache, revival and the at-most-once rule are per request.
//
// Admission and reservations are the serving policy the simulator replays too
// (admission/admission.h): each request reserves its worst case (K/V for prompt + max_tokens
// tokens at every layer, in the backend's own layout, plus with pruning the Aux Cache's worst
// case), first come first served. A pruned prefill holds less K/V than that, but a later decoding
// step may revive any pruned token at any layer, growing it back to the unpruned size; admitting
// against the K/V in use would then overrun the budget (docs/serving.md). So pruning admits no
// more requests than no pruning does; what it saves is time, and the K/V it does not hold shows in
// kv_bytes_in_use() against kv_bytes_reserved().
//
// Not thread-safe except where said: submit() and cancel() may be called from any thread, every
// other member from the one thread that runs step().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "admission/admission.h"
#include "engine/generate.h"
#include "engine/prefix_cache.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "pruning/policy.h"
#include "pruning/schedule.h"

namespace lp {

// Why a request ended.
enum class Finish { Length, Stop, Cancelled, Error };
const char* finish_name(Finish f);  // "length", "stop", "cancelled", "error"

// What a finished request did: the record `serve --log-requests` writes.
struct RequestRecord {
  using Time = std::chrono::steady_clock::time_point;
  uint64_t id = 0;
  Time arrival, admitted, first_token, finished;
  int64_t prompt_tokens = 0, output_tokens = 0;
  Finish finish = Finish::Length;
  std::string error;  // Finish::Error: what went wrong
  // Finish::Error because the GPU failed (lp::DeviceError), not because of the request: a server
  // answers 503 (try again, elsewhere) where an engine failure is a 500.
  bool device_error = false;
  PolicyKind policy = PolicyKind::None;
  std::string schedule;                        // as given (Schedule::to_string), "none" without pruning
  double prompt_tokens_computed_fraction = 1;  // share of the prompt's (token, layer) pairs computed
  int64_t revivals = 0;
  int64_t kv_bytes_after_prefill = 0;
  int64_t aux_cache_bytes = 0;
  int64_t cached_tokens = 0;  // the prompt's prefix copied from the prefix cache, not computed
};

// A generated token's log-probability under the model and the most likely alternatives, from the
// logits before sampling's temperature and top-p (vLLM's default: the model's distribution).
struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the top_logprobs most likely, most likely first
};

// The log-probabilities of `token` and of the k most likely tokens (ties to the lower id) from a
// row of logits: log-softmax in double precision.
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int k);

// Logits a prompt's log-probabilities may take at once (prompt tokens x vocabulary): 256 MiB.
inline constexpr int64_t kMaxPromptLogits = int64_t(64) << 20;

struct RequestParams {
  std::vector<int32_t> prompt;  // token ids, not empty
  int64_t max_tokens = 16;      // >= 1
  SamplerParams sampler;
  bool stop_at_end_of_generation = true;
  PolicyKind policy = PolicyKind::None;
  Schedule schedule = default_schedule();
  uint64_t prune_seed = 0;
  // Called on the step() thread with each generated token; return false to stop the request
  // there (a stop string matched, or the client left: Finish::Stop; see cancel() for the other).
  std::function<bool(int32_t token)> on_token;
  // Called once on the step() thread when the request leaves, its K/V already freed.
  std::function<void(const RequestRecord&)> on_finish;
  // >= 0: each generated token's log-probability and this many alternatives (at most 20) go to
  // on_logprobs, on the step() thread just before on_token gets the token.
  int top_logprobs = -1;
  std::function<void(const TokenLogprobs&)> on_logprobs;
  // The prompt's own log-probabilities (OpenAI's echo, what lm-eval's loglikelihood reads): each
  // prompt token after the first given the ones before it, with max(top_logprobs, 0) alternatives,
  // to on_prompt_logprobs after the prefill, before the first token. The prefill then computes
  // every prompt token and writes every row's logits (prompt x vocabulary floats, bounded by
  // kMaxPromptLogits, and counted in the request's reservation against the K/V budget): not with
  // pruning, and past the prefix cache.
  bool prompt_logprobs = false;
  std::function<void(std::span<const TokenLogprobs>)> on_prompt_logprobs;
};

struct SchedulerOptions {
  int64_t max_batch_tokens = 2048;  // rows per iteration: decoding rows + prefill tokens
  int64_t kv_budget_bytes = int64_t(1) << 30;
  // The most prompt + max_tokens a request may hold (serve --max-model-len); 0: the model's context.
  int64_t max_request_tokens = 0;
  // The prefix cache (engine/prefix_cache.h): blocks of this many tokens, held inside the K/V
  // budget beside the reservations and evicted least recently used when a request or a newer
  // block needs the room. Off: every prompt computed in full. On a backend that cannot copy its
  // state (Backend::copies_state) it is off whatever this says.
  bool prefix_cache = true;
  int64_t prefix_block_tokens = 16;
  // > 0: the cache holds at most this many bytes, whatever room the budget leaves. Its blocks live
  // in host memory: on a GPU, whose budget is the device's (tens of GiB), serve caps them
  // (--prefix-cache-mib).
  int64_t prefix_cache_max_bytes = 0;
  // Makes a request's backend for a capacity of n_ctx tokens. The scheduler makes one of capacity
  // 1 as it starts, to read the K/V layout reservations count in (Backend::kv_element_bytes,
  // Backend::kv_block), and holds it until it ends (what the backends share, such as the weights
  // on a GPU, stays loaded between requests).
  BackendFactory make_backend;
};

// The layout a request's reservation counts in on backend b: its K/V element and block, and what
// it holds beside K/V (Backend::held_bytes).
KvLayout kv_layout_of(const Backend& b);

class Scheduler {
 public:
  Scheduler(const Model& m, SchedulerOptions opt);
  ~Scheduler();

  // The reservation a request of this many prompt and new tokens needs (bytes).
  int64_t reservation_bytes(int64_t prompt_tokens, int64_t max_tokens, bool pruning) const;
  const KvLayout& kv_layout() const { return kv_; }

  // Queues a request (any thread). Throws lp::Error, and queues nothing, when it can never run: an
  // empty prompt, a token outside the vocabulary, prompt + max_tokens beyond the model's context,
  // or a reservation over the whole budget.
  // Once the device is lost, lp::DeviceError (lost) saying so.
  uint64_t submit(RequestParams r);
  // Cancels a queued or running request (any thread): it leaves at the next iteration boundary
  // with Finish::Cancelled, its K/V freed. Unknown or finished ids are ignored.
  void cancel(uint64_t id);

  // One iteration: takes in submissions and cancellations, admits from the queue's head what fits,
  // runs the batch, samples, and finishes requests. Returns false when there was nothing to do.
  // A failure at any stage of a request (admission, its prefill or decoding step, the batch,
  // sampling, its on_token callback) finishes that request with Finish::Error, its reason in
  // rec.error, and releases its reservation; the other requests go on (all of the batch's, when
  // the batch itself failed). A failure of the GPU (lp::DeviceError) is marked in rec.device_error;
  // one that loses the device (DeviceError::lost) ends every request, queued and running, and every
  // one submitted after it, with device_error and the reason. Throws only when an on_finish callback
  // threw, after every request has been accounted for.
  bool step();
  // Any thread: whether a GPU failure lost the device (step() ends every request from then on), and
  // what it was (set before device_lost() turns true).
  bool device_lost() const { return lost_.load(std::memory_order_acquire); }
  std::string device_lost_reason() const { return device_lost() ? lost_reason_ : std::string(); }
  // Blocks until a submission or cancellation arrives, or `timeout` passes, or wake() is called.
  void wait_for_work(std::chrono::milliseconds timeout);
  void wake();

  // State, for metrics (step() thread; the counters are plain reads).
  int64_t queued() const { return int64_t(queue_.size()); }
  int64_t running() const { return int64_t(running_.size()); }
  int64_t kv_bytes_reserved() const { return reserved_; }
  // The prefix cache: whether it is on, the bytes and blocks it holds, its counters (tokens looked
  // up and found, blocks evicted).
  bool prefix_cache() const { return bool(cache_); }
  int64_t prefix_cache_bytes() const { return cache_ ? cache_->bytes() : 0; }
  int64_t prefix_cache_blocks() const { return cache_ ? cache_->blocks() : 0; }
  PrefixIndex::Counters prefix_cache_counters() const {
    return cache_ ? cache_->counters() : PrefixIndex::Counters{};
  }
  int64_t kv_bytes_in_use() const;
  int64_t aux_cache_bytes() const;
  int64_t budget_bytes() const { return opt_.kv_budget_bytes; }
  // Cumulative: iterations run, the seconds their batches took (the passes begun and run), and
  // the seconds of the steps that ran them, all told (admission, sampling, the callbacks, finishing
  // requests: the scheduling overhead is the difference). Any thread may read them.
  int64_t iterations() const { return iterations_.load(std::memory_order_relaxed); }
  double busy_seconds() const { return busy_s_.load(std::memory_order_relaxed); }
  double step_seconds() const { return step_s_.load(std::memory_order_relaxed); }
  // Cumulative seconds of the prefix cache's work: hashing prompts and matching blocks, and copying
  // blocks into sessions and out of them (both inside step_seconds).
  double prefix_lookup_seconds() const { return lookup_s_.load(std::memory_order_relaxed); }
  double prefix_copy_seconds() const { return copy_s_.load(std::memory_order_relaxed); }

 private:
  struct Request;
  struct ReleaseFailed {};        // release_rows failed; rec.error says why
  void release_rows(Request& r);  // Backend::release_activations(kHeldRows), failures its own
  const Model& m_;
  SchedulerOptions opt_;
  KvLayout kv_;  // the backends' (the probe's)
  // A backend of capacity 1, made as the scheduler starts and held for its life: it tells the K/V
  // layout, and it keeps what the backends share alive between requests. The CUDA backend's weights
  // stay on the GPU while any backend holds them; without the probe, each request reaching an idle
  // server uploaded them again (16 GB at the 8B shape).
  std::unique_ptr<Backend> probe_;
  std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<std::unique_ptr<Request>> inbox_;
  std::vector<uint64_t> cancels_;
  bool woken_ = false;
  uint64_t next_id_ = 1;
  std::deque<std::unique_ptr<Request>> queue_;
  std::vector<std::unique_ptr<Request>> running_;
  int64_t reserved_ = 0;
  std::optional<PrefixCache> cache_;
  std::atomic<int64_t> iterations_{0};
  std::atomic<double> busy_s_{0}, step_s_{0};  // written by the step() thread only
  std::atomic<double> lookup_s_{0}, copy_s_{0};

  std::vector<std::string> callback_failures_;  // on_finish callbacks that threw, this step
  std::string lost_reason_;                     // written once, before lost_
  std::atomic<bool> lost_{false};

  // The exception in flight (inside a catch block): what it says and whether it is the GPU's
  // (lp::DeviceError); one that lost the device is recorded for every request after it.
  struct Failure {
    std::string what;
    bool device = false;
  };
  Failure caught();
  // A request's failure (inside a catch block): its reason, prefixed, and whether the device failed.
  void failed(Request& r, const std::string& prefix);
  // Once the device is lost: every queued and running request ends with it.
  void end_all_lost();

  // One iteration's steps, in step()'s order (vLLM's Scheduler.schedule, then the model runner).
  void take_inbox();
  void leave_cancelled();  // cancelled requests leave first, queued or running
  void admit();            // the queue's head while it fits (admission/admission.h)
  // The prefix cache: the blocks of r's sequence saved (after its prefill, and as it leaves);
  // a failure there is the cache's, never the request's.
  void save_prefix(Request& r, int64_t room);
  // A pass begun for every running request: the first n_decoding decode a token, the rest (just
  // admitted) prefill. Those whose pass could not begin go to `failed` with rec.error set.
  struct Batch;
  Batch begin_passes(size_t n_decoding);
  // The batch's tokens sampled, emitted and judged: the requests that end, and how.
  std::vector<std::pair<Request*, Finish>> emit(Batch& b, std::chrono::steady_clock::time_point done_at);
  // Frees r's session (its K/V and Aux Cache) and reports it (rec.error already set for Error).
  // An on_finish that throws is caught and kept for throw_callback_failures().
  void finish(std::unique_ptr<Request> r, Finish f);
  // Throws lp::Error naming the on_finish callbacks that threw this step, once the scheduler's
  // state is whole again (every request finished or running, every reservation counted once).
  void throw_callback_failures();
};

}  // namespace lp
