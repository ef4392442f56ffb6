// Printing a calibration, shared by `calibrate` and `validate` (its JSON and the fitted profile
// document are the calibrate room's: calibrate/calibrate_study.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "calibrate/calibrate_study.h"
#include "hwmodels/profile.h"

namespace lp::cli {

// calibrate --runs' fit (calib::calibration_json) as a readable table on stdout.
void print_calibration(const hw::Profile& fitted, const calib::CalibrationReport& rep,
                       const std::vector<calib::RunMeasurement>& runs);
// A subcommand's result: `out` as indented JSON with --json, else `text`.
void print_result(bool json_out, const nlohmann::ordered_json& out, const std::string& text);

}  // namespace lp::cli
