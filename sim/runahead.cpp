#include "sim/runahead.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "model/error.h"
#include "pruning/schedule.h"
#include "sim/layer_cost.h"
#include "sim/replay.h"
#include "traces/synthetic.h"

namespace lp::sim {

RunaheadLink default_link(const hw::Profile& hw) {
  if (hw.interconnect_bandwidth > 0)
    return {hw.interconnect_bandwidth * hw.interconnect_efficiency, hw.interconnect_latency,
            "the profile's interconnect"};
  return {hw.memory_bandwidth / 2, hw.dispatch_overhead,
          "one machine, shared memory: half the memory bandwidth (a copy reads and writes)"};
}

namespace {

// One rank's layer, in the three parts the timeline needs.
struct LayerParts {
  double pre = 0, attn = 0, post = 0;
};

// The costs of one rank's chunk: embed, each layer's parts, and the head (the last rank's).
struct RankCosts {
  double embed = 0, head = 0;
  std::vector<LayerParts> layers;  // [L], or one entry for a uniform model
};

class RunaheadModel {
 public:
  RunaheadModel(const ModelConfig& c, const hw::Profile& hw, const Precision& p, double share,
                std::span<const PruneStep> prune = {})
      : c_(c), hw_(hw::share_of(hw, share)), cc_(hw_, p), prune_(prune.begin(), prune.end()) {
    for (const PruneStep& st : prune_)
      if (st.layer < 0 || st.layer >= c.n_layer || !(st.share >= 0 && st.share < 1))
        fail("a pruning step at layer {} (share {}) is outside the model's {} layers or [0, 1)", st.layer,
             st.share, c.n_layer);
    for (int l = 0; l < (c.uniform() ? 1 : c.n_layer); ++l) lc_.push_back(c.uniform() ? c : c.layer(l));
  }

  // The work of each layer of a chunk: every row at every layer, except on a pruning last rank,
  // which keeps tokens_kept of all active tokens at each pruning layer (engine/runahead.h), its
  // own (recent) rows dropped at kRecentDropRate times the prefix's rate per token.
  std::vector<LayerWork> work(int64_t start, int64_t tokens, bool last) const {
    LayerWork w;
    w.rows = tokens;
    w.keys = start + tokens;
    w.pairs = tokens * start + tokens * (tokens + 1) / 2;
    if (!last || prune_.empty()) return std::vector<LayerWork>(lc_.size(), w);
    std::vector<LayerWork> out;
    const int64_t n = start + tokens;
    int64_t active = n;
    size_t next = 0;
    int64_t own_rows = tokens;
    for (int l = 0; l < c_.n_layer; ++l) {
      LayerWork x;
      x.rows = std::min(own_rows, active);
      const int64_t prefix = active - x.rows;
      x.keys = active;
      x.pairs = x.rows * prefix + x.rows * (x.rows + 1) / 2;
      if (next < prune_.size() && prune_[next].layer == l) {
        const int64_t kept = tokens_kept(active, prune_[next++].share);
        x.scorers = x.selects = 1;
        x.score_keys = x.select_keys = active;
        x.moved = x.rows;  // the kept rows compacted, the dropped ones saved
        // Dropped: d tokens, prefix ones at rate r and own ones at kRecentDropRate x r, the prefix
        // never below none and the own rows never below the last one.
        const double d = double(active - kept), own = double(own_rows), pre = double(active - own_rows);
        const double r = d / (pre + kRecentDropRate * own);
        const double pre_drop = std::min(pre, r * pre);
        own_rows = std::max<int64_t>(1, std::llround(own - std::min(own - 1, d - pre_drop)));
        active = kept;
      }
      out.push_back(x);
    }
    return out;
  }

