// SVG line and stacked bar charts (see plot.h).
//
// Layout is computed from estimated text widths (no font metrics are available without a
// renderer): sans-serif text is taken as 0.6 em per character, a slight overestimate for DejaVu
// Sans, the usual fallback, so labels get a little more room than they need rather than less.
// All coordinates are written with two decimals through fmt, which is what makes the output
// byte-for-byte deterministic.
#include "reports/plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <set>

namespace lp::report {
namespace {

// Okabe & Ito's colour-blind-safe palette, reordered so the first colours are the most distinct
// as thin lines on white; yellow comes last because it is hard to see as a line.
constexpr const char* kPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                    "#E69F00", "#56B4E9", "#000000", "#F0E442"};
constexpr int kPaletteSize = 8;

constexpr double kPad = 12;
constexpr double kTitleSize = 16, kSubtitleSize = 12, kLabelSize = 13, kTickSize = 11, kLegendSize = 12,
                 kNoteSize = 10.5;
constexpr const char* kInk = "#222";
constexpr const char* kMuted = "#555";
constexpr const char* kGrid = "#e3e3e3";
constexpr const char* kGridMinor = "#f1f1f1";

// Bars are large filled areas where black drowns its neighbours: they take a mid grey instead.
constexpr const char* kBarPalette[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                       "#E69F00", "#56B4E9", "#F0E442", "#999999"};

int palette_index(int c) {
  return ((c % kPaletteSize) + kPaletteSize) % kPaletteSize;
}

// Number of code points in UTF-8 text (continuation bytes do not advance the pen).
size_t glyphs(std::string_view s) {
  size_t n = 0;
  for (unsigned char ch : s) n += (ch & 0xC0) != 0x80;
  return n;
}

double text_width(std::string_view s, double size) {
  return 0.6 * size * static_cast<double>(glyphs(s));
}

// Coordinate with fixed precision. A non-finite value cannot reach here through the public API
// (every value is checked before it is mapped); the guard keeps the no-NaN invariant local.
std::string num(double v) {
  if (!std::isfinite(v)) v = 0;
  std::string s = fmt::format("{:.2f}", v);
  if (s == "-0.00") s = "0.00";
  return s;
}

std::string strip_zeros(std::string s) {
  if (s.find('.') == std::string::npos) return s;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// Cuts a UTF-8 string to at most n code points, adding an ellipsis when it cut.
std::string truncate(std::string_view s, size_t n) {
  if (glyphs(s) <= n || n == 0) return std::string(s);
  size_t count = 0, i = 0;
  for (; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) {
      if (count == n - 1) break;
      ++count;
    }
  }
  return std::string(s.substr(0, i)) + "\xE2\x80\xA6";
}

// Greedy word wrap to lines of at most max_chars code points; a single word longer than that
// stays whole on its own line (callers check the widest line).
std::vector<std::string> wrap_words(std::string_view text, size_t max_chars) {
  std::vector<std::string> lines;
  std::string line;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && text[i] == ' ') ++i;
    size_t j = i;
    while (j < text.size() && text[j] != ' ') ++j;
    if (j == i) break;
    std::string_view word = text.substr(i, j - i);
    if (line.empty()) {
      line = word;
    } else if (glyphs(line) + 1 + glyphs(word) <= max_chars) {
      line += ' ';
      line += word;
    } else {
      lines.push_back(line);
      line = word;
    }
    i = j;
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

uint32_t fnv1a(std::string_view s, uint32_t h = 2166136261u) {
  for (unsigned char ch : s) h = (h ^ ch) * 16777619u;
  return h;
}

double pow10i(int k) {
  return std::pow(10.0, k);
}

// ---- Ticks ----

double nice_step(double range, int target) {
  double raw = range / target;
  double mag = pow10i(static_cast<int>(std::floor(std::log10(raw))));
  double norm = raw / mag;
  double m = norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10;
  return m * mag;
}

// Largest 1, 2 or 5 x 10^k at or below v (v > 0); smallest at or above.
double floor125(double v) {
  int k = static_cast<int>(std::floor(std::log10(v)));
  for (double m : {10.0, 5.0, 2.0, 1.0})
    if (m * pow10i(k) <= v * (1 + 1e-9)) return m * pow10i(k);
  return pow10i(k - 1);
}
double ceil125(double v) {
  int k = static_cast<int>(std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * pow10i(k) >= v * (1 - 1e-9)) return m * pow10i(k);
  return pow10i(k + 2);
}

bool usable_bound(const std::optional<double>& b, bool log) {
  return b && std::isfinite(*b) && (!log || *b > 0);
}

// Caller ticks inside [lo, hi] become the labelled ticks, in ascending order without repeats.
std::vector<Tick> explicit_ticks(const Axis& axis, double lo, double hi) {
  std::vector<double> v;
  for (double t : axis.ticks)
    if (std::isfinite(t) && (!axis.log || t > 0) && t >= lo - 1e-9 * std::abs(lo) &&
        t <= hi + 1e-9 * std::abs(hi))
      v.push_back(t);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::vector<Tick> out;
  for (double t : v) out.push_back({t, format_tick(t), true});
  return out;
}

AxisTicks linear_ticks(double dmin, double dmax, const Axis& axis) {
  bool fix_lo = usable_bound(axis.min, false), fix_hi = usable_bound(axis.max, false);
  if (fix_lo && fix_hi && !(*axis.min < *axis.max)) fix_lo = fix_hi = false;  // caller error: ignore
  if (!std::isfinite(dmin) || !std::isfinite(dmax) || dmin > dmax) dmin = 0, dmax = 1;
  double lo = fix_lo ? *axis.min : dmin, hi = fix_hi ? *axis.max : dmax;
  if (!fix_lo && !fix_hi && lo == hi) {
    if (lo == 0) {
      hi = 1;
    } else {
      double d = 0.1 * std::abs(lo);
      lo -= d, hi += d;
    }
  }
  if (!(lo < hi)) {  // one fixed bound on the far side of the data
    double d = lo == 0 && hi == 0 ? 1 : std::max(std::abs(lo), std::abs(hi));
    if (fix_hi)
      lo = hi - d;
    else
      hi = lo + d;
  }
  if (!std::isfinite(hi - lo) || !(lo < hi)) lo = 0, hi = 1;

  AxisTicks r;
  if (!axis.ticks.empty()) {
    std::vector<Tick> t = explicit_ticks(axis, -HUGE_VAL, HUGE_VAL);
    if (!fix_lo && !t.empty()) lo = std::min(lo, t.front().value);
    if (!fix_hi && !t.empty()) hi = std::max(hi, t.back().value);
    double pad = 0.03 * (hi - lo);
    r.lo = fix_lo ? lo : lo - pad;
    r.hi = fix_hi ? hi : hi + pad;
    r.ticks = explicit_ticks(axis, r.lo, r.hi);
    return r;
  }
  double step = nice_step(hi - lo, 5);
  if (!fix_lo) lo = std::floor(lo / step + 1e-9) * step;
  if (!fix_hi) hi = std::ceil(hi / step - 1e-9) * step;
  r.lo = lo, r.hi = hi;
  double k0 = std::ceil(lo / step - 1e-9), k1 = std::floor(hi / step + 1e-9);
  int n = static_cast<int>(std::clamp(k1 - k0, -1.0, 100.0));
  for (int i = 0; i <= n; ++i) {
    double v = (k0 + i) * step;
    if (std::abs(v) < step * 1e-9) v = 0;  // no "-0"
    r.ticks.push_back({v, format_tick(v), true});
  }
  return r;
}

AxisTicks log_ticks(double dmin, double dmax, const Axis& axis) {
  bool fix_lo = usable_bound(axis.min, true), fix_hi = usable_bound(axis.max, true);
  if (fix_lo && fix_hi && !(*axis.min < *axis.max)) fix_lo = fix_hi = false;
  if (!std::isfinite(dmin) || !std::isfinite(dmax) || !(dmin > 0) || dmin > dmax) dmin = 1, dmax = 10;
  double lo = fix_lo ? *axis.min : dmin, hi = fix_hi ? *axis.max : dmax;
  if (!fix_lo && !fix_hi && lo == hi) lo /= 1.5, hi *= 1.5;
  if (!(lo < hi)) {
    if (fix_hi)
      lo = hi / 10;
    else
      hi = lo * 10;
  }
  if (!std::isfinite(hi / lo) || !(lo < hi) || !(lo > 0)) lo = 1, hi = 10;

  AxisTicks r;
  if (!axis.ticks.empty()) {
    std::vector<Tick> t = explicit_ticks(axis, 0, HUGE_VAL);
    if (!fix_lo && !t.empty()) lo = std::min(lo, t.front().value);
    if (!fix_hi && !t.empty()) hi = std::max(hi, t.back().value);
    double pad = std::pow(hi / lo, 0.03);
    r.lo = fix_lo ? lo : lo / pad;
    r.hi = fix_hi ? hi : hi * pad;
    r.ticks = explicit_ticks(axis, r.lo, r.hi);
    return r;
  }
  // Up to three decades the bounds snap to 1-2-5 values (256..32768 is drawn over 200..50k, not
  // 100..100k); wider ranges snap to whole decades.
  bool narrow = std::log10(hi / lo) <= 3;
  if (!fix_lo) lo = narrow ? floor125(lo) : pow10i(static_cast<int>(std::floor(std::log10(lo) + 1e-9)));
  if (!fix_hi) hi = narrow ? ceil125(hi) : pow10i(static_cast<int>(std::ceil(std::log10(hi) - 1e-9)));
  r.lo = lo, r.hi = hi;

  int k0 = static_cast<int>(std::floor(std::log10(lo))) - 1;
  int k1 = static_cast<int>(std::ceil(std::log10(hi))) + 1;
  auto inside = [&](double v) { return v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9); };
  int decades = 0;
  for (int k = k0; k <= k1; ++k) decades += inside(pow10i(k));
  double span = std::log10(hi / lo);
  bool minors = span <= 12;  // minor gridlines only while they stay apart
  for (int k = k0; k <= k1; ++k) {
    for (int m = 1; m <= 9; ++m) {
      double v = m * pow10i(k);
      if (!inside(v) || (m > 1 && !minors)) continue;
      // Labels: decades when four or more are in range, else 1-2-5, and every multiple when the
      // range is under a decade, so a short range never ends up with one or no labelled tick
      // (labels that would collide are thinned when drawn, minor ones first).
      bool labelled = m == 1 || (decades < 4 && span >= 1 && (m == 2 || m == 5)) || (decades < 2 && span < 1);
      r.ticks.push_back({v, labelled ? format_tick(v) : std::string(), m == 1});
    }
  }
  return r;
}

