// The serving simulation (sim/serving.h): against queueing theory where the scheduler reduces to a
// textbook queue, against the batch-1 replay where one request runs alone, and its inputs' errors.
#include <gtest/gtest.h>

#include <boost/math/distributions/beta.hpp>
#include <cmath>
#include <fstream>
#include <functional>
#include <string>

#include "hwmodels/profile.h"
#include "model/error.h"
#include "model/presets.h"
#include "pruning/schedule.h"
#include "sim/layer_cost.h"
#include "sim/replay.h"
#include "sim/serving_capacity.h"
#include "tests/sim/serving_world.h"

namespace lp {
namespace {

using sim::ServingRequest;

using World = testing::ServingWorld;

sim::ServingMethod unpruned() {
  return {};
}
sim::ServingMethod lazyllm(const ModelConfig& c) {
  return sim::serving_method({PolicyKind::LazyLLM, default_schedule()}, c);
}

// One request alone is the batch-1 replay of its synthetic trace: TTFT its prefill, the rest its
// decoding steps, unpruned and under LazyLLM.
TEST(ServingSim, OneRequestAloneIsTheBatchOneReplay) {
  World s;
  for (const sim::ServingMethod& m : {unpruned(), lazyllm(s.c)}) {
    const ServingRequest r{0.5, 4096, 17};
    const sim::ServingRun run = sim::simulate_serving(s.c, s.hw, s.p, m, s.cfg, {&r, 1});
    const sim::Prediction ref =
        sim::replay_synthetic(s.c, m.method.policy_name(), m.steps, 4096, 16, {}, s.hw, s.p);
    ASSERT_EQ(run.requests.size(), 1u);
    const sim::RequestOutcome& o = run.requests[0];
    EXPECT_DOUBLE_EQ(o.queue_s(), 0);
    EXPECT_NEAR(o.ttft_s(), ref.ttft_s, 1e-12 * ref.ttft_s) << m.name;
    EXPECT_NEAR(o.finished_s - o.first_token_s, ref.decode_s, 1e-9 * ref.decode_s) << m.name;
    EXPECT_NEAR(o.prompt_tokens_computed_fraction, ref.prompt_tokens_computed_fraction, 1e-12);
    EXPECT_EQ(run.iterations, 17);
  }
}

// With one output token (a request is one prefill) and a token budget of one prompt, the server is
// one FIFO server with a fixed service time S: under Poisson arrivals at load rho, an M/D/1 queue,
// whose mean wait is rho S / (2 (1 - rho)) (Pollaczek-Khinchine) and whose share of requests that
// wait at all is rho.
TEST(ServingSim, OnePrefillAtATimeIsAnMD1Queue) {
  World s;
  s.cfg.max_batch_tokens = 1024;
  const ServingRequest one{0, 1024, 1};
  const double S = sim::simulate_serving(s.c, s.hw, s.p, unpruned(), s.cfg, {&one, 1}).requests[0].ttft_s();
  for (const double rho : {0.5, 0.8}) {
    const auto len = sim::LengthDist::parse("1024", "prompt", "prompt_tokens");
    const auto out = sim::LengthDist::parse("1", "output", "output_tokens");
    const auto reqs = sim::make_workload(200000, {rho / S, 1}, len, out, 7);
    const sim::ServingRun run = sim::simulate_serving(s.c, s.hw, s.p, unpruned(), s.cfg, reqs);
    double wait = 0;
    int64_t waited = 0;
    for (const sim::RequestOutcome& o : run.requests) {
      wait += o.queue_s();
      waited += o.queue_s() > 0;
      ASSERT_NEAR(o.ttft_s() - o.queue_s(), S, 1e-9 * S);
    }
    wait /= double(run.requests.size());
    const double pk = rho * S / (2 * (1 - rho));
    EXPECT_NEAR(wait / pk, 1.0, 0.05) << "rho " << rho;
    EXPECT_NEAR(double(waited) / double(run.requests.size()), rho, 0.01) << "rho " << rho;
  }
}

// Gamma-distributed gaps: mean 1 / rate whatever the cv, and their variance cv^2 / rate^2; the
// same seed scales with the rate (common random numbers).
TEST(ServingSim, ArrivalsHaveTheirMeanAndVarianceAndScaleWithTheRate) {
  const auto len = sim::LengthDist::parse("100:200", "prompt", "prompt_tokens");
  for (const double cv : {0.5, 1.0, 3.0}) {
    const auto r = sim::make_workload(200000, {4.0, cv}, len, len, 3);
    double sum = 0, sq = 0, prev = 0;
    for (const ServingRequest& q : r) {
      const double g = q.arrival_s - prev;
      prev = q.arrival_s;
      sum += g, sq += g * g;
      ASSERT_GE(q.prompt_tokens, 100);
      ASSERT_LE(q.prompt_tokens, 200);
    }
    const double mean = sum / double(r.size()), var = sq / double(r.size()) - mean * mean;
    EXPECT_NEAR(mean, 0.25, 0.25 * 0.03) << cv;
    EXPECT_NEAR(std::sqrt(var) / mean, cv, cv * 0.05) << cv;
  }
  const auto a = sim::make_workload(100, {1.0, 1.0}, len, len, 5);
  const auto b = sim::make_workload(100, {2.0, 1.0}, len, len, 5);
  const auto c = sim::at_rate(a, 2.0);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(b[i].arrival_s, a[i].arrival_s / 2, 1e-12 * a[i].arrival_s);
    EXPECT_DOUBLE_EQ(c[i].arrival_s, a[i].arrival_s / 2);
    EXPECT_EQ(b[i].prompt_tokens, a[i].prompt_tokens);
  }
}

// Decoding together: 8 requests' step costs less than 8 steps alone (the weights are read once)
// and more than one; their first tokens come from one iteration.
TEST(ServingSim, BatchedDecodingSharesTheWeights) {
  World s;
  const ServingRequest alone{0, 512, 65};
  const double itl1 =
      sim::simulate_serving(s.c, s.hw, s.p, unpruned(), s.cfg, {&alone, 1}).requests[0].itl_s();
  std::vector<ServingRequest> eight(8, alone);
  const sim::ServingRun run = sim::simulate_serving(s.c, s.hw, s.p, unpruned(), s.cfg, eight);
  for (const sim::RequestOutcome& o : run.requests) {
    EXPECT_DOUBLE_EQ(o.first_token_s, run.requests[0].first_token_s);
    EXPECT_GT(o.itl_s(), itl1);
    EXPECT_LT(o.itl_s(), 2 * itl1);  // an 8B model's decoding step is bound by its weights
  }
  EXPECT_EQ(run.iterations, 65);
}

// Distribution-free quantile intervals: the order statistics' ranks from the binomial
// distribution, against the textbook's (the median of 100: ranks 40 and 61; of 16: 4 and 13) and
// ranks worked out from the binomial sums by hand (p90 of 16: from rank 12, no upper bound; p90 of
// 100: 84 and 96); a median of 5 cannot be bounded at 95% on either side.
TEST(ServingSim, QuantileIntervalsFromOrderStatistics) {
  const auto ranks = [](int n) {
    std::vector<double> v;
    for (int i = n; i >= 1; --i) v.push_back(i);  // given unsorted
    return v;
  };
  const auto check = [&](int n, double q, double lo, double hi, bool hi_open) {
    const sim::QuantileInterval r = sim::quantile_interval(ranks(n), q);
    EXPECT_EQ(r.lo, lo) << n << " " << q;
    EXPECT_EQ(r.hi, hi) << n << " " << q;
    EXPECT_FALSE(r.lo_open);
    EXPECT_EQ(r.hi_open, hi_open);
  };
  check(100, 0.5, 40, 61, false);
  check(16, 0.5, 4, 13, false);
  check(16, 0.9, 12, 16, true);
  check(100, 0.9, 84, 96, false);
  const sim::QuantileInterval five = sim::quantile_interval(ranks(5), 0.5);
  EXPECT_TRUE(five.lo_open && five.hi_open);
  EXPECT_EQ(five.lo, 1);
  EXPECT_EQ(five.hi, 5);
}

// A machine twice as slow: a lone request's every time doubles; a scale that is not a positive
// number is refused.
TEST(ServingSim, TimeScaleStretchesEveryIteration) {
  World s;
  const ServingRequest r{0, 2048, 9};
  const sim::ServingRun one = sim::simulate_serving(s.c, s.hw, s.p, lazyllm(s.c), s.cfg, {&r, 1});
  s.cfg.time_scale = 2;
  const sim::ServingRun two = sim::simulate_serving(s.c, s.hw, s.p, lazyllm(s.c), s.cfg, {&r, 1});
  EXPECT_NEAR(two.requests[0].ttft_s(), 2 * one.requests[0].ttft_s(), 1e-12);
  EXPECT_NEAR(two.requests[0].e2e_s(), 2 * one.requests[0].e2e_s(), 1e-12);
  for (const double bad : {0.0, -1.0, std::nan("")}) {
    s.cfg.time_scale = bad;
    EXPECT_THROW(sim::simulate_serving(s.c, s.hw, s.p, unpruned(), s.cfg, {&r, 1}), Error);
  }
}

// How the batch's GEMMs are grouped (hwmodels::Engine::own_gemm_rows): lazyprefill's CPU backend
// runs a member of 64 rows or more (a prefill) in GEMMs of its own and the others in one shared
// GEMM, so a decoding request beside a prefill reads the weights once more; vLLM runs one GEMM over
// all rows. The difference is, per layer, the row-priced ops of the decoder's row alone and of the
// prefill's rows alone against those of all rows together (cost_layer's RowsOnly part).
TEST(ServingSim, OwnGemmsForLargeMembersAsTheCpuBackendRunsThem) {
  World s;
  const int64_t P = 1024;
  const auto rows_cost = [&](int64_t n) {
    double t = 0;
    const auto add = [&t](const sim::OpCost& oc) { t += oc.time_s; };
    sim::cost_layer(
        sim::CostContext(s.hw, s.p), s.hw, 1, s.c, double(s.c.n_embd), sim::LayerWork{n},
        [&](Op, const sim::OpCost& oc) { add(oc); }, add, sim::LayerPart::RowsOnly);
    return t;
  };
  const auto ttft_beside_decoder = [&](int64_t own_from) {
    s.hw.engine.own_gemm_rows = own_from;
    const ServingRequest a{0, 512, 3};
    const double t1 =
        sim::simulate_serving(s.c, s.hw, s.p, unpruned(), s.cfg, {&a, 1}).requests[0].first_token_s;
    const std::vector<ServingRequest> two{a, {t1, P, 1}};  // B arrives as A starts decoding
    const sim::ServingRun run = sim::simulate_serving(s.c, s.hw, s.p, unpruned(), s.cfg, two);
    EXPECT_DOUBLE_EQ(run.requests[1].queue_s(), 0);
    return run.requests[1].ttft_s();
  };
  const double shared = ttft_beside_decoder(0), own = ttft_beside_decoder(64);
  const double extra = double(s.c.n_layer) * (rows_cost(1) + rows_cost(P) - rows_cost(P + 1));
  EXPECT_GT(extra, 0);
  EXPECT_NEAR(own - shared, extra, 1e-9 * own);
  EXPECT_DOUBLE_EQ(ttft_beside_decoder(P + 2), shared);  // no member that large: one GEMM
  // Alone, a request's GEMMs are its own either way.
  const ServingRequest b{0, P, 4};
  s.hw.engine.own_gemm_rows = 64;
  const sim::ServingRun own_alone = sim::simulate_serving(s.c, s.hw, s.p, unpruned(), s.cfg, {&b, 1});
  s.hw.engine.own_gemm_rows = 0;
  const sim::ServingRun shared_alone = sim::simulate_serving(s.c, s.hw, s.p, unpruned(), s.cfg, {&b, 1});
  EXPECT_DOUBLE_EQ(own_alone.requests[0].finished_s, shared_alone.requests[0].finished_s);
  EXPECT_EQ(hw::engine_preset("lazyprefill").own_gemm_rows, 64);
  EXPECT_EQ(hw::engine_preset("vllm").own_gemm_rows, 0);
}

// The K/V budget admits two reservations at once: the third request starts only when one of the
// first two has finished, and the reserved bytes never pass the budget.
TEST(ServingSim, AdmissionWaitsForKvBudget) {
  World s;
  const double res = reservation_bytes(s.c, sim::kv_layout(s.cfg), 2048, 64, false);
  s.cfg.kv_budget_bytes = 2.5 * res;
  std::vector<ServingRequest> four(4, ServingRequest{0, 2048, 64});
  const sim::ServingRun run = sim::simulate_serving(s.c, s.hw, s.p, unpruned(), s.cfg, four);
  EXPECT_DOUBLE_EQ(run.requests[0].admitted_s, 0);
  EXPECT_DOUBLE_EQ(run.requests[1].admitted_s, 0);
  EXPECT_GE(run.requests[2].admitted_s, std::min(run.requests[0].finished_s, run.requests[1].finished_s));
  EXPECT_LE(run.kv_reserved_peak, s.cfg.kv_budget_bytes);
  EXPECT_NEAR(run.kv_reserved_peak, 2 * res, 1e-6 * res);
}

// Chunked prefill: a 4096-token prompt in 1024-token chunks takes 4 iterations to its first token;
// under LazyLLM only its last chunk prunes, so it computes a larger share of the prompt.
TEST(ServingSim, ChunkedPrefillSpansIterationsAndPrunesOnlyTheLastChunk) {
  World s;
  const ServingRequest r{0, 4096, 1};
  const sim::ServingMethod m = lazyllm(s.c);
  const sim::ServingRun whole = sim::simulate_serving(s.c, s.hw, s.p, m, s.cfg, {&r, 1});
  s.cfg.chunk_tokens = 1024;
  s.cfg.max_batch_tokens = 1024;
  const sim::ServingRun chunked = sim::simulate_serving(s.c, s.hw, s.p, m, s.cfg, {&r, 1});
  EXPECT_EQ(whole.iterations, 1);
  EXPECT_EQ(chunked.iterations, 4);
  EXPECT_GT(chunked.requests[0].ttft_s(), whole.requests[0].ttft_s());
  // The unpruned prompt in chunks: the same pairs and rows as whole, so about the same time.
  const sim::ServingRun plain = sim::simulate_serving(s.c, s.hw, s.p, unpruned(), s.cfg, {&r, 1});
  s.cfg.chunk_tokens = 0;
  s.cfg.max_batch_tokens = 8192;
  const sim::ServingRun plain_whole = sim::simulate_serving(s.c, s.hw, s.p, unpruned(), s.cfg, {&r, 1});
  EXPECT_NEAR(plain.requests[0].ttft_s() / plain_whole.requests[0].ttft_s(), 1.0, 0.1);
}

// Capacity: the rate found meets the objectives and one a resolution above it does not; LazyLLM's
// shorter prefills serve more at long prompts; objectives no rate meets are reported as unmet.
TEST(ServingSim, CapacitySearchBracketsTheObjective) {
  World s;
  const auto prompt = sim::LengthDist::parse("8192", "prompt", "prompt_tokens");
  const auto output = sim::LengthDist::parse("16", "output", "output_tokens");
  sim::CapacityOptions o;
  o.objectives.ttft_p90_s = 2.0;
  o.requests = 400;
  o.seeds = 1;
  o.tolerance = 0.02;
  const auto none = sim::find_capacity(s.c, s.hw, s.p, unpruned(), s.cfg, {1, 1}, prompt, output, o);
  const auto lazy = sim::find_capacity(s.c, s.hw, s.p, lazyllm(s.c), s.cfg, {1, 1}, prompt, output, o);
  ASSERT_TRUE(none.met);
  ASSERT_TRUE(lazy.met);
  EXPECT_LE(none.at_rate.ttft.p90, 2.0);
  EXPECT_GT(lazy.rate, none.rate);
  const auto unit = sim::make_workload(400, {1, 1}, prompt, output, 0);
  const auto above = sim::serving_metrics(
      sim::simulate_serving(s.c, s.hw, s.p, unpruned(), s.cfg, sim::at_rate(unit, none.rate * 1.03)),
      o.objectives);
  EXPECT_GT(above.ttft.p90, 2.0);
  o.objectives.ttft_p90_s = 1e-4;  // below one prefill
  const auto never = sim::find_capacity(s.c, s.hw, s.p, unpruned(), s.cfg, {1, 1}, prompt, output, o);
  EXPECT_FALSE(never.met);
  EXPECT_GT(never.best.ttft.p90, 1e-4);
}

TEST(ServingSim, PercentilesInterpolateLikeNumpy) {
  // numpy.percentile([1, 2, 3, 4, 10], [50, 90, 99]) = 3, 7.6, 9.76
  const sim::Percentiles p = sim::percentiles({10, 2, 4, 1, 3});
  EXPECT_DOUBLE_EQ(p.p50, 3);
  EXPECT_NEAR(p.p90, 7.6, 1e-12);
  EXPECT_NEAR(p.p99, 9.76, 1e-12);
  EXPECT_DOUBLE_EQ(p.mean, 4);
}

std::string write(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// A sample's quantile against the order-statistic distribution (Boost.Math's beta, independent of
// the sampling code): from a population spread evenly over (0, 1), the median of 15 is the 8th
// order statistic, Beta(8, 8), and the 0.9-quantile of 11 (numpy's interpolation lands on a rank)
// the 10th, Beta(10, 2). The share within 10% and the 5th/95th percentiles of 20,000 draws must
// match those distributions to their Monte Carlo error.
TEST(ServingSim, SampleQuantileSpreadIsTheOrderStatisticsDistribution) {
  std::vector<double> pop;
  for (int i = 0; i < 200000; ++i) pop.push_back((i + 0.5) / 200000);
  const auto check = [&](double q, size_t n, double a, double b) {
    const boost::math::beta_distribution<double> beta(a, b);
    const sim::SampleSpread r = sim::sample_quantile_spread(pop, q, n, 0.10, 20000, 7);
    EXPECT_NEAR(r.population, q, 1e-5);
    const double want = boost::math::cdf(beta, q * 1.1) - boost::math::cdf(beta, q * 0.9);
    EXPECT_NEAR(r.share_within, want, 0.015) << q << " of " << n;
    EXPECT_NEAR(r.lo, boost::math::quantile(beta, 0.05), 0.01) << q << " of " << n;
    EXPECT_NEAR(r.hi, boost::math::quantile(beta, 0.95), 0.01) << q << " of " << n;
  };
  check(0.5, 15, 8, 8);
  check(0.9, 11, 10, 2);
  const std::vector<double> three{1, 2, 3};
  expect_error([&] { sim::sample_quantile_spread(three, 0.5, 4, 0.1); }, "cannot be drawn");
  expect_error([&] { sim::sample_quantile_spread(three, 0.5, 0, 0.1); }, "cannot be drawn");
  expect_error([&] { sim::sample_quantile_spread(three, 0.5, 2, 0.1, 0); }, "draws must be positive");
  // All of a population, drawn whole: its own quantile every time.
  const sim::SampleSpread whole = sim::sample_quantile_spread(three, 0.5, 3, 0.1, 10);
  EXPECT_EQ(whole.share_within, 1.0);
  EXPECT_EQ(whole.lo, 2.0);
}

TEST(ServingSim, ReadsArrivalFilesAndRefusesBadOnes) {
  const auto csv = sim::read_requests(
      write("ok.csv", "prompt_tokens,arrival_s,output_tokens,extra\n100,0.5,8,x\n200,0.5,16,y\n300,2,1,z\n"));
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(csv[1].prompt_tokens, 200);
  EXPECT_DOUBLE_EQ(csv[2].arrival_s, 2);
  // A serve log, in finish order: sorted by arrival; errors left out.
  const auto log = sim::read_requests(
      write("log.jsonl",
            "{\"arrival_s\": 2.0, \"prompt_tokens\": 10, \"output_tokens\": 4, \"finish\": \"length\"}\n"
            "{\"arrival_s\": 1.0, \"prompt_tokens\": 20, \"output_tokens\": 4, \"finish\": \"stop\"}\n"
            "{\"arrival_s\": 1.5, \"prompt_tokens\": 30, \"output_tokens\": 0, \"finish\": \"error\", "
            "\"error\": \"x\"}\n"));
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].prompt_tokens, 20);
  expect_error(
      [] {
        sim::read_requests(write("unsorted.csv", "arrival_s,prompt_tokens,output_tokens\n2,10,1\n1,10,1\n"));
      },
      "unsorted.csv:3: arrival_s 1 is before");
  expect_error(
      [] { sim::read_requests(write("neg.csv", "arrival_s,prompt_tokens,output_tokens\n-1,10,1\n")); },
      "neg.csv:2: arrival_s -1 is negative");
  expect_error(
      [] { sim::read_requests(write("nan.csv", "arrival_s,prompt_tokens,output_tokens\nsoon,10,1\n")); },
      "nan.csv:2: arrival_s 'soon' is not a number");
  expect_error(
      [] { sim::read_requests(write("frac.csv", "arrival_s,prompt_tokens,output_tokens\n1,10.5,1\n")); },
      "frac.csv:2: prompt_tokens '10.5' is not a whole number");
  expect_error(
      [] { sim::read_requests(write("zero.csv", "arrival_s,prompt_tokens,output_tokens\n1,0,1\n")); },
      "zero.csv:2: prompt_tokens 0 is not in");
  expect_error([] { sim::read_requests(write("cols.csv", "arrival_s,prompt_tokens\n1,10\n")); }, "cols.csv");
  expect_error([] { sim::read_requests(write("empty.csv", "arrival_s,prompt_tokens,output_tokens\n")); },
               "no requests");
  expect_error([] { sim::read_requests(write("badlog.jsonl", "{\"arrival_s\": 1}\n")); },
               "badlog.jsonl:1: no number 'prompt_tokens'");
  expect_error([] { sim::LengthDist::parse("9:3", "--prompt-tokens", "prompt_tokens"); }, "LO above HI");
  expect_error([] { sim::LengthDist::parse("many", "--prompt-tokens", "prompt_tokens"); },
               "not a whole number");
  expect_error([] { sim::LengthDist::parse("file:" + write("lens.txt", "10\n0\n"), "--prompt-tokens", "p"); },
               "lens.txt:2: length 0");
  const auto lens =
      sim::LengthDist::parse("file:" + write("lens2.txt", "10\n\n30\n"), "--prompt-tokens", "p");
  EXPECT_EQ(lens.samples, (std::vector<int64_t>{10, 30}));
}