  RankCosts rank(int64_t start, int64_t tokens, bool last) const {
    RankCosts r;
    const double D = c_.n_embd;
    const auto none = [](const OpCost&) {};
    cost_embed(
        cc_, hw_, 1, c_, tokens, D, [&](Op, const OpCost& oc) { r.embed += oc.time_s; }, none);
    const std::vector<LayerWork> works = work(start, tokens, last);
    for (size_t i = 0; i < works.size(); ++i) {
      const LayerWork& w = works[i];
      const ModelConfig& cfg = lc_[lc_.size() == 1 ? 0 : i];
      LayerParts parts;
      cost_layer(
          cc_, hw_, 1, cfg, D, w,
          [&](Op o, const OpCost& oc) {
            if (o == Op::AttnNorm || o == Op::QKV || o == Op::QKNorm || o == Op::Rope)
              parts.pre += oc.time_s;
            else if (o == Op::Attention)
              parts.attn += oc.time_s;
            else
              parts.post += oc.time_s;
          },
          none);
      r.layers.push_back(parts);
    }
    if (last)
      cost_head(
          cc_, hw_, 1, c_, 1, double(c_.n_vocab), [&](Op, const OpCost& oc) { r.head += oc.time_s; }, none);
    return r;
  }

  // K/V bytes of one token at layer l.
  double kv_token_bytes(int l) const {
    return double(lc_[c_.uniform() ? 0 : size_t(l)].kv_token_elems()) * cc_.dtypes.kv_bytes;
  }
  double weight_bytes() const { return weight_memory_bytes(c_, cc_.dtypes); }
  double activation_bytes(int64_t rows) const {
    double most = 0;
    for (const ModelConfig& g : lc_)
      most =
          std::max(most, double(rows) * (3.0 * g.n_embd + 2.0 * g.q_dim() + 2.0 * g.kv_dim() + 3.0 * g.n_ff) *
                             cc_.dtypes.elem_bytes);
    return most;
  }
  const ModelConfig& config() const { return c_; }

