// set_graphs, graphs_on, graph_counts and queue_on (cuda_ops.h) over the implementation's
// GraphState (graph_cache.h): ops.cu's on a GPU, the host emulation's in the tests.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/graph_cache.h"

namespace lp::cuda {

// Graphs turned off, or turned on by another thread, end the open capture first.
void set_graphs(bool on) {
  GraphState& g = graph_state();
  std::lock_guard lock(g.mu);
  if (!on || !g.mine()) g.end_capture();
  g.on = on;
  g.owner = std::this_thread::get_id();
}

bool graphs_on() {
  GraphState& g = graph_state();
  std::lock_guard lock(g.mu);
  return g.on && g.mine();
}

GraphCounts graph_counts() {
  GraphState& g = graph_state();
  std::lock_guard lock(g.mu);
  return g.counts;
}

// Another thread's open capture ends first; one begins where graphs are on for this thread; the
// operation joins the open one's sequence.
void* queue_on(uint64_t op) {
  GraphState& g = graph_state();
  std::lock_guard lock(g.mu);
  if (g.capturing && !g.mine()) g.end_capture();
  if (g.may_begin()) g.begin_capture();
  if (g.capturing) g.key = mix_op(g.key, op), ++g.ops;
  return g.stream();
}

}  // namespace lp::cuda
