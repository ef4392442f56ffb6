// lp_gpu_bench: TTFT on the CUDA backend with and without LazyLLM pruning, on the default
// model (its real weights) and on a Llama-3.1-8B-shaped model with random bf16 weights (speed does
// not depend on the weights), plus the GEMM and attention checks of the speed targets:
//   - GEMM TFLOP/s at the 8B shapes against the GPU's dense bf16 peak (its hardware profile);
//   - LazyLLM's measured TTFT speedup against its FLOP-ideal (the same FLOP counting as the
//     simulator, model/ops.h, on the pass's own per-layer counts);
//   - attention over pruned keys against a dense attention over the same number of pairs.
// Each figure is the median of 5 runs (--runs) after a warm-up, same process, same GPU. Without a GPU it
// prints why and exits 77.
// Usage: lp_gpu_bench [TOKENS (4096)] [--shape PRESET (llama-3.1-8b)] [--layers N] [--runs N]
//                     [--no-default-model] [--int8 (the shape again with random Q8_0 weights)]
// (--layers keeps the first N layers of the shape, so a model too big for one GPU can be timed
// per layer). Built a second time over the host emulation (lp_gpu_bench_on_host), where ctest runs
// it on a small shape so that its code has run before a GPU does; its times there mean nothing.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "calibrate/fit_measurements.h"
#include "engine/batch.h"
#include "engine/session.h"
#include "hwmodels/profile.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_ops.h"
#include "model/error.h"
#include "model/ops.h"
#include "model/paths.h"
#include "model/presets.h"
#include "model/quant.h"
#include "pruning/schedule.h"
#include "tests/random_blocks.h"