// ---- Text and scales ----

struct Scale {
  double lo, hi;
  bool log;
  double p0, p1;  // pixel positions of lo and hi
  double t(double v) const { return log ? std::log10(v) : v; }
  double operator()(double v) const { return p0 + (t(v) - t(lo)) / (t(hi) - t(lo)) * (p1 - p0); }
  bool contains(double v) const {
    double eps = 1e-9 * (std::abs(lo) + std::abs(hi));
    return v >= lo - eps && v <= hi + eps;
  }
};

class Svg {
 public:
  Svg(int w, int h, std::string_view title) {
    out_ += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    out_ += fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
        "font-family=\"sans-serif\">\n",
        w, h);
    if (!title.empty()) out_ += fmt::format("<title>{}</title>\n", xml_escape(title));
    out_ += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", w, h);
  }
  void raw(std::string_view s) { out_ += s; }
  // attrs: extra attributes, already formatted (` text-anchor="end"`).
  void text(double x, double y, std::string_view s, double size, std::string_view attrs = "") {
    out_ += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"{}\"{}>{}</text>\n", num(x), num(y), num(size),
                        attrs, xml_escape(s));
  }
  void line(double x1, double y1, double x2, double y2, std::string_view stroke, double width,
            std::string_view attrs = "") {
    out_ +=
        fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"{}\"{}/>\n",
                    num(x1), num(y1), num(x2), num(y2), stroke, num(width), attrs);
  }
  void rect(double x, double y, double w, double h, std::string_view fill, std::string_view attrs = "") {
    out_ += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"{}/>\n", num(x),
                        num(y), num(std::max(0.0, w)), num(std::max(0.0, h)), fill, attrs);
  }
  std::string finish() {
    out_ += "</svg>\n";
    return std::move(out_);
  }

 private:
  std::string out_;
};