 private:
  const ModelConfig& c_;
  hw::Profile hw_;
  CostContext cc_;
  std::vector<PruneStep> prune_;  // the last rank's
  std::vector<ModelConfig> lc_;
};

void check_chunks(std::span<const int64_t> chunks) {
  if (chunks.empty()) fail("a KV-Runahead partition needs at least one rank");
  for (size_t i = 0; i < chunks.size(); ++i)
    if (chunks[i] < 1) fail("rank {}'s chunk is {} tokens: every rank needs at least 1", i, chunks[i]);
}

RunaheadPrediction predict(const RunaheadModel& m, std::span<const int64_t> chunks,
                           const RunaheadLink& link) {
  check_chunks(chunks);
  if (!(link.bandwidth > 0)) fail("the KV-Runahead link needs a bandwidth above 0");
  const int L = m.config().n_layer;
  const size_t P = chunks.size();
  RunaheadPrediction out;
  out.link_bandwidth = link.bandwidth;
  out.link_latency_s = link.latency_s;
  std::vector<RankCosts> costs;
  int64_t start = 0;
  for (size_t p = 0; p < P; ++p) {
    RunaheadRank r;
    r.start = start;
    r.tokens = chunks[p];
    out.ranks.push_back(r);
    costs.push_back(m.rank(start, chunks[p], p + 1 == P));
    start += chunks[p];
  }
  std::vector<double> done(P), sent(P, 0.0), arrive(P, 0.0);
  for (size_t p = 0; p < P; ++p) done[p] = costs[p].embed, out.ranks[p].compute_s = costs[p].embed;
  for (int l = 0; l < L; ++l) {
    for (size_t p = 0; p < P; ++p) {
      const LayerParts& parts = costs[p].layers[costs[p].layers.size() == 1 ? 0 : size_t(l)];
      RunaheadRank& r = out.ranks[p];
      const double pre = done[p] + parts.pre;
      const double ready = p == 0 ? pre : std::max(pre, arrive[p]);
      r.wait_s += ready - pre;
      r.compute_s += parts.pre + parts.attn + parts.post;
      done[p] = ready + parts.attn + parts.post;
      if (p + 1 < P) {  // the prefix up to this rank's end, on to the next rank
        const double bytes = double(r.start + r.tokens) * m.kv_token_bytes(l);
        sent[p] = std::max(ready, sent[p]) + link.latency_s + bytes / link.bandwidth;
        arrive[p + 1] = sent[p];
        r.sent_bytes += bytes;
      }
    }
  }
  double kv_token_all_layers = 0;
  for (int l = 0; l < L; ++l) kv_token_all_layers += m.kv_token_bytes(l);
  for (size_t p = 0; p < P; ++p) {
    RunaheadRank& r = out.ranks[p];
    r.done_s = done[p];
    r.memory_bytes =
        m.weight_bytes() + double(r.start + r.tokens) * kv_token_all_layers + m.activation_bytes(r.tokens);
  }
  out.ranks.back().compute_s += costs.back().head;
  out.ttft_s = done.back() + costs.back().head;
  return out;
}

}  // namespace

RunaheadPrediction predict_runahead(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                                    std::span<const int64_t> chunks, const RunaheadLink& link,
                                    double rank_share, std::span<const PruneStep> last_rank_prune) {
  return predict(RunaheadModel(c, hw, p, rank_share, last_rank_prune), chunks, link);
}

std::vector<int64_t> even_partition(int64_t n, int p) {
  if (p < 1 || n < p) fail("{} tokens cannot be split over {} ranks of at least 1 token each", n, p);
  std::vector<int64_t> out(size_t(p), n / p);
  for (int64_t i = 0; i < n % p; ++i) ++out[size_t(i)];
  return out;
}

std::vector<int64_t> optimise_partition(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                                        int64_t n, int ranks, const RunaheadLink& link, double rank_share,
                                        std::span<const PruneStep> last_rank_prune) {
  std::vector<int64_t> chunks = even_partition(n, ranks);
  if (ranks == 1) return chunks;
  const RunaheadModel m(c, hw, p, rank_share, last_rank_prune);
  // Start from equal work: the least time T for which ranks given, in order, the most tokens
  // their own work fits in T cover the prompt (bisection on T; a rank's work grows with its
  // tokens and with its start). TTFT is the last rank's finish, a max over the ranks' chains, so
  // the search below from an even split would creep along it boundary by boundary.
  const auto work = [&](int64_t start, int64_t tokens, bool last) {
    const RankCosts k = m.rank(start, tokens, last);
    double t = k.embed + k.head;
    for (const LayerParts& x : k.layers)
      t += (x.pre + x.attn + x.post) * (k.layers.size() == 1 ? c.n_layer : 1);
    return t;
  };
  const auto cover = [&](double T, std::vector<int64_t>* out) {
    int64_t start = 0;
    for (int i = 0; i < ranks; ++i) {
      const bool last = i + 1 == ranks;
      const int64_t room = n - start - (ranks - 1 - i);  // leave a token for each later rank
      if (room < 1) return false;
      int64_t lo = 0, hi = room;  // the most tokens whose work fits in T
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo + 1) / 2;
        if (work(start, mid, last) <= T)
          lo = mid;
        else
          hi = mid - 1;
      }
      if (lo < 1) return false;
      if (last && start + lo < n) return false;
      if (out) (*out)[size_t(i)] = last ? n - start : lo;
      start += lo;
    }
    return true;
  };
  {
    double lo = 0, hi = work(0, n, true);
    for (int it = 0; it < 60 && hi - lo > 1e-9 * hi; ++it) {
      const double mid = (lo + hi) / 2;
      (cover(mid, nullptr) ? hi : lo) = mid;
    }
    std::vector<int64_t> eq(static_cast<size_t>(ranks));
    if (cover(hi, &eq)) chunks = eq;
  }
  // Boundaries b[1..P-1]: rank i holds [b[i], b[i+1]).
  std::vector<int64_t> b(size_t(ranks) + 1, 0);
  for (int i = 0; i < ranks; ++i) b[size_t(i) + 1] = b[size_t(i)] + chunks[size_t(i)];
  const auto ttft = [&](const std::vector<int64_t>& bounds) {
    std::vector<int64_t> ch(static_cast<size_t>(ranks));
    for (int i = 0; i < ranks; ++i) ch[size_t(i)] = bounds[size_t(i) + 1] - bounds[size_t(i)];
    return predict(m, ch, link).ttft_s;
  };
  double best = ttft(b);
  for (int sweep = 0; sweep < 64; ++sweep) {
    const double before = best;
    for (int i = 1; i < ranks; ++i) {
      // Golden-section search of boundary i over [b[i-1] + 1, b[i+1] - 1], then the integers
      // around where it ends.
      int64_t lo = b[size_t(i) - 1] + 1, hi = b[size_t(i) + 1] - 1;
      if (lo >= hi) continue;
      std::vector<int64_t> t = b;
      const auto at = [&](int64_t x) {
        t[size_t(i)] = x;
        return ttft(t);
      };
      const double g = (std::sqrt(5.0) - 1) / 2;
      double a = double(lo), z = double(hi);
      while (z - a > 3) {
        const double x1 = z - g * (z - a), x2 = a + g * (z - a);
        if (at(int64_t(std::llround(x1))) <= at(int64_t(std::llround(x2))))
          z = x2;
        else
          a = x1;
      }
      int64_t arg = b[size_t(i)];
      double val = best;
      for (int64_t x = std::max(lo, int64_t(a) - 1); x <= std::min(hi, int64_t(z) + 1); ++x) {
        const double v = at(x);
        if (v < val) val = v, arg = x;
      }
      b[size_t(i)] = arg;
      best = val;
    }
    if (before - best <= 1e-6 * before) break;
  }
  for (int i = 0; i < ranks; ++i) chunks[size_t(i)] = b[size_t(i) + 1] - b[size_t(i)];
  return chunks;
}

