// Charts for the capacity reports, written as standalone SVG text (no Python, no renderer).
//
// Two chart kinds cover the report: a line/scatter chart (TTFT vs prompt length, speedup vs share
// of tokens computed, measured vs predicted with the y = x diagonal) and a stacked bar chart
// (per-op breakdown). Axis labels carry the units ("TTFT (ms)"); tick labels are compact numbers
// (1.5k, 20M) chosen on 1-2-5 steps, or decades on log axes.
//
// Invariants: the output is well-formed XML with every text XML-escaped; it never contains a
// non-finite number; the same input gives the same bytes. Bad data never throws: non-finite values
// are skipped, non-positive values on a log axis are dropped, and each such drop is written as a
// small note under the chart so a reader knows something is missing.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lp::report {

struct Axis {
  std::string label;  // with the unit, e.g. "TTFT (ms)"
  bool log = false;
  std::optional<double> min{}, max{};  // fixed bounds; unset: from the data, widened to nice ticks
  // Labelled tick positions chosen by the caller (e.g. powers of two for prompt lengths); empty:
  // automatic. Values outside the axis range (or non-positive on a log axis) are ignored.
  std::vector<double> ticks{};
};

struct Series {
  std::string name;
  std::vector<double> x, y;  // paired by index; extra values in the longer one are ignored
  bool lines = true;
  bool points = true;
  bool dashed = false;
  int color = -1;  // palette index, -1 = next unused
};

struct LineChart {
  std::string title, subtitle;
  Axis x, y;
  std::vector<Series> series;
  bool diagonal = false;  // draw y = x, for measured-vs-predicted
};

std::string svg_line_chart(const LineChart& c, int width = 760, int height = 460);

struct BarSegment {
  std::string name;
  std::vector<double> values;  // one per category; missing values count as 0
};

struct StackedBarChart {
  std::string title, subtitle;
  std::vector<std::string> categories;
  Axis y;                            // linear only: a log scale has no meaning for stacked heights
  std::vector<BarSegment> segments;  // drawn bottom to top
};

std::string svg_stacked_bars(const StackedBarChart& c, int width = 760, int height = 460);

// Escapes & < > " ' for use in both text and attribute values.
std::string xml_escape(std::string_view s);

// ---- Exposed for tests and for callers that want the same ticks elsewhere ----

struct Tick {
  double value;
  std::string label;  // empty: a gridline without a label (log minor ticks)
  bool major = true;  // decades on log axes; every tick on linear axes
};

struct AxisTicks {
  double lo = 0, hi = 1;  // the axis range drawn, lo < hi (both > 0 on a log axis)
  std::vector<Tick> ticks;
};

// Range and ticks for data spanning [data_min, data_max] (finite, data_min <= data_max, and > 0 on
// a log axis; otherwise a default range is used). Honours axis.min/max/ticks.
AxisTicks axis_ticks(double data_min, double data_max, const Axis& axis);

// Compact tick label: 0, 0.25, 950, 1k, 1.5k, 1024, 20M, 1e-05.
std::string format_tick(double v);

}  // namespace lp::report
