#include "sim/serving_workload.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/random/gamma_distribution.hpp>
#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "admission/request_log.h"
#include "model/csv_reader.h"  // fast-cpp-csv-parser
#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"

namespace lp::sim {

namespace {

constexpr int64_t kMaxRequests = int64_t(1) << 24;  // a file or workload: 16.7M requests at most
constexpr int64_t kMaxTokens = int64_t(1) << 24;

// The whole field, spaces (and a line's \r) around it aside, as a T (a finite one for double);
// nullopt when it is not one.
template <class T>
std::optional<T> parse_field(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\r')) s.remove_suffix(1);
  T v{};
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(v)) return std::nullopt;
  return v;
}
std::optional<int64_t> whole(std::string_view s) {
  return parse_field<int64_t>(s);
}
std::optional<double> number(std::string_view s) {
  return parse_field<double>(s);
}
void check_tokens(int64_t v, const std::string& where, const char* what) {
  if (v < 1 || v > kMaxTokens) fail("{}: {} {} is not in [1, {}]", where, what, v, kMaxTokens);
}

// Requests of a `serve --log-requests` file, sorted by arrival; those that ended in an error left
// out.
std::vector<ServingRequest> read_log(const std::string& path) {
  std::vector<ServingRequest> out;
  for (const LoggedRequest& r : read_request_log(path)) {
    if (r.error) continue;
    const std::string where = fmt::format("{}:{}", path, r.line);
    check_tokens(r.prompt_tokens, where, "prompt_tokens");
    // A request cancelled before its first token generated nothing; it still arrived and was
    // prefilled, so it counts with one output token.
    const int64_t output = std::max<int64_t>(r.output_tokens, 1);
    check_tokens(output, where, "output_tokens");
    ServingRequest q{r.arrival_s, r.prompt_tokens, output};
    q.cached_tokens = r.cached_tokens;  // the hit the server measured, replayed as it was
    out.push_back(q);
  }
  return out;
}

// A CSV of requests (fast-cpp-csv-parser, as calibrate/'s importers read theirs).
std::vector<ServingRequest> read_csv(const std::string& path) {
  const std::string text = read_input_file(path, "arrival file", input_cap::kTrace);
  std::vector<ServingRequest> out;
  try {
    io::CSVReader<3, io::trim_chars<' ', '\t', '\r'>, io::double_quote_escape<',', '"'>,
                  io::throw_on_overflow, io::single_line_comment<'#'>>
        in(path, text.data(), text.data() + text.size());
    in.read_header(io::ignore_extra_column, "arrival_s", "prompt_tokens", "output_tokens");
    std::string a, pt, ot;
    while (in.read_row(a, pt, ot)) {
      const std::string where = fmt::format("{}:{}", path, in.get_file_line());
      const auto at = number(a);
      if (!at) fail("{}: arrival_s '{}' is not a number", where, escape_text(a));
      if (*at < 0) fail("{}: arrival_s {} is negative", where, *at);
      if (!out.empty() && *at < out.back().arrival_s)
        fail("{}: arrival_s {} is before the previous row's {} (arrival times must be sorted)", where, *at,
             out.back().arrival_s);
      ServingRequest r{*at};
      const auto p = whole(pt), o = whole(ot);
      if (!p) fail("{}: prompt_tokens '{}' is not a whole number", where, escape_text(pt));
      if (!o) fail("{}: output_tokens '{}' is not a whole number", where, escape_text(ot));
      check_tokens(*p, where, "prompt_tokens");
      check_tokens(*o, where, "output_tokens");
      r.prompt_tokens = *p, r.output_tokens = *o;
      if (int64_t(out.size()) >= kMaxRequests) fail("{}: more than {} requests", path, kMaxRequests);
      out.push_back(r);
    }
  } catch (const io::error::base& e) {
    fail("{}: {}", path, e.what());
  }
  return out;
}

bool looks_like_log(const std::string& path) {
  InputLines in(path, "request file", input_cap::kTrace);
  std::string line;
  while (in.next(line)) {
    const size_t i = line.find_first_not_of(" \t\r");
    if (i != std::string::npos) return line[i] == '{';
  }
  return false;
}

}  // namespace

// ---- workloads ----