// Title and subtitle, wrapped to the width; returns the y below them.
double draw_heading(Svg& svg, const std::string& title, const std::string& subtitle, int width) {
  double y = kPad;
  auto per_line = [&](double size) {
    return static_cast<size_t>(std::max(8.0, (width - 2 * kPad) / (0.6 * size)));
  };
  for (const auto& l : wrap_words(title, per_line(kTitleSize))) {
    y += kTitleSize + 3;
    svg.text(kPad, y, l, kTitleSize, fmt::format(" font-weight=\"bold\" fill=\"{}\"", kInk));
  }
  for (const auto& l : wrap_words(subtitle, per_line(kSubtitleSize))) {
    y += kSubtitleSize + 4;
    svg.text(kPad, y, l, kSubtitleSize, fmt::format(" fill=\"{}\"", kMuted));
  }
  return y + (y > kPad ? 12 : 4);
}

// Notes wrapped to the width; lines are returned so the layout can reserve room first.
std::vector<std::string> note_lines(const std::vector<std::string>& notes, int width) {
  std::vector<std::string> lines;
  size_t per = static_cast<size_t>(std::max(10.0, (width - 2 * kPad) / (0.6 * kNoteSize)));
  for (const auto& n : notes)
    for (auto& l : wrap_words(n, per)) lines.push_back(std::move(l));
  return lines;
}

void draw_notes(Svg& svg, const std::vector<std::string>& lines, int height) {
  double y = height - kPad - (lines.size() - 1.0) * (kNoteSize + 3);
  for (const auto& l : lines) {
    svg.text(kPad, y, l, kNoteSize, fmt::format(" font-style=\"italic\" fill=\"{}\"", kMuted));
    y += kNoteSize + 3;
  }
}

// Which tick labels to show so that none overlap: all, else the major ones, else every k-th major.
// extent(i) is the label's size along the axis, pos(i) its centre in pixels.
std::vector<bool> visible_labels(const std::vector<Tick>& ticks, const std::vector<double>& pos,
                                 const std::vector<double>& extent) {
  const double gap = 6;
  auto fits = [&](const std::vector<bool>& show) {
    double last_end = -HUGE_VAL;
    // Positions may run either way (y grows downwards); sort the shown ones by position.
    std::vector<std::pair<double, double>> iv;
    for (size_t i = 0; i < ticks.size(); ++i)
      if (show[i]) iv.push_back({pos[i] - extent[i] / 2, pos[i] + extent[i] / 2});
    std::sort(iv.begin(), iv.end());
    for (auto [a, b] : iv) {
      if (a < last_end + gap) return false;
      last_end = b;
    }
    return true;
  };
  std::vector<bool> show(ticks.size());
  for (size_t i = 0; i < ticks.size(); ++i) show[i] = !ticks[i].label.empty();
  if (fits(show)) return show;
  for (size_t i = 0; i < ticks.size(); ++i) show[i] = show[i] && ticks[i].major;
  if (fits(show)) return show;
  std::vector<size_t> majors;
  for (size_t i = 0; i < ticks.size(); ++i)
    if (show[i]) majors.push_back(i);
  for (size_t stride = 2; stride <= std::max<size_t>(2, majors.size()); ++stride) {
    std::fill(show.begin(), show.end(), false);
    for (size_t j = 0; j < majors.size(); j += stride) show[majors[j]] = true;
    if (fits(show)) return show;
  }
  return show;
}

// Legend entries laid out to the right of the plot (one column) or below it (rows that wrap).
struct LegendItem {
  std::string name;
  std::string color;
  enum Kind { kLine, kSwatch } kind = kLine;
  bool dashed = false, hollow = false, line = true, marker = true;
  int shape = 0;
  std::string dash = "6 4";
};

constexpr double kSampleW = 28;  // line sample or swatch, then a gap, then the name
constexpr double kRowH = 18;

double item_width(const LegendItem& it) {
  return kSampleW + 6 + text_width(it.name, kLegendSize);
}

struct LegendLayout {
  bool right = true;
  double width = 0;                       // right: column width
  std::vector<std::vector<size_t>> rows;  // below: items per row
  double height() const { return rows.size() * kRowH; }
};

