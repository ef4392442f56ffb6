#include "traces/trace.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "model/config.h"
#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"
#include "pruning/policy.h"

namespace lp::trace {

namespace {
using json = nlohmann::json;

json step_json(const Step& s) {
  json j = {{"kind", s.kind},           {"new_tokens", s.new_tokens}, {"queries", s.queries},
            {"keys", s.keys},           {"pairs", s.pairs},           {"revived", s.revived},
            {"aux_reads", s.aux_reads}, {"aux_writes", s.aux_writes}};
  if (!s.attended.empty()) j["attended"] = s.attended;
  return j;
}

// The optional detail, appended to a step line by hand so that scores are written as the shortest
// text that reads back as the same float (nlohmann would print them as doubles, up to 17 digits).
void append_detail(fmt::memory_buffer& b, const Step& s) {
  auto out = std::back_inserter(b);
  if (s.pruning) {
    fmt::format_to(out, ",\"pruning\":[");
    for (size_t i = 0; i < s.pruning->size(); ++i) {
      const Pruning& p = (*s.pruning)[i];
      fmt::format_to(out, "{}{{\"layer\":{},\"kept\":[{}]", i > 0 ? "," : "", p.layer,
                     fmt::join(p.kept, ","));
      if (!p.scores.empty()) {
        fmt::format_to(out, ",\"scores\":[");
        for (size_t k = 0; k < p.scores.size(); ++k) {
          if (k > 0) b.push_back(',');
          // "-0" would read back as the integer 0: keep the sign with a decimal point.
          const float x = p.scores[k];
          if (x == 0 && std::signbit(x))
            fmt::format_to(out, "-0.0");
          else
            fmt::format_to(out, "{}", x);
        }
        b.push_back(']');
      }
      b.push_back('}');
    }
    b.push_back(']');
  }
  if (s.revived_positions) {
    fmt::format_to(out, ",\"revived_positions\":[");
    for (size_t l = 0; l < s.revived_positions->size(); ++l)
      fmt::format_to(out, "{}[{}]", l > 0 ? "," : "", fmt::join((*s.revived_positions)[l], ","));
    b.push_back(']');
  }
  if (s.routes) {
    fmt::format_to(out, ",\"routes\":[");
    for (size_t l = 0; l < s.routes->size(); ++l) {
      const Routes& r = (*s.routes)[l];
      fmt::format_to(out, "{}{{\"positions\":[{}],\"experts\":[{}]}}", l > 0 ? "," : "",
                     fmt::join(r.positions, ","), fmt::join(r.experts, ","));
    }
    b.push_back(']');
  }
}

std::vector<int64_t> layer_array(const json& j, const char* key, int n_layer, const std::string& where) {
  if (!j.contains(key) || !j[key].is_array()) fail("{}: missing array '{}'", where, key);
  const auto& a = j[key];
  if (int(a.size()) != n_layer)
    fail("{}: '{}' has {} entries, expected n_layer = {}", where, key, a.size(), n_layer);
  std::vector<int64_t> v;
  for (const auto& x : a) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0)
      fail("{}: '{}' must hold non-negative integers", where, key);
    v.push_back(x.get<int64_t>());
  }
  return v;
}

// Positions: integers, ascending without repeats, inside the context [0, context).
std::vector<int32_t> positions(const json& a, const std::string& field, int64_t context,
                               const std::string& where) {
  if (!a.is_array()) fail("{}: '{}' must be an array of positions", where, field);
  std::vector<int32_t> v;
  v.reserve(a.size());
  for (const auto& x : a) {
    if (!x.is_number_integer()) fail("{}: '{}' must hold integer positions", where, field);
    const int64_t p = x.get<int64_t>();
    if (p < 0 || p >= context)
      fail("{}: '{}' holds position {}, outside the context [0, {})", where, field, p, context);
    if (!v.empty() && p <= v.back())
      fail("{}: '{}' must be ascending without repeats ({} after {})", where, field, p, v.back());
    v.push_back(int32_t(p));
  }
  return v;
}

