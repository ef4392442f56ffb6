#include "engine/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <numeric>

#include "engine/batch.h"
#include "kernels/cpu/backend.h"
#include "model/error.h"
#include "pruning/method.h"

namespace lp {

using Clock = std::chrono::steady_clock;

namespace {

// What the exception in flight says (inside a catch block).
std::string current_error() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// x += s for a counter only the step() thread writes (others may read it).
void add_seconds(std::atomic<double>& x, Clock::time_point from, Clock::time_point to) {
  x.store(x.load(std::memory_order_relaxed) + std::chrono::duration<double>(to - from).count(),
          std::memory_order_relaxed);
}

}  // namespace

const char* finish_name(Finish f) {
  switch (f) {
    case Finish::Length:
      return "length";
    case Finish::Stop:
      return "stop";
    case Finish::Cancelled:
      return "cancelled";
    case Finish::Error:
      return "error";
  }
  return "?";
}

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int k) {
  const int64_t V = int64_t(logits.size());
  if (token < 0 || token >= V) fail("log-probability of token {} of {}", token, V);
  float mx = logits[0];
  for (const float x : logits) mx = std::max(mx, x);
  double sum = 0;
  for (const float x : logits) sum += std::exp(double(x) - double(mx));
  const double lse = double(mx) + std::log(sum);
  TokenLogprobs out;
  out.token = token;
  out.logprob = float(double(logits[size_t(token)]) - lse);
  k = int(std::min<int64_t>(std::max(k, 0), V));
  if (k > 0) {
    std::vector<int32_t> ids(static_cast<size_t>(V));
    std::iota(ids.begin(), ids.end(), 0);
    const auto more_likely = [&](int32_t a, int32_t b) {
      return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
    };
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), more_likely);
    for (int i = 0; i < k; ++i)
      out.top.emplace_back(ids[size_t(i)], float(double(logits[size_t(ids[size_t(i)])]) - lse));
  }
  return out;
}

struct Scheduler::Request {
  uint64_t id = 0;
  RequestParams p;
  RequestRecord rec;
  int64_t reservation = 0;
  bool cancelled = false;
  std::unique_ptr<Session> session;
  std::unique_ptr<PruningPolicy> policy;
  std::vector<PruneStep> steps;
  PruneRequest prune;
  std::optional<Sampler> sampler;
  // Greedy without log-probabilities: the batch brings back the token, not the logits
  // (BatchMember::greedy; on a GPU they stay on the device).
  bool greedy_only = false;
  int32_t greedy_token = 0;
  std::vector<int32_t> generated;  // the last one is fed to the next decoding step
  std::vector<float> logits;
  // The prefix cache: the kind of state this request reads and writes (none: it bypasses the cache),
  // the hit admission found (pinned only inside admit()), and the blocks it loaded or saved.
  std::optional<CacheKind> cache_kind;
  PrefixCache::Hit hit;
  std::vector<PrefixCache::BlockId> lineage;
  trace::Step stats;  // of the pass in flight
  Session::Pass pass;
};

KvLayout kv_layout_of(const Backend& b) {
  const Backend::Held held = b.held_bytes();
  return KvLayout{.element_bytes = double(b.kv_element_bytes()),
                  .block = b.kv_block(),
                  .token_bytes = held.token_bytes,
                  .request_bytes = held.request_bytes,
                  .aux_in_token_bytes = held.aux_in_token_bytes};
}

Scheduler::Scheduler(const Model& m, SchedulerOptions opt) : m_(m), opt_(std::move(opt)) {
  if (opt_.max_batch_tokens < 1)
    fail("an iteration's token budget must be at least 1, got {}", opt_.max_batch_tokens);
  if (opt_.kv_budget_bytes < 1) fail("the K/V budget must be positive");
  if (!opt_.make_backend) internal_fail("the scheduler has no backend factory");
  probe_ = opt_.make_backend(1);
  kv_ = kv_layout_of(*probe_);
  if (opt_.prefix_cache && probe_->copies_state())
    cache_.emplace(m.config().n_layer, m.config().n_embd, opt_.prefix_block_tokens);
}

Scheduler::~Scheduler() = default;

int64_t Scheduler::reservation_bytes(int64_t prompt_tokens, int64_t max_tokens, bool pruning) const {
  return int64_t(lp::reservation_bytes(m_.config(), kv_, prompt_tokens, max_tokens, pruning));
}