LegendLayout plan_legend(const std::vector<LegendItem>& items, int width, double max_plot_h) {
  LegendLayout L;
  if (items.empty()) return L;
  double w = 0;
  for (const auto& it : items) w = std::max(w, item_width(it));
  if (w <= 0.3 * width && items.size() * kRowH <= max_plot_h) {
    L.right = true;
    L.width = w;
    for (size_t i = 0; i < items.size(); ++i) L.rows.push_back({i});
    return L;
  }
  L.right = false;
  double avail = width - 2 * kPad, x = 0;
  L.rows.emplace_back();
  for (size_t i = 0; i < items.size(); ++i) {
    double iw = item_width(items[i]) + 18;
    if (!L.rows.back().empty() && x + iw > avail) L.rows.emplace_back(), x = 0;
    L.rows.back().push_back(i);
    x += iw;
  }
  return L;
}

std::string marker_svg(double x, double y, int shape, std::string_view color, bool hollow,
                       std::string_view cls) {
  std::string fill = hollow ? "#ffffff" : std::string(color);
  std::string paint = fmt::format("fill=\"{}\" stroke=\"{}\" stroke-width=\"1.5\"", fill, color);
  const double r = 3.6;
  switch (shape % 4) {
    case 1:
      return fmt::format("<rect class=\"{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" {}/>\n", cls,
                         num(x - r * 0.9), num(y - r * 0.9), num(1.8 * r), num(1.8 * r), paint);
    case 2:
      return fmt::format("<path class=\"{}\" d=\"M{} {}L{} {}L{} {}Z\" {}/>\n", cls, num(x), num(y - 1.2 * r),
                         num(x + 1.1 * r), num(y + 0.8 * r), num(x - 1.1 * r), num(y + 0.8 * r), paint);
    case 3:
      return fmt::format("<path class=\"{}\" d=\"M{} {}L{} {}L{} {}L{} {}Z\" {}/>\n", cls, num(x),
                         num(y - 1.25 * r), num(x + 1.25 * r), num(y), num(x), num(y + 1.25 * r),
                         num(x - 1.25 * r), num(y), paint);
    default:
      return fmt::format("<circle class=\"{}\" cx=\"{}\" cy=\"{}\" r=\"{}\" {}/>\n", cls, num(x), num(y),
                         num(r), paint);
  }
}

void draw_legend(Svg& svg, const std::vector<LegendItem>& items, const LegendLayout& L, double x0,
                 double y0) {
  svg.raw("<g class=\"legend\">\n");
  double y = y0;
  for (const auto& row : L.rows) {
    double x = x0;
    double cy = y + kRowH / 2;
    for (size_t i : row) {
      const LegendItem& it = items[i];
      if (it.kind == LegendItem::kSwatch) {
        svg.rect(x + kSampleW - 14, cy - 6, 12, 12, it.color);
      } else {
        if (it.line)
          svg.line(x, cy, x + kSampleW, cy, it.color, 2,
                   it.dashed ? fmt::format(" stroke-dasharray=\"{}\"", it.dash) : std::string());
        if (it.marker) svg.raw(marker_svg(x + kSampleW / 2, cy, it.shape, it.color, it.hollow, "lg"));
      }
      svg.text(x + kSampleW + 6, cy + 0.35 * kLegendSize, it.name, kLegendSize,
               fmt::format(" fill=\"{}\"", kInk));
      x += item_width(it) + 18;
    }
    y += kRowH;
  }
  svg.raw("</g>\n");
}

// The legend (right of the plot at (plot_right, plot_top), or in rows above the notes) and the
// notes under the chart, then the closing tag: the same for every chart kind.
std::string finish_chart(Svg& svg, const std::vector<LegendItem>& items, const LegendLayout& L,
                         double plot_right, double plot_top, const std::vector<std::string>& notes,
                         int height) {
  if (!items.empty()) {
    if (L.right)
      draw_legend(svg, items, L, plot_right + 18, plot_top);
    else
      draw_legend(svg, items, L, kPad,
                  height - kPad - notes.size() * (kNoteSize + 3) - (notes.empty() ? 0 : 6) - L.height());
  }
  if (!notes.empty()) draw_notes(svg, notes, height);
  return svg.finish();
}

