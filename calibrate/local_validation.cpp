#include "calibrate/local_validation.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <boost/math/statistics/univariate_statistics.hpp>
#include <cmath>

#include "model/error.h"
#include "sim/replay.h"

namespace lp::calib {

std::string LocalCase::label() const {
  std::string s = fmt::format("{}-{}-{}", tokens, policy, schedule);
  std::replace(s.begin(), s.end(), ':', '_');
  std::replace(s.begin(), s.end(), ',', '+');
  return s;
}

std::vector<int64_t> local_lengths(bool quick) {
  return quick ? std::vector<int64_t>{256, 512, 1024, 2048} : std::vector<int64_t>{256, 1024, 4096, 8192};
}

std::vector<LocalCase> local_cases(const std::vector<int64_t>& lengths) {
  const std::vector<std::pair<std::string, std::string>> schedules = {{"none", "none"},
                                                                      {"lazyllm", "0.3:0.3,0.6:0.3,0.9:0.3"},
                                                                      {"lazyllm", "0.1:0.5,0.3:0.5,0.5:0.5"},
                                                                      {"frozen", "0.3:0.3,0.6:0.3,0.9:0.3"}};
  std::vector<LocalCase> cases;
  for (size_t li = 0; li < lengths.size(); ++li)
    for (size_t si = 0; si < schedules.size(); ++si)
      cases.push_back({lengths[li], schedules[si].first, schedules[si].second, (li + si) % 2 == 0});
  return cases;
}

const OpCheck* HeldOutCase::worst_op() const {
  const OpCheck* worst = nullptr;
  for (const OpCheck& o : ops)
    if (o.measured_ms > 0.05 * measured_ms &&
        (!worst || std::fabs(o.error_pct) > std::fabs(worst->error_pct)))
      worst = &o;
  return worst;
}

namespace {

double pct_error(double predicted, double measured) {
  return measured > 0 ? 100 * (predicted / measured - 1) : 0;
}

HeldOutCase check_held_out(const MeasuredCase& m, const ModelConfig& c, const hw::Profile& fitted,
                           const hw::Profile& base, const sim::Precision& precision) {
  const sim::Prediction p = sim::replay(m.trace, c, fitted, precision);
  const sim::Prediction b = sim::replay(m.trace, c, base, precision);
  HeldOutCase h{
      m.c, m.run.prefill_s * 1e3, p.ttft_s * 1e3, pct_error(p.ttft_s, m.run.prefill_s), b.ttft_s * 1e3, {}};
  std::array<double, kNumOps> measured{};
  std::array<bool, kNumOps> timed{};
  for (const OpSample& s : m.run.ops) {
    measured[size_t(s.op)] += s.seconds * 1e3;
    timed[size_t(s.op)] = true;
  }
  for (size_t i = 0; i < kNumOps; ++i)
    if (timed[i]) {
      const double po = p.prefill_ops[i].time_s * 1e3;
      h.ops.push_back({Op(i), measured[i], po, pct_error(po, measured[i])});
    }
  return h;
}

}  // namespace

LocalValidation validate_local(const hw::Profile& base, const ModelConfig& c, const sim::Precision& precision,
                               const std::vector<MeasuredCase>& cases) {
  LocalValidation v;
  for (const MeasuredCase& m : cases) {
    if (m.rounds_prefill_s.empty() || m.rounds_prefill_s.size() != cases.front().rounds_prefill_s.size())
      fail("validate: every case needs the same number of rounds ({} has {}, {} has {})",
           cases.front().c.label(), cases.front().rounds_prefill_s.size(), m.c.label(),
           m.rounds_prefill_s.size());
    if (m.c.train) v.train.push_back(m.run);
  }
  if (v.train.empty() || v.train.size() == cases.size())
    fail("validate: {} of {} cases are calibrated on; some must be and some held out", v.train.size(),
         cases.size());
  v.fitted = calibrate(base, v.train, &v.report);

  double ape = 0, base_ape = 0;
  for (const MeasuredCase& m : cases) {
    if (m.c.train) continue;
    v.held.push_back(check_held_out(m, c, v.fitted, base, precision));
    ape += std::fabs(v.held.back().error_pct);
    base_ape += std::fabs(pct_error(v.held.back().base_predicted_ms, v.held.back().measured_ms));
  }
  v.mape_pct = ape / double(v.held.size());
  v.base_mape_pct = base_ape / double(v.held.size());

  // A ratio of two runs within one round (a few seconds apart: a slow minute of a shared machine
  // slows both), the median over the rounds, their range as its spread.
  for (const MeasuredCase& m : cases) {
    if (m.c.policy == "none") continue;
    const auto none = std::find_if(cases.begin(), cases.end(), [&](const MeasuredCase& x) {
      return x.c.policy == "none" && x.c.tokens == m.c.tokens;
    });
    if (none == cases.end()) continue;
    std::vector<double> ratios;
    for (size_t r = 0; r < m.rounds_prefill_s.size(); ++r)
      ratios.push_back(none->rounds_prefill_s[r] / m.rounds_prefill_s[r]);
    SpeedupCheck s;
    s.c = m.c;
    s.held_out = !m.c.train || !none->c.train;
    s.measured_min = *std::min_element(ratios.begin(), ratios.end());
    s.measured_max = *std::max_element(ratios.begin(), ratios.end());
    s.measured = boost::math::statistics::median(ratios);
    s.fastest_runs = none->run.prefill_s / m.run.prefill_s;
    s.predicted = sim::replay(none->trace, c, v.fitted, precision).ttft_s /
                  sim::replay(m.trace, c, v.fitted, precision).ttft_s;
    s.within_range = s.predicted >= s.measured_min && s.predicted <= s.measured_max;
    s.error_points = 100 * (s.predicted - s.measured);
    v.worst_points = std::max(v.worst_points, std::fabs(s.error_points));
    if (s.held_out) v.worst_points_held_out = std::max(v.worst_points_held_out, std::fabs(s.error_points));
    v.within_range += s.within_range;
    v.speedups.push_back(std::move(s));
  }
  return v;
}

}  // namespace lp::calib