LengthDist LengthDist::parse(const std::string& s, const std::string& what, const std::string& column) {
  LengthDist d;
  if (s.rfind("file:", 0) == 0) {
    const std::string path = s.substr(5);
    if (path.empty()) fail("{}: 'file:' names no file", what);
    std::string first;
    {
      InputLines in(path, "length file", input_cap::kTrace);
      while (in.next(first) && first.find_first_not_of(" \t\r") == std::string::npos) {
      }
    }
    if (whole(first)) {  // one length a line
      InputLines in(path, "length file", input_cap::kTrace);
      std::string line;
      int64_t n = 0;
      while (in.next(line)) {
        ++n;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const auto v = whole(line);
        const std::string where = fmt::format("{}:{}", path, n);
        if (!v) fail("{}: '{}' is not a whole number", where, escape_text(line));
        check_tokens(*v, where, "length");
        if (int64_t(d.samples.size()) >= kMaxRequests) fail("{}: more than {} lengths", path, kMaxRequests);
        d.samples.push_back(*v);
      }
    } else {
      for (const ServingRequest& r : read_requests(path))
        d.samples.push_back(column == "output_tokens" ? r.output_tokens : r.prompt_tokens);
    }
    if (d.samples.empty()) fail("{}: {} holds no lengths", what, path);
    return from_samples(std::move(d.samples));
  }
  if (s.rfind("normal:", 0) == 0) {
    const std::string rest = s.substr(7);
    const size_t c = rest.find(':');
    const auto mean = c == std::string::npos ? std::nullopt : number(std::string_view(rest).substr(0, c));
    const auto sd = c == std::string::npos ? std::nullopt : number(std::string_view(rest).substr(c + 1));
    if (!mean || !sd) fail("{}: '{}' is not normal:MEAN:SD with numbers", what, escape_text(s));
    if (*mean < 1 || *mean > double(kMaxTokens) || *sd < 0 || *sd > double(kMaxTokens))
      fail("{}: '{}' needs a mean in [1, {}] and a standard deviation in [0, {}]", what, escape_text(s),
           kMaxTokens, kMaxTokens);
    d.kind = Kind::Normal;
    d.mean = *mean, d.sd = *sd;
    d.lo = 1;
    d.hi = std::min<int64_t>(kMaxTokens, int64_t(std::ceil(*mean + 6 * *sd)));
    return d;
  }
  const size_t colon = s.find(':');
  if (colon == std::string::npos) {
    const auto v = whole(s);
    if (!v) fail("{}: '{}' is not a whole number, LO:HI, normal:MEAN:SD or file:PATH", what, escape_text(s));
    check_tokens(*v, what, "length");
    d.lo = d.hi = *v;
    return d;
  }
  const auto lo = whole(std::string_view(s).substr(0, colon)),
             hi = whole(std::string_view(s).substr(colon + 1));
  if (!lo || !hi) fail("{}: '{}' is not LO:HI with whole numbers", what, escape_text(s));
  check_tokens(*lo, what, "length");
  check_tokens(*hi, what, "length");
  if (*lo > *hi) fail("{}: '{}' has LO above HI", what, escape_text(s));
  d.kind = *lo == *hi ? Kind::Fixed : Kind::Uniform;
  d.lo = *lo, d.hi = *hi;
  return d;
}

LengthDist LengthDist::from_samples(std::vector<int64_t> samples) {
  LengthDist d;
  d.kind = Kind::Samples;
  const auto [lo, hi] = std::minmax_element(samples.begin(), samples.end());
  d.lo = *lo, d.hi = *hi;
  d.samples = std::move(samples);
  return d;
}

std::string LengthDist::describe() const {
  switch (kind) {
    case Kind::Fixed:
      return fmt::format("{}", lo);
    case Kind::Uniform:
      return fmt::format("uniform {}-{}", lo, hi);
    case Kind::Normal:
      return fmt::format("normal, mean {} sd {}", mean, sd);
    case Kind::Samples:
      break;
  }
  return fmt::format("{} samples of {}-{}", samples.size(), lo, hi);
}

int64_t LengthDist::max() const {
  return hi;
}