std::string plural(size_t n, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

// Gridlines, ticks and tick labels of a horizontal (x) axis along the bottom of the plot.
void draw_x_axis(Svg& svg, const AxisTicks& T, const Scale& sx, double top, double bottom) {
  std::vector<double> pos, ext;
  for (const auto& t : T.ticks) pos.push_back(sx(t.value)), ext.push_back(text_width(t.label, kTickSize));
  std::vector<bool> show = visible_labels(T.ticks, pos, ext);
  for (size_t i = 0; i < T.ticks.size(); ++i) {
    bool strong = T.ticks[i].major || show[i];
    svg.line(pos[i], top, pos[i], bottom, strong ? kGrid : kGridMinor, 1);
    if (show[i]) {
      svg.line(pos[i], bottom, pos[i], bottom + 4, "#333", 1);
      svg.text(pos[i], bottom + 6 + kTickSize, T.ticks[i].label, kTickSize,
               fmt::format(" text-anchor=\"middle\" fill=\"{}\"", kInk));
    }
  }
}

// Same for the vertical (y) axis on the left; returns nothing, labels are right-aligned.
void draw_y_axis(Svg& svg, const AxisTicks& T, const Scale& sy, double left, double right) {
  std::vector<double> pos, ext;
  for (const auto& t : T.ticks) pos.push_back(sy(t.value)), ext.push_back(kTickSize);
  std::vector<bool> show = visible_labels(T.ticks, pos, ext);
  for (size_t i = 0; i < T.ticks.size(); ++i) {
    bool strong = T.ticks[i].major || show[i];
    svg.line(left, pos[i], right, pos[i], strong ? kGrid : kGridMinor, 1);
    if (show[i]) {
      svg.line(left - 4, pos[i], left, pos[i], "#333", 1);
      svg.text(left - 7, pos[i] + 0.35 * kTickSize, T.ticks[i].label, kTickSize,
               fmt::format(" text-anchor=\"end\" fill=\"{}\"", kInk));
    }
  }
}

double widest_label(const AxisTicks& T) {
  double w = 0;
  for (const auto& t : T.ticks) w = std::max(w, text_width(t.label, kTickSize));
  return w;
}

// The rotated label sits left of the tick labels (its glyphs extend left of x by the ascent).
void draw_y_label(Svg& svg, const std::string& label, const AxisTicks& T, double left, double top,
                  double bottom) {
  if (label.empty()) return;
  double x = left - widest_label(T) - 18;
  double cy = (top + bottom) / 2;
  svg.text(x, cy, label, kLabelSize,
           fmt::format(" text-anchor=\"middle\" fill=\"{}\" transform=\"rotate(-90 {} {})\"", kInk, num(x),
                       num(cy)));
}

}  // namespace

std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        // Control characters other than tab/newline are not allowed in XML 1.0 at all.
        if (static_cast<unsigned char>(ch) < 0x20 && ch != '\t' && ch != '\n' && ch != '\r')
          out += ' ';
        else
          out += ch;
    }
  }
  return out;
}

std::string format_tick(double v) {
  if (!std::isfinite(v)) return "";
  double a = std::abs(v);
  if (a < 1e-12) return "0";
  std::string sign = v < 0 ? "-" : "";
  struct Tier {
    double base;
    const char* suffix;
  };
  for (Tier t : {Tier{1e12, "T"}, Tier{1e9, "G"}, Tier{1e6, "M"}, Tier{1e3, "k"}}) {
    if (a < t.base * (1 - 1e-9)) continue;
    double s100 = a / t.base * 100;
    // Only when exact with two decimals: 1.5k, 1.05k; 1024 stays 1024, not a rounded "1.02k".
    if (std::abs(s100 - std::round(s100)) <= 1e-6 * s100)
      return sign + strip_zeros(fmt::format("{:.2f}", a / t.base)) + t.suffix;
    break;
  }
  if (a >= 1e3) {
    if (a < 1e7 && std::abs(a - std::round(a)) <= 1e-6 * a) return sign + fmt::format("{:.0f}", a);
    return sign + fmt::format("{:.3g}", a);
  }
  if (a >= 1e-4) return sign + fmt::format("{:.6g}", a);
  return sign + fmt::format("{:.2g}", a);
}

AxisTicks axis_ticks(double data_min, double data_max, const Axis& axis) {
  return axis.log ? log_ticks(data_min, data_max, axis) : linear_ticks(data_min, data_max, axis);
}

// ---- Line chart ----