uint64_t Scheduler::submit(RequestParams p) {
  if (device_lost()) throw DeviceError("the GPU cannot be used any more: " + lost_reason_, true);
  const ModelConfig& c = m_.config();
  const int64_t T = int64_t(p.prompt.size());
  if (T == 0) fail("the prompt is empty (no tokens)");
  if (p.max_tokens < 1) fail("max_tokens must be at least 1, got {}", p.max_tokens);
  if (p.top_logprobs > 20) fail("top_logprobs must be at most 20, got {}", p.top_logprobs);
  if (p.prompt_logprobs && T * int64_t(c.n_vocab) > kMaxPromptLogits)
    fail("the prompt's log-probabilities over {} tokens need {} MiB of logits, more than {} MiB", T,
         T * int64_t(c.n_vocab) * 4 >> 20, kMaxPromptLogits * 4 >> 20);
  const int64_t ctx = opt_.max_request_tokens > 0 ? std::min<int64_t>(opt_.max_request_tokens, c.n_ctx_train)
                                                  : int64_t(c.n_ctx_train);
  if (p.max_tokens > ctx - T)  // not T + max_tokens: that overflows near 2^63
    fail(
        "the prompt's {} tokens + max_tokens {} exceed {} of {} tokens", T, p.max_tokens,
        ctx < c.n_ctx_train ? "the context a request may hold here (--max-model-len)" : "the model's context",
        ctx);
  for (const int32_t id : p.prompt)
    if (id < 0 || id >= c.n_vocab) fail("token id {} is outside the vocabulary of {}", id, c.n_vocab);
  check_method(p.policy, p.schedule);
  auto r = std::make_unique<Request>();
  const bool drop = p.policy == PolicyKind::RandomDrop;
  if (drop) {  // the model sees a shorter prompt, unpruned
    p.prompt = random_drop_ids(p.prompt, *drop_share(p.schedule), p.prune_seed);
    p.policy = PolicyKind::None;
  }
  const bool pruning = p.policy != PolicyKind::None && !p.schedule.steps.empty();
  if (pruning && p.prompt_logprobs)
    fail("the prompt's log-probabilities need every prompt token computed: not with pruning ({})",
         policy_name(p.policy));
  r->steps = pruning ? resolve_schedule(p.schedule, c.n_layer, c.global_layers()) : std::vector<PruneStep>{};
  r->reservation = reservation_bytes(int64_t(p.prompt.size()), p.max_tokens, pruning);
  // The prompt's log-probabilities hold a logits row a prompt token until the prefill is done: in
  // the reservation, so that requests asking for them are admitted within the budget too.
  if (p.prompt_logprobs) r->reservation += int64_t(p.prompt.size()) * c.n_vocab * int64_t(sizeof(float));
  if (r->reservation > opt_.kv_budget_bytes)
    fail(
        "the prompt's {} tokens + max_tokens {} need {:.1f} MiB of K/V{}, over the whole budget of {:.1f} "
        "MiB",
        T, p.max_tokens, double(r->reservation) / (1 << 20), p.prompt_logprobs ? " and logits" : "",
        double(opt_.kv_budget_bytes) / (1 << 20));
  // Without pruning the cache holds every pair computed; with LazyLLM what it left. The other
  // policies (a static set, random layers) bypass it: their decoding does not revive what a
  // cached prefix lacks as LazyLLM's does (docs/serving.md).
  if (!pruning)
    r->cache_kind = CacheKind::Full;
  else if (p.policy == PolicyKind::LazyLLM)
    r->cache_kind = CacheKind::Pruned;
  r->rec.arrival = Clock::now();
  r->rec.prompt_tokens = T;  // as sent: with random-drop, the computed fraction says how many the model saw
  r->rec.policy = drop ? PolicyKind::RandomDrop : pruning ? p.policy : PolicyKind::None;
  r->rec.schedule = drop || pruning ? p.schedule.to_string() : "none";
  r->p = std::move(p);
  std::lock_guard lk(inbox_mu_);
  r->id = r->rec.id = next_id_++;
  const uint64_t id = r->id;
  inbox_.push_back(std::move(r));
  inbox_cv_.notify_one();
  return id;
}

void Scheduler::cancel(uint64_t id) {
  std::lock_guard lk(inbox_mu_);
  cancels_.push_back(id);
  inbox_cv_.notify_one();
}

