#include "calibrate/lone_decode.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <boost/math/statistics/univariate_statistics.hpp>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "calibrate/fit_measurements.h"
#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "sim/replay.h"

namespace lp::calib {
namespace {

double median(std::vector<double> v) {
  return boost::math::statistics::median(v);
}

// An op's measured time in a `run --json` output's ops.decode.total, seconds.
double op_seconds(const nlohmann::json& total, const char* op, const std::string& path) {
  const auto it = total.find(op);
  if (it == total.end()) return 0;  // an op that never ran (no pruning stage in these steps)
  const auto ms = it->find("ms");
  if (!it->is_object() || ms == it->end() || !ms->is_number() || !(ms->get<double>() >= 0))
    fail("{}: ops.decode.total.{}.ms must be a number >= 0", path, op);
  return ms->get<double>() * 1e-3;
}

// What the fit needs of a replay, per span of steps: attention and pruning (score + select) time.
struct Parts {
  double attention = 0, pruning = 0;
};

// Replays `run`'s trace up to each measured step count on `hw`; per step count, the decoding
// steps' attention and pruning (score + select) time.
std::vector<Parts> replay_parts(const LoneDecodeRun& run, const ModelConfig& c, const hw::Profile& hw,
                                const sim::Precision& p) {
  const trace::Trace t = sim::map_trace(run.trace, c.n_layer, 0);
  std::vector<Parts> out;
  for (const int64_t k : run.steps) {
    sim::Replayer rp(t.header, c, hw, p);
    int64_t decoded = 0;
    for (const trace::Step& s : t.steps) {
      const bool prefill = s.kind == "prefill";
      if (!prefill && decoded == k) break;
      rp.add(s);
      decoded += prefill ? 0 : 1;
    }
    const sim::Prediction pr = std::move(rp).finish();
    out.push_back({pr.decode_ops[size_t(Op::Attention)].time_s,
                   pr.decode_ops[size_t(Op::Score)].time_s + pr.decode_ops[size_t(Op::Select)].time_s});
  }
  return out;
}

// The replay's attention and pruning time per span of steps (each run's step counts in turn, the
// span from the previous count to this one), on profile `h`.
std::vector<Parts> span_parts(const std::vector<LoneDecodeRun>& runs, const ModelConfig& c,
                              const hw::Profile& h, const sim::Precision& p) {
  std::vector<Parts> out;
  for (const LoneDecodeRun& r : runs) {
    const std::vector<Parts> cum = replay_parts(r, c, h, p);
    for (size_t i = 0; i < cum.size(); ++i)
      out.push_back(
          {cum[i].attention - (i ? cum[i - 1].attention : 0), cum[i].pruning - (i ? cum[i - 1].pruning : 0)});
  }
  return out;
}

// Least squares of sum_i (r_i - a_i x - b_i y)^2 over x, y, with x >= x_lo and y >= y_lo (each
// held at its bound when it comes out below, and the other refitted). Throws lp::Error naming
// `what` when the spans cannot tell x from y (the a and b columns proportional, or one zero).
std::pair<double, double> fit_two(const std::vector<double>& a, const std::vector<double>& b,
                                  const std::vector<double>& r, double x_lo, double y_lo, const char* what) {
  double aa = 0, ab = 0, bb = 0, ar = 0, br = 0;
  for (size_t i = 0; i < r.size(); ++i)
    aa += a[i] * a[i], ab += a[i] * b[i], bb += b[i] * b[i], ar += a[i] * r[i], br += b[i] * r[i];
  const double det = aa * bb - ab * ab;
  if (!(det > 1e-9 * aa * bb)) fail("lone decoding runs: the spans cannot determine {}", what);
  double x = (ar * bb - br * ab) / det, y = (br * aa - ar * ab) / det;
  if (x < x_lo) x = x_lo, y = (br - ab * x) / bb;
  if (y < y_lo) y = y_lo, x = std::max((ar - ab * y) / aa, x_lo);
  return {x, y};
}

double rms_log(const std::vector<double>& pred, const std::vector<double>& meas) {
  double s = 0;
  for (size_t i = 0; i < pred.size(); ++i) {
    const double e = std::log(std::max(pred[i], 1e-12) / meas[i]);
    s += e * e;
  }
  return std::sqrt(s / double(std::max<size_t>(pred.size(), 1)));
}

}  // namespace

std::vector<LoneDecodeRun> load_lone_decodes(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) fail("{}: not a folder of lone decoding runs", dir);
  std::vector<std::string> traces;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (f.ends_with(".trace.jsonl")) traces.push_back(f.substr(0, f.size() - 12));
  }
  std::sort(traces.begin(), traces.end());
  if (traces.empty()) fail("{}: no <name>.trace.jsonl", dir);
  std::vector<LoneDecodeRun> runs;
  for (const std::string& name : traces) {
    LoneDecodeRun run;
    run.name = name + ".trace.jsonl";
    run.trace = trace::read_trace((fs::path(dir) / run.name).string());
    if (run.trace.header.policy != "lazyllm") fail("{}/{}: a lazyllm trace is needed", dir, run.name);
    int64_t trace_steps = 0;
    for (const trace::Step& s : run.trace.steps) trace_steps += s.kind == "prefill" ? 0 : 1;
    const std::regex re(name + R"(-n([0-9]{1,6})-r([0-9]{1,4})\.json)");
    std::map<int64_t, std::vector<std::array<double, 2>>> by_n;
    for (const auto& e : fs::directory_iterator(dir)) {
      std::smatch m;
      const std::string f = e.path().filename().string();
      if (!std::regex_match(f, m, re)) continue;
      const std::string path = e.path().string();
      const auto j = json_parse(read_input_file(path, "run --json output", input_cap::kResults), path, true);
      if (j.is_discarded() || !j.is_object()) fail("{}: not a JSON object", path);
      const auto ops = j.find("ops");
      if (ops == j.end() || !ops->is_object() || !ops->contains("decode") || !(*ops)["decode"].is_object() ||
          !(*ops)["decode"].contains("total") || !(*ops)["decode"]["total"].is_object())
        fail("{}: no ops.decode.total (run --json of a run with decoding steps)", path);
      const auto& total = (*ops)["decode"]["total"];
      const int64_t n = std::stoll(m[1].str());
      if (n < 2 || n - 1 > trace_steps)
        fail("{}: {} new tokens make {} decoding steps; the trace {} has {}", path, n, n - 1, run.name,
             trace_steps);
      by_n[n].push_back({op_seconds(total, "attention", path),
                         op_seconds(total, "score", path) + op_seconds(total, "select", path)});
    }
    for (const auto& [n, rounds] : by_n) {
      std::vector<double> at, pr;
      for (const auto& r : rounds) at.push_back(r[0]), pr.push_back(r[1]);
      run.steps.push_back(n - 1);
      run.attention_s.push_back(median(at));
      run.pruning_s.push_back(median(pr));
    }
    if (run.steps.empty()) fail("{}: no {}-n<N>-r<R>.json beside {}", dir, name, run.name);
    runs.push_back(std::move(run));
  }
  size_t spans = 0;
  for (const LoneDecodeRun& r : runs) spans += r.steps.size();
  if (spans < 2) fail("{}: {} span of decoding steps; the fit needs at least 2", dir, spans);
  return runs;
}

