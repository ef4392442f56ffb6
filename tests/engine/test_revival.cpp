// LazyLLM decoding with revival against a slow dense formulation.
//
// The reference keeps, for every token, a table of K/V per layer (present or not) and the
// hidden state at which the token next continues ("state": input of layer `at`). A step
// computes token t at layer l iff t is active at l (every token before the first pruning
// layer, then the set the engine's new token selected) and has no K/V there; its input is the
// previous layer's output if it was computed there in this step, else its stored state. Keys at
// layer l are exactly the step's active tokens at or before the query's position. Arithmetic is
// the scalar reference kernels (double accumulation), one row at a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <vector>

#include "engine/session.h"
#include "kernels/context.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ref.h"
#include "model/config.h"
#include "model/gguf.h"
#include "pruning/policy.h"
#include "pruning/schedule.h"
#include "tests/gguf_writer.h"
#include "tests/reference_model.h"
#include "tests/test_util.h"

namespace lp {
namespace {

using testing::tensor_f32;

struct Dense {
  const GgufFile& f;
  const ModelConfig& c;
  int L;
  int64_t D, H, Hkv, Dh, F;
  std::vector<std::map<int32_t, std::vector<float>>> k, v;      // [L] pos -> [Hkv*Dh] after RoPE
  std::map<int32_t, std::pair<int, std::vector<float>>> state;  // pos -> (layer, input hidden)
  std::vector<std::vector<float>> w_q, w_k, w_v, w_o, w_g, w_u, w_d, n1, n2;
  std::vector<float> emb, out_norm;

  Dense(const GgufFile& file, const ModelConfig& cfg) : f(file), c(cfg), L(cfg.n_layer) {
    D = c.n_embd, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim, F = c.n_ff;
    k.resize(static_cast<size_t>(L));
    v.resize(static_cast<size_t>(L));
    for (int l = 0; l < L; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      w_q.push_back(tensor_f32(f, p + "attn_q.weight"));
      w_k.push_back(tensor_f32(f, p + "attn_k.weight"));
      w_v.push_back(tensor_f32(f, p + "attn_v.weight"));
      w_o.push_back(tensor_f32(f, p + "attn_output.weight"));
      w_g.push_back(tensor_f32(f, p + "ffn_gate.weight"));
      w_u.push_back(tensor_f32(f, p + "ffn_up.weight"));
      w_d.push_back(tensor_f32(f, p + "ffn_down.weight"));
      n1.push_back(tensor_f32(f, p + "attn_norm.weight"));
      n2.push_back(tensor_f32(f, p + "ffn_norm.weight"));
    }
    emb = tensor_f32(f, "token_embd.weight");
    out_norm = tensor_f32(f, "output_norm.weight");
  }

