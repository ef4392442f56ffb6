#include "reports/accuracy.h"

#include <fmt/format.h>

#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"

namespace lp::report {

nlohmann::json read_eval(const std::string& path) {
  const std::string text = read_input_file(path, "eval result", input_cap::kResults);
  nlohmann::json j;
  try {
    j = json_parse(text, path);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON ({})", path, e.what());
  }
  if (!j.is_object() || !j.contains("results") || !j["results"].is_array())
    fail("{}: not an `eval --json` result (no 'results' array)", path);
  return j;
}

std::vector<AccuracyEvidence> accuracy_evidence(const nlohmann::json& eval, const std::string& policy,
                                                const std::string& schedule) {
  std::vector<AccuracyEvidence> out;
  for (const auto& r : eval.value("results", nlohmann::json::array())) {
    if (!r.is_object() || !r.contains("methods") || !r["methods"].is_array()) continue;
    for (const auto& m : r["methods"]) {
      if (!m.is_object() || m.value("policy", "") != policy || m.value("schedule", "") != schedule) continue;
      AccuracyEvidence e;
      e.task = r.value("task", "");
      e.length = r.value("length", int64_t(0));
      e.samples = m.value("samples", int64_t(0));
      if (m.contains("accuracy") && m["accuracy"].is_number()) {
        e.metric = "accuracy";
        e.value = m["accuracy"].get<double>();
        e.change = m.value("accuracy_change", 0.0);
      } else if (m.contains("nll_change") && m["nll_change"].is_number()) {
        e.metric = "NLL change";
        e.value = e.change = m["nll_change"].get<double>();
      } else {
        continue;
      }
      out.push_back(e);
    }
  }
  return out;
}

nlohmann::json accuracy_json(const std::vector<AccuracyEvidence>& rows) {
  if (rows.empty()) return "accuracy not measured";
  nlohmann::json out = nlohmann::json::array();
  for (const AccuracyEvidence& e : rows)
    out.push_back({{"task", e.task},
                   {"length", e.length},
                   {"metric", e.metric},
                   {"value", e.value},
                   {"change", e.change},
                   {"samples", e.samples}});
  return out;
}

std::string accuracy_words(const std::vector<AccuracyEvidence>& rows) {
  if (rows.empty()) return "accuracy not measured";
  std::string out;
  for (const AccuracyEvidence& e : rows)
    out += fmt::format("{}{} at {} tokens: {} {:.4g} ({:+.4g}, {} samples)", out.empty() ? "" : "; ", e.task,
                       e.length, e.metric, e.value, e.change, e.samples);
  return out;
}

}  // namespace lp::report
