// Pruning schedules: the inline form and the JSON file, resolved for several depths; a schedule
// that parses must print to a form that parses back to the same schedule.
#include <cstdio>
#include <cstdlib>

#include "fuzz/fuzz_util.h"
#include "pruning/schedule.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = lp::fuzz::as_text(data, size);
  lp::fuzz::refuses_cleanly([&] {
    const lp::Schedule s = lp::parse_schedule(text);
    const std::string printed = s.to_string();
    if (lp::parse_schedule(printed).to_string() != printed) {
      std::fprintf(stderr, "'%s' does not read back as itself\n", printed.c_str());
      std::abort();
    }
    for (int layers : {1, 2, 30, 80, 1024})
      lp::fuzz::refuses_cleanly([&] { (void)lp::resolve_schedule(s, layers); });
  });
  const std::string& path = lp::fuzz::mem_file().write(data, size);
  lp::fuzz::refuses_cleanly([&] {
    const lp::Schedule s = lp::load_schedule_file(path);
    for (int layers : {1, 30, 1024})
      lp::fuzz::refuses_cleanly([&] { (void)lp::resolve_schedule(s, layers); });
  });
  return 0;
}