std::vector<ServingRequest> make_workload(int64_t n, const Arrivals& a, const LengthDist& prompt,
                                          const LengthDist& output, uint64_t seed) {
  if (n < 1 || n > kMaxRequests) fail("the number of requests must be in [1, {}], got {}", kMaxRequests, n);
  if (!(a.rate > 0) || !std::isfinite(a.rate)) fail("the arrival rate must be positive, got {}", a.rate);
  if (!(a.cv > 0) || !std::isfinite(a.cv) || a.cv > 100)
    fail("the arrivals' coefficient of variation must be in (0, 100], got {}", a.cv);
  // Gamma gaps of shape k = 1 / cv^2 and scale 1 / k: mean 1, variance cv^2 (k = 1: exponential).
  const double k = 1 / (a.cv * a.cv);
  boost::random::mt19937_64 gap_rng(seed), len_rng(seed ^ 0x9e3779b97f4a7c15ull);
  boost::random::gamma_distribution<double> gap(k, 1 / k);
  const auto draw = [&](const LengthDist& d) -> int64_t {
    switch (d.kind) {
      case LengthDist::Kind::Fixed:
        return d.lo;
      case LengthDist::Kind::Uniform:
        return boost::random::uniform_int_distribution<int64_t>(d.lo, d.hi)(len_rng);
      case LengthDist::Kind::Normal:
        return std::clamp<int64_t>(
            std::llround(boost::random::normal_distribution<double>(d.mean, d.sd)(len_rng)), d.lo, d.hi);
      case LengthDist::Kind::Samples:
        break;
    }
    return d
        .samples[size_t(boost::random::uniform_int_distribution<size_t>(0, d.samples.size() - 1)(len_rng))];
  };
  std::vector<ServingRequest> out(static_cast<size_t>(n));
  double t = 0;
  for (ServingRequest& r : out) {
    t += gap(gap_rng);
    r.arrival_s = t / a.rate;
    r.prompt_tokens = draw(prompt);
    r.output_tokens = draw(output);
  }
  return out;
}

std::vector<ServingRequest> at_rate(std::span<const ServingRequest> unit, double rate) {
  if (!(rate > 0)) fail("the arrival rate must be positive, got {}", rate);
  std::vector<ServingRequest> out(unit.begin(), unit.end());
  for (ServingRequest& r : out) r.arrival_s = std::isinf(rate) ? 0.0 : r.arrival_s / rate;
  return out;
}

std::vector<LoggedRequest> read_request_log(const std::string& path) {
  InputLines in(path, "request log", input_cap::kTrace);
  std::vector<LoggedRequest> out;
  std::string line;
  int64_t n = 0;
  while (in.next(line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const RequestLogLine l = parse_request_log_line(line, fmt::format("{}:{}", path, n));
    LoggedRequest r;
    r.line = n;
    r.error = l.failed();
    r.arrival_s = l.arrival_s, r.admitted_s = l.admitted_s, r.first_token_s = l.first_token_s,
    r.finished_s = l.finished_s;
    r.prompt_tokens = l.prompt_tokens, r.output_tokens = l.output_tokens;
    r.revivals = l.revivals.value_or(0);
    r.cached_tokens = l.cached_tokens.value_or(-1);
    if (int64_t(out.size()) >= kMaxRequests) fail("{}: more than {} requests", path, kMaxRequests);
    out.push_back(r);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const LoggedRequest& a, const LoggedRequest& b) { return a.arrival_s < b.arrival_s; });
  return out;
}

std::vector<ServingRequest> read_requests(const std::string& path) {
  std::vector<ServingRequest> r = looks_like_log(path) ? read_log(path) : read_csv(path);
  if (r.empty()) fail("{}: no requests", path);
  return r;
}

void share_prefixes(std::vector<ServingRequest>& reqs, int64_t tokens, int64_t groups) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].shared_group = int64_t(i) % groups;
    reqs[i].shared_tokens = tokens;
    reqs[i].prompt_tokens += tokens;
  }
}

std::pair<int64_t, int64_t> parse_shared_prefix(const std::string& s, const std::string& what) {
  const size_t colon = s.find(':');
  const auto whole = [&](const std::string& part, int64_t hi) -> int64_t {
    if (part.empty() || part.size() > 9 || part.find_first_not_of("0123456789") != std::string::npos)
      usage_fail("{}: '{}' is not TOKENS:GROUPS (whole numbers from 1)", what, escape_text(s));
    const int64_t v = std::stoll(part);
    if (v < 1 || v > hi)
      usage_fail("{}: '{}' is not TOKENS:GROUPS (tokens 1 to {}, groups 1 to {})", what, escape_text(s),
                 int64_t(1) << 24, int64_t(1) << 24);
    return v;
  };
  if (colon == std::string::npos) usage_fail("{}: '{}' is not TOKENS:GROUPS", what, escape_text(s));
  return {whole(s.substr(0, colon), int64_t(1) << 24), whole(s.substr(colon + 1), int64_t(1) << 24)};
}

}  // namespace lp::sim