std::pair<double, double> lone_decode_scale_range(const LoneDecodeFit& f) {
  return {std::max(f.listed_compute, f.listed_memory / hw::kMaxMemoryEfficiency), 1e3};
}

void set_lone_decodes(hw::Profile& hw, const LoneDecodeFit& f, double t) {
  const auto [lo, hi] = lone_decode_scale_range(f);
  if (!(t >= lo * (1 - 1e-12) && t <= hi))
    fail("a time scale of {} puts decoding attention over listed keys outside its bounds ({}-{})", t, lo, hi);
  set_param(hw, "attention.listed_compute", std::min(f.listed_compute / t, 1.0));
  set_param(hw, "attention.listed_memory", f.listed_memory / t);
  set_param(hw, "pruning.stage_us", f.stage_us * t);
  set_param(hw, "pruning.key_ns", f.key_ns * t);
}

LoneDecodeFit fit_lone_decodes(hw::Profile& hw, const ModelConfig& c, const sim::Precision& p,
                               const std::vector<LoneDecodeRun>& runs) {
  constexpr double kFree = 1e12;  // a share so large its term vanishes
  // The replay's parts with the listed shares and stage costs at chosen values: the time each
  // parameter's inverse multiplies comes out as a difference (every cost is linear in them).
  const auto with = [&](double lc, double lm, double stage_us, double key_ns) {
    hw::Profile h = hw;
    set_param(h, "attention.listed_compute", lc);
    set_param(h, "attention.listed_memory", lm);
    set_param(h, "pruning.stage_us", stage_us);
    set_param(h, "pruning.key_ns", key_ns);
    return span_parts(runs, c, h, p);
  };
  std::vector<double> m_att, m_pr;
  for (const LoneDecodeRun& r : runs)
    for (size_t i = 0; i < r.steps.size(); ++i) {
      m_att.push_back(r.attention_s[i] - (i ? r.attention_s[i - 1] : 0));
      m_pr.push_back(r.pruning_s[i] - (i ? r.pruning_s[i - 1] : 0));
    }
  for (size_t i = 0; i < m_att.size(); ++i)
    if (!(m_att[i] > 0) || !(m_pr[i] > 0))
      fail(
          "lone decoding runs: span {} has no attention or pruning time (the step counts measured must "
          "rise, and each run must decode with LazyLLM)",
          i + 1);

  LoneDecodeFit f;
  f.spans = m_att.size();
  {
    std::vector<double> a, q;
    for (const Parts& x : span_parts(runs, c, hw, p)) a.push_back(x.attention), q.push_back(x.pruning);
    f.attention_rms_before = rms_log(a, m_att);
    f.pruning_rms_before = rms_log(q, m_pr);
  }
  const std::vector<Parts> base = with(kFree, kFree, 0, 0), unit_c = with(1, kFree, 1, 0),
                           unit_m = with(kFree, 1, 0, 1);
  std::vector<double> a, b, r, s, k, rp;
  for (size_t i = 0; i < f.spans; ++i) {
    a.push_back((unit_c[i].attention - base[i].attention) / m_att[i]);
    b.push_back((unit_m[i].attention - base[i].attention) / m_att[i]);
    r.push_back(1 - base[i].attention / m_att[i]);
    s.push_back((unit_c[i].pruning - base[i].pruning) / m_pr[i]);  // per us of stage cost
    k.push_back((unit_m[i].pruning - base[i].pruning) / m_pr[i]);  // per ns of key cost
    rp.push_back(1 - base[i].pruning / m_pr[i]);
  }
  const auto [x, y] =
      fit_two(a, b, r, 1.0, 1.0 / hw::kMaxMemoryEfficiency, "decoding attention's compute and memory shares");
  f.listed_compute = 1 / x, f.listed_memory = 1 / y;
  const auto [st, kn] = fit_two(s, k, rp, 0, 0, "the pruning stages' cost per stage and per key");
  f.stage_us = st, f.key_ns = kn;
  set_lone_decodes(hw, f);
  std::vector<double> pa, pq;
  for (size_t i = 0; i < f.spans; ++i) {
    pa.push_back(base[i].attention + m_att[i] * (a[i] * x + b[i] * y));
    pq.push_back(base[i].pruning + m_pr[i] * (s[i] * st + k[i] * kn));
  }
  f.attention_rms_after = rms_log(pa, m_att);
  f.pruning_rms_after = rms_log(pq, m_pr);
  return f;
}

}  // namespace lp::calib
