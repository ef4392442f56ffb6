#include "reports/plan_chart.h"

namespace lp::report {

LineChart plan_chart(const sim::PlanResult& r, const std::vector<std::string>& methods,
                     const std::string& subtitle) {
  LineChart c;
  c.title = "Deployments: throughput per GPU against speed per user";
  c.subtitle = subtitle;
  c.x = {"output tokens/s a user (1 / mean ITL)"};
  c.y = {"output tokens/s a GPU"};
  std::vector<Series> per(methods.size());
  for (size_t m = 0; m < methods.size(); ++m) per[m] = {methods[m], {}, {}, false, true};
  for (const sim::PlanPoint& pt : r.points) {
    Series& s = per[r.layouts[pt.layout].method];
    s.x.push_back(pt.tokens_per_s_per_user);
    s.y.push_back(pt.tokens_per_s_per_gpu);
  }
  for (Series& s : per)
    if (!s.x.empty()) c.series.push_back(std::move(s));
  Series frontier{"Pareto frontier", {}, {}, true, false};
  for (const size_t i : r.frontier) {
    frontier.x.push_back(r.points[i].tokens_per_s_per_user);
    frontier.y.push_back(r.points[i].tokens_per_s_per_gpu);
  }
  if (!frontier.x.empty()) c.series.push_back(std::move(frontier));
  return c;
}

}  // namespace lp::report
