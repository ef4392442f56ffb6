#include "engine/runahead.h"

#include <chrono>
#include <cstring>
#include <numeric>
#include <vector>

#include "engine/batch.h"
#include "model/error.h"

namespace lp {

RunaheadTimes runahead_prefill(Session& s, std::span<const int32_t> prompt, const RunaheadPart& part,
                               KvLink* from_prev, KvLink* to_next, float* logits, const PruneRequest* prune) {
  using Clock = std::chrono::steady_clock;
  const auto secs = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  const auto t0 = Clock::now();
  const int64_t N = int64_t(prompt.size());
  if (part.ranks < 1 || part.rank < 0 || part.rank >= part.ranks)
    fail("KV-Runahead: rank {} of {}", part.rank, part.ranks);
  if (part.tokens < 1 || part.start < 0 || part.start + part.tokens > N)
    fail("KV-Runahead: rank {}'s chunk [{}, {}) is not inside the prompt's {} tokens", part.rank, part.start,
         part.start + part.tokens, N);
  const bool first = part.rank == 0, last = part.rank + 1 == part.ranks;
  if (first != (part.start == 0)) fail("KV-Runahead: rank 0, and only rank 0, starts at the prompt's start");
  if (last != (part.start + part.tokens == N))
    fail("KV-Runahead: the last rank, and only it, ends the prompt");
  if ((from_prev == nullptr) != first || (to_next == nullptr) != last)
    internal_fail("KV-Runahead rank {} of {} without its links", part.rank, part.ranks);
  if (s.n_cached() != 0) fail("KV-Runahead needs an empty session");

  std::vector<int32_t> pos(size_t(part.start + part.tokens));
  std::iota(pos.begin(), pos.end(), 0);
  const std::span<const int32_t> own(pos.data() + part.start, size_t(part.tokens));
  const std::span<const int32_t> prefix(pos.data(), size_t(part.start));
  const int64_t last_row = part.tokens - 1;
  Session::Pass ps =
      s.begin_forward(prompt.subspan(size_t(part.start), size_t(part.tokens)), own,
                      last ? std::span<const int64_t>(&last_row, 1) : std::span<const int64_t>{},
                      last ? prune : nullptr, nullptr, nullptr);
  if (last && ps.pruning && !first) {
    ps.prefix.assign(prefix.begin(), prefix.end());
    ps.keyed_prefix = true;
  }
  RunaheadTimes t;
  std::vector<std::byte> in, out[2], kept;
  const int L = s.model().config().n_layer;
  // A pruning last rank: the prefix positions it dropped, per layer, with their K/V, taken into
  // the cache after the pass (so its attention reads only the kept keys, contiguous in the cache,
  // and decoding can still select them).
  struct Dropped {
    std::vector<int32_t> pos;
    std::vector<std::byte> rows;
  };
  std::vector<Dropped> dropped(ps.keyed_prefix ? size_t(L) : 0);
  LayerHooks hooks;
  if (!first)  // the prefix's K/V of this layer, before attention reads it
    hooks.before_attention = [&](int l) {
      in.resize(size_t(part.start * s.kv_token_bytes(l)));
      const auto w0 = Clock::now();
      from_prev->recv(l, in);
      t.wait_s += secs(Clock::now() - w0);
      if (ps.keyed_prefix && int64_t(ps.prefix.size()) < part.start) {
        // The message holds K rows then V rows of positions 0..start-1: the kept ones now.
        const size_t row = size_t(s.kv_token_bytes(l) / 2), n = size_t(part.start);
        const size_t nk = ps.prefix.size(), nd = n - nk;
        Dropped& d = dropped[size_t(l)];
        kept.resize(2 * nk * row);
        d.rows.resize(2 * nd * row);
        for (size_t p = 0, k = 0, j = 0; p < n; ++p) {
          const bool keep = k < nk && ps.prefix[k] == int32_t(p);
          std::byte* dst = keep ? kept.data() + k * row : d.rows.data() + j * row;
          const size_t other = keep ? nk : nd;  // the V rows follow the block's K rows
          std::memcpy(dst, in.data() + p * row, row);
          std::memcpy(dst + other * row, in.data() + (n + p) * row, row);
          if (keep)
            ++k;
          else
            d.pos.push_back(int32_t(p)), ++j;
        }
        s.import_kv(l, ps.prefix, kept);
      } else {
        s.import_kv(l, prefix, in);
      }
    };
  if (!last)  // the grown prefix on to the next rank (the buffer two layers back is free)
    hooks.after_attention = [&](int l) {
      std::vector<std::byte>& buf = out[l % 2];
      const int64_t n = part.start + part.tokens;
      buf.resize(size_t(n * s.kv_token_bytes(l)));
      const auto e0 = Clock::now();
      s.export_kv(l, n, buf);
      t.export_s += secs(Clock::now() - e0);
      to_next->send(l, buf);
      t.sent_bytes += double(buf.size());
    };
  run_layers(BatchMember{&s, &ps, logits}, hooks);
  if (s.head(ps) > 0) s.lm_head(ps, logits);
  for (int l = 0; l < int(dropped.size()); ++l)
    if (!dropped[size_t(l)].pos.empty())
      s.import_kv(l, dropped[size_t(l)].pos, dropped[size_t(l)].rows, true);
  if (to_next) to_next->finish();
  t.total_s = secs(Clock::now() - t0);
  return t;
}

}  // namespace lp
