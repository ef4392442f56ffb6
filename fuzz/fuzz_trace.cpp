// The trace reader, step by step, with everything a trace feeds: the summary inspect prints and
// the simulator's replay of it (on its own model and mapped onto another), so hostile counts
// cannot reach undefined arithmetic downstream.
#include "fuzz/fuzz_util.h"
#include "hwmodels/profile.h"
#include "model/config.h"
#include "sim/replay.h"
#include "traces/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const lp::hw::Profile hw = lp::hw::load_profile("h100-sxm");
  const std::string& path = lp::fuzz::mem_file().write(data, size);
  lp::fuzz::refuses_cleanly([&] {
    lp::trace::TraceReader r(path);
    const lp::trace::Header& h = r.header();
    const lp::ModelConfig c = lp::config_from_json(h.model, "fuzz");
    lp::trace::Summarizer sum(h);
    lp::sim::Replayer own(h, c, hw, lp::sim::Precision{});
    lp::ModelConfig small = c;
    small.n_layer = 3;
    small.layer_n_head.clear();
    small.layer_n_head_kv.clear();
    small.layer_n_ff.clear();
    const lp::trace::Header mapped = lp::sim::map_header(h, 3, 1000);
    lp::sim::Replayer other(mapped, small, hw, lp::sim::Precision{});
    for (lp::trace::Step s; r.next(s);) {
      sum.add(s);
      own.add(s);
      other.add(lp::sim::map_step(h, s, 3, 1000));
    }
    (void)sum.finish();
    (void)std::move(own).finish();
    (void)std::move(other).finish();
  });
  return 0;
}