namespace {

using namespace lp;

int g_runs = 5;     // timed runs per figure (--runs)
int g_steady = 32;  // decoding steps after which LazyLLM's are in steady state (issue 58; --steady)

// n bf16 values from N(0, 1) into device memory at p.
void upload_random_bf16(void* p, int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> h(static_cast<size_t>(n));
  for (uint16_t& x : h) x = f32_to_bf16(nd(g));
  cuda::copy_to_device(p, h.data(), h.size() * 2);
}

double median_ms(const std::function<void()>& f) {
  f();  // warm-up
  std::vector<double> t;
  for (int i = 0; i < g_runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    cuda::synchronize("bench");
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Random bf16 weights of a preset's shape (a cheap generator: values in about [-0.02, 0.02]), or
// with int8 random Q8_0 blocks (--dtype int8 on the GPU: scale 0.02 / 127, random quants).
std::unique_ptr<Model> random_model(const std::string& preset, int layers, bool int8) {
  ModelConfig c = preset_config(preset);
  if (layers > 0) c.n_layer = std::min(c.n_layer, layers);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  const auto fill = [&](int64_t rows, int64_t cols) {
    Matrix m;
    m.rows = rows;
    m.cols = cols;
    if (int8) {
      m.dtype = DType::Int8;
      m.q.resize(rows * m.row_bytes(), false);
      testing::fill_random_blocks(GgmlType::Q8_0, m.q.data(), rows * cols / 32, state++, 0.02f / 127);
      m.parts = {{GgmlType::Q8_0, rows, m.q.data()}};
      return m;
    }
    m.dtype = DType::BF16;
    m.bf16.resize(rows * cols, false);
    uint16_t* p = m.bf16.data();
    for (int64_t i = 0; i < rows * cols; ++i) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      const float v = (float(state >> 40) / float(1 << 24) - 0.5f) * 0.04f;
      uint32_t u;
      std::memcpy(&u, &v, 4);
      p[i] = uint16_t(u >> 16);
    }
    return m;
  };
  Weights w;
  w.dtype = int8 ? DType::Int8 : DType::BF16;
  const int64_t D = c.n_embd, F = c.n_ff, Q = int64_t(c.n_head) * c.head_dim,
                KV = int64_t(c.n_head_kv) * c.head_dim;
  w.tok_embd = fill(c.n_vocab, D);
  if (!c.tied_embeddings) w.output = fill(c.n_vocab, D);
  w.output_norm.assign(size_t(D), 1.0f);
  for (int l = 0; l < c.n_layer; ++l) {
    LayerWeights lw;
    lw.attn_norm.assign(size_t(D), 1.0f);
    lw.ffn_norm.assign(size_t(D), 1.0f);
    lw.wqkv = fill(Q + 2 * KV, D);
    lw.wo = fill(D, Q);
    // The later architectures' extra tensors (Qwen2's biases, Qwen3's q/k norms, Gemma 3's
    // post-norms) and a mixture of experts' router (f32) and experts.
    if (c.attention_bias) lw.qkv_bias.assign(size_t(Q + 2 * KV), 0.0f);
    if (c.qk_norm) lw.q_norm.assign(size_t(c.head_dim), 1.0f), lw.k_norm.assign(size_t(c.head_dim), 1.0f);
    if (c.post_norms) lw.post_attn_norm.assign(size_t(D), 1.0f), lw.post_ffn_norm.assign(size_t(D), 1.0f);
    if (c.moe()) {
      const int64_t E = c.n_expert, Fe = c.n_ff_exp;
      lw.router.rows = E;
      lw.router.cols = D;
      lw.router.dtype = DType::F32;
      lw.router.f32.resize(E * D, false);
      for (int64_t i = 0; i < E * D; ++i) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        lw.router.f32.data()[i] = (float(state >> 40) / float(1 << 24) - 0.5f) * 0.2f;
      }
      for (int64_t e = 0; e < E; ++e) {
        lw.expert_gate_up.push_back(fill(2 * Fe, D));
        lw.expert_down.push_back(fill(D, Fe));
      }
    } else {
      lw.w_gate_up = fill(2 * F, D);
      lw.w_down = fill(D, F);
    }
    w.layers.push_back(std::move(lw));
  }
  return std::make_unique<Model>(c, std::move(w), nullptr, "random " + preset);
}

// Prefill FLOPs of a pass from its per-layer counts (model/ops.h), for the FLOP-ideal speedup.
double pass_flops(const ModelConfig& c, const trace::Step& st) {
  double f = 0;
  for (int l = 0; l < c.n_layer; ++l) {
    const OpShape s{st.queries[size_t(l)], st.pairs[size_t(l)], st.keys[size_t(l)]};
    for (Op op : {Op::AttnNorm, Op::QKV, Op::Rope, Op::Attention, Op::OProj, Op::FfnNorm, Op::GateUp,
                  Op::SwiGLU, Op::Down})
      f += op_flops(c, op, s);
  }
  return f;
}

// A bench row's schedule ("none": no steps) resolved for the model, or a line saying why the row is
// skipped (a few layers of a shape, --layers, may not hold every schedule) and nullopt.
std::optional<std::vector<PruneStep>> steps_or_skip(const char* sched, const ModelConfig& c) {
  if (std::string(sched) == "none") return std::vector<PruneStep>{};
  try {
    return resolve_schedule(parse_schedule(sched), c.n_layer, c.global_layers());
  } catch (const Error& e) {
    fmt::print("  {:<28} skipped: {}\n", sched, e.what());
    return std::nullopt;
  }
}

// T random token ids (from `seed`) at positions 0 .. T - 1.
struct Prompt {
  std::vector<int32_t> ids, pos;
  Prompt(const ModelConfig& c, int64_t T, uint32_t seed) : ids(static_cast<size_t>(T)), pos(ids.size()) {
    std::mt19937 rng(seed);
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = int32_t(rng() % uint32_t(c.n_vocab)), pos[i] = int32_t(i);
  }
};

void ttft_rows(const Model& m, int64_t T, const cuda::BackendOptions& opt = {}) {
  const ModelConfig& c = m.config();
  const auto [ids, pos] = Prompt(c, T, 1);
  const int64_t last = T - 1;
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  double base_ms = 0, base_flops = 0;
  // Weights uploaded once, outside the timings; room for the decoding steps timed after the prefill.
  const int steps_timed = g_runs + 1, steps_between = std::max(0, g_steady - steps_timed);
  const int64_t room = T + std::max<int64_t>(g_runs + 2, 2 * steps_timed + steps_between);
  cuda::BackendOptions defer_opt = opt, wait_opt = opt;
  defer_opt.deferred_selection = true;
  wait_opt.deferred_selection = false;
  Session s(m, cuda::make_backend(c, m.weights(), room, defer_opt));  // the prefills, then deferred steps
  Session waiting(m, cuda::make_backend(c, m.weights(), room, wait_opt));
  double dense_step = 0;
  for (const char* sched : {"none", "0.3:0.3,0.6:0.3,0.9:0.3", "0.1:0.5,0.3:0.5,0.5:0.5"}) {
    const bool prune = std::string(sched) != "none";
    const std::optional<std::vector<PruneStep>> resolved = steps_or_skip(sched, c);
    if (!resolved) continue;
    const std::vector<PruneStep>& steps = *resolved;
    trace::Step st;
    auto policy = make_policy(prune ? PolicyKind::LazyLLM : PolicyKind::None);
    const PruneRequest req{steps, policy.get()};
    const auto pass = [&](trace::Step* stats) {
      s.reset();
      s.forward(ids, pos, {&last, 1}, logits.data(), prune ? &req : nullptr, stats);
    };
    // Timed without stats (which would bring each step's scores to the host); one more pass counts.
    const double ms = median_ms([&] { pass(nullptr); });
    pass(&st);
    const double flops = pass_flops(c, st);
    if (!prune) base_ms = ms, base_flops = flops;
    fmt::print("  {:<28} {:>7} tokens  {:>10.2f} ms  speedup {:>5.2f}x  FLOP-ideal {:>5.2f}x  ratio {:.2f}\n",
               sched, T, ms, base_ms / ms, base_flops / flops, (base_ms / ms) / (base_flops / flops));
    // Decoding steps after this prefill (its K/V and Aux Cache): one token each, over every key
    // (dense) or re-selecting and reviving at the schedule's layers (LazyLLM), with the times the host
    // waited for the device in each (cuda::host_waits). LazyLLM's on this session, whose selections are
    // deferred (one wait a step where nothing is revived), and on one that waits at each selection,
    // alternated step by step: its first steps, where revivals cluster, and after g_steady steps (the
    // issue's steady state, against the dense step's 1.3x).
    if (!prune) {
      int32_t p = int32_t(T);
      const int64_t row = 0, waits0 = cuda::host_waits();
      dense_step = median_ms([&] {
        const int32_t id = 1, at = p++;
        s.forward({&id, 1}, {&at, 1}, {&row, 1}, logits.data());
      });
      const double waits = double(cuda::host_waits() - waits0) / double(g_runs + 1);  // the warm-up's too
      fmt::print("  {:<28} {:>7} keys    {:>10.2f} ms  ({:.0f} tokens/s, {:.1f} host waits a step)\n",
                 "decoding step (dense)", T, dense_step, 1e3 / dense_step, waits);
      continue;
    }
    waiting.reset();
    waiting.forward(ids, pos, {&last, 1}, logits.data(), &req);
    Session* const both[2] = {&s, &waiting};
    int32_t p = int32_t(T);
    const auto steps_of = [&](int n, bool timed, const char* when) {
      std::vector<double> ms[2];
      int64_t waits[2] = {0, 0};
      for (int i = 0; i < n; ++i, ++p)
        for (int k = 0; k < 2; ++k) {
          const int64_t w0 = cuda::host_waits();
          const auto t0 = std::chrono::steady_clock::now();
          both[k]->decode_step(1, p, logits.data(), &req);
          ms[k].push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
          waits[k] += cuda::host_waits() - w0;
        }
      if (!timed) return;
      for (int k = 0; k < 2; ++k) {
        std::sort(ms[k].begin(), ms[k].end());
        const double med = ms[k][ms[k].size() / 2];
        fmt::print(
            "  {:<28} {:>7} keys    {:>10.2f} ms  ({:.0f} tokens/s, {:.1f} host waits a step, {:.2f}x "
            "dense; {})\n",
            k == 0 ? "decoding step (deferred)" : "decoding step (waiting)", T, med, 1e3 / med,
            double(waits[k]) / n, med / dense_step, when);
      }
    };
    const int64_t redone0 = s.steps_redone();
    steps_of(steps_timed, true, "first steps");
    steps_of(steps_between, false, "");
    steps_of(steps_timed, true, fmt::format("after {} steps", steps_timed + steps_between).c_str());
    fmt::print("  {:<28} {} of {} steps computed again (a revival missed)\n", "deferred",
               s.steps_redone() - redone0, 2 * steps_timed + steps_between);
  }
}

// The decoding rows' pruning: LazyLLM's default schedule on c, or none (a null request).
class DecodePruning {
 public:
  DecodePruning(const ModelConfig& c, bool prune)
      : steps_(prune
                   ? resolve_schedule(parse_schedule("0.3:0.3,0.6:0.3,0.9:0.3"), c.n_layer, c.global_layers())
                   : std::vector<PruneStep>{}),
        policy_(make_policy(prune ? PolicyKind::LazyLLM : PolicyKind::None)),
        req_{steps_, policy_.get()},
        prune_(prune) {}
  DecodePruning(const DecodePruning&) = delete;
  DecodePruning& operator=(const DecodePruning&) = delete;
  const PruneRequest* request() const { return prune_ ? &req_ : nullptr; }