// The optional detail of one step line, checked against the header and the step's counts.
// `context`: tokens in the context once the step has run (positions 0 .. context - 1).
void read_detail(const json& j, const Header& h, int64_t context, Step& s, const std::string& where) {
  if (j.contains("pruning")) {
    const json& a = j["pruning"];
    if (!a.is_array()) fail("{}: 'pruning' must be an array", where);
    if (a.size() != h.schedule_layers.size())
      fail("{}: 'pruning' has {} entries, expected {} (one per schedule_layers entry)", where, a.size(),
           h.schedule_layers.size());
    std::vector<Pruning> steps;
    for (size_t i = 0; i < a.size(); ++i) {
      const std::string f = fmt::format("pruning[{}]", i);
      const json& e = a[i];
      if (!e.is_object()) fail("{}: '{}' must be an object", where, f);
      if (!e.contains("layer") || !e["layer"].is_number_integer())
        fail("{}: '{}.layer' must be an integer", where, f);
      const int64_t layer = e["layer"].get<int64_t>();
      if (layer < 0 || layer >= h.n_layer)
        fail("{}: '{}.layer' is {}, outside [0, n_layer = {})", where, f, layer, h.n_layer);
      if (layer != h.schedule_layers[i].first)
        fail("{}: '{}.layer' is {}, expected {} (schedule_layers[{}])", where, f, layer,
             h.schedule_layers[i].first, i);
      if (!e.contains("kept")) fail("{}: missing '{}.kept'", where, f);
      Pruning p;
      p.layer = int(layer);
      p.kept = positions(e["kept"], f + ".kept", context, where);
      // Active before this selection: every token for the first step, else the previous kept.
      if (i > 0 &&
          !std::includes(steps.back().kept.begin(), steps.back().kept.end(), p.kept.begin(), p.kept.end()))
        fail("{}: '{}.kept' holds positions that were not active before it (not in 'pruning[{}].kept')",
             where, f, i - 1);
      const int64_t active = i == 0 ? context : int64_t(steps.back().kept.size());
      if (s.kind == "prefill" && layer + 1 < h.n_layer &&
          int64_t(p.kept.size()) != s.queries[size_t(layer + 1)])
        fail("{}: '{}.kept' has {} positions but 'queries' at layer {} is {}", where, f, p.kept.size(),
             layer + 1, s.queries[size_t(layer + 1)]);
      if (e.contains("scores")) {
        const json& sc = e["scores"];
        if (!sc.is_array()) fail("{}: '{}.scores' must be an array", where, f);
        if (int64_t(sc.size()) != active)
          fail("{}: '{}.scores' has {} entries, expected {} (the tokens active before the selection)", where,
               f, sc.size(), active);
        p.scores.reserve(sc.size());
        for (const auto& x : sc) {
          const float v = x.is_number() ? float(x.get<double>()) : NAN;
          if (!std::isfinite(v)) fail("{}: '{}.scores' must hold finite numbers", where, f);
          p.scores.push_back(v);
        }
      }
      steps.push_back(std::move(p));
    }
    s.pruning = std::move(steps);
  }
  if (j.contains("revived_positions")) {
    const json& a = j["revived_positions"];
    if (!a.is_array()) fail("{}: 'revived_positions' must be an array", where);
    if (int(a.size()) != h.n_layer)
      fail("{}: 'revived_positions' has {} entries, expected n_layer = {}", where, a.size(), h.n_layer);
    std::vector<std::vector<int32_t>> rev;
    for (int l = 0; l < h.n_layer; ++l) {
      const std::string f = fmt::format("revived_positions[{}]", l);
      rev.push_back(positions(a[size_t(l)], f, context, where));
      if (int64_t(rev.back().size()) != s.revived[size_t(l)])
        fail("{}: '{}' has {} positions but 'revived' at layer {} is {}", where, f, rev.back().size(), l,
             s.revived[size_t(l)]);
    }
    s.revived_positions = std::move(rev);
  }
  if (j.contains("routes")) {
    // Each layer's computed rows and their experts: n_expert_used of them per row, each below
    // n_expert (the header's model says both).
    const json& a = j["routes"];
    const auto count = [&](const char* key) -> int64_t {
      const auto it = h.model.find(key);
      return it != h.model.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
    };
    const int64_t E = count("n_expert"), k = count("n_expert_used");
    if (E <= 0 || k <= 0 || k > E)
      fail("{}: 'routes' needs the header's model to have n_expert and n_expert_used", where);
    if (!a.is_array() || int(a.size()) != h.n_layer)
      fail("{}: 'routes' must be an array of n_layer = {} entries", where, h.n_layer);
    std::vector<Routes> routes(size_t(h.n_layer));
    for (int l = 0; l < h.n_layer; ++l) {
      const std::string f = fmt::format("routes[{}]", l);
      const json& e = a[size_t(l)];
      if (!e.is_object() || !e.contains("positions") || !e.contains("experts") || !e["experts"].is_array())
        fail("{}: '{}' must be an object with 'positions' and 'experts' arrays", where, f);
      Routes& r = routes[size_t(l)];
      r.positions = positions(e["positions"], f + ".positions", context, where);
      if (int64_t(r.positions.size()) != s.queries[size_t(l)])
        fail("{}: '{}.positions' has {} positions but 'queries' at layer {} is {}", where, f,
             r.positions.size(), l, s.queries[size_t(l)]);
      const json& x = e["experts"];
      if (int64_t(x.size()) != int64_t(r.positions.size()) * k)
        fail("{}: '{}.experts' has {} entries, expected {} ({} per position)", where, f, x.size(),
             int64_t(r.positions.size()) * k, k);
      r.experts.reserve(x.size());
      for (const auto& v : x) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= E)
          fail("{}: '{}.experts' must hold expert numbers in [0, {})", where, f, E);
        r.experts.push_back(int32_t(v.get<int64_t>()));
      }
    }
    s.routes = std::move(routes);
  }
}
}  // namespace