std::string svg_line_chart(const LineChart& c, int width, int height) {
  width = std::clamp(width, 240, 8000);
  height = std::clamp(height, 180, 8000);
  std::vector<std::string> notes;

  // Points kept per series (NaN marks a gap that breaks the line), and what was dropped.
  struct Kept {
    std::vector<double> x, y;
  };
  std::vector<Kept> kept(c.series.size());
  size_t nonfinite = 0, nonpos_x = 0, nonpos_y = 0, mismatched = 0;
  double xmin = HUGE_VAL, xmax = -HUGE_VAL, ymin = HUGE_VAL, ymax = -HUGE_VAL;
  for (size_t s = 0; s < c.series.size(); ++s) {
    const Series& se = c.series[s];
    size_t n = std::min(se.x.size(), se.y.size());
    mismatched += se.x.size() != se.y.size();
    for (size_t i = 0; i < n; ++i) {
      double x = se.x[i], y = se.y[i];
      size_t* dropped = !std::isfinite(x) || !std::isfinite(y) ? &nonfinite
                        : c.x.log && !(x > 0)                  ? &nonpos_x
                        : c.y.log && !(y > 0)                  ? &nonpos_y
                                                               : nullptr;
      bool ok = !dropped;
      if (dropped) ++*dropped, x = y = NAN;
      kept[s].x.push_back(x);
      kept[s].y.push_back(y);
      if (ok) {
        xmin = std::min(xmin, x), xmax = std::max(xmax, x);
        ymin = std::min(ymin, y), ymax = std::max(ymax, y);
      }
    }
  }
  bool any = xmin <= xmax;
  if (!any) notes.push_back("No data to plot.");
  if (nonfinite)
    notes.push_back(fmt::format("{} skipped (not a finite number).", plural(nonfinite, "point", "points")));
  if (nonpos_x)
    notes.push_back(fmt::format("{} with x <= 0 dropped (log x axis).", plural(nonpos_x, "point", "points")));
  if (nonpos_y)
    notes.push_back(fmt::format("{} with y <= 0 dropped (log y axis).", plural(nonpos_y, "point", "points")));
  if (mismatched)
    notes.push_back(fmt::format("{} with different x and y lengths: extra values ignored.",
                                plural(mismatched, "series", "series")));
  for (const Axis* a : {&c.x, &c.y}) {
    const char* which = a == &c.x ? "x" : "y";
    if ((a->min && !usable_bound(a->min, a->log)) || (a->max && !usable_bound(a->max, a->log)))
      notes.push_back(fmt::format("Unusable {} axis bound ignored.", which));
    else if (a->min && a->max && !(*a->min < *a->max))
      notes.push_back(fmt::format("{} axis bounds ignored (min >= max).", which));
  }
  if (!any) xmin = xmax = ymin = ymax = NAN;

  // y = x compares like with like: give both axes the same range when both are free.
  if (c.diagonal && any && c.x.log == c.y.log && !c.x.min && !c.x.max && !c.y.min && !c.y.max &&
      c.x.ticks.empty() && c.y.ticks.empty()) {
    xmin = ymin = std::min(xmin, ymin);
    xmax = ymax = std::max(xmax, ymax);
  }
  AxisTicks tx = axis_ticks(xmin, xmax, c.x), ty = axis_ticks(ymin, ymax, c.y);
  {
    Scale sx{tx.lo, tx.hi, c.x.log, 0, 1}, sy{ty.lo, ty.hi, c.y.log, 0, 1};
    size_t outside = 0;
    for (const auto& k : kept)
      for (size_t i = 0; i < k.x.size(); ++i)
        outside += !std::isnan(k.x[i]) && (!sx.contains(k.x[i]) || !sy.contains(k.y[i]));
    if (outside)
      notes.push_back(
          fmt::format("{} outside the axis range not shown.", plural(outside, "point", "points")));
  }

  // Colours: explicit indices are kept; -1 takes the next index no explicit series uses.
  std::set<int> taken;
  for (const auto& s : c.series)
    if (s.color >= 0) taken.insert(palette_index(s.color));
  std::vector<int> color(c.series.size());
  int next = 0;
  for (size_t s = 0; s < c.series.size(); ++s) {
    if (c.series[s].color >= 0) {
      color[s] = palette_index(c.series[s].color);
      continue;
    }
    while (taken.size() < static_cast<size_t>(kPaletteSize) && taken.count(palette_index(next))) ++next;
    color[s] = palette_index(next++);
  }

  std::vector<LegendItem> items;
  for (size_t s = 0; s < c.series.size(); ++s) {
    const Series& se = c.series[s];
    LegendItem it;
    it.name = se.name;
    it.color = kPalette[color[s]];
    it.dashed = se.dashed;
    it.hollow = se.dashed;
    it.line = se.lines;
    it.marker = se.points;
    it.shape = color[s];
    items.push_back(it);
  }
  if (c.diagonal) {
    LegendItem it;
    it.name = "y = x";
    it.color = "#888888";
    it.dashed = true;
    it.dash = "3 3";
    it.marker = false;
    items.push_back(it);
  }

  Svg svg(width, height, c.title);
  double top = draw_heading(svg, c.title, c.subtitle, width);
  std::vector<std::string> nl = note_lines(notes, width);
  LegendLayout L = plan_legend(items, width, height - top - 90);

  double bottom_space = kPad + nl.size() * (kNoteSize + 3) + (nl.empty() ? 0 : 6);
  if (!L.right) bottom_space += L.height() + 8;
  double x_label_y = height - bottom_space - 2;  // baseline of the x axis label
  if (!c.x.label.empty()) bottom_space += kLabelSize + 10;
  bottom_space += kTickSize + 12;
  double left = kPad + (c.y.label.empty() ? 0 : kLabelSize + 10) + widest_label(ty) + 10;
  double right_space = kPad + (L.right && !items.empty() ? L.width + 18 : 0);
  // The last x tick label is centred on the right edge: leave it half its width.
  if (!tx.ticks.empty())
    right_space = std::max(right_space, kPad + text_width(tx.ticks.back().label, kTickSize) / 2);
  double pl = left, pr = std::max(left + 40, width - right_space);
  double pt = top, pb = std::max(top + 40, height - bottom_space);
  // With y = x over equal ranges a square plot puts the diagonal at 45 degrees, so the distance
  // from it reads the same along both axes.
  if (c.diagonal && c.x.log == c.y.log && tx.lo == ty.lo && tx.hi == ty.hi) pr = std::min(pr, pl + (pb - pt));

  Scale sx{tx.lo, tx.hi, c.x.log, pl, pr}, sy{ty.lo, ty.hi, c.y.log, pb, pt};
  draw_x_axis(svg, tx, sx, pt, pb);
  draw_y_axis(svg, ty, sy, pl, pr);
  svg.line(pl, pb, pr, pb, "#333", 1);
  svg.line(pl, pt, pl, pb, "#333", 1);
  if (!c.x.label.empty())
    svg.text((pl + pr) / 2, x_label_y, c.x.label, kLabelSize,
             fmt::format(" text-anchor=\"middle\" fill=\"{}\"", kInk));
  draw_y_label(svg, c.y.label, ty, pl, pt, pb);

  // Lines are clipped to the plot (a little beyond it so a line along the border keeps its width).
  std::string clip_id = fmt::format(
      "lp-clip-{:08x}",
      fnv1a(fmt::format("{}|{}|{}|{}", c.title, c.subtitle, c.series.size(), width * 10007 + height)));
  svg.raw(fmt::format(
      "<defs><clipPath id=\"{}\"><rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/></clipPath></defs>\n",
      clip_id, num(pl - 3), num(pt - 3), num(pr - pl + 6), num(pb - pt + 6)));

  if (c.diagonal) {
    double lo = std::max(tx.lo, ty.lo), hi = std::min(tx.hi, ty.hi);
    if (lo < hi) {
      // Straight in pixels when both axes share a scale type; a sampled curve otherwise (then one
      // axis is log, so lo > 0 and geometric steps are even on it).
      int n = c.x.log == c.y.log ? 1 : 64;
      std::string d;
      for (int i = 0; i <= n; ++i) {
        double f = static_cast<double>(i) / n;
        double v = c.x.log || c.y.log ? lo * std::pow(hi / lo, f) : lo + (hi - lo) * f;
        d += fmt::format("{}{} {}", i ? "L" : "M", num(sx(v)), num(sy(v)));
      }
      svg.raw(
          fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"#888888\" stroke-width=\"1.2\" "
                      "stroke-dasharray=\"3 3\" clip-path=\"url(#{})\"/>\n",
                      d, clip_id));
    }
  }

  for (size_t s = 0; s < c.series.size(); ++s) {
    const Series& se = c.series[s];
    const char* col = kPalette[color[s]];
    const Kept& k = kept[s];
    svg.raw(fmt::format("<g class=\"series\" data-name=\"{}\">\n", xml_escape(se.name)));
    if (se.lines) {
      // Gaps (dropped points) break the line; a lone point between gaps gets a dot if no markers.
      std::string d;
      size_t run = 0;
      std::vector<size_t> lone;
      for (size_t i = 0; i <= k.x.size(); ++i) {
        bool ok = i < k.x.size() && !std::isnan(k.x[i]);
        if (ok) {
          d += fmt::format("{}{} {}", run ? "L" : "M", num(sx(k.x[i])), num(sy(k.y[i])));
          ++run;
        } else {
          if (run == 1) lone.push_back(i - 1);
          run = 0;
        }
      }
      if (!d.empty())
        svg.raw(fmt::format(
            "<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" stroke-linejoin=\"round\"{} "
            "clip-path=\"url(#{})\"/>\n",
            d, col, se.dashed ? " stroke-dasharray=\"6 4\"" : "", clip_id));
      if (!se.points)
        for (size_t i : lone)
          if (sx.contains(k.x[i]) && sy.contains(k.y[i]))
            svg.raw(fmt::format("<circle class=\"dot\" cx=\"{}\" cy=\"{}\" r=\"2\" fill=\"{}\"/>\n",
                                num(sx(k.x[i])), num(sy(k.y[i])), col));
    }
    if (se.points) {
      for (size_t i = 0; i < k.x.size(); ++i) {
        if (std::isnan(k.x[i])) continue;
        if (!sx.contains(k.x[i]) || !sy.contains(k.y[i])) continue;  // counted in the notes
        svg.raw(marker_svg(sx(k.x[i]), sy(k.y[i]), color[s], col, se.dashed, "mk"));
      }
    }
    svg.raw("</g>\n");
  }

  return finish_chart(svg, items, L, pr, pt, nl, height);
}