void Scheduler::wake() {
  std::lock_guard lk(inbox_mu_);
  woken_ = true;
  inbox_cv_.notify_one();
}

void Scheduler::wait_for_work(std::chrono::milliseconds timeout) {
  std::unique_lock lk(inbox_mu_);
  inbox_cv_.wait_for(lk, timeout, [&] { return !inbox_.empty() || !cancels_.empty() || woken_; });
  woken_ = false;
}

void Scheduler::take_inbox() {
  std::vector<std::unique_ptr<Request>> in;
  std::vector<uint64_t> cancels;
  {
    std::lock_guard lk(inbox_mu_);
    in.swap(inbox_);
    cancels.swap(cancels_);
  }
  for (auto& r : in) queue_.push_back(std::move(r));
  for (const uint64_t id : cancels) {
    for (auto& r : queue_)
      if (r->id == id) r->cancelled = true;
    for (auto& r : running_)
      if (r->id == id) r->cancelled = true;
  }
}

void Scheduler::release_rows(Request& r) {
  try {
    r.session->backend().release_activations(kHeldRows);
  } catch (...) {
    failed(r, "giving back activations");  // a GPU's failure is marked as such (and a lost GPU)
    throw ReleaseFailed{};
  }
}

void Scheduler::save_prefix(Request& r, int64_t room) {
  if (!cache_ || !r.cache_kind || !r.session) return;
  const auto t0 = Clock::now();
  try {
    std::vector<int32_t> seq = r.p.prompt;
    seq.insert(seq.end(), r.generated.begin(), r.generated.end());  // the held ones: Session::n_cached
    if (opt_.prefix_cache_max_bytes > 0) room = std::min(room, opt_.prefix_cache_max_bytes);
    cache_->save(*r.session, seq, *r.cache_kind, r.lineage, room);
    add_seconds(copy_s_, t0, Clock::now());
  } catch (...) {
    // A copy that failed (no memory): the sequence stays uncached, the request goes on.
  }
}

void Scheduler::finish(std::unique_ptr<Request> r, Finish f) {
  if (r->session) reserved_ -= r->reservation;
  // A request that computed its prompt leaves its blocks in the cache (a failed pass's state is
  // unknown: nothing of it is kept).
  if (f != Finish::Error && !r->generated.empty()) save_prefix(*r, opt_.kv_budget_bytes - reserved_);
  r->session.reset();  // the K/V and the Aux Cache go now
  r->rec.finish = f;
  r->rec.finished = Clock::now();
  if (r->rec.first_token == RequestRecord::Time{}) r->rec.first_token = r->rec.finished;
  if (r->rec.admitted == RequestRecord::Time{}) r->rec.admitted = r->rec.finished;
  r->rec.output_tokens = int64_t(r->generated.size());
  if (!r->p.on_finish) return;
  try {  // the request is gone from the scheduler whatever the callback does; the others go on
    r->p.on_finish(r->rec);
  } catch (...) {
    callback_failures_.push_back(fmt::format("request {}'s finish callback: {}", r->id, current_error()));
  }
}

void Scheduler::throw_callback_failures() {
  if (callback_failures_.empty()) return;
  std::string what = callback_failures_.front();
  if (callback_failures_.size() > 1) what += fmt::format(" (and {} more)", callback_failures_.size() - 1);
  callback_failures_.clear();
  throw Error(what);
}

int64_t Scheduler::kv_bytes_in_use() const {
  int64_t b = 0;
  for (const auto& r : running_) b += r->session->kv_bytes_used();
  return b;
}

int64_t Scheduler::aux_cache_bytes() const {
  int64_t b = 0;
  for (const auto& r : running_) b += r->session->aux().bytes();
  return b;
}

void Scheduler::leave_cancelled() {
  for (auto it = queue_.begin(); it != queue_.end();)
    if ((*it)->cancelled) {
      auto r = std::move(*it);
      it = queue_.erase(it);
      finish(std::move(r), Finish::Cancelled);
    } else {
      ++it;
    }
  for (size_t i = 0; i < running_.size();)
    if (running_[i]->cancelled) {
      auto r = std::move(running_[i]);
      running_.erase(running_.begin() + std::ptrdiff_t(i));
      finish(std::move(r), Finish::Cancelled);
    } else {
      ++i;
    }
}

