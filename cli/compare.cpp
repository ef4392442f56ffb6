// `lazyprefill compare`: every way this tool knows to cut time to first token, side by side, for
// one model on one kind of device at several prompt lengths: the plain prefill on one device,
// LazyLLM (each schedule), tensor parallelism over P devices with and without LazyLLM, KV-Runahead
// over P devices with and without LazyLLM on its last rank (sim/runahead.h), and KV Prediction with
// an auxiliary model (sim/kv_predict.h). Per method: TTFT, speedup over the plain prefill, devices
// used, memory per device and whether it fits, and what it costs in accuracy where that is known
// (LazyLLM: from an `eval --json` output when given; the exact methods: exact; the rest: not
// measured). One table (or --json) and one chart (--chart FILE.svg: TTFT against prompt length).
#include "sim/compare.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

#include "cli/calibration_output.h"
#include "cli/commands.h"
#include "model/error.h"
#include "model/io.h"
#include "reports/plot.h"
#include "sim/kv_predict.h"

namespace lp::cli {
namespace {

// The comparison's tables as text, and TTFT against prompt length per method family (the chart's
// series, in the order the families first appear).
struct RenderedTables {
  std::string text;
  std::vector<report::Series> series;
};
RenderedTables render_tables(const sim::Comparison& cmp) {
  RenderedTables out;
  std::map<std::string, size_t> family;  // index in out.series
  for (const sim::CompareTable& t : cmp.tables) {
    out.text += fmt::format("\nprompt {} tokens\n  {:<34} {:>7} {:>11} {:>8} {:>10}  {}\n", t.prompt_tokens,
                            "method", "devices", "TTFT ms", "speedup", "GiB/device", "accuracy");
    for (const sim::CompareRow& r : t.rows) {
      if (r.refused) {
        out.text += fmt::format("  {:<34} {:>7} {:>11}  {}\n", r.method, r.devices, "-", r.note);
        continue;
      }
      out.text += fmt::format("  {:<34} {:>7} {:>11.1f} {:>7.2f}x {:>9.1f}{}  {}\n", r.method, r.devices,
                              r.ttft_s * 1e3, r.speedup, r.memory_bytes / (1 << 30), r.fits ? " " : "!",
                              r.accuracy_note);
      auto [it, added] = family.try_emplace(r.family, out.series.size());
      if (added) out.series.push_back({.name = r.family, .x = {}, .y = {}});
      out.series[it->second].x.push_back(double(t.prompt_tokens));
      out.series[it->second].y.push_back(r.ttft_s * 1e3);
    }
  }
  return out;
}

}  // namespace

int cmd_compare(const CompareArgs& a) {
  sim::CompareRequest req;
  req.model = a.model;
  req.model_config = a.model_config;
  req.hws = load_profiles(a.hw, a.engine);
  req.precision = a.precision;
  req.devices = a.devices;
  req.prompt_tokens = parse_lengths(a.prompt_tokens, "--prompt-tokens");
  req.schedules = a.schedules;
  req.kv_predict = a.kv_predict;
  req.eval = a.eval;
  const sim::CompareReport rep = sim::compare(req);
  const hw::Profile& hw = rep.hw;
  const sim::Precision& prec = rep.precision;
  RenderedTables tables = render_tables(rep.comparison);
  std::string text =
      fmt::format("{} on {} ({} {}/{}/{}; {} devices for the parallel methods, {:.0f} GiB each)\n", rep.model,
                  hw.name, hw.kind == "gpu" ? "GPU" : "CPU", prec.weights, prec.compute, prec.kv, a.devices,
                  hw.memory_capacity / (1 << 30)) +
      tables.text;
  text += fmt::format("\nThe combinations use LazyLLM {}. ! : needs more memory than a device has.\n",
                      rep.combined_schedule);
  if (rep.kv_predict) text += fmt::format("KV Prediction's accuracy: {}\n", sim::kv_predict_accuracy_note());
  if (!a.chart.empty()) {
    report::LineChart ch;
    ch.title = fmt::format("Time to first token: {} on {}", rep.model, hw.name);
    ch.subtitle =
        fmt::format("one device, or {} for tensor parallelism and KV-Runahead; predicted", a.devices);
    ch.x = {"prompt (tokens)", true};
    ch.y = {"TTFT (ms)", true};
    ch.series = std::move(tables.series);
    write_file_atomic(a.chart, report::svg_line_chart(ch), "chart");
  }
  print_result(a.json_out, rep.to_json(a.chart), text);
  return 0;
}

}  // namespace lp::cli
