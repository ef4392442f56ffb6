// Pruning schedules: the inline form and the JSON file, resolved for several depths; a schedule
// that parses must print to a form that parses back to the same schedule.
#include <cstdio>
#include <cstdlib>
#include <vector>

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
    // A sliding-window model's global layers (Gemma 3's every sixth): depths move there and may merge,
    // and a merged share must stay below 1.
    for (int layers : {6, 18, 62})
      lp::fuzz::refuses_cleanly([&] {
        std::vector<int> global;
        for (int l = 5; l < layers; l += 6) global.push_back(l);
        for (const lp::PruneStep& st : lp::resolve_schedule(s, layers, global))
          if (!(st.share >= 0 && st.share < 1)) {
            std::fprintf(stderr, "resolved share %.17g outside [0, 1)\n", st.share);
            std::abort();
          }
      });
  });
  const std::string& path = lp::fuzz::mem_file().write(data, size);
  lp::fuzz::refuses_cleanly([&] {
    const lp::Schedule s = lp::load_schedule_file(path);
    for (int layers : {1, 30, 1024})
      lp::fuzz::refuses_cleanly([&] { (void)lp::resolve_schedule(s, layers); });
  });
  return 0;
}
