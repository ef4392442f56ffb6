// The small JSON inputs: hardware profiles, model configurations (presets and trace headers use
// the same reader), revival models, `report --validation` files and `report --plan` files (a saved
// `plan --out`), from any bytes.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_util.h"
#include "hwmodels/profile.h"
#include "model/config.h"
#include "model/presets.h"
#include "reports/capacity.h"
#include "reports/plan_section.h"
#include "sim/revival.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = lp::fuzz::mem_file().write(data, size);
  lp::fuzz::refuses_cleanly([&] { (void)lp::hw::load_profile(path); });
  lp::fuzz::refuses_cleanly([&] { (void)lp::sim::load_revival_model(path); });
  const nlohmann::ordered_json oj =
      nlohmann::ordered_json::parse(lp::fuzz::as_text(data, size), nullptr, false);
  if (oj.is_discarded()) return 0;
  const nlohmann::json j = nlohmann::json::parse(lp::fuzz::as_text(data, size));
  lp::fuzz::refuses_cleanly([&] { (void)lp::hw::parse_profile(oj, "fuzz"); });
  lp::fuzz::refuses_cleanly([&] { (void)lp::config_from_json(j, "fuzz"); });
  lp::fuzz::refuses_cleanly([&] { (void)lp::sim::parse_revival_model(j, "fuzz"); });
  // A `report --validation` file: checked, then drawn into the measured-vs-predicted chart.
  lp::fuzz::refuses_cleanly([&] {
    lp::report::check_validation(j, "fuzz");
    static const lp::report::Report rep = [] {
      lp::report::Request r;
      r.model = lp::preset_config("llama-2-7b");
      r.hws = {lp::hw::load_profile("l4")};
      r.methods = {{"none", lp::Method{}, {}, nullptr, {}, "none"}};
      r.lengths = {512, 1024};
      return lp::report::build_report(r);
    }();
    (void)lp::report::report_charts(rep, &j);
  });
  // A `report --plan` file: read, then written as the report's section and chart.
  lp::fuzz::refuses_cleanly([&] { (void)lp::report::plan_html(lp::report::read_plan(j, "fuzz")); });
  return 0;
}
