#include "traces/trace.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "model/error.h"

namespace lp::trace {

namespace {
using json = nlohmann::json;

json step_json(const Step& s) {
  return {{"kind", s.kind},           {"new_tokens", s.new_tokens}, {"queries", s.queries},
          {"keys", s.keys},           {"pairs", s.pairs},           {"revived", s.revived},
          {"aux_reads", s.aux_reads}, {"aux_writes", s.aux_writes}};
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
}  // namespace

void write_trace(const Trace& t, const std::string& path) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write trace '{}': {}", path, std::strerror(errno));
    const Header& h = t.header;
    json steps_sched = json::array();
    for (const auto& [l, s] : h.schedule_layers) steps_sched.push_back({{"layer", l}, {"share", s}});
    const json head = {{"lazyprefill_trace", h.version},
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
    out << head.dump() << '\n';
    for (const Step& s : t.steps) out << step_json(s).dump() << '\n';
    out.flush();
    if (!out) {
      out.close();
      std::remove(tmp.c_str());
      fail("cannot write trace '{}': write failed", path);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    fail("cannot write trace '{}': {}", path, std::strerror(e));
  }
}

Trace read_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read trace '{}': {}", path, std::strerror(errno));
  std::string line;
  if (!std::getline(in, line)) fail("{}: empty file, not a lazyprefill trace", path);
  const json head = json::parse(line, nullptr, false);
  if (head.is_discarded() || !head.is_object() || !head.contains("lazyprefill_trace"))
    fail("{}: not a lazyprefill trace (line 1 is not a trace header)", path);
  Trace t;
  Header& h = t.header;
  try {
    h.version = head.at("lazyprefill_trace").get<int>();
    if (h.version != kVersion)
      fail("{}: trace version {} is not supported (expected {})", path, h.version, kVersion);
    h.n_layer = head.at("n_layer").get<int>();
    if (h.n_layer < 1 || h.n_layer > 1024) fail("{}: n_layer {} is out of range", path, h.n_layer);
    h.model = head.at("model");
    h.policy = head.at("policy").get<std::string>();
    h.schedule = head.at("schedule").get<std::string>();
    for (const auto& s : head.at("schedule_layers"))
      h.schedule_layers.emplace_back(s.at("layer"), s.at("share"));
    h.prompt_tokens = head.at("prompt_tokens").get<int64_t>();
    h.dtype = head.value("dtype", "");
    h.tool_version = head.value("tool_version", "");
    h.git_commit = head.value("git_commit", "");
    h.seed = head.value("seed", uint64_t{0});
  } catch (const json::exception& e) {
    fail("{}: line 1: bad trace header ({})", path, e.what());
  }
  int64_t n = 1;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    const std::string where = fmt::format("{}: line {}", path, n);
    const json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) fail("{}: not a JSON object", where);
    Step s;
    if (!j.contains("kind") || !j["kind"].is_string()) fail("{}: missing 'kind'", where);
    s.kind = j["kind"].get<std::string>();
    s.new_tokens = j.value("new_tokens", int64_t{0});
    s.queries = layer_array(j, "queries", h.n_layer, where);
    s.keys = layer_array(j, "keys", h.n_layer, where);
    s.pairs = layer_array(j, "pairs", h.n_layer, where);
    s.revived = layer_array(j, "revived", h.n_layer, where);
    s.aux_reads = layer_array(j, "aux_reads", h.n_layer, where);
    s.aux_writes = layer_array(j, "aux_writes", h.n_layer, where);
    t.steps.push_back(std::move(s));
  }
  if (t.steps.empty()) fail("{}: trace has no steps", path);
  if (t.steps[0].kind != "prefill") fail("{}: the first step must be the prefill", path);
  return t;
}

Summary summarize(const Trace& t) {
  Summary s;
  const int L = t.header.n_layer;
  const Step& pre = t.steps.front();
  const int64_t T = pre.new_tokens > 0 ? pre.new_tokens : t.header.prompt_tokens;
  double computed = 0;
  for (int l = 0; l < L; ++l) {
    s.prompt_share_per_layer.push_back(T > 0 ? double(pre.queries[l]) / double(T) : 0.0);
    computed += double(pre.queries[l]);
  }
  s.prompt_share = T > 0 ? computed / (double(T) * L) : 0.0;
  // Over the whole generation: a dense run computes every new token at every layer once.
  double all = 0, dense = 0;
  int64_t tokens = 0;
  std::vector<int64_t> per_layer(size_t(L), 0);
  for (const Step& st : t.steps) {
    tokens += st.new_tokens;
    dense += double(st.new_tokens) * L;
    for (int l = 0; l < L; ++l) {
      all += double(st.queries[l]);
      per_layer[size_t(l)] += st.queries[l];
      s.aux_writes += st.aux_writes[l];
      s.revivals += st.revived[l];
    }
  }
  s.generation_share = dense > 0 ? all / dense : 0.0;
  for (int l = 0; l < L; ++l) s.at_most_once = s.at_most_once && per_layer[size_t(l)] <= tokens;
  for (int l = 0; l < L; ++l) s.kv_tokens_final += t.steps.back().keys[l];
  return s;
}

}  // namespace lp::trace