// ---- Stacked bars ----

namespace {
// Value label with three significant digits: 1.23k, 45.6, 0.0123.
std::string format_value(double v) {
  if (!std::isfinite(v)) return "";
  double a = std::abs(v);
  if (a < 1e-12) return "0";
  double r = std::strtod(fmt::format("{:.2e}", a).c_str(), nullptr);
  std::string sign = v < 0 ? "-" : "";
  for (auto [base, suffix] :
       {std::pair{1e12, "T"}, std::pair{1e9, "G"}, std::pair{1e6, "M"}, std::pair{1e3, "k"}})
    if (r >= base) return sign + fmt::format("{:.3g}", r / base) + suffix;
  return sign + fmt::format("{:.3g}", r);
}
}  // namespace

std::string svg_stacked_bars(const StackedBarChart& c, int width, int height) {
  width = std::clamp(width, 240, 8000);
  height = std::clamp(height, 180, 8000);
  std::vector<std::string> notes;
  const size_t n = c.categories.size();

  // Stacked heights from clean values: non-finite skipped, negatives drawn as 0.
  std::vector<std::vector<double>> val(c.segments.size(), std::vector<double>(n, 0.0));
  std::vector<double> total(n, 0.0);
  size_t nonfinite = 0, negative = 0, short_rows = 0;
  for (size_t s = 0; s < c.segments.size(); ++s) {
    const auto& v = c.segments[s].values;
    short_rows += v.size() != n;
    for (size_t i = 0; i < std::min(n, v.size()); ++i) {
      if (!std::isfinite(v[i])) {
        ++nonfinite;
        continue;
      }
      if (v[i] < 0) {
        ++negative;
        continue;
      }
      val[s][i] = v[i];
      total[i] += v[i];
    }
  }
  double tmax = 0;
  for (double t : total) tmax = std::max(tmax, t);
  if (n == 0 || c.segments.empty()) notes.push_back("No data to plot.");
  if (nonfinite)
    notes.push_back(fmt::format("{} skipped (not a finite number).", plural(nonfinite, "value", "values")));
  if (negative) notes.push_back(fmt::format("{} below 0 drawn as 0.", plural(negative, "value", "values")));
  if (short_rows)
    notes.push_back(fmt::format("{} without one value per category: missing values count as 0.",
                                plural(short_rows, "segment", "segments")));
  if (c.y.log) notes.push_back("Stacked bars use a linear y axis (a log scale would distort the stacks).");
  if (!std::isfinite(tmax)) tmax = 0;  // sum of huge finite values

  Axis ya = c.y;
  ya.log = false;
  AxisTicks ty = axis_ticks(0, tmax, ya);

  std::vector<LegendItem> items;
  // Listed top segment first so the legend reads in the same order as the stack.
  for (size_t s = c.segments.size(); s-- > 0;) {
    LegendItem it;
    it.name = c.segments[s].name;
    it.color = kBarPalette[palette_index(static_cast<int>(s))];
    it.kind = LegendItem::kSwatch;
    items.push_back(it);
  }

  Svg svg(width, height, c.title);
  double top = draw_heading(svg, c.title, c.subtitle, width);
  LegendLayout L = plan_legend(items, width, height - top - 90);
  std::vector<std::string> nl = note_lines(notes, width);

  double left = kPad + (c.y.label.empty() ? 0 : kLabelSize + 10) + widest_label(ty) + 10;
  double right_space = kPad + (L.right && !items.empty() ? L.width + 18 : 0);
  double pr = width - right_space;
  double band = n ? (pr - left) / n : pr - left;

  // Category labels: on one line if they fit the band, else wrapped on spaces (at most 3 lines),
  // else rotated 40 degrees and cut to a length that keeps the plot at least half the height.
  const double kCat = kTickSize;
  size_t per_line = static_cast<size_t>(std::max(1.0, (band - 6) / (0.6 * kCat)));
  std::vector<std::vector<std::string>> wrapped(n);
  bool fit = true;
  size_t max_lines = 1;
  for (size_t i = 0; i < n; ++i) {
    wrapped[i] = wrap_words(c.categories[i], per_line);
    if (wrapped[i].empty()) wrapped[i].push_back("");
    max_lines = std::max(max_lines, wrapped[i].size());
    for (const auto& l : wrapped[i]) fit = fit && glyphs(l) <= per_line;
  }
  fit = fit && max_lines <= 3;
  const double angle = 40, ca = std::cos(angle * std::numbers::pi / 180),
               sa = std::sin(angle * std::numbers::pi / 180);
  std::vector<std::string> rotated(n);
  double label_h = max_lines * (kCat + 3);
  if (!fit) {
    double max_h = 0.3 * height;
    size_t max_chars = static_cast<size_t>(std::max(4.0, (max_h / sa) / (0.6 * kCat)));
    double w = 0;
    for (size_t i = 0; i < n; ++i) {
      rotated[i] = truncate(c.categories[i], max_chars);
      w = std::max(w, text_width(rotated[i], kCat));
    }
    label_h = w * sa + kCat;
    // The first label reaches left of its bar; widen the left margin when it would leave the image.
    if (n) left = std::max(left, kPad + text_width(rotated[0], kCat) * ca - band / 2);
    band = n ? (pr - left) / n : pr - left;
  }

  double bottom_space = kPad + nl.size() * (kNoteSize + 3) + (nl.empty() ? 0 : 6);
  if (!L.right) bottom_space += L.height() + 8;
  bottom_space += 6 + label_h + 8;
  double pl = left, pt = top + 8;  // room for the totals above the tallest bar
  double pb = std::max(pt + 40, height - bottom_space);
  Scale sy{ty.lo, ty.hi, false, pb, pt};

  draw_y_axis(svg, ty, sy, pl, pr);
  svg.line(pl, pt, pl, pb, "#333", 1);
  draw_y_label(svg, c.y.label, ty, pl, pt, pb);

  double bar_w = std::min(band * 0.62, 90.0);
  double base = sy(std::clamp(0.0, ty.lo, ty.hi));
  for (size_t i = 0; i < n; ++i) {
    double cx = pl + band * (i + 0.5);
    double acc = 0;
    svg.raw(fmt::format("<g class=\"bar\" data-category=\"{}\">\n", xml_escape(c.categories[i])));
    for (size_t s = 0; s < c.segments.size(); ++s) {
      double v = val[s][i];
      if (v <= 0) continue;
      double y0 = sy(std::clamp(acc, ty.lo, ty.hi)), y1 = sy(std::clamp(acc + v, ty.lo, ty.hi));
      acc += v;
      if (y0 - y1 < 0.05) continue;
      svg.raw(fmt::format(
          "<rect class=\"seg\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"#ffffff\" "
          "stroke-width=\"0.6\"><title>{}: {}</title></rect>\n",
          num(cx - bar_w / 2), num(y1), num(bar_w), num(y0 - y1),
          kBarPalette[palette_index(static_cast<int>(s))], xml_escape(c.segments[s].name),
          xml_escape(format_value(v))));
    }
    svg.raw("</g>\n");
    std::string tl = format_value(total[i]);
    if (total[i] > 0 && !tl.empty() && text_width(tl, 10) <= band - 2)
      svg.text(cx, sy(std::clamp(total[i], ty.lo, ty.hi)) - 4, tl, 10,
               fmt::format(" text-anchor=\"middle\" fill=\"{}\"", kMuted));
    if (fit) {
      double y = pb + 6 + kCat;
      for (const auto& l : wrapped[i]) {
        svg.text(cx, y, l, kCat, fmt::format(" text-anchor=\"middle\" fill=\"{}\"", kInk));
        y += kCat + 3;
      }
    } else {
      double y = pb + 6 + kCat * 0.8;
      std::string full =
          rotated[i] == c.categories[i] ? "" : fmt::format("<title>{}</title>", xml_escape(c.categories[i]));
      svg.raw(
          fmt::format("<text x=\"{0}\" y=\"{1}\" font-size=\"{2}\" text-anchor=\"end\" fill=\"{3}\" "
                      "transform=\"rotate(-{4} {0} {1})\">{5}{6}</text>\n",
                      num(cx), num(y), num(kCat), kInk, num(angle), xml_escape(rotated[i]), full));
    }
  }
  svg.line(pl, base, pr, base, "#333", 1);

  return finish_chart(svg, items, L, pr, pt, nl, height);
}

}  // namespace lp::report
