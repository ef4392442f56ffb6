#include "reports/capacity.h"

#include <fmt/format.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>

#include "model/error.h"
#include "reports/plot.h"
#include "sim/replay.h"
#include "traces/synthetic.h"

namespace lp::report {

namespace {
using json = nlohmann::ordered_json;

// One method's prediction at prompt length N, its steps streamed (memory O(layers), whatever the
// decoding steps); the per-layer detail, which the report does not print, is dropped.
sim::Prediction method_prediction(const Request& r, const ReportedMethod& m, const hw::Profile& hw, int64_t N,
                                  int64_t new_tokens) {
  sim::Prediction p;
  if (m.trace) {
    const trace::Header h = sim::map_header(m.trace->header, r.model.n_layer, N);
    sim::Replayer rp(h, r.model, hw, r.precision, r.batch, 1, 0);
    for (const trace::Step& s : m.trace->steps) rp.add(sim::map_step(m.trace->header, s, r.model.n_layer, N));
    p = std::move(rp).finish();
  } else {
    p = sim::replay_synthetic(r.model, m.method.policy_name(), m.steps, N,
                              std::max<int64_t>(0, new_tokens - 1), m.revival, hw, r.precision, r.batch);
  }
  p.prefill_layers = {};
  return p;
}

// The memory a deployment may use on one device: the user's budget, never more than the device.
double budget_bytes(const Request& r, const hw::Profile& hw) {
  return r.mem_budget_gib ? std::min(*r.mem_budget_gib * 1073741824.0, hw.memory_capacity)
                          : hw.memory_capacity;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// Op groups for the breakdown chart.
const std::vector<std::pair<std::string, std::vector<Op>>>& op_groups() {
  static const std::vector<std::pair<std::string, std::vector<Op>>> g = {
      {"qkv", {Op::QKV}},
      {"attention", {Op::Attention}},
      {"o_proj", {Op::OProj}},
      {"gate_up", {Op::GateUp}},
      {"down", {Op::Down}},
      {"norms, rope, swiglu, residual", {Op::AttnNorm, Op::FfnNorm, Op::Rope, Op::SwiGLU, Op::Residual}},
      {"pruning (score, select, gather)", {Op::Score, Op::Select, Op::Gather}},
      {"embed, LM head", {Op::Embed, Op::OutputNorm, Op::LmHead}}};
  return g;
}
}  // namespace

json build_report(const Request& r) {
  if (r.hws.empty()) fail("report: no hardware profile");
  if (r.methods.empty() || r.methods[0].method.policy != PolicyKind::None)
    fail("report: the first method must be none");
  if (r.lengths.empty()) usage_fail("--prompt-lengths is empty");
  if (r.batch < 1) usage_fail("--batch must be at least 1, got {}", r.batch);
  for (int64_t N : r.lengths) {
    if (N < 1) usage_fail("prompt length {} is not positive", N);
    if (r.model.n_ctx_train > 0 && N + std::max<int64_t>(0, r.new_tokens - 1) > r.model.n_ctx_train)
      usage_fail("prompt length {} (+ {} new tokens) exceeds the model's context of {} tokens", N,
                 r.new_tokens, r.model.n_ctx_train);
  }
  if (r.slo_ttft_ms && !(*r.slo_ttft_ms > 0)) usage_fail("--slo-ttft-ms must be positive");
  if (r.mem_budget_gib && !(*r.mem_budget_gib > 0)) usage_fail("--mem-budget-gib must be positive");

  const size_t H = r.hws.size(), M = r.methods.size(), NL = r.lengths.size();
  // A report is read by people: its table has a column per length. Bounded before anything is
  // allocated (a sweep streams grids of any size).
  if (NL > kMaxLengths)
    usage_fail("--prompt-lengths names {} lengths, over the {} a report shows (use sweep for more)", NL,
               kMaxLengths);
  if (H * M * NL > kMaxCells)
    usage_fail(
        "{} hardware profiles x {} methods x {} lengths is {} results, over the {} a report holds (use "
        "sweep for more)",
        H, M, NL, H * M * NL, kMaxCells);
  struct Cell {
    sim::Prediction p;
    double share = 1;
  };
  std::vector<Cell> cells(H * M * NL);
  tbb::parallel_for(size_t(0), cells.size(), [&](size_t k) {
    const size_t h = k / (M * NL), m = (k / NL) % M, n = k % NL;
    cells[k].p = method_prediction(r, r.methods[m], r.hws[h], r.lengths[n], r.new_tokens);
    cells[k].share = cells[k].p.prompt_share;
  });
  const auto cell = [&](size_t h, size_t m, size_t n) -> const Cell& { return cells[(h * M + m) * NL + n]; };

  json results = json::array();
  for (size_t h = 0; h < H; ++h)
    for (size_t m = 0; m < M; ++m)
      for (size_t n = 0; n < NL; ++n) {
        const sim::Prediction& p = cell(h, m, n).p;
        const sim::Prediction& b = cell(h, 0, n).p;
        const double budget = budget_bytes(r, r.hws[h]);
        const double per_seq = (p.memory.kv + p.memory.aux) / double(r.batch);
        const double free = budget - p.memory.weights - p.memory.activations;
        // Capped where a double still counts exactly (a 1 PiB device of 1-byte sequences fits
        // 2^50: never reached by a real profile, but a cast past int64_t would be undefined).
        const int64_t seqs =
            per_seq > 0 && free > 0 ? int64_t(std::min(std::floor(free / per_seq), 9007199254740992.0)) : 0;
        const Op bound = p.prefill_bound_op();
        json ops = json::object();
        for (int i = 0; i < kNumOps; ++i) {
          const sim::OpCost& o = p.prefill_ops[size_t(i)];
          if (o.calls == 0) continue;
          ops[std::string(op_name(Op(i)))] = {{"time_ms", o.time_s * 1e3},
                                              {"flop", o.flops},
                                              {"bytes", o.bytes},
                                              {"bound", o.memory_bound() ? "memory" : "compute"}};
        }
        double bytes = 0;
        for (const sim::OpCost& o : p.prefill_ops) bytes += o.bytes;
        results.push_back({{"hw", r.hws[h].name},
                           {"method", r.methods[m].name},
                           {"prompt_tokens", r.lengths[n]},
                           {"ttft_ms", p.ttft_s * 1e3},
                           {"baseline_ttft_ms", b.ttft_s * 1e3},
                           {"speedup", b.ttft_s / p.ttft_s},
                           {"prompt_tokens_computed_fraction", cell(h, m, n).share},
                           {"prefill_flop", p.prefill_flops()},
                           {"prefill_bytes", bytes},
                           {"decode_step_mean_ms", p.decode_step_mean_s() * 1e3},
                           {"total_ms", p.total_s * 1e3},
                           {"memory_bytes", p.memory.to_json()},
                           {"fits_in_memory", p.memory.total() <= budget},
                           {"concurrent_sequences", seqs},
                           {"bound_op", std::string(op_name(bound))},
                           {"bound", p.prefill_ops[size_t(bound)].memory_bound() ? "memory" : "compute"},
                           {"ops", ops}});
      }

  // Per hardware and method: the longest prompt within the TTFT objective (bisection on the
  // prefill, which grows with the prompt) and the sequences that fit at the longest length.
  const int64_t ctx =
      r.model.n_ctx_train > 0 ? r.model.n_ctx_train : *std::max_element(r.lengths.begin(), r.lengths.end());
  std::vector<json> capacity(H * M);
  tbb::parallel_for(size_t(0), H * M, [&](size_t k) {
    const size_t h = k / M, m = k % M;
    const auto ttft_ms = [&](int64_t N) {
      return method_prediction(r, r.methods[m], r.hws[h], N, 0).ttft_s * 1e3;
    };
    json c = {{"hw", r.hws[h].name}, {"method", r.methods[m].name}};
    if (r.slo_ttft_ms) {
      const double slo = *r.slo_ttft_ms;
      if (ttft_ms(1) > slo) {
        c["max_prompt_tokens_within_slo"] = nullptr;
        c["slo_note"] =
            fmt::format("no prompt length meets {} ms (a 1-token prompt takes {:.3g} ms)", slo, ttft_ms(1));
      } else if (ttft_ms(ctx) <= slo) {
        c["max_prompt_tokens_within_slo"] = ctx;
        c["slo_note"] = fmt::format("the whole context ({} tokens) meets {} ms", ctx, slo);
      } else {
        int64_t lo = 1, hi = ctx;  // ttft(lo) <= slo < ttft(hi)
        while (hi - lo > 1) {
          const int64_t mid = lo + (hi - lo) / 2;
          (ttft_ms(mid) <= slo ? lo : hi) = mid;
        }
        c["max_prompt_tokens_within_slo"] = lo;
        c["slo_note"] = fmt::format("prompts up to {} tokens meet {} ms", lo, slo);
      }
    }
    const size_t nmax = size_t(std::max_element(r.lengths.begin(), r.lengths.end()) - r.lengths.begin());
    c["longest_prompt_tokens"] = r.lengths[nmax];
    c["concurrent_sequences_at_longest"] = results[(h * M + m) * NL + nmax]["concurrent_sequences"];
    c["memory_budget_bytes"] = budget_bytes(r, r.hws[h]);
    capacity[k] = std::move(c);
  });

  json hws = json::array();
  for (const hw::Profile& p : r.hws)
    hws.push_back({{"name", p.name},
                   {"description", p.description},
                   {"engine", p.engine.name},
                   {"efficiency_default", p.efficiency_default},
                   {"efficiency_source", p.sources.count("efficiency") ? p.sources.at("efficiency") : ""},
                   {"peak_source", p.sources.count("peak_tflops") ? p.sources.at("peak_tflops") : ""}});
  json methods = json::array();
  for (const ReportedMethod& m : r.methods)
    methods.push_back({{"name", m.name},
                       {"policy", m.method.policy_name()},
                       {"schedule", m.method.schedule_text()},
                       {"revivals", m.revivals}});
  json prov = {
      {"tool_version", r.tool_version},
      {"git_commit", r.git_commit},
      {"generated_utc", utc_now()},
      {"model", {{"name", r.model.name}, {"source", r.model_source}, {"config", config_to_json(r.model)}}},
      {"hardware", hws},
      {"trace", r.trace_origin.empty() ? json(nullptr) : json(r.trace_origin)},
      {"methods", methods},
      {"precision",
       {{"weights", r.precision.weights}, {"compute", r.precision.compute}, {"kv", r.precision.kv}}},
      {"batch", r.batch},
      {"new_tokens", r.new_tokens},
      {"slo_ttft_ms", r.slo_ttft_ms ? json(*r.slo_ttft_ms) : json(nullptr)},
      {"mem_budget_gib", r.mem_budget_gib ? json(*r.mem_budget_gib) : json(nullptr)}};
  return {{"lazyprefill_capacity_report", 1},
          {"provenance", prov},
          {"prompt_lengths", r.lengths},
          {"results", results},
          {"capacity", capacity}};
}

std::string summary_text(const json& rep) {
  std::string out;
  const auto& lengths = rep["prompt_lengths"];
  std::map<std::string, std::vector<const json*>> by_hw;
  std::vector<std::string> hw_order;
  for (const json& x : rep["results"]) {
    const std::string h = x["hw"].get<std::string>();
    if (!by_hw.count(h)) hw_order.push_back(h);
    by_hw[h].push_back(&x);
  }
  const auto& prov = rep["provenance"];
  out += fmt::format("capacity report: {} ({}), batch {}, weights {} compute {} kv {}\n",
                     prov["model"]["name"].get<std::string>(), prov["model"]["source"].get<std::string>(),
                     prov["batch"].get<int64_t>(), prov["precision"]["weights"].get<std::string>(),
                     prov["precision"]["compute"].get<std::string>(),
                     prov["precision"]["kv"].get<std::string>());
  if (prov["new_tokens"].get<int64_t>() > 1)  // decoding is costed: say how revivals were modelled
    for (const json& m : prov["methods"])
      if (m["policy"] == "lazyllm" || m["policy"] == "random")
        out += fmt::format("revivals ({}): {}\n", m["name"].get<std::string>(),
                           m["revivals"].get<std::string>());
  for (const std::string& h : hw_order) {
    out += fmt::format("\n{}: TTFT in ms (speedup over none) per prompt length\n{:<40}", h, "method");
    for (const auto& n : lengths) out += fmt::format(" {:>18}", n.get<int64_t>());
    out += "\n";
    std::string method;
    for (const json* x : by_hw[h]) {
      if ((*x)["method"].get<std::string>() != method) {
        if (!method.empty()) out += "\n";
        method = (*x)["method"].get<std::string>();
        out += fmt::format("{:<40}", method.substr(0, 40));
      }
      out +=
          fmt::format(" {:>10.4g} ({:.2f}x)", (*x)["ttft_ms"].get<double>(), (*x)["speedup"].get<double>());
    }
    out += "\n";
    for (const json& c : rep["capacity"])
      if (c["hw"] == h) {
        out += fmt::format(
            "  {:<38} {} sequences fit at {} tokens", c["method"].get<std::string>().substr(0, 38),
            c["concurrent_sequences_at_longest"].get<int64_t>(), c["longest_prompt_tokens"].get<int64_t>());
        if (c.contains("slo_note")) out += "; " + c["slo_note"].get<std::string>();
        out += "\n";
      }
  }
  return out;
}

void check_validation(const nlohmann::json& v, const std::string& origin) {
  if (!v.is_object() || !v.contains("cases") || !v["cases"].is_array())
    fail("{}: not a `validate --json` output (no \"cases\" array)", origin);
  if (v.contains("ttft_mape") && !v["ttft_mape"].is_number())
    fail("{}: 'ttft_mape' must be a number", origin);
  size_t i = 0;
  for (const auto& k : v["cases"]) {
    ++i;
    if (!k.is_object()) fail("{}: case {} is not an object", origin, i);
    for (const char* f : {"measured_ttft_ms", "predicted_ttft_ms"})
      if (!k.contains(f) || !k[f].is_number() || !(k[f].get<double>() > 0) ||
          !std::isfinite(k[f].get<double>()))
        fail("{}: case {}: '{}' must be a positive number", origin, i, f);
    for (const char* f : {"policy", "schedule"})
      if (k.contains(f) && !k[f].is_string()) fail("{}: case {}: '{}' must be a string", origin, i, f);
  }
}

std::vector<std::pair<std::string, std::string>> report_charts(const json& rep,
                                                               const nlohmann::json* validation) {
  std::vector<std::pair<std::string, std::string>> out;
  std::vector<std::string> hws, methods;
  for (const json& h : rep["provenance"]["hardware"]) hws.push_back(h["name"].get<std::string>());
  for (const json& m : rep["provenance"]["methods"]) methods.push_back(m["name"].get<std::string>());
  const std::string pruned = methods.size() > 1 ? methods[1] : methods[0];
  const std::string model = rep["provenance"]["model"]["name"].get<std::string>();
  const auto pts = [&](const std::string& h, const std::string& m, const char* xk, const char* yk) {
    std::vector<double> x, y;
    for (const json& r : rep["results"])
      if (r["hw"] == h && r["method"] == m) {
        x.push_back(r[xk].get<double>());
        y.push_back(r[yk].get<double>());
      }
    return std::make_pair(x, y);
  };
  std::vector<double> lengths;
  for (const auto& n : rep["prompt_lengths"]) lengths.push_back(double(n.get<int64_t>()));
  const bool wide = lengths.size() > 1 && *std::max_element(lengths.begin(), lengths.end()) >=
                                              4 * *std::min_element(lengths.begin(), lengths.end());
  {
    LineChart c;
    c.title = "Time to first token vs prompt length";
    c.subtitle = fmt::format("{}; dashed: no pruning, solid: {}", model, pruned);
    c.x = {"prompt length (tokens)", wide};
    c.x.ticks = lengths;
    c.y = {"TTFT (ms)", true};
    for (size_t i = 0; i < hws.size(); ++i) {
      auto [x0, y0] = pts(hws[i], methods[0], "prompt_tokens", "ttft_ms");
      c.series.push_back({hws[i] + " none", x0, y0, true, true, true, int(i)});
      if (methods.size() > 1) {
        auto [x1, y1] = pts(hws[i], pruned, "prompt_tokens", "ttft_ms");
        c.series.push_back({hws[i] + " pruned", x1, y1, true, true, false, int(i)});
      }
    }
    out.emplace_back("ttft-vs-prompt-length.svg", svg_line_chart(c));
  }
  {
    LineChart c;
    c.title = "TTFT speedup vs share of prompt (token, layer) pairs computed";
    c.subtitle = fmt::format("{}; every method and prompt length, one colour per hardware", model);
    c.x = {"share of prompt (token, layer) pairs computed", false, 0.0, 1.0};
    c.y = {"TTFT speedup over no pruning (x)", false};
    for (size_t i = 0; i < hws.size(); ++i) {
      Series s{hws[i], {}, {}, false, true, false, int(i)};
      for (size_t m = 1; m < methods.size(); ++m) {
        auto [x, y] = pts(hws[i], methods[m], "prompt_tokens_computed_fraction", "speedup");
        s.x.insert(s.x.end(), x.begin(), x.end());
        s.y.insert(s.y.end(), y.begin(), y.end());
      }
      c.series.push_back(std::move(s));
    }
    out.emplace_back("speedup-vs-share-computed.svg", svg_line_chart(c));
  }
  {
    const int64_t longest = int64_t(*std::max_element(lengths.begin(), lengths.end()));
    StackedBarChart c;
    c.title = fmt::format("Where the prefill time goes at {} tokens", longest);
    c.subtitle = "per op group, as a share of the unpruned TTFT on the same hardware";
    c.y = {"prefill time (% of unpruned TTFT)"};
    std::vector<const json*> bars;
    for (const std::string& h : hws)
      for (const std::string& m : {methods[0], pruned})
        for (const json& r : rep["results"])
          if (r["hw"] == h && r["method"] == m && r["prompt_tokens"].get<int64_t>() == longest) {
            bars.push_back(&r);
            c.categories.push_back(h + (m == methods[0] ? " none" : " pruned"));
          }
    for (const auto& [name, ops] : op_groups()) {
      BarSegment seg{name, {}};
      for (const json* b : bars) {
        double t = 0;
        for (Op op : ops) {
          const std::string n(op_name(op));
          if ((*b)["ops"].contains(n)) t += (*b)["ops"][n]["time_ms"].get<double>();
        }
        seg.values.push_back(100 * t / (*b)["baseline_ttft_ms"].get<double>());
      }
      c.segments.push_back(std::move(seg));
    }
    out.emplace_back("op-breakdown.svg", svg_stacked_bars(c, 860, 480));
  }
  if (validation && validation->contains("cases")) {
    LineChart c;
    c.title = "Simulator: measured vs predicted TTFT (held-out cases)";
    c.subtitle = fmt::format("lazyprefill validate on this machine, held-out MAPE {:.1f}%",
                             validation->value("ttft_mape", 0.0));
    c.x = {"measured TTFT (ms)", true};
    c.y = {"predicted TTFT (ms)", true};
    c.diagonal = true;
    std::map<std::string, Series> by_policy;
    for (const auto& k : (*validation)["cases"]) {
      const std::string sched = k.value("schedule", std::string());
      const std::string pol = k.value("policy", std::string("case")) + (sched == "none" ? "" : " " + sched);
      Series& s = by_policy[pol];
      s.name = pol;
      s.lines = false;
      s.x.push_back(k["measured_ttft_ms"].get<double>());
      s.y.push_back(k["predicted_ttft_ms"].get<double>());
    }
    for (auto& [k, s] : by_policy) c.series.push_back(std::move(s));
    out.emplace_back("measured-vs-predicted.svg", svg_line_chart(c));
  }
  return out;
}

std::string report_html(const json& rep, const std::vector<std::pair<std::string, std::string>>& charts) {
  const auto& prov = rep["provenance"];
  std::string h =
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>lazyprefill capacity "
      "report</title>\n"
      "<style>body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}"
      "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px "
      "8px;text-align:right}"
      "th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}figure{margin:1.5em 0}"
      "code{background:#f4f4f4;padding:1px 4px}</style></head><body>\n";
  h += fmt::format("<h1>Capacity report: {}</h1>\n", xml_escape(prov["model"]["name"].get<std::string>()));
  h += fmt::format(
      "<p>Model source <code>{}</code>; batch {}; weights {}, compute {}, KV {}; generated {} by lazyprefill "
      "{} "
      "({}).</p>\n",
      xml_escape(prov["model"]["source"].get<std::string>()), prov["batch"].get<int64_t>(),
      xml_escape(prov["precision"]["weights"].get<std::string>()),
      xml_escape(prov["precision"]["compute"].get<std::string>()),
      xml_escape(prov["precision"]["kv"].get<std::string>()),
      xml_escape(prov["generated_utc"].get<std::string>()),
      xml_escape(prov["tool_version"].get<std::string>()), xml_escape(prov["git_commit"].get<std::string>()));
  if (!prov["trace"].is_null())
    h += fmt::format(
        "<p>Pruning pattern from the recorded trace <code>{}</code>, mapped to each prompt length.</p>\n",
        xml_escape(prov["trace"].get<std::string>()));
  if (prov["new_tokens"].get<int64_t>() > 1)
    for (const json& m : prov["methods"])
      if (m["policy"] == "lazyllm" || m["policy"] == "random")
        h +=
            fmt::format("<p>Revivals while decoding, {}: {}.</p>\n", xml_escape(m["name"].get<std::string>()),
                        xml_escape(m["revivals"].get<std::string>()));
  h += "<h2>Hardware</h2>\n<table><tr><th>profile</th><th>part</th><th>efficiencies</th></tr>\n";
  for (const auto& x : prov["hardware"])
    h += fmt::format(
        "<tr><td>{}</td><td>{}</td><td style=\"text-align:left\">{}</td></tr>\n",
        xml_escape(x["name"].get<std::string>()), xml_escape(x["description"].get<std::string>()),
        x["efficiency_default"].get<bool>() ? "datasheet defaults"
                                            : xml_escape(x["efficiency_source"].get<std::string>()));
  h += "</table>\n<h2>TTFT (ms) and speedup over no pruning</h2>\n";
  h += "<table><tr><th>hardware / method</th>";
  for (const auto& n : rep["prompt_lengths"]) h += fmt::format("<th>{} tokens</th>", n.get<int64_t>());
  h += "</tr>\n";
  std::string key;
  for (const auto& x : rep["results"]) {
    const std::string k = x["hw"].get<std::string>() + " / " + x["method"].get<std::string>();
    if (k != key) {
      if (!key.empty()) h += "</tr>\n";
      key = k;
      h += fmt::format("<tr><td>{}</td>", xml_escape(k));
    }
    h += fmt::format("<td>{:.4g} ({:.2f}x)</td>", x["ttft_ms"].get<double>(), x["speedup"].get<double>());
  }
  h += "</tr></table>\n<h2>Capacity</h2>\n<table><tr><th>hardware / method</th><th>longest prompt within the "
       "TTFT "
       "objective</th><th>sequences that fit at the longest length</th></tr>\n";
  for (const auto& c : rep["capacity"])
    h += fmt::format(
        "<tr><td>{} / {}</td><td>{}</td><td>{} at {} tokens</td></tr>\n",
        xml_escape(c["hw"].get<std::string>()), xml_escape(c["method"].get<std::string>()),
        c.contains("slo_note") ? xml_escape(c["slo_note"].get<std::string>()) : "no objective given",
        c["concurrent_sequences_at_longest"].get<int64_t>(), c["longest_prompt_tokens"].get<int64_t>());
  h += "</table>\n<h2>Charts</h2>\n";
  for (const auto& [name, svg] : charts) {
    // Inline SVG in HTML takes no XML declaration.
    const std::string_view body =
        svg.starts_with("<?xml") ? std::string_view(svg).substr(svg.find("?>") + 2) : svg;
    h += fmt::format("<figure>{}<figcaption>{}</figcaption></figure>\n", body, name);
  }
  h += "</body></html>\n";
  return h;
}

}  // namespace lp::report