void write_trace(const Trace& t, const std::string& path) {
  // JSON has no infinities or NaNs: refuse before anything is written.
  for (size_t i = 0; i < t.steps.size(); ++i)
    if (t.steps[i].pruning)
      for (const Pruning& p : *t.steps[i].pruning)
        for (float x : p.scores)
          if (!std::isfinite(x))
            fail("cannot write trace '{}': step {} has a score that is not finite at layer {}", path, i,
                 p.layer);
  std::string out;
  {
    const Header& h = t.header;
    json steps_sched = json::array();
    for (const auto& [l, s] : h.schedule_layers) steps_sched.push_back({{"layer", l}, {"share", s}});
    json head = {{"lazyprefill_trace", h.version},
                 {"tool_version", h.tool_version},
                 {"git_commit", h.git_commit},
                 {"model", h.model},
                 {"n_layer", h.n_layer},
                 {"dtype", h.dtype},
                 {"policy", h.policy},
                 {"schedule", h.schedule},
                 {"schedule_layers", steps_sched},
                 {"prompt_tokens", h.prompt_tokens},
                 {"seed", h.seed},
                 {"steps", t.steps.size()}};
    if (h.prompt_tokens_dropped > 0) head["prompt_tokens_dropped"] = h.prompt_tokens_dropped;
    out = head.dump() + '\n';
    fmt::memory_buffer b;
    for (const Step& s : t.steps) {
      const std::string line = step_json(s).dump();
      b.clear();
      b.append(line.data(), line.data() + line.size() - 1);  // without the closing brace
      append_detail(b, s);
      b.append(std::string_view("}\n"));
      out.append(b.data(), b.size());
    }
  }
  write_file_atomic(path, out, "trace");
}