  // One step: new tokens (ids at positions) and the engine's selections per pruning layer.
  // Returns the last new token's logits and counts per layer of rows computed.
  std::vector<float> step(const std::vector<int32_t>& ids, const std::vector<int32_t>& pos,
                          const std::vector<PruneStep>& steps, const std::vector<std::vector<int32_t>>& kept,
                          std::vector<int64_t>* computed) {
    for (size_t i = 0; i < ids.size(); ++i)
      state[pos[i]] = {0, std::vector<float>(emb.begin() + ids[i] * D, emb.begin() + (ids[i] + 1) * D)};
    std::vector<int32_t> active;
    for (const auto& [p, s] : state) active.push_back(p);  // every token, ascending
    std::map<int32_t, std::vector<float>> cur;             // rows computed at the previous layer
    size_t si = 0;
    computed->assign(size_t(L), 0);
    for (int l = 0; l < L; ++l) {
      std::vector<int32_t> rows;
      for (int32_t p : active)
        if (!k[size_t(l)].count(p)) rows.push_back(p);
      (*computed)[size_t(l)] = int64_t(rows.size());
      std::map<int32_t, std::vector<float>> xin, qs;
      for (int32_t p : rows) {
        if (cur.count(p)) {
          xin[p] = cur[p];
        } else {
          EXPECT_EQ(state.at(p).first, l) << "token " << p << " resumes at the wrong layer";
          xin[p] = state.at(p).second;
        }
        std::vector<float> xn(static_cast<size_t>(D)), q(size_t(H * Dh)), kk(size_t(Hkv * Dh)), vv(kk.size());
        ref::rmsnorm(xin[p].data(), n1[size_t(l)].data(), xn.data(), 1, D, c.rms_eps);
        ref::matmul(xn.data(), w_q[size_t(l)].data(), q.data(), 1, D, H * Dh);
        ref::matmul(xn.data(), w_k[size_t(l)].data(), kk.data(), 1, D, Hkv * Dh);
        ref::matmul(xn.data(), w_v[size_t(l)].data(), vv.data(), 1, D, Hkv * Dh);
        ref::rope(q.data(), &p, 1, H, Dh, c.rope_dim, c.rope_theta, nullptr);
        ref::rope(kk.data(), &p, 1, Hkv, Dh, c.rope_dim, c.rope_theta, nullptr);
        k[size_t(l)][p] = kk;
        v[size_t(l)][p] = vv;
        qs[p] = q;
      }
      // Keys: the active set (all of which now have K/V here).
      std::vector<float> K, V;
      std::vector<int32_t> kp;
      for (int32_t p : active) {
        K.insert(K.end(), k[size_t(l)].at(p).begin(), k[size_t(l)].at(p).end());
        V.insert(V.end(), v[size_t(l)].at(p).begin(), v[size_t(l)].at(p).end());
        kp.push_back(p);
      }
      std::map<int32_t, std::vector<float>> out;
      for (int32_t p : rows) {
        std::vector<float> o(size_t(H * Dh)), t(static_cast<size_t>(D)), xn(static_cast<size_t>(D)),
            g(static_cast<size_t>(F)), u(g.size()), a(g.size());
        ref::attention(qs[p].data(), &p, 1, K.data(), V.data(), kp.data(), int64_t(kp.size()), H, Hkv, Dh,
                       o.data());
        std::vector<float> x = xin[p];
        ref::matmul(o.data(), w_o[size_t(l)].data(), t.data(), 1, H * Dh, D);
        for (int64_t i = 0; i < D; ++i) x[size_t(i)] += t[size_t(i)];
        ref::rmsnorm(x.data(), n2[size_t(l)].data(), xn.data(), 1, D, c.rms_eps);
        ref::matmul(xn.data(), w_g[size_t(l)].data(), g.data(), 1, D, F);
        ref::matmul(xn.data(), w_u[size_t(l)].data(), u.data(), 1, D, F);
        ref::swiglu(g.data(), u.data(), a.data(), F);
        ref::matmul(a.data(), w_d[size_t(l)].data(), t.data(), 1, F, D);
        for (int64_t i = 0; i < D; ++i) x[size_t(i)] += t[size_t(i)];
        out[p] = x;
        state[p] = {l + 1, x};
      }
      if (si < steps.size() && steps[si].layer == l) active = kept[si++];
      cur = std::move(out);
    }
    const int32_t last = pos.back();
    std::vector<float> xn(static_cast<size_t>(D)), logits(size_t(c.n_vocab));
    ref::rmsnorm(cur.at(last).data(), out_norm.data(), xn.data(), 1, D, c.rms_eps);
    const auto head = f.find_tensor("output.weight") ? tensor_f32(f, "output.weight") : emb;
    ref::matmul(xn.data(), head.data(), logits.data(), 1, D, c.n_vocab);
    return logits;
  }
};

using testing::rms;

struct RevivalCase {
  int64_t T;
  PolicyKind policy;
  const char* schedule;
  int decode_steps;
};

class Revival : public ::testing::TestWithParam<RevivalCase> {};

TEST_P(Revival, MultiStepDecodeMatchesDenseFormulation) {
  const RevivalCase rc = GetParam();
  testing::TempDir dir;
  testing::TinyModelSpec spec;
  spec.n_layer = 4;
  const std::string path = testing::write_tiny_model(dir.path() + "/tiny.gguf", spec);
  const GgufFile f = GgufFile::open(path);
  const ModelConfig c = config_from_gguf(f);
  CpuContext ctx(2);
  const auto m = Model::load(path, DType::F32, ctx);
  const auto steps = resolve_schedule(parse_schedule(rc.schedule), c.n_layer);
  auto policy = make_policy(rc.policy, 11);
  const PruneRequest req{steps, policy.get()};
  std::mt19937 rng(uint32_t(rc.T));
  std::vector<int32_t> ids(static_cast<size_t>(rc.T)), pos(ids.size());
  for (auto& i : ids) i = int32_t(rng() % uint32_t(c.n_vocab));
  std::iota(pos.begin(), pos.end(), 0);

  Session s(ctx, *m, rc.T + rc.decode_steps);
  Dense ref(f, c);
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  trace::Step st;
  const int64_t last = rc.T - 1;
  s.forward(ids, pos, {&last, 1}, logits.data(), &req, &st);
  std::vector<int64_t> computed;
  auto want = ref.step(ids, pos, steps, testing::kept_of(st), &computed);
  EXPECT_EQ(st.queries, computed) << "prefill";
  const trace::Step prefill_step = st;
  std::vector<trace::Step> decoded;
  int64_t revivals = 0;
  std::vector<int64_t> per_layer_total = st.queries;
  for (int d = 0; d < rc.decode_steps; ++d) {
    for (size_t j = 0; j < want.size(); ++j)
      ASSERT_NEAR(logits[j], want[j], 1e-4 * rms(want)) << "step " << d;
    const int32_t tok = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const int32_t p = int32_t(rc.T + d);
    s.decode_step(tok, p, logits.data(), &req, &st);
    decoded.push_back(st);
    want = ref.step({tok}, {p}, steps, testing::kept_of(st), &computed);
    EXPECT_EQ(st.queries, computed) << "decode step " << d;
    for (int l = 0; l < c.n_layer; ++l) {
      revivals += st.revived[size_t(l)];
      per_layer_total[size_t(l)] += st.queries[size_t(l)];
      // At most once over the whole generation: no layer computed more tokens than exist.
      EXPECT_LE(per_layer_total[size_t(l)], rc.T + d + 1);
    }
  }
  for (size_t j = 0; j < want.size(); ++j) ASSERT_NEAR(logits[j], want[j], 1e-4 * rms(want)) << "last step";
  // The paper's "% of prompt tokens computed", from the trace steps' counts, against the session's
  // own record of which (prompt token, layer) pairs hold K/V (computed there, once).
  {
    trace::Header h;
    h.n_layer = c.n_layer;
    h.prompt_tokens = rc.T;
    trace::Summarizer sum(h);
    sum.add(prefill_step);
    for (const trace::Step& d : decoded) sum.add(d);
    int64_t held = 0;
    for (int l = 0; l < c.n_layer; ++l)
      for (int32_t p = 0; p < int32_t(rc.T); ++p) held += s.computed(l, p);
    EXPECT_NEAR(sum.finish().prompt_tokens_computed_fraction_after_generation,
                double(held) / double(rc.T * c.n_layer), 1e-12);
  }
  std::printf("revivals: %lld\n", (long long)revivals);
  if (rc.policy == PolicyKind::Frozen) {
    EXPECT_EQ(revivals, 0);  // static never revives
  }
  if (rc.policy == PolicyKind::RandomLayers && rc.T > 8) {
    EXPECT_GT(revivals, 0);  // random re-selects
  }
}

// The prefix cache's LazyLLM semantics (engine/prefix_cache.h) against the same dense formulation:
// request A (a document and its question) prefills pruned and decodes; the document's blocks of
// its state are saved and loaded into a new session, where request B's question runs as one
// decoding step of several rows (Session::extend). The reference continues from A's state with
// A's question and answer forgotten: each of B's rows starts from the state A left (or is
// revived from it at exactly the layer its state was saved at) and no pair A computed is computed
// again. The same, loaded twice and saved again, is the same bytes.
TEST(Revival, ACachedPrefixResumesAsTheDenseFormulation) {
  testing::TempDir dir;
  testing::TinyModelSpec spec;
  spec.n_layer = 4;
  const std::string path = testing::write_tiny_model(dir.path() + "/tiny.gguf", spec);
  const GgufFile f = GgufFile::open(path);
  const ModelConfig c = config_from_gguf(f);
  CpuContext ctx(2);
  const auto m = Model::load(path, DType::F32, ctx);
  const auto steps = resolve_schedule(parse_schedule("0:0.5,2:0.5"), c.n_layer);
  auto policy = make_policy(PolicyKind::LazyLLM, 3);
  const PruneRequest req{steps, policy.get()};
  std::mt19937 rng(7);
  const int32_t doc = 32, qa = 9, qb = 7;  // the document: two blocks of 16
  std::vector<int32_t> ids(static_cast<size_t>(doc + qa)), pos(ids.size());
  for (auto& i : ids) i = int32_t(rng() % uint32_t(c.n_vocab));
  std::iota(pos.begin(), pos.end(), 0);

  // A: prefill, then three decoding steps (revivals reach into the document).
  Session a(ctx, *m, doc + qa + 3);
  Dense ref(f, c);
  std::vector<float> logits(size_t(c.n_vocab));
  trace::Step st;
  const int64_t last = int64_t(ids.size()) - 1;
  a.forward(ids, pos, {&last, 1}, logits.data(), &req, &st);
  std::vector<int64_t> computed;
  ref.step(ids, pos, steps, testing::kept_of(st), &computed);
  for (int d = 0; d < 3; ++d) {
    const int32_t tok = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const int32_t p = doc + qa + d;
    a.decode_step(tok, p, logits.data(), &req, &st);
    ref.step({tok}, {p}, steps, testing::kept_of(st), &computed);
  }
  const std::optional<TokenStates> b0 = a.save_states(0, 16), b1 = a.save_states(16, 16);
  ASSERT_TRUE(b0 && b1);
  EXPECT_FALSE(b0->full(c.n_layer) && b1->full(c.n_layer)) << "nothing of the document was pruned";
  for (int l = 0; l < c.n_layer; ++l)  // the reference forgets A's question and answer
    for (auto* kv : {&ref.k[size_t(l)], &ref.v[size_t(l)]}) kv->erase(kv->lower_bound(doc), kv->end());
  ref.state.erase(ref.state.lower_bound(doc), ref.state.end());

  Session b(ctx, *m, doc + qb);
  const TokenStates* blocks[] = {&*b0, &*b1};
  b.load_states(blocks);
  for (int l = 0; l < c.n_layer; ++l)
    for (int32_t p = 0; p < doc; ++p) EXPECT_EQ(b.computed(l, p), a.computed(l, p)) << l << " " << p;
  std::vector<int32_t> q(static_cast<size_t>(qb)), qpos(q.size());
  for (auto& i : q) i = int32_t(rng() % uint32_t(c.n_vocab));
  std::iota(qpos.begin(), qpos.end(), doc);
  b.extend(q, qpos, logits.data(), req, &st);  // at most once: a recomputed pair would throw
  const std::vector<float> want = ref.step(q, qpos, steps, testing::kept_of(st), &computed);
  EXPECT_EQ(st.queries, computed);
  for (size_t j = 0; j < want.size(); ++j) ASSERT_NEAR(logits[j], want[j], 1e-4 * rms(want)) << j;
  int64_t revived = 0;
  for (int l = 0; l < c.n_layer; ++l)
    for (const int32_t p : (*st.revived_positions)[size_t(l)]) {
      EXPECT_LT(p, doc);
      EXPECT_FALSE(a.computed(l, p)) << "revived where A computed it";
      ++revived;
    }
  EXPECT_GT(revived, 0) << "B's question revived nothing of the document";

  // Saved from B, the document's blocks are A's with B's revivals: each token as deep or deeper.
  const std::optional<TokenStates> c0 = b.save_states(0, 16);
  ASSERT_TRUE(c0);
  for (int64_t i = 0; i < 16; ++i) EXPECT_GE(c0->depth[size_t(i)], b0->depth[size_t(i)]);
  // A round trip is the same bytes.
  Session again(ctx, *m, 16);
  const TokenStates* one[] = {&*b0};
  again.load_states(one);
  const std::optional<TokenStates> back = again.save_states(0, 16);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->depth, b0->depth);
  EXPECT_EQ(back->kv, b0->kv);
  EXPECT_EQ(back->aux, b0->aux);
}

// On an empty session the extending pass is LazyLLM's pruned prefill, bit for bit: the same
// logits, the same pairs computed, the same states saved.
TEST(Revival, ExtendingAnEmptySessionIsThePrunedPrefill) {
  testing::TempDir dir;
  testing::TinyModelSpec spec;
  spec.n_layer = 4;
  const std::string path = testing::write_tiny_model(dir.path() + "/tiny.gguf", spec);
  CpuContext ctx(2);
  for (const DType dt : {DType::F32, DType::Int8}) {
    const auto m = Model::load(path, dt, ctx);
    const auto steps = resolve_schedule(parse_schedule("0:0.4,1:0.5"), m->config().n_layer);
    auto policy = make_policy(PolicyKind::LazyLLM, 3);
    const PruneRequest req{steps, policy.get()};
    std::vector<int32_t> ids = testing::random_ids(50, m->config().n_vocab, 4), pos(ids.size());
    std::iota(pos.begin(), pos.end(), 0);
    Session cold(ctx, *m, 64), ext(ctx, *m, 64);
    std::vector<float> want(size_t(m->config().n_vocab)), got(want.size());
    const int64_t last = int64_t(ids.size()) - 1;
    cold.forward(ids, pos, {&last, 1}, want.data(), &req);
    ext.extend(ids, pos, got.data(), req);
    EXPECT_EQ(got, want) << dtype_name(dt);
    const auto sc = cold.save_states(0, 48), se = ext.save_states(0, 48);
    ASSERT_TRUE(sc && se);
    EXPECT_EQ(sc->depth, se->depth);
    EXPECT_EQ(sc->kv, se->kv);
    EXPECT_EQ(sc->aux, se->aux);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Revival,
                         ::testing::Values(RevivalCase{1, PolicyKind::LazyLLM, "0:0.5", 3},
                                           RevivalCase{2, PolicyKind::LazyLLM, "0:0.5,1:0.5", 3},
                                           RevivalCase{17, PolicyKind::LazyLLM, "0:0.3,1:0.3,2:0.3", 5},
                                           RevivalCase{40, PolicyKind::RandomLayers, "0:0.5,2:0.5", 6},
                                           RevivalCase{33, PolicyKind::Frozen, "0:0.3,1:0.3", 4},
                                           RevivalCase{111, PolicyKind::LazyLLM, "1:0.6", 4}),
                         [](const ::testing::TestParamInfo<RevivalCase>& info) {
                           const RevivalCase& c = info.param;
                           std::string name =
                               "T";  // appended, not "T" + ...: gcc 12 warns falsely (-Wrestrict)
                           name += std::to_string(c.T) + "_" + policy_name(c.policy) + "_" + c.schedule +
                                   "_steps" + std::to_string(c.decode_steps);
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name + "_" + std::to_string(info.index);
                         });

}  // namespace
}  // namespace lp
