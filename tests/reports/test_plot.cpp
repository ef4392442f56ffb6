// SVG charts: well-formed XML (checked by a small parser below, not by eye), every name and label
// present and escaped, one marker per finite point, log axes that drop non-positive values with a
// note, no NaN or inf ever written, byte-identical output for identical input, and 1-2-5 ticks.
#include <gtest/gtest.h>

#include <array>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "reports/plot.h"

namespace lp::report {
namespace {

// ---- A minimal XML well-formedness checker ----
//
// Enough of XML 1.0 for what the charts may contain: a declaration, comments, elements with
// double-quoted attributes, text with the five predefined entities and numeric references. Returns
// "" when well-formed, else what is wrong and where.
bool valid_entity(std::string_view s, size_t amp, size_t* len) {
  size_t semi = s.find(';', amp);
  if (semi == std::string_view::npos || semi - amp > 10) return false;
  std::string_view e = s.substr(amp + 1, semi - amp - 1);
  *len = semi - amp + 1;
  if (e == "amp" || e == "lt" || e == "gt" || e == "quot" || e == "apos") return true;
  if (e.size() >= 2 && e[0] == '#') {
    bool hex = e[1] == 'x';
    std::string_view digits = e.substr(hex ? 2 : 1);
    if (digits.empty()) return false;
    for (char c : digits)
      if (!(hex ? std::isxdigit(static_cast<unsigned char>(c)) : std::isdigit(static_cast<unsigned char>(c))))
        return false;
    return true;
  }
  return false;
}

std::string check_chars(std::string_view s, size_t at, bool attribute) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<')
      return "raw '<' in " + std::string(attribute ? "attribute" : "text") + " at " + std::to_string(at + i);
    if (s[i] == '&') {
      size_t len = 0;
      if (!valid_entity(s, i, &len)) return "bad entity at " + std::to_string(at + i);
      i += len - 1;
    }
  }
  return "";
}

bool name_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':';
}
bool name_char(char c) {
  return name_start(c) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.';
}