// Admission (admission/admission.h), whole prefills: the queue's head while its reservation fits
// the budget and its prompt the iteration's token budget; the decoding rows are already in it.
void Scheduler::admit() {
  // The cache's blocks count in the budget beside the reservations; a head that does not fit
  // evicts them (least recently used first) before it waits.
  const int64_t cache_bytes = prefix_cache_bytes();
  Admission admission({double(opt_.kv_budget_bytes), opt_.max_batch_tokens, 0},
                      double(reserved_ + cache_bytes), int64_t(running_.size()));
  while (!queue_.empty()) {
    Request& h = *queue_.front();
    const int64_t T = int64_t(h.p.prompt.size());
    // The longest cached prefix, leaving at least the last token to compute (its logits).
    // A prompt whose every row's logits are asked for is computed in full (its blocks are saved).
    if (cache_ && h.cache_kind && !h.p.prompt_logprobs) {
      const auto t0 = Clock::now();
      h.hit = cache_->lookup(h.p.prompt, *h.cache_kind, T - 1);
      add_seconds(lookup_s_, t0, Clock::now());
    }
    int64_t rows = T;
    if (cache_) {
      rows = admit_with_cache(admission, cache_->index(), h.hit.blocks, h.hit.tokens, double(h.reservation),
                              T, double(opt_.kv_budget_bytes),
                              [this](PrefixCache::BlockId id) { cache_->forget(id); });
      if (h.hit.blocks.empty()) h.hit.tokens = 0;  // dropped: its own hit stood in the way
      if (rows < 0) {
        cache_->release(h.hit);
        break;
      }
    } else if (!admission.fits(double(h.reservation), T)) {
      break;
    }
    auto r = std::move(queue_.front());
    queue_.pop_front();
    // Everything admission builds, before the reservation counts: a failure here (no memory for
    // the session, a sampler or policy that refuses its parameters) ends this request with its
    // error and reserves nothing. Before issue 50 the sampler came after the reservation, and a
    // top_p of 0 lost both the request and its K/V budget.
    try {
      r->session = std::make_unique<Session>(m_, opt_.make_backend(T + r->p.max_tokens));
      r->sampler.emplace(r->p.sampler);
      if (r->p.policy != PolicyKind::None) {  // as generate(): with no steps, decode_step prunes nothing
        r->policy = make_policy(r->p.policy, r->p.prune_seed);
        r->prune = PruneRequest{r->steps, r->policy.get()};
      }
      r->logits.resize(size_t(m_.config().n_vocab) * (r->p.prompt_logprobs ? size_t(T) : 1));
      if (r->hit.tokens > 0) {
        const auto t0 = Clock::now();
        cache_->load(*r->session, r->hit);
        add_seconds(copy_s_, t0, Clock::now());
      }
    } catch (...) {
      failed(*r, "admission");
      if (cache_) cache_->release(r->hit);
      r->session.reset();  // finish() releases a reservation only for a request that has a session
      finish(std::move(r), Finish::Error);
      continue;
    }
    if (cache_ && r->cache_kind) {
      cache_->count_query(T, r->hit.tokens);
      r->rec.cached_tokens = r->hit.tokens;
      r->lineage = r->hit.blocks;
      cache_->release(r->hit);
      r->hit.tokens = r->rec.cached_tokens;  // the blocks are copied; the pass starts after them
    }
    admission.take(double(r->reservation), rows);
    reserved_ += r->reservation;
    r->rec.admitted = Clock::now();
    running_.push_back(std::move(r));
  }
}

struct Scheduler::Batch {
  std::vector<BatchMember> members;
  std::vector<Request*> in_batch;
  std::vector<Request*> failed;  // their pass could not begin (rec.error says why)
  std::string error;             // the batched pass failed: every member ends with it
  bool device_error = false;     // and the GPU failed
};