namespace {
// A header or step field's name: lowercase letters, digits, '_' and '-', as the tools write them.
bool plain_name(const std::string& s) {
  if (s.size() > 32) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
  return true;
}
constexpr int64_t kMaxTokens = int64_t(1) << 31;  // positions are int32_t
}  // namespace

TraceReader::TraceReader(const std::string& path) : in_(path, "trace", input_cap::kTrace) {
  std::string line;
  if (!in_.next(line)) fail("{}: empty file, not a lazyprefill trace", path);
  const json head = json_parse(line, path, true);
  if (head.is_discarded() || !head.is_object() || !head.contains("lazyprefill_trace"))
    fail("{}: not a lazyprefill trace (line 1 is not a trace header)", path);
  Header& h = header_;
  const std::string where = path + ": line 1";
  try {
    if (!head.at("lazyprefill_trace").is_number_integer() ||
        head.at("lazyprefill_trace").get<int64_t>() != kVersion)
      fail("{}: trace version {} is not supported (expected {})", path, head.at("lazyprefill_trace").dump(),
           kVersion);
    h.version = kVersion;
    const json& nl = head.at("n_layer");
    if (!json_integer(nl, 1, 1024)) fail("{}: n_layer {} is out of range [1, 1024]", where, nl.dump());
    h.n_layer = nl.get<int>();
    h.model = head.at("model");
    // The model must be one the simulator can cost, and the one the counts are per layer of.
    const ModelConfig c = config_from_json(h.model, where + ": header model");
    if (c.n_layer != h.n_layer)
      fail("{}: the header model has {} layers but n_layer is {}", where, c.n_layer, h.n_layer);
    // The names before the paper's baselines existed ("static", "random") are read as what they
    // became, so every reader sees today's names.
    const std::string policy = head.at("policy").get<std::string>();
    const std::optional<PolicyKind> kind = policy_in_file(policy);
    if (!kind) fail("{}: unknown policy '{}' (expected {})", where, escape_text(policy), kPolicyNames);
    h.policy = policy_name(*kind);
    h.schedule = head.at("schedule").get<std::string>();
    if (h.schedule.size() > 4096) fail("{}: the schedule is {} bytes long", where, h.schedule.size());
    for (const auto& e : head.at("schedule_layers")) {
      const json& l = e.at("layer");
      const double share = e.at("share").get<double>();
      if (!json_integer(l, 0, h.n_layer - 1))
        fail("{}: schedule_layers: layer {} is outside [0, n_layer = {})", where, l.dump(), h.n_layer);
      if (!(share >= 0 && share <= 1)) fail("{}: schedule_layers: share {} is outside [0, 1]", where, share);
      if (!h.schedule_layers.empty() && l.get<int>() <= h.schedule_layers.back().first)
        fail("{}: schedule_layers must be in ascending layer order", where);
      h.schedule_layers.emplace_back(l.get<int>(), share);
    }
    const json& pt = head.at("prompt_tokens");
    if (!json_integer(pt, 1, kMaxTokens - 1))
      fail("{}: prompt_tokens {} is out of range [1, 2^31)", where, pt.dump());
    h.prompt_tokens = pt.get<int64_t>();
    if (head.contains("prompt_tokens_dropped")) {
      const json& d = head["prompt_tokens_dropped"];
      if (!json_integer(d, 0, kMaxTokens - 1 - h.prompt_tokens))
        fail("{}: prompt_tokens_dropped {} is out of range", where, d.dump());
      h.prompt_tokens_dropped = d.get<int64_t>();
    }
    h.dtype = head.value("dtype", "");
    if (!plain_name(h.dtype)) fail("{}: dtype '{}' is not a dtype name", where, escape_text(h.dtype));
    h.tool_version = head.value("tool_version", "");
    h.git_commit = head.value("git_commit", "");
    if (head.contains("seed")) {  // an unsigned integer (a float read as one would be undefined)
      const json& sd = head["seed"];
      if (!sd.is_number_unsigned() && !(sd.is_number_integer() && sd.get<int64_t>() >= 0))
        fail("{}: seed {} is not a non-negative integer", where, sd.dump());
      h.seed = sd.get<uint64_t>();
    }
    if (head.contains("steps")) {
      const json& n = head["steps"];
      if (!json_integer(n, 1, kMaxTokens - 1)) fail("{}: steps {} is not a step count", where, n.dump());
      declared_ = n.get<int64_t>();
    }
  } catch (const json::exception& e) {
    fail("{}: bad trace header ({})", where, e.what());
  }
}