TEST(ServingSim, RefusesWhatCouldNeverRun) {
  World s;
  const auto len = sim::LengthDist::parse("10", "p", "p");
  expect_error([&] { sim::make_workload(10, {0.0, 1}, len, len, 0); }, "arrival rate must be positive");
  expect_error([&] { sim::at_rate({}, 0); }, "arrival rate must be positive");
  s.cfg.kv_budget_bytes = 1 << 20;
  const ServingRequest big{0, 100000, 10};
  expect_error(
      [&] {
        sim::simulate_serving(s.c, s.hw, s.p, unpruned(), s.cfg, {&big, 1});
      },
      "could never run");
  s.cfg.kv_budget_bytes = 0;
  expect_error(
      [&] {
        sim::simulate_serving(s.c, s.hw, s.p, unpruned(), s.cfg, {&big, 1});
      },
      "budget must be positive");
  World t;
  const std::vector<ServingRequest> back{{2, 10, 1}, {1, 10, 1}};
  expect_error([&] { sim::simulate_serving(t.c, t.hw, t.p, unpruned(), t.cfg, back); }, "not sorted");
  sim::CapacityOptions o;
  expect_error(
      [&] {
        sim::find_capacity(t.c, t.hw, t.p, unpruned(), t.cfg, {1, 1}, len, len, o);
      },
      "needs an objective");
}

}  // namespace
}  // namespace lp
