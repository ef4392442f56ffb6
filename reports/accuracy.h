// Accuracy evidence for pruned rows of a plan or report: what `lazyprefill eval --json` measured for
// a pruning method, found by its policy and schedule; "accuracy not measured" where nothing was.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace lp::report {

struct AccuracyEvidence {
  std::string task, metric;  // metric: "accuracy" (QA tasks) or "NLL change"
  int64_t length = 0;        // prompt tokens
  double value = 0;          // accuracy, or the NLL change
  double change = 0;         // accuracy change against unpruned (QA tasks), else the NLL change
  int64_t samples = 0;
};

// An `eval --json` file as read (lp::Error naming the file when it is not one).
nlohmann::json read_eval(const std::string& path);
// Every task and length of `eval` that ran `policy` at `schedule` (its inline form).
std::vector<AccuracyEvidence> accuracy_evidence(const nlohmann::json& eval, const std::string& policy,
                                                const std::string& schedule);
// Evidence as a plan's or report's JSON gives it: one object a row, or "accuracy not measured".
nlohmann::json accuracy_json(const std::vector<AccuracyEvidence>& rows);
// The same in words: "kv at 4096 tokens: accuracy 0.9 (-0.1, 10 samples); ...".
std::string accuracy_words(const std::vector<AccuracyEvidence>& rows);

}  // namespace lp::report