bool TraceReader::next(Step& out) {
  const Header& h = header_;
  const std::string& path = in_.path();
  std::string line;
  for (;;) {
    if (!in_.next(line)) {
      if (steps_ == 0) fail("{}: trace has no steps", path);
      if (declared_ >= 0 && steps_ != declared_)
        fail("{}: the header says {} steps but the file holds {} (truncated or appended to)", path, declared_,
             steps_);
      return false;
    }
    ++line_no_;
    if (!line.empty()) break;
  }
  const std::string where = fmt::format("{}: line {}", path, line_no_);
  const json j = json_parse(line, where, true);
  if (j.is_discarded() || !j.is_object()) fail("{}: not a JSON object", where);
  Step s;
  if (!j.contains("kind") || !j["kind"].is_string()) fail("{}: missing 'kind'", where);
  s.kind = j["kind"].get<std::string>();
  if (steps_ == 0 && s.kind != "prefill") fail("{}: the first step must be the prefill", where);
  if (steps_ > 0 && s.kind != "decode")
    fail("{}: kind '{}': every step after the prefill is a decoding step", where, escape_text(s.kind));
  if (declared_ >= 0 && steps_ >= declared_)
    fail("{}: the header says {} steps but the file holds more", where, declared_);
  const json nt = j.value("new_tokens", json(0));
  if (!json_integer(nt, 0, kMaxTokens - 1)) fail("{}: 'new_tokens' {} is out of range", where, nt.dump());
  s.new_tokens = nt.get<int64_t>();
  if (steps_ == 0 && s.new_tokens != 0 && s.new_tokens != h.prompt_tokens)
    fail("{}: the prefill appends {} tokens but the header's prompt has {}", where, s.new_tokens,
         h.prompt_tokens);
  if (steps_ > 0 && s.new_tokens < 1) fail("{}: a decoding step appends no token", where);
  s.queries = layer_array(j, "queries", h.n_layer, where);
  s.keys = layer_array(j, "keys", h.n_layer, where);
  s.pairs = layer_array(j, "pairs", h.n_layer, where);
  s.revived = layer_array(j, "revived", h.n_layer, where);
  s.aux_reads = layer_array(j, "aux_reads", h.n_layer, where);
  s.aux_writes = layer_array(j, "aux_writes", h.n_layer, where);
  if (j.contains("attended")) s.attended = layer_array(j, "attended", h.n_layer, where);
  context_ += steps_ == 0 && s.new_tokens == 0 ? h.prompt_tokens : s.new_tokens;
  if (context_ >= kMaxTokens) fail("{}: the context reaches {} tokens, past 2^31", where, context_);
  // Counts a run can record: nothing at a layer exceeds the tokens in the context, a row attends
  // at most every position, and only computed rows were revived.
  for (int l = 0; l < h.n_layer; ++l) {
    const size_t i = size_t(l);
    const auto over = [&](const char* what, int64_t v, int64_t cap, const char* bound) {
      if (v > cap) fail("{}: '{}' at layer {} is {}, more than {} ({})", where, what, l, v, bound, cap);
    };
    over("queries", s.queries[i], context_, "the tokens in the context");
    over("keys", s.keys[i], context_, "the tokens in the context");
    if (!s.attended.empty()) over("attended", s.attended[i], context_, "the tokens in the context");
    over("aux_writes", s.aux_writes[i], context_, "the tokens in the context");
    over("aux_reads", s.aux_reads[i], context_, "the tokens in the context");
    over("revived", s.revived[i], s.queries[i], "the rows computed there");
    // pairs <= queries x context, in doubles: both below 2^31, the product exact below 2^62.
    if (double(s.pairs[i]) > double(s.queries[i]) * double(context_))
      fail("{}: 'pairs' at layer {} is {}, more than its {} rows can attend in a context of {}", where, l,
           s.pairs[i], s.queries[i], context_);
  }
  read_detail(j, h, context_, s, where);
  ++steps_;
  out = std::move(s);
  return true;
}

