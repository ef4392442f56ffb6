// What `run` reports, shared by `run` and `validate`: the trace of a generation and the
// `run --json` object (the measurement format `calibrate` reads).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/generate.h"
#include "traces/trace.h"

namespace lp::cli {

// The trace of a generation (header, prefill step, one step per decoding step when the options
// recorded them); with `detail`, kept positions, scores and revived positions.
trace::Trace run_trace(const ModelConfig& c, const GenerateOptions& opt, const GenerateResult& r,
                       const std::string& dtype, uint64_t seed, bool detail);

// The run --json object without the sampling settings (the caller adds those).
nlohmann::json run_json(const Model& m, const GenerateOptions& opt, const GenerateResult& r,
                        const std::string& dtype, int threads);

}  // namespace lp::cli