Scheduler::Batch Scheduler::begin_passes(size_t n_decoding) {
  Batch b;
  for (size_t i = 0; i < running_.size(); ++i) {
    Request& r = *running_[i];
    try {
      if (i < n_decoding) {
        const int32_t tok = r.generated.back();
        const int32_t p = int32_t(int64_t(r.p.prompt.size()) + int64_t(r.generated.size()) - 1);
        r.pass = r.session->begin_decode(tok, p, r.policy ? &r.prune : nullptr, &r.stats, nullptr);
      } else {  // the prompt after its cached prefix (all of it without a hit)
        const int64_t cached = r.hit.tokens, T = int64_t(r.p.prompt.size());
        const std::span<const int32_t> ids = std::span<const int32_t>(r.p.prompt).subspan(size_t(cached));
        std::vector<int32_t> pos(size_t(T - cached));
        std::iota(pos.begin(), pos.end(), int32_t(cached));
        const int64_t last = int64_t(pos.size()) - 1;
        std::vector<int64_t> rows{last};
        if (r.p.prompt_logprobs) {  // every row's logits (the prompt is computed in full: no hit)
          rows.resize(pos.size());
          std::iota(rows.begin(), rows.end(), 0);
        }
        if (cached > 0 && !r.steps.empty())  // LazyLLM after a cached prefix: revival's semantics
          r.pass = r.session->begin_extend(ids, pos, r.prune, &r.stats, nullptr);
        else
          r.pass = r.session->begin_forward(ids, pos, rows, r.steps.empty() ? nullptr : &r.prune, &r.stats,
                                            nullptr);
      }
      r.greedy_only = r.p.sampler.temperature == 0.0f && r.p.top_logprobs < 0 && !r.p.prompt_logprobs;
      b.members.push_back(
          {r.session.get(), &r.pass, r.logits.data(), r.greedy_only ? &r.greedy_token : nullptr});
      b.in_batch.push_back(&r);
    } catch (...) {
      failed(r, i < n_decoding ? "decoding step" : "prefill");
      b.failed.push_back(&r);
    }
  }
  return b;
}

// Sample, emit, and finish what is done. The sampling (a pass over each member's V logits) runs
// side by side like the members' attention; the callbacks run in order on this thread. Each
// member's failure is its own: it ends with its error, the others go on.
std::vector<std::pair<Scheduler::Request*, Finish>> Scheduler::emit(Batch& b, Clock::time_point done_at) {
  const std::vector<Request*>& in_batch = b.in_batch;
  std::vector<int32_t> sampled(in_batch.size());
  std::vector<std::optional<TokenLogprobs>> logprobs(in_batch.size());
  std::vector<std::vector<TokenLogprobs>> prompt_logprobs(in_batch.size());
  const int64_t V = m_.config().n_vocab;
  std::vector<std::string> sample_error(in_batch.size());
  if (b.error.empty() && !in_batch.empty())
    in_batch[0]->session->backend().for_each_member(int64_t(in_batch.size()), [&](int64_t i) {
      try {
        Request& r = *in_batch[size_t(i)];
        // The last row's logits (a prefill that asked for the prompt's has one row a token).
        const std::span<const float> last = std::span<const float>(r.logits).last(size_t(V));
        sampled[size_t(i)] = r.greedy_only ? r.greedy_token : r.sampler->sample(last);
        if (r.p.top_logprobs >= 0)
          logprobs[size_t(i)] = token_logprobs(last, sampled[size_t(i)], r.p.top_logprobs);
        if (r.p.prompt_logprobs && r.generated.empty()) {  // token t + 1 given the tokens to t: row t
          const std::vector<int32_t>& ids = r.p.prompt;
          for (size_t t = 0; t + 1 < ids.size(); ++t)
            prompt_logprobs[size_t(i)].push_back(
                token_logprobs(std::span<const float>(r.logits).subspan(t * size_t(V), size_t(V)), ids[t + 1],
                               std::max(r.p.top_logprobs, 0)));
        }
      } catch (...) {
        sample_error[size_t(i)] = "sampling: " + current_error();
      }
    });
  std::vector<std::pair<Request*, Finish>> done;
  for (Request* r : b.failed) done.emplace_back(r, Finish::Error);
  for (size_t i = 0; i < in_batch.size(); ++i) {
    Request* r = in_batch[i];
    if (!b.error.empty() || !sample_error[i].empty()) {
      r->rec.error = b.error.empty() ? sample_error[i] : b.error;
      r->rec.device_error = !b.error.empty() && b.device_error;
      done.emplace_back(r, Finish::Error);
      continue;
    }
    const bool prefill = r->generated.empty();
    try {
      if (prefill) {
        double computed = 0;
        for (const int64_t n : r->stats.queries) computed += double(n);
        r->rec.prompt_tokens_computed_fraction =
            computed / (double(r->rec.prompt_tokens) * m_.config().n_layer);
        r->rec.kv_bytes_after_prefill = r->session->kv_bytes_used();
        r->rec.aux_cache_bytes = r->session->aux().bytes();
        r->rec.first_token = done_at;
        // Decoding needs one row: the prompt's activations go back (revivals grow them again).
        release_rows(*r);
        if (r->p.prompt_logprobs) {
          if (r->p.on_prompt_logprobs) r->p.on_prompt_logprobs(prompt_logprobs[i]);
          r->logits.resize(size_t(V));  // one row a decoding step from now on
          r->logits.shrink_to_fit();
        }
        // The prompt's blocks, for the requests behind it (this one's reservation is counted).
        save_prefix(*r, opt_.kv_budget_bytes - reserved_);
      } else {
        for (const int64_t n : r->stats.revived) r->rec.revivals += n;
        // A step that revived more rows at a layer grew the activations: they go back, so the
        // request holds what its reservation counts (on a GPU without a wait: stream-ordered).
        release_rows(*r);
      }
      const int32_t tok = sampled[i];
      r->generated.push_back(tok);
      if (logprobs[i] && r->p.on_logprobs) r->p.on_logprobs(*logprobs[i]);
      // The caller's detokenisation and streaming: what it throws ends this request alone.
      const bool go_on = !r->p.on_token || r->p.on_token(tok);
      if (!go_on || (r->p.stop_at_end_of_generation && m_.tokenizer().is_end_of_generation(tok)))
        done.emplace_back(r, Finish::Stop);
      else if (int64_t(r->generated.size()) >= r->p.max_tokens)
        done.emplace_back(r, Finish::Length);
    } catch (const ReleaseFailed&) {  // release_rows said why (rec.error, rec.device_error)
      done.emplace_back(r, Finish::Error);
    } catch (...) {
      r->rec.error = "emitting a token: " + current_error();
      done.emplace_back(r, Finish::Error);
    }
  }
  return done;
}

