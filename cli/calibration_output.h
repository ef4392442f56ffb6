// Printing and saving a calibration, shared by `calibrate` and `validate`.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "calibrate/calibrate.h"
#include "hwmodels/profile.h"

namespace lp::cli {

// The report as JSON: per family the fitted parameters and residuals, per run measured vs
// predicted prefill time.
nlohmann::ordered_json calibration_json(const hw::Profile& fitted, const calib::CalibrationReport& rep,
                                        const std::vector<calib::RunMeasurement>& runs);
// The same as a readable table on stdout.
void print_calibration(const hw::Profile& fitted, const calib::CalibrationReport& rep,
                       const std::vector<calib::RunMeasurement>& runs);
// The fitted profile document: the base's fields, the fitted efficiency block, `name`, and
// sources.efficiency naming how it was made (`provenance`).
nlohmann::ordered_json fitted_profile_json(const hw::Profile& fitted, const std::string& name,
                                           const std::string& provenance);
// That document written whole to `path` (write_file_atomic), its text UTF-8 safe.
void write_fitted_profile(const std::string& path, const hw::Profile& fitted, const std::string& name,
                          const std::string& provenance);

// A subcommand's result: `out` as indented JSON with --json, else `text`.
void print_result(bool json_out, const nlohmann::ordered_json& out, const std::string& text);

}  // namespace lp::cli