Trace read_trace(const std::string& path) {
  TraceReader r(path);
  Trace t;
  t.header = r.header();
  Step s;
  while (r.next(s)) t.steps.push_back(std::move(s));
  return t;
}

double prefill_computed_fraction(const Step& prefill, int64_t prompt_tokens, int64_t dropped) {
  const int64_t T = (prefill.new_tokens > 0 ? prefill.new_tokens : prompt_tokens) + dropped;
  double computed = 0;
  for (int64_t q : prefill.queries) computed += double(q);
  return T > 0 && !prefill.queries.empty() ? computed / (double(T) * double(prefill.queries.size())) : 0.0;
}

double prompt_computed_fraction(const Trace& t) {
  return prefill_computed_fraction(t.steps.front(), t.header.prompt_tokens, t.header.prompt_tokens_dropped);
}

Summarizer::Summarizer(const Header& h)
    : L_(h.n_layer),
      prompt_tokens_(h.prompt_tokens),
      dropped_(h.prompt_tokens_dropped),
      per_layer_(size_t(h.n_layer), 0) {}

void Summarizer::add(const Step& st) {
  const int L = L_;
  if (steps_++ == 0) {
    // Of the prompt as given: random-drop's dropped tokens were computed at no layer.
    const int64_t T = (st.new_tokens > 0 ? st.new_tokens : prompt_tokens_) + dropped_;
    dense_ += double(dropped_) * L;
    for (int l = 0; l < L; ++l)
      s_.prompt_share_per_layer.push_back(T > 0 ? double(st.queries[size_t(l)]) / double(T) : 0.0);
    s_.prompt_tokens_computed_fraction = prefill_computed_fraction(st, prompt_tokens_, dropped_);
    prompt_dense_ = double(T) * L;
    for (int l = 0; l < L; ++l) prompt_pairs_ += double(st.queries[size_t(l)]);
  } else {
    // A decoding step's rows beyond its new tokens (computed at every layer) are revived prompt tokens.
    for (int l = 0; l < L; ++l) prompt_pairs_ += double(st.queries[size_t(l)] - st.new_tokens);
  }
  // Over the whole generation: a dense run computes every new token at every layer once.
  tokens_ += st.new_tokens;
  dense_ += double(st.new_tokens) * L;
  for (int l = 0; l < L; ++l) {
    all_ += double(st.queries[size_t(l)]);
    per_layer_[size_t(l)] += st.queries[size_t(l)];
    s_.aux_writes += st.aux_writes[size_t(l)];
    s_.revivals += st.revived[size_t(l)];
  }
  s_.detail = s_.detail || st.pruning || st.revived_positions || st.routes;
  s_.kv_tokens_final = 0;
  for (int l = 0; l < L; ++l) s_.kv_tokens_final += st.keys[size_t(l)];
}

Summary Summarizer::finish() const {
  Summary s = s_;
  s.all_share = dense_ > 0 ? all_ / dense_ : 0.0;
  s.prompt_tokens_computed_fraction_after_generation =
      prompt_dense_ > 0 ? prompt_pairs_ / prompt_dense_ : 0.0;
  for (int l = 0; l < L_; ++l) s.at_most_once = s.at_most_once && per_layer_[size_t(l)] <= tokens_;
  return s;
}

Summary summarize(const Trace& t) {
  Summarizer s(t.header);
  for (const Step& st : t.steps) s.add(st);
  return s.finish();
}

}  // namespace lp::trace