std::string check_xml(std::string_view s) {
  std::vector<std::string> stack;
  int roots = 0;
  size_t i = 0;
  auto where = [&](size_t p) { return " at " + std::to_string(p); };
  while (i < s.size()) {
    size_t lt = s.find('<', i);
    std::string_view text = s.substr(i, (lt == std::string_view::npos ? s.size() : lt) - i);
    if (stack.empty()) {
      for (char c : text)
        if (!std::isspace(static_cast<unsigned char>(c))) return "text outside the root" + where(i);
    } else if (auto e = check_chars(text, i, false); !e.empty()) {
      return e;
    }
    if (lt == std::string_view::npos) break;
    i = lt;
    if (s.substr(i, 5) == "<?xml") {
      if (roots || !stack.empty()) return "declaration after the root" + where(i);
      size_t end = s.find("?>", i);
      if (end == std::string_view::npos) return "unterminated declaration";
      i = end + 2;
      continue;
    }
    if (s.substr(i, 4) == "<!--") {
      size_t end = s.find("-->", i);
      if (end == std::string_view::npos) return "unterminated comment";
      i = end + 3;
      continue;
    }
    if (s.substr(i, 2) == "</") {
      size_t j = i + 2, k = j;
      while (k < s.size() && name_char(s[k])) ++k;
      std::string name(s.substr(j, k - j));
      while (k < s.size() && std::isspace(static_cast<unsigned char>(s[k]))) ++k;
      if (k >= s.size() || s[k] != '>') return "bad closing tag" + where(i);
      if (stack.empty() || stack.back() != name)
        return "closing </" + name + "> does not match <" + (stack.empty() ? "" : stack.back()) + ">" +
               where(i);
      stack.pop_back();
      i = k + 1;
      continue;
    }
    size_t j = i + 1;
    if (j >= s.size() || !name_start(s[j])) return "bad tag name" + where(i);
    size_t k = j;
    while (k < s.size() && name_char(s[k])) ++k;
    std::string name(s.substr(j, k - j));
    std::map<std::string, int> seen;
    bool closed = false, self = false;
    while (k < s.size()) {
      size_t ws = k;
      while (k < s.size() && std::isspace(static_cast<unsigned char>(s[k]))) ++k;
      if (k >= s.size()) break;
      if (s[k] == '>') {
        closed = true, ++k;
        break;
      }
      if (s.substr(k, 2) == "/>") {
        closed = self = true, k += 2;
        break;
      }
      if (ws == k) return "no space before attribute in <" + name + ">" + where(k);
      size_t a = k;
      if (!name_start(s[k])) return "bad attribute name in <" + name + ">" + where(k);
      while (k < s.size() && name_char(s[k])) ++k;
      std::string attr(s.substr(a, k - a));
      if (seen[attr]++) return "duplicate attribute " + attr + where(a);
      if (k >= s.size() || s[k] != '=') return "attribute " + attr + " without '='" + where(k);
      ++k;
      if (k >= s.size() || s[k] != '"') return "attribute " + attr + " not double-quoted" + where(k);
      size_t end = s.find('"', k + 1);
      if (end == std::string_view::npos) return "unterminated attribute " + attr;
      if (auto e = check_chars(s.substr(k + 1, end - k - 1), k + 1, true); !e.empty()) return e;
      k = end + 1;
    }
    if (!closed) return "unterminated tag <" + name + ">";
    if (stack.empty()) {
      if (roots++) return "second root element <" + name + ">" + where(i);
      if (name != "svg") return "root is <" + name + ">, not <svg>";
    }
    if (!self) stack.push_back(name);
    i = k;
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  if (roots != 1) return "no root element";
  return "";
}

size_t count(std::string_view hay, std::string_view needle) {
  size_t n = 0;
  for (size_t p = hay.find(needle); p != std::string_view::npos; p = hay.find(needle, p + needle.size())) ++n;
  return n;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Every numeric coordinate attribute must be a plain finite number inside the canvas.
void expect_sane(const std::string& svg, int width = 760, int height = 460) {
  EXPECT_EQ(check_xml(svg), "") << svg;
  const std::string l = lower(svg);
  EXPECT_EQ(l.find("nan"), std::string::npos) << svg;
  EXPECT_EQ(l.find("inf"), std::string::npos) << svg;
  EXPECT_NE(svg.find("viewBox=\"0 0 " + std::to_string(width) + " " + std::to_string(height) + "\""),
            std::string::npos);
  EXPECT_NE(svg.find("font-family=\"sans-serif\""), std::string::npos);
  EXPECT_NE(svg.find("fill=\"#ffffff\""), std::string::npos);  // white background
  static const std::regex coord(R"re(\s(x|y|x1|x2|y1|y2|cx|cy)="([^"]*)")re");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), coord); it != std::sregex_iterator(); ++it) {
    const std::string v = (*it)[2];
    char* end = nullptr;
    double d = std::strtod(v.c_str(), &end);
    ASSERT_EQ(*end, '\0') << "not a number: " << (*it)[0];
    const std::string name = (*it)[1];
    const double lim = name[0] == 'x' || name == "cx" ? width : height;
    EXPECT_GE(d, -1) << (*it)[0];
    EXPECT_LE(d, lim + 1) << (*it)[0];
  }
}

std::vector<double> tick_values(const AxisTicks& t, bool labelled_only = true) {
  std::vector<double> v;
  for (const auto& k : t.ticks)
    if (!labelled_only || !k.label.empty()) v.push_back(k.value);
  return v;
}

LineChart ttft_chart() {
  LineChart c;
  c.title = "TTFT vs prompt length";
  c.subtitle = "bf16, batch 1";
  c.x = {"Prompt length (tokens)", true};
  c.y = {"TTFT (ms)", true};
  const char* hw[] = {"h100-sxm", "a100-80g", "l4"};
  for (int h = 0; h < 3; ++h) {
    Series base, pruned;
    base.name = std::string(hw[h]) + " baseline";
    pruned.name = std::string(hw[h]) + " LazyLLM";
    base.dashed = true;
    base.color = pruned.color = h;
    for (double l = 256; l <= 32768; l *= 2) {
      double t = (h + 1) * (4 + l * 0.05 + l * l * 2e-6);
      base.x.push_back(l), base.y.push_back(t);
      pruned.x.push_back(l), pruned.y.push_back(0.6 * t);
    }
    c.series.push_back(base), c.series.push_back(pruned);
  }
  return c;
}

StackedBarChart ops_chart() {
  StackedBarChart c;
  c.title = "Prefill time per op";
  c.categories = {"h100-sxm none 8192",    "h100-sxm lazyllm 8192", "a100-80g none 8192",
                  "a100-80g lazyllm 8192", "l4 none 8192",          "l4 lazyllm 8192"};
  c.y = {"Prefill time (ms)"};
  const char* ops[] = {"embedding", "rmsnorm", "qkv", "rope", "attention", "o_proj", "ffn_up", "ffn_down"};
  for (int o = 0; o < 8; ++o) {
    BarSegment s{ops[o], {}};
    for (int i = 0; i < 6; ++i) s.values.push_back((o + 1) * (i + 1) * 1.5);
    c.segments.push_back(s);
  }
  return c;
}

// ---- The checker itself must be able to fail ----

TEST(PlotXmlChecker, AcceptsWellFormedAndRejectsBroken) {
  EXPECT_EQ(
      check_xml("<?xml version=\"1.0\"?>\n<svg a=\"1\"><g><text x=\"1\">a &amp; b</text></g><rect/></svg>\n"),
      "");
  EXPECT_NE(check_xml("<svg><g></svg>"), "");                 // unbalanced
  EXPECT_NE(check_xml("<svg><g></text></g></svg>"), "");      // mismatched
  EXPECT_NE(check_xml("<svg x=1></svg>"), "");                // unquoted attribute
  EXPECT_NE(check_xml("<svg x='1'></svg>"), "");              // single quotes (we always write double)
  EXPECT_NE(check_xml("<svg x=\"1\"y=\"2\"></svg>"), "");     // no space between attributes
  EXPECT_NE(check_xml("<svg x=\"1\" x=\"2\"></svg>"), "");    // duplicate attribute
  EXPECT_NE(check_xml("<svg><text>a < b</text></svg>"), "");  // raw '<'
  EXPECT_NE(check_xml("<svg><text>a & b</text></svg>"), "");  // raw '&'
  EXPECT_NE(check_xml("<svg><text x=\"a<b\"/></svg>"), "");   // '<' in attribute
  EXPECT_NE(check_xml("<svg></svg><svg></svg>"), "");         // two roots
  EXPECT_NE(check_xml("<svg>"), "");                          // unclosed
}

// ---- Escaping ----

TEST(Plot, XmlEscape) {
  EXPECT_EQ(xml_escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
  EXPECT_EQ(xml_escape("it's > 1"), "it&#39;s &gt; 1");
  EXPECT_EQ(xml_escape("tab\there"), "tab\there");
  EXPECT_EQ(xml_escape(std::string("bell\x07")), "bell ");  // not allowed in XML 1.0 at all
  EXPECT_EQ(xml_escape("µs ≤ 5"), "µs ≤ 5");                // UTF-8 passes through
}

// ---- Ticks ----

TEST(PlotTicks, LinearNiceSteps) {
  AxisTicks t = axis_ticks(0, 97, Axis{});
  EXPECT_EQ(tick_values(t), (std::vector<double>{0, 20, 40, 60, 80, 100}));
  EXPECT_EQ(t.lo, 0);
  EXPECT_EQ(t.hi, 100);

  t = axis_ticks(3, 7.2, Axis{});  // step 1
  EXPECT_EQ(tick_values(t), (std::vector<double>{3, 4, 5, 6, 7, 8}));

  t = axis_ticks(0.013, 0.087, Axis{});  // step 0.01; labels without float noise
  ASSERT_EQ(t.ticks.size(), 9u);
  EXPECT_EQ(t.ticks.front().label, "0.01");
  EXPECT_EQ(t.ticks[6].label, "0.07");
  EXPECT_EQ(t.ticks.back().label, "0.09");

  t = axis_ticks(-12, 38, Axis{});  // step 10 across zero, and a plain "0" (never "-0")
  EXPECT_EQ(tick_values(t), (std::vector<double>{-20, -10, 0, 10, 20, 30, 40}));
  EXPECT_EQ(t.ticks[2].label, "0");

  t = axis_ticks(0, 9400, Axis{});
  std::vector<std::string> labels;
  for (const auto& k : t.ticks) labels.push_back(k.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"0", "2k", "4k", "6k", "8k", "10k"}));
}

TEST(PlotTicks, FixedBoundsAndExplicitTicks) {
  Axis a;
  a.min = 0, a.max = 1;
  AxisTicks t = axis_ticks(0.31, 0.52, a);
  EXPECT_EQ(t.lo, 0);
  EXPECT_EQ(t.hi, 1);
  ASSERT_EQ(t.ticks.size(), 6u);
  EXPECT_DOUBLE_EQ(t.ticks[3].value, 0.6);

  Axis only_min;
  only_min.min = 1.0;
  t = axis_ticks(1.2, 2.47, only_min);
  EXPECT_EQ(t.lo, 1.0);
  EXPECT_GE(t.hi, 2.47);

  Axis x;
  x.log = true;
  x.ticks = {256, 1024, 4096, 16384, -5, 0};  // non-positive ones are ignored on a log axis
  t = axis_ticks(256, 16384, x);
  EXPECT_EQ(tick_values(t), (std::vector<double>{256, 1024, 4096, 16384}));
  EXPECT_LT(t.lo, 256);  // padded so edge markers are not cut
  EXPECT_GT(t.hi, 16384);
  EXPECT_EQ(t.ticks[1].label, "1024");
}

TEST(PlotTicks, LogDecadesAndMinorLabels) {
  Axis log;
  log.log = true;
  AxisTicks t = axis_ticks(1, 1000, log);
  EXPECT_EQ(t.lo, 1);
  EXPECT_EQ(t.hi, 1000);
  std::vector<double> major;
  for (const auto& k : t.ticks)
    if (k.major) major.push_back(k.value);
  EXPECT_EQ(major, (std::vector<double>{1, 10, 100, 1000}));
  EXPECT_EQ(tick_values(t), major);  // four decades: only they are labelled
  EXPECT_EQ(t.ticks.size(), 28u);    // 1..9 x 3 decades + 1000: gridlines for the minors

  // 256..32768: bounds snap to 1-2-5 values and, with only two decades inside, 2 and 5 get labels.
  t = axis_ticks(256, 32768, log);
  EXPECT_EQ(t.lo, 200);
  EXPECT_EQ(t.hi, 50000);
  EXPECT_EQ(tick_values(t), (std::vector<double>{200, 500, 1000, 2000, 5000, 10000, 20000, 50000}));

  // Wide ranges snap to whole decades.
  t = axis_ticks(0.03, 4.5e5, log);
  EXPECT_DOUBLE_EQ(t.lo, 0.01);
  EXPECT_DOUBLE_EQ(t.hi, 1e6);

  // Under one decade every multiple is labelled.
  t = axis_ticks(3, 7, log);
  EXPECT_EQ(tick_values(t), (std::vector<double>{2, 3, 4, 5, 6, 7, 8, 9, 10}));
}

TEST(PlotTicks, DegenerateRanges) {
  for (bool log : {false, true}) {
    Axis a;
    a.log = log;
    for (auto [lo, hi] : std::vector<std::pair<double, double>>{
             {5, 5}, {0, 0}, {NAN, NAN}, {INFINITY, -INFINITY}, {-3, -1}, {1e300, 1e300}, {-1e308, 1e308}}) {
      AxisTicks t = axis_ticks(lo, hi, a);
      EXPECT_TRUE(std::isfinite(t.lo) && std::isfinite(t.hi) && t.lo < t.hi)
          << lo << " " << hi << " log " << log;
      if (log) {
        EXPECT_GT(t.lo, 0);
      }
      EXPECT_LE(t.ticks.size(), 200u);
      for (const auto& k : t.ticks) EXPECT_TRUE(std::isfinite(k.value));
    }
  }
}

TEST(PlotTicks, CompactLabels) {
  EXPECT_EQ(format_tick(0), "0");
  EXPECT_EQ(format_tick(-0.0), "0");
  EXPECT_EQ(format_tick(0.25), "0.25");
  EXPECT_EQ(format_tick(950), "950");
  EXPECT_EQ(format_tick(1000), "1k");
  EXPECT_EQ(format_tick(1500), "1.5k");
  EXPECT_EQ(format_tick(1024), "1024");  // not a rounded "1.02k"
  EXPECT_EQ(format_tick(32768), "32768");
  EXPECT_EQ(format_tick(-3000), "-3k");
  EXPECT_EQ(format_tick(2e6), "2M");
  EXPECT_EQ(format_tick(4.5e9), "4.5G");
  EXPECT_EQ(format_tick(0.1 + 0.2), "0.3");
  EXPECT_EQ(format_tick(1e-5), "1e-05");
}

// ---- Line charts ----

TEST(PlotLineChart, WellFormedWithEveryNameAndLabel) {
  LineChart c = ttft_chart();
  std::string svg = svg_line_chart(c);
  expect_sane(svg);
  for (const auto& s : c.series) EXPECT_NE(svg.find(">" + s.name + "</text>"), std::string::npos) << s.name;
  EXPECT_NE(svg.find(">TTFT (ms)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">Prompt length (tokens)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">TTFT vs prompt length</text>"), std::string::npos);
  EXPECT_NE(svg.find(">bf16, batch 1</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "stroke-dasharray=\"6 4\""), 3u * 2);  // 3 dashed lines + their 3 legend samples
  EXPECT_EQ(count(svg, "class=\"mk\""), 6u * 8);
}

TEST(PlotLineChart, EscapesNamesLabelsAndTitles) {
  LineChart c;
  c.title = "<script> & \"title\"";
  c.x.label = "x <units>";
  c.y.label = "y & 'units'";
  c.series.push_back(Series{"a<b & \"c\"", {1, 2, 3}, {3, 1, 2}});
  std::string svg = svg_line_chart(c);
  expect_sane(svg);
  EXPECT_NE(svg.find("a&lt;b &amp; &quot;c&quot;"), std::string::npos);
  EXPECT_NE(svg.find("&lt;script&gt; &amp; &quot;title&quot;"), std::string::npos);
  EXPECT_NE(svg.find("x &lt;units&gt;"), std::string::npos);
  EXPECT_NE(svg.find("y &amp; &#39;units&#39;"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_EQ(svg.find("<script>"), std::string::npos);
}

TEST(PlotLineChart, OneMarkerPerFinitePoint) {
  LineChart c;
  c.x.label = "x", c.y.label = "y";
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  c.series.push_back(Series{"a", {1, 2, nan, 4, 5, 6}, {1, 4, 9, inf, 25, -inf}});  // 3 finite pairs
  c.series.push_back(Series{"b", {1, 2, 3}, {2, 2, 2}});                            // 3
  c.series.push_back(Series{"c", {7}, {1}});                                        // a single point
  Series lines_only{"d", {1, 2}, {0, 1}};
  lines_only.points = false;  // no markers for it
  c.series.push_back(lines_only);
  c.series.push_back(Series{"empty", {}, {}});
  c.series.push_back(Series{"ragged", {1, 2, 3}, {5}});  // one pair; the rest ignored with a note
  std::string svg = svg_line_chart(c);
  expect_sane(svg);
  EXPECT_EQ(count(svg, "class=\"mk\""), 3u + 3 + 1 + 1);
  EXPECT_NE(svg.find("3 points skipped (not a finite number)."), std::string::npos);
  EXPECT_NE(svg.find("1 series with different x and y lengths"), std::string::npos);
  EXPECT_NE(svg.find(">empty</text>"), std::string::npos);  // still in the legend
}

TEST(PlotLineChart, LogAxesDropNonPositiveValuesWithANote) {
  LineChart c;
  c.x = {"x", true};
  c.y = {"y (ms)", true};
  c.series.push_back(Series{"s", {1, 2, 0, -4, 5, 6}, {1, 0, 3, 4, -5, 6}});
  std::string svg;
  ASSERT_NO_THROW(svg = svg_line_chart(c));
  expect_sane(svg);
  EXPECT_EQ(count(svg, "class=\"mk\""), 2u);  // (1,1) and (6,6)
  EXPECT_NE(svg.find("2 points with x &lt;= 0 dropped (log x axis)."), std::string::npos);
  EXPECT_NE(svg.find("2 points with y &lt;= 0 dropped (log y axis)."), std::string::npos);

  // The same data on linear axes keeps everything and says nothing.
  c.x.log = c.y.log = false;
  svg = svg_line_chart(c);
  EXPECT_EQ(count(svg, "class=\"mk\""), 6u);
  EXPECT_EQ(svg.find("dropped"), std::string::npos);
}

TEST(PlotLineChart, PointsOutsideFixedBoundsAreNotDrawnAndNoted) {
  LineChart c;
  c.x.min = 0, c.x.max = 10;
  c.series.push_back(Series{"s", {-5, 1, 5, 20}, {1, 2, 3, 4}});
  std::string svg = svg_line_chart(c);
  expect_sane(svg);
  EXPECT_EQ(count(svg, "class=\"mk\""), 2u);
  EXPECT_NE(svg.find("2 points outside the axis range not shown."), std::string::npos);
}

TEST(PlotLineChart, DegenerateInputNeverThrowsNorWritesNanOrInf) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  std::vector<LineChart> charts(8);
  charts[1].series.push_back(Series{"only bad values", {nan, nan}, {nan, 1}});
  charts[2].series.push_back(Series{"single", {3}, {3}});
  charts[3].series.push_back(Series{"equal", {5, 5, 5}, {2, 2, 2}});
  charts[4].series.push_back(Series{"huge", {-1e308, 1e308}, {1e308, -1e308}});
  charts[5].x = {"log x", true, -1.0, 0.0};  // unusable bounds on a log axis
  charts[5].y = {"y", false, 5.0, 1.0};      // min > max
  charts[5].series.push_back(Series{"s", {inf, 1, 10}, {1, 2, 3}});
  charts[6].y.log = true;
  charts[6].series.push_back(Series{"all non-positive", {1, 2}, {0, -1}});
  charts[7].diagonal = true;
  charts[7].x.log = true;
  charts[7].series.push_back(Series{"mixed axes", {1, 10, 100}, {2, 20, 90}});
  for (size_t i = 0; i < charts.size(); ++i) {
    for (auto [w, h] : {std::pair{760, 460}, std::pair{240, 180}}) {
      std::string svg;
      ASSERT_NO_THROW(svg = svg_line_chart(charts[i], w, h)) << i;
      SCOPED_TRACE(i);
      expect_sane(svg, w, h);
    }
  }
  EXPECT_NE(svg_line_chart(charts[0]).find("No data to plot."), std::string::npos);
  EXPECT_NE(svg_line_chart(charts[5]).find("Unusable x axis bound ignored."), std::string::npos);
  EXPECT_NE(svg_line_chart(charts[5]).find("y axis bounds ignored (min &gt;= max)."), std::string::npos);
}

TEST(PlotLineChart, DiagonalAndSharedRange) {
  LineChart c;
  c.x = {"Predicted (ms)", true};
  c.y = {"Measured (ms)", true};
  c.diagonal = true;
  Series s{"runs", {10, 100, 1000}, {12, 90, 1500}};
  s.lines = false;
  c.series.push_back(s);
  std::string svg = svg_line_chart(c);
  expect_sane(svg);
  EXPECT_NE(svg.find(">y = x</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "stroke-dasharray=\"3 3\""), 2u);  // the diagonal and its legend sample
  // Both axes get one range and the plot is square, so the diagonal runs corner to corner: from
  // the bottom-left to the top-right of the plot (the clip rectangle less its 3 px margin).
  std::smatch d, r;
  ASSERT_TRUE(std::regex_search(
      svg, d,
      std::regex(R"re(<path d="M([0-9.]+) ([0-9.]+)L([0-9.]+) ([0-9.]+)" fill="none" stroke="#888888")re")));
  ASSERT_TRUE(std::regex_search(
      svg, r,
      std::regex(
          R"re(<clipPath id="[^"]+"><rect x="([0-9.]+)" y="([0-9.]+)" width="([0-9.]+)" height="([0-9.]+)")re")));
  const double left = std::stod(r[1]) + 3, top = std::stod(r[2]) + 3;
  const double right = left + std::stod(r[3]) - 6, bottom = top + std::stod(r[4]) - 6;
  EXPECT_NEAR(std::stod(d[1]), left, 0.011);
  EXPECT_NEAR(std::stod(d[2]), bottom, 0.011);
  EXPECT_NEAR(std::stod(d[3]), right, 0.011);
  EXPECT_NEAR(std::stod(d[4]), top, 0.011);
  EXPECT_NEAR(right - left, bottom - top, 0.011);
  EXPECT_EQ(count(svg, "class=\"mk\""), 3u);
}

TEST(PlotLineChart, LegendStaysOutsideThePlot) {
  auto plot_box = [](const std::string& svg) {
    std::smatch m;
    EXPECT_TRUE(std::regex_search(
        svg, m,
        std::regex(
            R"re(<clipPath id="[^"]+"><rect x="([-0-9.]+)" y="([-0-9.]+)" width="([0-9.]+)" height="([0-9.]+)")re")));
    // The clip rectangle is the plot inflated by 3 px on every side.
    double x = std::stod(m[1]) + 3, y = std::stod(m[2]) + 3;
    return std::array<double, 4>{x, y, x + std::stod(m[3]) - 6, y + std::stod(m[4]) - 6};
  };
  auto legend_origin = [](const std::string& svg) {
    size_t g = svg.find("<g class=\"legend\">");
    EXPECT_NE(g, std::string::npos);
    std::smatch m;
    std::string rest = svg.substr(g);
    EXPECT_TRUE(std::regex_search(rest, m, std::regex(R"re(<line x1="([-0-9.]+)" y1="([-0-9.]+)")re")));
    return std::pair{std::stod(m[1]), std::stod(m[2])};
  };
  // Short names: a column to the right.
  LineChart c = ttft_chart();
  std::string svg = svg_line_chart(c);
  auto box = plot_box(svg);
  auto [lx, ly] = legend_origin(svg);
  EXPECT_GT(lx, box[2]);
  // Long names: rows below the plot.
  for (auto& s : c.series) s.name += " with a much longer description of the configuration";
  svg = svg_line_chart(c);
  expect_sane(svg);
  box = plot_box(svg);
  std::tie(lx, ly) = legend_origin(svg);
  EXPECT_GT(ly, box[3]);
}

TEST(PlotLineChart, Deterministic) {
  LineChart a = ttft_chart(), b = ttft_chart();
  EXPECT_EQ(svg_line_chart(a), svg_line_chart(b));
  EXPECT_EQ(svg_line_chart(a), svg_line_chart(a));
  StackedBarChart p = ops_chart(), q = ops_chart();
  EXPECT_EQ(svg_stacked_bars(p), svg_stacked_bars(q));
  // And it depends on the data: a changed value changes the bytes.
  b.series[0].y[0] *= 2;
  EXPECT_NE(svg_line_chart(a), svg_line_chart(b));
}

// ---- Stacked bars ----

TEST(PlotStackedBars, WellFormedWithEverySegmentAndCategory) {
  StackedBarChart c = ops_chart();
  std::string svg = svg_stacked_bars(c);
  expect_sane(svg);
  for (const auto& s : c.segments) EXPECT_NE(svg.find(">" + s.name + "</text>"), std::string::npos) << s.name;
  for (const auto& cat : c.categories)
    EXPECT_NE(svg.find("data-category=\"" + cat + "\""), std::string::npos);
  EXPECT_NE(svg.find(">Prefill time (ms)</text>"), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"seg\""), 6u * 8);
  // Six categories fit the width when wrapped on spaces, so nothing is rotated.
  EXPECT_EQ(svg.find("rotate(-40"), std::string::npos);
  EXPECT_NE(svg.find(">h100-sxm</text>"), std::string::npos);
}

TEST(PlotStackedBars, LongCategoriesAreRotatedAndCut) {
  StackedBarChart c = ops_chart();
  for (auto& cat : c.categories) cat += " / llama-3.1-8b / bf16 / batch 1 / a long suffix that cannot fit";
  std::string svg = svg_stacked_bars(c);
  expect_sane(svg);
  EXPECT_EQ(count(svg, "rotate(-40"), 6u);
  EXPECT_NE(svg.find("\xE2\x80\xA6"), std::string::npos);                            // cut with an ellipsis
  EXPECT_NE(svg.find("<title>" + c.categories[0] + "</title>"), std::string::npos);  // full name on hover
}

TEST(PlotStackedBars, DegenerateInput) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  StackedBarChart c;
  c.title = "bad & <data>";
  c.y = {"ms", true};  // log is not used for stacks, with a note
  c.categories = {"a", "b", "c"};
  c.segments.push_back(BarSegment{"x", {1, nan, -2}});
  c.segments.push_back(BarSegment{"y", {2}});
  c.segments.push_back(BarSegment{"z", {0, 0, 0, 9}});
  std::string svg;
  ASSERT_NO_THROW(svg = svg_stacked_bars(c));
  expect_sane(svg);
  EXPECT_EQ(count(svg, "class=\"seg\""), 2u);  // x:a and y:a
  EXPECT_NE(svg.find("1 value skipped (not a finite number)."), std::string::npos);
  EXPECT_NE(svg.find("1 value below 0 drawn as 0."), std::string::npos);
  EXPECT_NE(svg.find("2 segments without one value per category"), std::string::npos);
  EXPECT_NE(svg.find("linear y axis"), std::string::npos);

  for (const StackedBarChart& d :
       {StackedBarChart{}, StackedBarChart{"t", "", {"only"}, {}, {}},
        StackedBarChart{"t", "", {}, {}, {BarSegment{"s", {1}}}},
        StackedBarChart{"t", "", {"zero"}, {}, {BarSegment{"s", {0}}}},
        StackedBarChart{"t",
                        "",
                        {"big", "bigger"},
                        {},
                        {BarSegment{"s", {1e308, 1e308}}, BarSegment{"u", {1e308, 1e308}}}}}) {
    ASSERT_NO_THROW(svg = svg_stacked_bars(d, 300, 200));
    expect_sane(svg, 300, 200);
  }
}

}  // namespace
}  // namespace lp::report
