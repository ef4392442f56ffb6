// The optimiser every fit uses (calibrate/bobyqa.h): it always hands back the best point it evaluated,
// says how it stopped, and throws only when there is no point to return.
#include <gtest/gtest.h>
#include <nlopt.h>

#include <array>
#include <cmath>
#include <limits>

#include "calibrate/bobyqa.h"
#include "model/error.h"

namespace lp {
namespace {

struct Count {
  int calls = 0;
};

// A smooth bowl with its minimum at (0.3, -0.2).
double bowl(unsigned, const double* x, double*, void* d) {
  ++static_cast<Count*>(d)->calls;
  return (x[0] - 0.3) * (x[0] - 0.3) + 4 * (x[1] + 0.2) * (x[1] + 0.2);
}

TEST(Bobyqa, ConvergesOnABowl) {
  Count c;
  double x[2] = {0.9, 0.9};
  const double lo[2] = {-1, -1}, hi[2] = {1, 1};
  const calib::OptimizerStatus s = calib::minimize_bobyqa(2, x, lo, hi, bowl, &c, 4000, 1e-9, "bowl");
  EXPECT_TRUE(s.converged) << s.name;
  EXPECT_EQ(s.evaluations, c.calls);
  EXPECT_NEAR(x[0], 0.3, 1e-6);
  EXPECT_NEAR(x[1], -0.2, 1e-6);
  EXPECT_EQ(calib::describe_stop(s), "");
}

// Every stop that NLopt documents as leaving a point behind returns one and reports itself; the
// budget running out is such a stop.
TEST(Bobyqa, AStopShortOfConvergenceReturnsTheBestPointSeen) {
  Count c;
  double x[2] = {0.9, 0.9};
  const double lo[2] = {-1, -1}, hi[2] = {1, 1};
  const calib::OptimizerStatus s = calib::minimize_bobyqa(2, x, lo, hi, bowl, &c, 8, 1e-12, "bowl");
  EXPECT_FALSE(s.converged);
  EXPECT_EQ(s.name, "maxeval_reached");
  EXPECT_EQ(s.evaluations, 8);
  // The point returned is the best of those evaluated, and its value is the one reported.
  EXPECT_DOUBLE_EQ(bowl(2, x, nullptr, &c), s.best);
  EXPECT_LT(s.best, bowl(2, std::array<double, 2>{0.9, 0.9}.data(), nullptr, &c));
  EXPECT_EQ(calib::describe_stop(s), "maxeval_reached after 8 evaluations");
}

TEST(Bobyqa, ClassifiesEveryNloptResult) {
  for (int code : {NLOPT_SUCCESS, NLOPT_STOPVAL_REACHED, NLOPT_FTOL_REACHED, NLOPT_XTOL_REACHED}) {
    EXPECT_TRUE(calib::optimizer_outcome(code).returns_point) << code;
    EXPECT_TRUE(calib::optimizer_outcome(code).converged) << code;
  }
  // NLopt's documentation: ROUNDOFF_LIMITED "still typically returns a useful result"; the limits
  // and a forced stop leave the best point so far. The demo's failure was -4.
  for (int code : {NLOPT_MAXEVAL_REACHED, NLOPT_MAXTIME_REACHED, NLOPT_ROUNDOFF_LIMITED, NLOPT_FORCED_STOP,
                   NLOPT_FAILURE}) {
    EXPECT_TRUE(calib::optimizer_outcome(code).returns_point) << code;
    EXPECT_FALSE(calib::optimizer_outcome(code).converged) << code;
  }
  EXPECT_STREQ(calib::optimizer_outcome(-4).name, "roundoff_limited");
  EXPECT_FALSE(calib::optimizer_outcome(NLOPT_INVALID_ARGS).returns_point);
  EXPECT_FALSE(calib::optimizer_outcome(NLOPT_OUT_OF_MEMORY).returns_point);
  EXPECT_FALSE(calib::optimizer_outcome(-77).returns_point);
}

double nan_everywhere(unsigned, const double*, double*, void*) {
  return std::numeric_limits<double>::quiet_NaN();
}
// NaN outside a small region: the optimiser must not take a NaN for a minimum.
double nan_outside(unsigned, const double* x, double*, void*) {
  if (x[0] > 0.5) return std::numeric_limits<double>::quiet_NaN();
  return (x[0] - 0.2) * (x[0] - 0.2);
}

TEST(Bobyqa, NonFiniteValuesNeverWinAndAllOfThemIsAnError) {
  double x[1] = {0.4};
  const double lo[1] = {-1}, hi[1] = {1};
  const calib::OptimizerStatus s =
      calib::minimize_bobyqa(1, x, lo, hi, nan_outside, nullptr, 500, 1e-9, "partly NaN");
  EXPECT_TRUE(std::isfinite(s.best));
  EXPECT_LE(x[0], 0.5);
  double y[1] = {0.4};
  try {
    calib::minimize_bobyqa(1, y, lo, hi, nan_everywhere, nullptr, 50, 1e-9, "the test fit");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the test fit: every prediction was NaN"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lp
