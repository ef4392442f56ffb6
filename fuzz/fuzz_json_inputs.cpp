// The small JSON inputs: hardware profiles, model configurations (presets and trace headers use
// the same reader) and revival models, from any bytes.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_util.h"
#include "hwmodels/profile.h"
#include "model/config.h"
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
  return 0;
}