Scheduler::Failure Scheduler::caught() {
  Failure f;
  try {
    throw;
  } catch (const DeviceError& e) {
    f = {e.what(), true};
    if (e.lost() && !device_lost()) {
      lost_reason_ = f.what;
      lost_.store(true, std::memory_order_release);
    }
  } catch (...) {
    f.what = current_error();
  }
  return f;
}

void Scheduler::failed(Request& r, const std::string& prefix) {
  const Failure f = caught();
  r.rec.error = prefix + ": " + f.what;
  r.rec.device_error = f.device;
}

void Scheduler::end_all_lost() {
  const auto end = [this](std::unique_ptr<Request> r) {
    r->rec.error = "the GPU cannot be used any more: " + lost_reason_;
    r->rec.device_error = true;
    finish(std::move(r), Finish::Error);
  };
  while (!queue_.empty()) {
    auto r = std::move(queue_.front());
    queue_.pop_front();
    end(std::move(r));
  }
  while (!running_.empty()) {
    auto r = std::move(running_.back());
    running_.pop_back();
    end(std::move(r));
  }
}

bool Scheduler::step() {
  const auto start = Clock::now();
  take_inbox();
  if (device_lost()) {  // nothing runs on a lost device: every request ends now
    if (queue_.empty() && running_.empty()) return false;
    end_all_lost();
    throw_callback_failures();
    return true;
  }
  leave_cancelled();
  if (queue_.empty() && running_.empty()) {
    throw_callback_failures();
    return false;
  }
  const auto t0 = Clock::now();
  const size_t n_decoding = running_.size();  // admitted before this iteration: they decode
  admit();
  // The batch: a decoding row for every request that was running, the prefill of each admitted one.
  Batch b = begin_passes(n_decoding);
  try {
    if (device_lost()) throw DeviceError(lost_reason_, true);  // lost as a pass began: nothing runs
    run_batch(b.members);
  } catch (...) {
    const Failure f = caught();
    b.error = "batch: " + f.what;  // every member's state is unknown now: they all end
    b.device_error = f.device;
  }
  const auto t1 = Clock::now();
  iterations_.fetch_add(1, std::memory_order_relaxed);
  add_seconds(busy_s_, t0, t1);
  for (auto& [r, f] : emit(b, t1)) {
    auto it = std::find_if(running_.begin(), running_.end(), [r = r](const auto& u) { return u.get() == r; });
    auto owned = std::move(*it);
    running_.erase(it);
    finish(std::move(owned), f);
  }
  if (device_lost()) end_all_lost();
  add_seconds(step_s_, start, Clock::now());
  throw_callback_failures();
  return true;
}

}  // namespace lp