 private:
  std::vector<PruneStep> steps_;
  std::unique_ptr<PruningPolicy> policy_;
  PruneRequest req_;
  bool prune_;
};

// The prefix cache on the GPU (`serve --backend cuda`): a T-token prefix's states, unpruned and after
// LazyLLM's default schedule, saved to host memory (Session::save_states: K/V gathered on the device,
// one copy back a layer) and loaded into a fresh session (load_states), against the prefill that
// computes them: what a hit costs where a miss costs the prefill.
void prefix_rows(const Model& m, int64_t T) {
  const ModelConfig& c = m.config();
  const auto [ids, pos] = Prompt(c, T, 3);
  const int64_t last = T - 1;
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  for (const char* sched : {"none", "0.3:0.3,0.6:0.3,0.9:0.3"}) {
    const bool prune = std::string(sched) != "none";
    const std::optional<std::vector<PruneStep>> resolved = steps_or_skip(sched, c);
    if (!resolved) continue;
    const std::vector<PruneStep>& steps = *resolved;
    auto policy = make_policy(prune ? PolicyKind::LazyLLM : PolicyKind::None);
    const PruneRequest req{steps, policy.get()};
    Session a(m, cuda::make_backend(c, m.weights(), T)), b(m, cuda::make_backend(c, m.weights(), T));
    const double prefill_ms = median_ms([&] {
      a.reset();
      a.forward(ids, pos, {&last, 1}, logits.data(), prune ? &req : nullptr);
    });
    std::optional<TokenStates> st;
    const double save_ms = median_ms([&] { st = a.save_states(0, T); });
    if (!st) {
      fmt::print("  {:<28} the states are not a prefix the cache holds\n", sched);
      continue;
    }
    const TokenStates* blocks[] = {&*st};
    const double load_ms = median_ms([&] {
      b.reset();
      b.load_states(blocks);
    });
    fmt::print(
        "  {:<28} prefill {:8.2f} ms; states {:7.1f} MiB saved {:7.2f} ms, loaded {:7.2f} ms ({:.1f}x "
        "faster than the prefill)\n",
        sched, prefill_ms, double(st->bytes()) / 1048576.0, save_ms, load_ms, prefill_ms / load_ms);
  }
}

// Continuous batching's decoding steps (engine/batch.h, as `serve` runs them): n sessions, each
// after its own prefill of T tokens (LazyLLM's default schedule or none), decoding one token each
// per step, every GEMM and row op once over all of them. Tokens/s of 1 and 8 members side by side
// (issue 58, item 3: 8 requests at least 4x one request's tokens/s at the 8B shape), with the
// operations each step queues (cuda::queued_ops) and the times it waits (cuda::host_waits).
void batch_rows(const Model& m, int64_t T, int members) {
  const ModelConfig& c = m.config();
  const int64_t last = T - 1;
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::iota(pos.begin(), pos.end(), 0);
  for (const bool prune : {false, true}) {
    const DecodePruning pruning(c, prune);
    const PruneRequest* const req = pruning.request();
    double alone = 0;
    // One member and `members`, each launched op by op and captured as CUDA graphs (issue 58, item 2:
    // BackendOptions::cuda_graphs; a LazyLLM step a graph per stretch between its waits), with the
    // graphs' segments a step and the executables instantiated over the timed steps (0 once settled).
    for (const auto& [n, graphs] :
         {std::pair{1, false}, std::pair{1, true}, std::pair{members, false}, std::pair{members, true}}) {
      const cuda::BackendOptions opt{.cuda_graphs = graphs};
      std::vector<std::unique_ptr<Session>> ss;
      std::vector<std::vector<float>> logits(size_t(n), std::vector<float>(size_t(c.n_vocab)));
      std::mt19937 rng(11);
      for (int i = 0; i < n; ++i) {
        std::vector<int32_t> ids(static_cast<size_t>(T));
        for (int32_t& id : ids) id = int32_t(rng() % uint32_t(c.n_vocab));
        ss.push_back(std::make_unique<Session>(m, cuda::make_backend(c, m.weights(), T + g_runs + 3, opt)));
        ss.back()->forward(ids, pos, {&last, 1}, logits[size_t(i)].data(), req);
      }
      int32_t at = int32_t(T);
      const auto step = [&] {
        std::vector<Session::Pass> passes;
        std::vector<BatchMember> batch;
        passes.reserve(size_t(n));
        for (int i = 0; i < n; ++i)
          passes.push_back(ss[size_t(i)]->begin_decode(1, at, req, nullptr, nullptr));
        for (int i = 0; i < n; ++i)
          batch.push_back({ss[size_t(i)].get(), &passes[size_t(i)], logits[size_t(i)].data()});
        run_batch(batch);
        ++at;
      };
      step();  // the first step grows the batch's buffers; the counts are the steps after it
      const int64_t ops0 = cuda::queued_ops(), waits0 = cuda::host_waits();
      const cuda::GraphCounts g0 = cuda::graph_counts();
      const double ms = median_ms(step);
      const cuda::GraphCounts g1 = cuda::graph_counts();
      const double steps_run = g_runs + 1, tokens_s = n * 1e3 / ms;
      if (n == 1 && !graphs) alone = tokens_s;
      fmt::print(
          "  {:<9} {} member{}  {:>8.2f} ms a step  {:>8.0f} tokens/s  "
          "({:.2f}x one; {:.0f} operations queued and {:.1f} host waits a step{})\n",
          prune ? "LazyLLM" : "unpruned", n, n == 1 ? " " : "s", ms, tokens_s, tokens_s / alone,
          double(cuda::queued_ops() - ops0) / steps_run, double(cuda::host_waits() - waits0) / steps_run,
          graphs
              ? fmt::format("; as CUDA graphs: {:.1f} segments a step, {} instantiated",
                            double(g1.launched - g0.launched) / steps_run, g1.instantiated - g0.instantiated)
              : "");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"lp_gpu_bench: TTFT with and without LazyLLM, GEMMs and attention on the CUDA backend"};
  int64_t T = 4096;
  std::string shape = "llama-3.1-8b";
  int layers = 0;
  bool no_default = false;
  app.add_option("tokens", T, "Prompt tokens")->check(CLI::Range(int64_t(2), int64_t(1) << 20));
  bool int8 = false;
  app.add_flag("--int8", int8, "Also time the shape with random Q8_0 weights (--dtype int8 on the GPU)");
  app.add_option("--shape", shape, "Model preset whose shape gets random bf16 weights")
      ->check(CLI::IsMember(preset_names()));
  app.add_option("--layers", layers, "Keep only the first N layers of the shape (0: all)")
      ->check(CLI::Range(0, 1024));
  app.add_flag("--no-default-model", no_default, "Skip the default model's TTFT rows");
  bool f32_attention = true;
  app.add_flag("!--no-f32-attention", f32_attention,
               "Skip the shape's TTFT rows with the f32 attention kernel (beside the tensor cores')");
  int64_t batch_prompt = 512;
  int batch_members = 8;
  app.add_option("--batch-members", batch_members, "Members of the batched decoding rows (beside one alone)")
      ->check(CLI::Range(2, 256));
  app.add_option("--batch-prompt", batch_prompt, "Prompt tokens of each batched decoding member")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 20));
  app.add_option("--steady", g_steady, "LazyLLM decoding steps before its steady-state rows")
      ->check(CLI::Range(0, 100000));
  app.add_option("--runs", g_runs, "Timed runs per figure, after one warm-up (the median is printed)")
      ->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  try {
    cuda::Device d;
    try {
      d = cuda::open_device();
    } catch (const Error& e) {
      std::printf("SKIPPED: %s\n", e.what());
      return 77;
    }
    fmt::print("GPU: {} (sm_{}{}, {:.1f} GiB)\n", d.name, d.cc_major, d.cc_minor,
               double(d.total_bytes) / 1073741824.0);
    // The GPU's dense bf16 peak, from the profile whose name or aliases name it (as calibrate matches
    // hardware names: case, spaces and '_' ignored).
    double peak = 0;
    if (const auto profile = calib::match_profile(d.name, {})) {
      peak = hw::load_profile(*profile).peak("bf16");
      fmt::print("hardware profile: {} (dense bf16 peak {:.0f} TFLOP/s)\n", *profile, peak / 1e12);
    } else {
      fmt::print("no hardware profile names '{}': GEMMs are not compared with a peak\n", d.name);
    }
    fmt::print("\nTTFT: the prefill of a random prompt and its last row's logits (median of {})\n", g_runs);
    if (!no_default && std::filesystem::exists(default_model_path())) {
      CpuContext ctx(4);
      const auto m = Model::load(default_model_path(), DType::F32, ctx);
      fmt::print("default model (SmolLM2-135M, f32):\n");
      ttft_rows(*m, std::min<int64_t>(T, 8192));
      fmt::print("default model: decoding steps, op by op and as CUDA graphs, after {}-token prompts\n",
                 std::min<int64_t>(T, batch_prompt));
      batch_rows(*m, std::min<int64_t>(T, batch_prompt), batch_members);
    }
    // A bf16 session's attention runs on the tensor cores in f16 over its f16 K/V cache (the default,
    // issue 58: the figure to set beside the published vLLM and TensorRT-LLM TTFTs of this shape); the
    // same with the f32 kernel beside it.
    const auto mr = random_model(shape, layers, false);
    fmt::print("{} shape ({} layers), random bf16 weights, f16 K/V, attention on the tensor cores:\n", shape,
               mr->config().n_layer);
    ttft_rows(*mr, T);
    if (f32_attention) {
      fmt::print("{} shape, random bf16 weights, f16 K/V, attention by the f32 kernel (CUDA cores):\n",
                 shape);
      ttft_rows(*mr, T, cuda::BackendOptions{.tensor_core_attention = false});
    }
    fmt::print(
        "\n{} shape, random bf16 weights: the prefix cache's copies of a {}-token prefix (median of {})\n",
        shape, T, g_runs);
    prefix_rows(*mr, T);
    fmt::print(
        "\n{} shape, random bf16 weights: batched decoding steps after {}-token prompts (median of {})\n",
        shape, std::min<int64_t>(T, batch_prompt), g_runs);
    batch_rows(*mr, std::min<int64_t>(T, batch_prompt), batch_members);
    if (int8) {
      const auto mq = random_model(shape, layers, true);
      fmt::print("{} shape ({} layers), random Q8_0 weights (--dtype int8: bf16 activations):\n", shape,
                 mq->config().n_layer);
      ttft_rows(*mq, T);
    }

    // GEMMs at the shape's prefill sizes.
    fmt::print("\nGEMM, bf16 inputs, f32 accumulation ({} rows):\n", T);
    const ModelConfig c = mr->config();
    const int64_t D = c.n_embd, F = c.n_ff, QKV = int64_t(c.n_head + 2 * c.n_head_kv) * c.head_dim;
    for (auto [name, K, N] : {std::tuple<const char*, int64_t, int64_t>{"qkv", D, QKV},
                              {"o", D, D},
                              {"gate_up", D, 2 * F},
                              {"down", F, D}}) {
      void* a = cuda::device_alloc(size_t(T * K) * 2, "bench A");
      void* w = cuda::device_alloc(size_t(N * K) * 2, "bench W");
      void* o = cuda::device_alloc(size_t(T * N) * 4, "bench C");
      upload_random_bf16(a, T * K, 1);  // defined inputs: the speed must not depend on what the memory held
      upload_random_bf16(w, N * K, 2);
      const double ms =
          median_ms([&, K = K, N = N] { cuda::gemm_bf16((uint16_t*)a, (uint16_t*)w, (float*)o, T, K, N); });
      const double tflops = 2.0 * T * K * N / (ms * 1e-3) / 1e12;
      fmt::print("  {:<8} [{}x{}]x[{}x{}]  {:>8.3f} ms  {:>7.1f} TFLOP/s{}\n", name, T, K, K, N, ms, tflops,
                 peak > 0 ? fmt::format("  {:.0f}% of the {:.0f} TFLOP/s dense peak",
                                        100 * tflops * 1e12 / peak, peak / 1e12)
                          : "");
      cuda::device_free(a), cuda::device_free(w), cuda::device_free(o);
    }

    // Attention over pruned keys against a dense attention over the same number of pairs. In a
    // pruned prefill layer the rows are the kept tokens and the keys are the same tokens, at their
    // original positions: here T/2 of T positions drawn at random (sorted), as a pruning step keeps
    // them. The dense case is T/2 rows at positions 0 .. T/2 - 1. The causal pairs are the same
    // (positions keep their order); what differs is what the kernel sees: positions with gaps,
    // on which it masks and decides which key tiles a block can skip. A kernel that masked by
    // index, or skipped tiles by index, would read the wrong pairs or waste tiles here.
    // K and V are an f16 cache, as a bf16 or int8 session keeps them (kernels/kv_type.h).
    fmt::print("\nattention, {} heads / {} KV heads, Dh {}, f16 K/V:\n", c.n_head, c.n_head_kv, c.head_dim);
    const int64_t H = c.n_head, Hkv = c.n_head_kv, Dh = c.head_dim, Tq = std::max<int64_t>(1, T / 2);
    std::vector<int32_t> all(static_cast<size_t>(T)), kept(static_cast<size_t>(Tq)),
        dense(static_cast<size_t>(Tq));
    std::iota(all.begin(), all.end(), 0);
    std::mt19937 pick(7);
    std::shuffle(all.begin(), all.end() - 1, pick);  // the last token is always kept
    std::copy(all.begin(), all.begin() + Tq - 1, kept.begin());
    kept[size_t(Tq - 1)] = int32_t(T - 1);
    std::sort(kept.begin(), kept.end());
    std::iota(dense.begin(), dense.end(), 0);
    void* q = cuda::device_alloc(size_t(Tq * H * Dh) * 4, "bench q");
    void* k = cuda::device_alloc(size_t(Tq * Hkv * Dh) * 2, "bench k");
    void* v = cuda::device_alloc(size_t(Tq * Hkv * Dh) * 2, "bench v");
    void* out = cuda::device_alloc(size_t(Tq * H * Dh) * 4, "bench out");
    void* qp = cuda::device_alloc(size_t(Tq) * 4, "bench pos");
    void* kp = cuda::device_alloc(size_t(Tq) * 4, "bench pos");
    {  // defined inputs (uninitialised memory may hold NaNs, which would change the work)
      std::mt19937 g(3);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> hq(size_t(Tq * H * Dh));
      std::vector<uint16_t> hk(size_t(Tq * Hkv * Dh));
      for (float& x : hq) x = nd(g);
      for (uint16_t& x : hk) x = f32_to_f16(nd(g));
      cuda::copy_to_device(q, hq.data(), hq.size() * 4);
      cuda::copy_to_device(k, hk.data(), hk.size() * 2);
      cuda::copy_to_device(v, hk.data(), hk.size() * 2);
    }
    using Attention = decltype(&cuda::attention);
    const auto time_at = [&](Attention run, const std::vector<int32_t>& pos) {
      cuda::copy_to_device(qp, pos.data(), size_t(Tq) * 4);
      cuda::copy_to_device(kp, pos.data(), size_t(Tq) * 4);
      return median_ms([&] {
        run((float*)q, (int32_t*)qp, Tq, k, v, (int32_t*)kp, Tq, H, Hkv, Dh, 1.0f / std::sqrt(float(Dh)), 0,
            (float*)out, nullptr, KvType::F16);
      });
    };
    // Both kernels: f32 on CUDA cores, and f16 on the tensor cores (issue 58); TFLOP/s over the causal
    // pairs' 4 Dh FLOPs a head (Q K^T and P V).
    const double pairs = double(Tq) * double(Tq + 1) / 2, flops = 4.0 * double(Dh) * double(H) * pairs;
    for (const auto& [name, run] :
         {std::pair<const char*, Attention>{"f32, CUDA cores", &cuda::attention},
          std::pair<const char*, Attention>{"f16, tensor cores", &cuda::attention_tc}}) {
      const double pruned_ms = time_at(run, kept), dense_ms = time_at(run, dense);
      fmt::print(
          "  {}: {} kept rows of {} over their own keys {:.3f} ms, {} dense rows {:.3f} ms ({} causal pairs "
          "each, {:.1f} TFLOP/s dense): ratio {:.2f}\n",
          name, Tq, T, pruned_ms, Tq, dense_ms, int64_t(pairs), flops / (dense_ms * 1e-3) / 1e12,
          pruned_ms / dense_ms);
    }
    for (void* p : {q, k, v, out, qp, kp}) cuda::device_free(p);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "lp_gpu_bench: error: %s\n", e.what());
    return 1;
  }
}