std::vector<int64_t> parse_partition(const std::string& arg, const ModelConfig& c, const hw::Profile& hw,
                                     const Precision& p, int64_t n, int ranks, const RunaheadLink& link,
                                     double rank_share, std::span<const PruneStep> last_rank_prune) {
  std::string low = arg;
  std::transform(low.begin(), low.end(), low.begin(),
                 [](unsigned char ch) { return char(std::tolower(ch)); });
  if (n < ranks) usage_fail("the prompt has {} tokens, fewer than the {} ranks", n, ranks);
  if (low == "auto") return optimise_partition(c, hw, p, n, ranks, link, rank_share, last_rank_prune);
  if (low == "even") return even_partition(n, ranks);
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= arg.size()) {
    const size_t comma = std::min(arg.find(',', pos), arg.size());
    const std::string item = arg.substr(pos, comma - pos);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || !end || *end || v < 1)
      usage_fail("'{}' is not a chunk of at least 1 token (give auto, even or n1,n2,...)", item);
    out.push_back(v);
    pos = comma + 1;
  }
  if (int(out.size()) != ranks) usage_fail("{} chunks for {} ranks", out.size(), ranks);
  const int64_t sum = std::accumulate(out.begin(), out.end(), int64_t(0));
  if (sum != n) usage_fail("the chunks sum to {} tokens, the prompt has {}", sum, n);
  return out;
}

RunaheadComparison compare_runahead(const ModelConfig& c, const hw::Profile& hw, const Precision& p,
                                    std::span<const int64_t> chunks, std::span<const int64_t> plain_chunks,
                                    const RunaheadLink& link, double rank_share,
                                    std::span<const PruneStep> last_rank_prune) {
  RunaheadComparison out;
  out.runahead = predict_runahead(c, hw, p, chunks, link, rank_share, last_rank_prune);
  int64_t n = 0;
  for (int64_t k : chunks) n += k;
  const std::vector<int64_t> one = {n};
  out.single_s = predict_runahead(c, hw, p, one, link, 1).ttft_s;
  out.single_share_s =
      rank_share < 1 ? predict_runahead(c, hw, p, one, link, rank_share).ttft_s : out.single_s;
  if (!last_rank_prune.empty()) {
    out.lazy_single_s = predict_runahead(c, hw, p, one, link, 1, last_rank_prune).ttft_s;
    out.plain_s = predict_runahead(c, hw, p, plain_chunks, link, rank_share).ttft_s;
  }
  for (const RunaheadRank& k : out.runahead.ranks)
    out.most_memory_bytes = std::max(out.most_memory_bytes, k.memory_bytes);
  const int P = int(chunks.size());
  if (P > 1 && rank_share == 1) {
    try {
      check_tp(c, hw, P);
      out.tp_s = replay(trace::synthetic_trace(c, "none", {}, n, 0), c, hw, p, 1, P).ttft_s;
    } catch (const UsageError& e) {
      out.tp_refused = e.what();
    }
  }
  return out;
}

}  // namespace lp::sim
