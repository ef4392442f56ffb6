// Every case of the op table (tests/op_cases.h) timed on the CPU backend through the Backend
// interface: the shapes the op tests check (lp_tests' CpuBackendOps) are the shapes measured here,
// on the tests' model (head width 16: what a call costs at awkward row counts) and on a wider one
// (head width 64: per-head work as in a real model). Ops that change their inputs (K/V append, row
// gather, Aux Cache store and merge) have them put back outside the timed region (manual timing).
//
//   build/lp_bench --benchmark_filter='BackendOps/attention_T989'
//   build/lp_bench --benchmark_filter='BackendOps/.*/w64'
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "kernels/context.h"
#include "kernels/cpu/backend.h"
#include "tests/op_cases.h"

namespace lp::testing {
namespace {

// One case ready to time: `run` is the op, `restore` (may be empty) puts back what it changed.
struct ReadyOp {
  std::function<void()> restore, run;
};

// The inputs each op reads, random, and the op; the attention cases hold the keys the op tests
// give them (tests/op_cases.h, key_layout).
ReadyOp prepare(const OpCase& oc, const ModelConfig& c, Backend& b) {
  const int64_t T = oc.T, D = c.n_embd, Q = c.n_head * c.head_dim, KV = c.n_head_kv * c.head_dim;
  const int64_t QKV = Q + 2 * KV;
  std::mt19937 rng(uint32_t(T * 31 + oc.gqa));
  const std::vector<int32_t> pos = row_positions(T);
  b.set_rows(pos);
  for (const Tensor t :
       {Tensor::X, Tensor::XN, Tensor::QKV, Tensor::Attn, Tensor::FF, Tensor::Act, Tensor::Branch})
    b.write(t, random_vec(size_t(T * tensor_width(c, t)), rng));
  const auto append = [&](const std::vector<int32_t>& p) {
    b.set_rows(p);
    b.write(Tensor::QKV, random_vec(p.size() * size_t(QKV), rng));
    b.kv_append(0);
  };

  switch (oc.op) {
    case OpKind::Embed: {
      std::vector<int32_t> ids(static_cast<size_t>(T));
      for (auto& i : ids) i = int32_t(rng() % uint32_t(c.n_vocab));
      return {{}, [&b, ids] { b.embed(ids); }};
    }
    case OpKind::RmsNorm:
      return {{}, [&b] { b.rmsnorm(Norm::Attn, 0); }};
    case OpKind::MatmulQKV:
      return {{}, [&b] { b.matmul(Proj::QKV, 0); }};
    case OpKind::MatmulO:
      return {{}, [&b] { b.matmul(Proj::O, 0); }};
    case OpKind::MatmulGateUp:
      return {{}, [&b] { b.matmul(Proj::GateUp, 0); }};
    case OpKind::MatmulDown:
      return {{}, [&b] { b.matmul(Proj::Down, 0); }};
    case OpKind::Moe:
      return {{}, [&b] {
                b.route(0);
                b.experts(0);
              }};
    case OpKind::LmHead: {
      auto logits = std::make_shared<std::vector<float>>(static_cast<size_t>(T * c.n_vocab));
      return {{}, [&b, logits] { b.lm_head(logits->data()); }};
    }
    case OpKind::PostNorm: {  // in place: the rows put back before each run
      const auto x = random_vec(size_t(T * D), rng);
      return {[&b, x] { b.write(Tensor::Branch, x); }, [&b] { b.post_norm(Norm::PostAttn, 0); }};
    }
    case OpKind::QkNorm: {  // in place: the rows put back before each run
      const auto x = random_vec(size_t(T * tensor_width(c, Tensor::QKV)), rng);
      return {[&b, x] { b.write(Tensor::QKV, x); }, [&b] { b.qk_norm(0); }};
    }
    case OpKind::Rope:  // a rotation: the values keep their size however often it runs
      return {{}, [&b] { b.rope(0); }};
    case OpKind::KvAppend:
      return {[&b] { b.reset(); }, [&b] { b.kv_append(0); }};
    case OpKind::Attention:
    case OpKind::AttentionSubset:
    case OpKind::AttentionUnordered:
    case OpKind::Scores:
    case OpKind::SelectTop: {
      const KeyLayout lay = key_layout(oc.op, pos);
      for (const std::vector<int32_t>& batch : lay.earlier) append(batch);
      append(pos);  // the rows: their K/V appended, their q left in qkv
      std::vector<int32_t> kpos;
      for (const int32_t s : lay.slots) kpos.push_back(lay.slot_pos[size_t(s)]);
      const std::vector<int32_t> slots = lay.all_in_order ? std::vector<int32_t>{} : lay.slots;
      if (oc.op == OpKind::Scores) return {{}, [&b, slots] { b.last_row_scores(0, slots); }};
      if (oc.op == OpKind::SelectTop) {
        b.last_row_scores(0, slots);
        const int64_t keep = (int64_t(kpos.size()) + 1) / 2;
        return {{}, [&b, kpos, keep] { benchmark::DoNotOptimize(b.select_top(kpos, keep)); }};
      }
      return {{}, [&b, slots] { b.attention(0, slots, false); }};
    }
    case OpKind::SwiGLU:
      return {{}, [&b] { b.swiglu(); }};
    case OpKind::Residual:
      return {{}, [&b] { b.residual(); }};
    case OpKind::GatherRows: {  // compaction after pruning: every other row
      const auto x = random_vec(size_t(T * D), rng);
      std::vector<int64_t> rows;
      for (int64_t i = 0; i < T; i += 2) rows.push_back(i);
      return {[&b, pos, x] { b.set_rows(pos), b.write(Tensor::X, x); }, [&b, rows] { b.gather_rows(rows); }};
    }
    case OpKind::AuxStoreMerge: {  // every third row stored, then merged back between the others
      const auto x = random_vec(size_t(T * D), rng);
      std::vector<int64_t> rows, entries;
      for (int64_t i = 0; i < T; i += 3) rows.push_back(i);
      for (size_t i = 0; i < rows.size(); ++i) entries.push_back(int64_t(i));
      const int64_t R = int64_t(rows.size());
      RowMerge m;
      for (int64_t i = 0; i < T; ++i) m.x_src.push_back(i), m.x_dst.push_back(i + std::min(i, R));
      for (int64_t e = 0; e < R; ++e) m.aux_src.push_back(e), m.aux_dst.push_back(2 * e + 1);
      return {[&b, pos, x] { b.set_rows(pos), b.write(Tensor::X, x); },
              [&b, rows, entries, m, T, R] {
                b.aux_store(rows, entries);
                b.merge_rows(m, T + R);
              }};
    }
  }
  return {};
}

void BM_BackendOp(benchmark::State& st, OpCase oc, int head_dim) {
  const OpModel& om = case_model(oc, head_dim);
  CpuContext ctx(2);
  CpuBackend b(ctx, om.c, om.w, 2 * oc.T + 2);
  const ReadyOp op = prepare(oc, om.c, b);
  for (auto _ : st) {
    if (op.restore) op.restore();
    const auto t0 = std::chrono::steady_clock::now();
    op.run();
    b.synchronize();
    st.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  st.SetItemsProcessed(int64_t(st.iterations()) * oc.T);  // rows per second
}

const bool registered = [] {
  for (const int head_dim : {16, 64})
    for (const OpCase& oc : op_cases())
      benchmark::RegisterBenchmark(("BackendOps/" + case_name(oc) + "/w" + std::to_string(head_dim)).c_str(),
                                   BM_BackendOp, oc, head_dim)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond);
  return true;
}();

}  // namespace
}  // namespace lp::testing
