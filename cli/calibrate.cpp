// `lazyprefill calibrate`: fit a hardware profile's efficiencies to measured `run --json` outputs.
#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/calibration_output.h"
#include "cli/commands.h"
#include "model/error.h"
#include "model/io.h"
#include "sim/calibrate.h"

namespace lp::cli {

namespace fs = std::filesystem;

namespace {
std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}
}  // namespace

CLI::App* add_calibrate(CLI::App& app, CalibrateArgs& a) {
  auto* c = app.add_subcommand(
      "calibrate",
      "Fit a hardware profile's efficiencies to measured runs (run --json outputs).\n"
      "  lazyprefill run --prompt-file p.txt --max-new-tokens 0 --dtype f32 --json > runs/p.json   # a few of these\n"
      "  lazyprefill calibrate --runs runs/ --base cpu-local --out cpu-local.json");
  c->add_option("--runs", a.runs, "Folder of run --json outputs (*.json)")->required();
  c->add_option("--base", a.base, "Profile to start from (name or .json); its other fields are kept")->required();
  c->add_option("--out", a.out, "Where to write the fitted profile (.json)")->required();
  c->add_option("--name", a.name, "Name of the fitted profile (default: the base's name)");
  c->add_flag("--json", a.json_out, "Print the fit report as JSON");
  return c;
}

int cmd_calibrate(const CalibrateArgs& a) {
  if (!fs::is_directory(a.runs)) usage_fail("--runs '{}' is not a folder", a.runs);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(a.runs))
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.empty()) fail("--runs '{}' holds no .json files", a.runs);
  std::vector<sim::RunMeasurement> runs;
  for (const fs::path& f : files) {
    std::ifstream in(f);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not valid JSON ({})", f.string(), e.what());
    }
    runs.push_back(sim::measurement_from_run_json(j, f.filename().string()));
  }
  const hw::Profile base = hw::load_profile(a.base);
  sim::CalibrationReport rep;
  const hw::Profile fitted = sim::calibrate(base, runs, &rep);
  const std::string name = a.name.empty() ? base.name : a.name;
  const std::string provenance =
      fmt::format("calibrated on {} by `lazyprefill calibrate --base {}` from {} runs in {}", today(), a.base,
                  runs.size(), a.runs);
  write_file_atomic(a.out, fitted_profile_json(fitted, name, provenance).dump(2) + "\n", "profile");
  if (a.json_out) {
    nlohmann::ordered_json j = calibration_json(fitted, rep, runs);
    j["profile"] = a.out;
    std::puts(j.dump(2).c_str());
  } else {
    print_calibration(fitted, rep, runs);
    fmt::print("\nwrote {}\n", a.out);
  }
  return 0;
}

}  // namespace lp::cli
