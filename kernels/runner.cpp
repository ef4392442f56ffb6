#include "kernels/runner.h"

#include <sys/resource.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "model/error.h"
#include "model/gguf.h"
#include "model/quant.h"
#include "model/vocab.h"

namespace lp {

double OpTimers::total_seconds() const {
  double s = 0;
  for (double v : seconds) s += v;
  return s;
}
double OpTimers::total_flops() const {
  double s = 0;
  for (double v : flops) s += v;
  return s;
}

std::unique_ptr<Model> Model::load(const std::string& path, DType dtype, CpuContext& ctx) {
  GgufFile f = GgufFile::open(path);
  ModelConfig c = config_from_gguf(f);
  auto tok = std::make_unique<Tokenizer>(vocab_from_gguf(f));
  if (tok->n_vocab() != c.n_vocab)
    fail("{}: tokenizer has {} tokens but the embedding has {} rows", path, tok->n_vocab(), c.n_vocab);
  Weights w = load_weights(f, c, dtype, ctx);
  return std::make_unique<Model>(std::move(c), std::move(w), std::move(tok), path);
}

Session::Session(const Model& m, int64_t n_ctx) : m_(m), n_ctx_(n_ctx) {
  const ModelConfig& c = m.config();
  if (n_ctx < 1) fail("context size must be positive, got {}", n_ctx);
  kv_.resize(size_t(c.n_layer));
  for (auto& kv : kv_) kv.init(n_ctx, c.n_head_kv, c.head_dim);
}

void Session::reset() {
  for (auto& kv : kv_) kv.n = 0;
}

int64_t Session::kv_bytes() const {
  int64_t b = 0;
  for (const auto& kv : kv_) b += (kv.kt.size() + kv.v.size()) * 4;
  return b;
}

namespace {
using Clock = std::chrono::steady_clock;

// Times one op and records its counted FLOPs.
struct Timed {
  OpTimers* t;
  Op op;
  double flops;
  Clock::time_point t0 = Clock::now();
  ~Timed() {
    if (t) t->add(op, std::chrono::duration<double>(Clock::now() - t0).count(), flops);
  }
};
}  // namespace

void Session::forward(CpuContext& ctx, std::span<const int32_t> ids, std::span<const int32_t> pos,
                      std::span<const int64_t> logit_rows, float* logits, OpTimers* timers) {
  const ModelConfig& c = m_.config();
  const Weights& w = m_.weights();
  const int64_t T = int64_t(ids.size());
  if (T == 0) fail("forward: no tokens");
  if (pos.size() != ids.size()) fail("forward: {} ids but {} positions", ids.size(), pos.size());
  if (n_cached() + T > n_ctx_)
    fail("context full: {} cached + {} new tokens exceed the context size {}", n_cached(), T, n_ctx_);
  for (int64_t t = 0; t < T; ++t) {
    if (ids[t] < 0 || ids[t] >= c.n_vocab)
      fail("token id {} is outside the vocabulary [0, {})", ids[t], c.n_vocab);
    if (t > 0 && pos[t] <= pos[t - 1]) fail("forward: positions must be strictly increasing");
  }
  const int64_t D = c.n_embd, H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim, F = c.n_ff;
  const int64_t QKV = (H + 2 * Hkv) * Dh, Q = H * Dh;
  x_.resize(T * D, false);
  xn_.resize(T * D, false);
  qkv_.resize(T * QKV, false);
  attn_.resize(T * Q, false);
  ff_.resize(T * 2 * F, false);
  act_.resize(T * F, false);
  tmp_.resize(T * D, false);
  const OpShape shape{T, 0, 0};

  {
    Timed tm{timers, Op::Embed, op_flops(c, Op::Embed, shape)};
    const Matrix& E = w.tok_embd;
    ctx.run([&] {
      tbb::parallel_for(int64_t(0), T, [&](int64_t t) {
        float* dst = x_.data() + t * D;
        if (E.dtype == DType::F32)
          std::memcpy(dst, E.f32.data() + int64_t(ids[t]) * D, size_t(D) * 4);
        else
          for (int64_t i = 0; i < D; ++i) dst[i] = bf16_to_f32(E.bf16[int64_t(ids[t]) * D + i]);
      });
    });
  }
  const RopeTable rope_tab = rope_table(pos.data(), T, c.rope_dim, c.rope_theta,
                                        w.rope_freqs.empty() ? nullptr : w.rope_freqs.data());

  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = w.layers[size_t(l)];
    LayerKV& kv = kv_[size_t(l)];
    {
      Timed tm{timers, Op::AttnNorm, op_flops(c, Op::AttnNorm, shape)};
      rmsnorm(ctx, x_.data(), L.attn_norm.data(), xn_.data(), T, D, c.rms_eps);
    }
    {
      Timed tm{timers, Op::QProj, op_flops(c, Op::QProj, shape) + 2 * op_flops(c, Op::KProj, shape)};
      gemm_.run(ctx, xn_.data(), T, D, L.wqkv, qkv_.data(), QKV);
    }
    {
      Timed tm{timers, Op::Rope, op_flops(c, Op::Rope, shape)};
      rope(ctx, qkv_.data(), T, QKV, H + Hkv, Dh, rope_tab);  // q and k heads are adjacent
    }
    const int64_t n_keys = kv.n + T;
    {
      // Pairs attended: each query sees the cached keys at or before its position.
      int64_t pairs = 0;
      for (int64_t t = 0; t < T; ++t) {
        pairs += std::upper_bound(kv.pos.begin(), kv.pos.begin() + kv.n, pos[t]) - kv.pos.begin();
        pairs += t + 1;
      }
      Timed tm{timers, Op::Attention, op_flops(c, Op::Attention, OpShape{T, pairs, n_keys})};
      kv.append(qkv_.data() + Q, QKV, qkv_.data() + Q + Hkv * Dh, QKV, pos.data(), T);
      attention(ctx, qkv_.data(), QKV, pos.data(), T, kv, H, attn_.data(), Q);
    }
    {
      Timed tm{timers, Op::OProj, op_flops(c, Op::OProj, shape)};
      gemm_.run(ctx, attn_.data(), T, Q, L.wo, tmp_.data(), D);
    }
    {
      Timed tm{timers, Op::Residual, op_flops(c, Op::Residual, shape) / 2};
      add_inplace(ctx, x_.data(), tmp_.data(), T * D);
    }
    {
      Timed tm{timers, Op::FfnNorm, op_flops(c, Op::FfnNorm, shape)};
      rmsnorm(ctx, x_.data(), L.ffn_norm.data(), xn_.data(), T, D, c.rms_eps);
    }
    {
      Timed tm{timers, Op::Gate, 2 * op_flops(c, Op::Gate, shape)};
      gemm_.run(ctx, xn_.data(), T, D, L.w_gate_up, ff_.data(), 2 * F);
    }
    {
      Timed tm{timers, Op::SwiGLU, op_flops(c, Op::SwiGLU, shape)};
      swiglu(ctx, ff_.data(), 2 * F, ff_.data() + F, 2 * F, act_.data(), F, T, F);
    }
    {
      Timed tm{timers, Op::Down, op_flops(c, Op::Down, shape)};
      gemm_.run(ctx, act_.data(), T, F, L.w_down, tmp_.data(), D);
    }
    {
      Timed tm{timers, Op::Residual, op_flops(c, Op::Residual, shape) / 2};
      add_inplace(ctx, x_.data(), tmp_.data(), T * D);
    }
  }

  // Final norm and LM head only for the rows that need logits.
  const int64_t R = int64_t(logit_rows.size());
  if (R == 0) return;
  Buffer<float> rows(R * D, false);
  for (int64_t r = 0; r < R; ++r) {
    if (logit_rows[r] < 0 || logit_rows[r] >= T) fail("forward: logit row {} out of range", logit_rows[r]);
    std::memcpy(rows.data() + r * D, x_.data() + logit_rows[r] * D, size_t(D) * 4);
  }
  const OpShape head{R, 0, 0};
  {
    Timed tm{timers, Op::OutputNorm, op_flops(c, Op::OutputNorm, head)};
    rmsnorm(ctx, rows.data(), w.output_norm.data(), rows.data(), R, D, c.rms_eps);
  }
  {
    Timed tm{timers, Op::LmHead, op_flops(c, Op::LmHead, head)};
    gemm_.run(ctx, rows.data(), R, D, w.lm_head(), logits, c.n_vocab);
  }
}

double peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace lp
