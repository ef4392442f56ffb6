#include "pruning/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "model/error.h"
#include "model/io.h"
#include "model/json_checks.h"

namespace lp {

const char* const kScheduleSyntaxHelp =
    "A schedule is comma-separated AT:SHARE steps, \"none\" (no pruning), or a schedule file.\n"
    "  AT     prune after this layer: a 0-based layer index (8), a fraction of depth written\n"
    "         with a decimal point (0.3), or a percentage of depth (30%). Depth f on an L-layer\n"
    "         model is layer round(f*L)-1: 0.3 of 30 layers is layer 8, so layers 0-8 see all tokens.\n"
    "         On a sliding-window model (Gemma 3) a depth goes to the nearest global layer.\n"
    "  SHARE  share of the tokens still active there that the later layers do not compute:\n"
    "         a fraction (0.3) or a percentage (30%), at least 0 and below 1.\n"
    "  A share alone (0.3) drops that share of the prompt before the model: random-drop's schedule.\n"
    "  Steps go in increasing order. Default 0.3:0.3,0.6:0.3,0.9:0.3 (30% of the active tokens\n"
    "  after 30%, 60% and 90% of depth), on 30 layers the same as 8:0.3,17:0.3,26:0.3.\n"
    "  File (JSON): {\"lazyprefill_schedule\": 1, \"steps\": [{\"depth\": 0.3, \"share\": 0.3},\n"
    "               {\"layer\": 17, \"share\": 0.3}]}  (each step has a layer or a depth)";

namespace {

using nlohmann::json;

std::string_view trim(std::string_view s) {
  const auto ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

bool all_digits(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Shortest fixed-notation text that reads back as exactly v ("0.3", "8", "0.00001"): never an
// exponent, so a layer index never gains a decimal point and a fraction always has one.
std::string fixed(double v) {
  char buf[512];  // the longest finite double in fixed notation is ~330 characters
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed);
  if (r.ec != std::errc{}) return fmt::format("{}", v);
  return std::string(buf, r.ptr);
}

// A number as written in the inline syntax: DIGITS, DIGITS.DIGITS (either side may be empty, not
// both), optionally followed by '%'. No sign, no exponent. The value is the exact decimal,
// correctly rounded once, so "30%" and "0.3" give the same double.
struct Written {
  double value;  // a percentage already divided by 100
  bool point;    // written with a decimal point
  bool percent;
};

std::optional<Written> read_number(std::string_view t) {
  Written w{0, false, false};
  if (!t.empty() && t.back() == '%') {
    w.percent = true;
    t.remove_suffix(1);
  }
  const size_t dot = t.find('.');
  w.point = dot != std::string_view::npos;
  const std::string_view ip = t.substr(0, dot);
  const std::string_view fp = w.point ? t.substr(dot + 1) : std::string_view{};
  if ((ip.empty() && fp.empty()) || !all_digits(ip) || !all_digits(fp)) return std::nullopt;
  // ip.fp% is the integer ipfp times 10^-(len(fp) + 2).
  const std::string s = fmt::format("{}{}e-{}", ip, fp, fp.size() + (w.percent ? 2 : 0));
  const auto r = std::from_chars(s.data(), s.data() + s.size(), w.value);
  if (r.ec != std::errc{} || r.ptr != s.data() + s.size()) return std::nullopt;
  return w;
}

std::string describe(const ScheduleStep& s) {
  if (s.before_model) return "before the model";
  return s.fraction ? fmt::format("depth {}", fixed(s.at)) : fmt::format("layer {}", fixed(s.at));
}

// The checks that need no model: ranges of one step. `where` starts the message.
void check_step(const ScheduleStep& s, const std::string& where) {
  if (s.before_model) {
    if (!(s.share >= 0 && s.share < 1)) fail("{}: drop share {} must be in [0, 1)", where, s.share);
    return;
  }
  if (s.fraction) {
    if (!(s.at > 0 && s.at < 1)) fail("{}: depth fraction {} must be in (0, 1)", where, s.at);
  } else {
    if (!(s.at >= 0)) fail("{}: layer {} is negative", where, s.at);
    if (s.at != std::floor(s.at)) fail("{}: layer {} is not a whole number", where, s.at);
  }
  if (!(s.share >= 0 && s.share < 1)) fail("{}: share {} must be in [0, 1)", where, s.share);
}

// Steps of the same kind (layers, depths) must be strictly increasing as written; a layer and a
// depth can only be compared once resolved against a model.
void check_order(const std::vector<ScheduleStep>& steps, const std::string& where) {
  for (const ScheduleStep& s : steps)
    if (s.before_model && steps.size() > 1)
      fail("{}: a share alone (a drop before the model, random-drop's) must be the schedule's only step",
           where);
  for (size_t i = 0; i < steps.size(); ++i) {
    for (size_t j = i; j-- > 0;) {
      if (steps[j].fraction != steps[i].fraction) continue;
      if (steps[j].at == steps[i].at)
        fail("{}: {} appears twice (steps {} and {})", where, describe(steps[i]), j + 1, i + 1);
      if (steps[j].at > steps[i].at)
        fail("{}: step {} ({}) comes after step {} ({}); steps must be in increasing order", where, i + 1,
             describe(steps[i]), j + 1, describe(steps[j]));
      break;  // the earlier ones of this kind were checked against steps[j] already
    }
  }
}

ScheduleStep parse_item(std::string_view item) {
  const size_t colon = item.find(':');
  if (colon == std::string_view::npos) {  // a share alone: a drop before the model
    const auto s = read_number(item);
    if (!item.starts_with('-') && s) {
      ScheduleStep step{0, false, s->value, true};
      check_step(step, fmt::format("schedule item '{}'", item));
      return step;
    }
    fail(
        "schedule item '{}': expected AT:SHARE, e.g. 0.3:0.3, 30%:30% or 8:0.3 (or a share alone, 0.3, "
        "for random-drop)",
        item);
  }
  const std::string_view at = trim(item.substr(0, colon));
  const std::string_view share = trim(item.substr(colon + 1));
  if (at.starts_with('-')) fail("schedule item '{}': AT '{}' is negative", item, at);
  if (share.starts_with('-')) fail("schedule item '{}': share '{}' is negative", item, share);
  const auto a = read_number(at);
  if (!a)
    fail(
        "schedule item '{}': malformed AT '{}' (a layer index like 8, a depth fraction like 0.3, "
        "or a percentage of depth like 30%)",
        item, at);
  const auto s = read_number(share);
  if (!s)
    fail("schedule item '{}': malformed share '{}' (a fraction like 0.3 or a percentage like 30%)", item,
         share);
  ScheduleStep step{a->value, a->point || a->percent, s->value};
  if (a->point && !a->percent && !(a->value < 1))
    fail("schedule item '{}': depth fraction {} must be in (0, 1) (a layer index has no decimal point)", item,
         at);
  check_step(step, fmt::format("schedule item '{}'", item));
  return step;
}

}  // namespace

Schedule default_schedule() {
  return Schedule{{{0.3, true, 0.3}, {0.6, true, 0.3}, {0.9, true, 0.3}}};
}

std::string Schedule::to_string() const {
  if (steps.empty()) return "none";
  std::string out;
  for (const ScheduleStep& s : steps) {
    if (!out.empty()) out += ',';
    // A depth fraction in (0, 1) always prints with a decimal point, a whole layer never does.
    out += s.before_model ? fixed(s.share) : fixed(s.at) + ':' + fixed(s.share);
  }
  return out;
}

json Schedule::to_json() const {
  json arr = json::array();
  for (const ScheduleStep& s : steps) {
    json o = json::object();
    if (s.before_model)
      o["before_model"] = true;
    else if (s.fraction)
      o["depth"] = s.at;
    else if (s.at == std::floor(s.at) && std::abs(s.at) < 0x1p53)
      o["layer"] = int64_t(s.at);
    else
      o["layer"] = s.at;  // not a valid layer; kept as is so loading reports it
    o["share"] = s.share;
    arr.push_back(std::move(o));
  }
  return json{{"lazyprefill_schedule", 1}, {"steps", std::move(arr)}};
}

Schedule parse_schedule(std::string_view inline_text) {
  const std::string_view text = trim(inline_text);
  Schedule out;
  if (text.empty() || text == "none") return out;
  size_t begin = 0;
  while (true) {
    const size_t comma = text.find(',', begin);
    const std::string_view item =
        trim(text.substr(begin, comma == std::string_view::npos ? comma : comma - begin));
    if (item.empty())
      fail("schedule '{}': step {} is empty (steps are separated by single commas)", text,
           out.steps.size() + 1);
    out.steps.push_back(parse_item(item));
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  check_order(out.steps, fmt::format("schedule '{}'", text));
  return out;
}

Schedule load_schedule_file(const std::string& path) {
  const std::string text = read_input_file(path, "schedule file", input_cap::kSmallJson);

  json j;
  try {
    j = json_parse(text, path);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a number such as 1e400
    // Drop nlohmann's "[json.exception.parse_error.101] " tag; the rest says where and why.
    std::string_view why = e.what();
    if (const size_t tag = why.find("] "); why.starts_with("[json.") && tag != std::string_view::npos)
      why.remove_prefix(tag + 2);
    fail("{}: not a schedule file (not JSON: {})", path, why);
  }
  const auto not_schedule = [&](const std::string& why) { fail("{}: not a schedule file ({})", path, why); };

  if (!j.is_object() || !j.contains("lazyprefill_schedule"))
    not_schedule("expected a JSON object with \"lazyprefill_schedule\": 1 and \"steps\"");
  for (const auto& [key, value] : j.items())
    if (key != "lazyprefill_schedule" && key != "steps") not_schedule(fmt::format("unknown key \"{}\"", key));
  const json& version = j["lazyprefill_schedule"];
  if (!version.is_number_integer()) not_schedule("\"lazyprefill_schedule\" must be an integer version");
  if (version.get<int64_t>() != 1)
    fail("{}: schedule file version {} is not supported (this build reads version 1)", path, version.dump());
  if (!j.contains("steps") || !j["steps"].is_array()) not_schedule("\"steps\" must be an array");

  Schedule out;
  for (const json& st : j["steps"]) {
    const size_t n = out.steps.size() + 1;
    if (!st.is_object()) not_schedule(fmt::format("step {} is not an object", n));
    for (const auto& [key, value] : st.items())
      if (key != "layer" && key != "depth" && key != "share" && key != "before_model")
        not_schedule(fmt::format(
            "step {}: unknown key \"{}\" (a step has \"layer\" or \"depth\", and \"share\")", n, key));
    if (st.contains("before_model")) {
      if (st["before_model"] != true)
        not_schedule(fmt::format("step {}: \"before_model\" can only be true", n));
      if (st.contains("layer") || st.contains("depth"))
        not_schedule(fmt::format("step {}: a step before the model has no \"layer\" or \"depth\"", n));
      if (!st.contains("share") || !st["share"].is_number())
        not_schedule(fmt::format("step {}: \"share\" must be a number", n));
      ScheduleStep step{0, false, st["share"].get<double>(), true};
      check_step(step, fmt::format("{}: step {}", path, n));
      out.steps.push_back(step);
      continue;
    }
    const bool has_layer = st.contains("layer"), has_depth = st.contains("depth");
    if (has_layer == has_depth)
      not_schedule(fmt::format("step {} must have exactly one of \"layer\" and \"depth\"", n));
    if (!st.contains("share")) not_schedule(fmt::format("step {} has no \"share\"", n));
    if (has_layer && !st["layer"].is_number_integer())
      not_schedule(fmt::format("step {}: \"layer\" must be an integer", n));
    if (has_depth && !st["depth"].is_number())
      not_schedule(fmt::format("step {}: \"depth\" must be a number", n));
    if (!st["share"].is_number()) not_schedule(fmt::format("step {}: \"share\" must be a number", n));
    ScheduleStep step{st[has_layer ? "layer" : "depth"].get<double>(), has_depth, st["share"].get<double>()};
    check_step(step, fmt::format("{}: step {}", path, n));
    out.steps.push_back(step);
  }
  check_order(out.steps, path);
  return out;
}

Schedule schedule_from_arg(const std::string& arg) {
  const std::string_view t = trim(arg);
  if (t.empty() || t == "none") return Schedule{};
  std::error_code ec;
  if (std::filesystem::exists(arg, ec)) return load_schedule_file(arg);
  // Inline text never has a '/' or a ".json": a typo in a path should say so, not "malformed AT".
  if (t.find('/') != std::string_view::npos || t.ends_with(".json"))
    usage_fail("{}: no such schedule file", arg);
  try {
    return parse_schedule(arg);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());  // a malformed --schedule argument is a usage error
  }
}

namespace {
// The global layer in [0, last] nearest `layer` (ties: the earlier), or -1 when there is none.
int nearest_global(int layer, int last, const std::vector<int>& global_layers) {
  int best = -1;
  for (const int g : global_layers)
    if (g >= 0 && g <= last &&
        (best < 0 || std::abs(g - layer) < std::abs(best - layer) ||
         (std::abs(g - layer) == std::abs(best - layer) && g < best)))
      best = g;
  return best;
}
}  // namespace

std::vector<PruneStep> resolve_schedule(const Schedule& s, int n_layer,
                                        const std::vector<int>& global_layers) {
  if (n_layer < 1) fail("cannot resolve a schedule for a model with {} layers", n_layer);
  const int last = n_layer - 2;  // the last layer a prune can follow: after layer L-1 nothing is left
  std::vector<PruneStep> out;
  out.reserve(s.steps.size());
  for (size_t i = 0; i < s.steps.size(); ++i) {
    const ScheduleStep& st = s.steps[i];
    const std::string where = fmt::format("schedule step {} ({})", i + 1, describe(st));
    check_step(st, where);
    if (st.before_model)
      fail("{}: a share alone ({}) drops tokens before the model, which only random-drop does", where,
           fixed(st.share));
    if (last < 0) fail("{}: a {}-layer model has no layer to prune after", where, n_layer);
    int layer;
    std::string clamped;
    bool moved = false;  // a depth moved to a global layer
    if (st.fraction) {
      // round(f * L) - 1, halves up: the first round(f * L) layers run on all tokens.
      const double fl = st.at * n_layer;
      const int raw = int(std::floor(fl + fl * kShareSlack + 0.5)) - 1;
      layer = std::clamp(raw, 0, last);
      if (layer != raw) clamped = fmt::format(" (clamped from {})", raw);
      if (const int g = nearest_global(layer, last, global_layers); g >= 0) {
        moved = g != layer;
        if (moved)
          clamped += fmt::format(" (moved from sliding-window layer {} to global layer {})", layer, g);
        layer = g;
        // Two depths on one global layer (every depth moves where there is one: the step before was moved
        // too if it was a depth).
        if (i > 0 && s.steps[i - 1].fraction && out.back().layer == g) {
          const double merged = 1 - (1 - out.back().share) * (1 - st.share);
          if (!(merged < 1))
            fail(
                "{} moves to global layer {} with the step before it, and together they would prune every "
                "token (share {}); give smaller shares or absolute layers",
                where, g, fixed(merged));
          out.back().share = merged;
          continue;
        }
      }
    } else {
      if (st.at > last)
        fail(
            "{}: a {}-layer model can prune after layers 0 to {} only (a prune after the last layer "
            "would do nothing)",
            where, n_layer, last);
      layer = int(st.at);
    }
    if (!out.empty() && layer <= out.back().layer) {
      // Depths as written are increasing (or the steps were built in code out of order), so two
      // depths that meet mean too few layers; a layer and a depth can also cross at this depth.
      const bool depths = st.fraction && s.steps[i - 1].fraction && s.steps[i - 1].at < st.at;
      fail(
          "{} resolves to layer {}{} on a {}-layer model, not after step {}'s layer {}: pruning layers must "
          "increase ({})",
          where, layer, clamped, n_layer, i, out.back().layer,
          moved ? "on a sliding-window model a depth goes to the nearest global layer; write absolute layers"
          : depths ? "the model is too shallow for this schedule; use fewer steps or absolute layers"
                   : "put the steps in increasing order for this model");
    }
    out.push_back({layer, st.share});
  }
  return out;
}

std::optional<double> drop_share(const Schedule& s) {
  if (s.steps.size() == 1 && s.steps[0].before_model) return s.steps[0].share;
  return std::nullopt;
}

void tokens_kept_fail(int64_t n_active, double share) {
  if (n_active < 1) fail("tokens_kept: n_active {} must be at least 1", n_active);
  fail("tokens_kept: share {} must be in [0, 1)", share);
}

}  // namespace lp
