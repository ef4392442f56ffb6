// The memory wall: read and STREAM-triad bandwidth on 2 threads (kernels/cpu/membw.h), with 4 KiB
// and with transparent huge pages, buffers of max(1 GiB, 4 x the last-level cache).
//
//   build/lp_bench --benchmark_filter=MemBandwidth
//
// One measurement per case (5 passes over the buffer; counters: the best pass's GB/s and the
// median's). Decoding reads each weight once a token, so BM_Decode, BM_QGemv and BM_PruneDecode
// report their GB/s as a share of the read figure (bench/ceiling.h).
#include <benchmark/benchmark.h>

#include "kernels/context.h"
#include "kernels/cpu/membw.h"

namespace {

void BM_MemBandwidth(benchmark::State& st) {
  const auto pattern = lp::MemPattern(st.range(0));
  const bool huge = st.range(1) != 0;
  lp::CpuContext ctx(2);
  lp::Bandwidth b;
  for (auto _ : st) b = lp::measure_bandwidth(ctx, pattern, {.huge_pages = huge});
  st.SetLabel(std::string(lp::mem_pattern_name(pattern)) + (huge ? " huge pages " : " 4k pages ") + b.isa +
              " " + std::to_string(b.bytes >> 20) + " MiB");
  st.counters["GB/s"] = b.gbs;
  st.counters["median_GB/s"] = b.median_gbs;
}
BENCHMARK(BM_MemBandwidth)
    ->ArgsProduct({{int(lp::MemPattern::Read), int(lp::MemPattern::Triad)}, {0, 1}})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
