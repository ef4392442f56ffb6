// set_graphs, graph_counts, queue_on and the captures' scratch (cuda_ops.h) over the
// implementation's GraphState (graph_cache.h): ops.cu's on a GPU, the host emulation's in the tests.
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

void restart_arena(GraphState& g) {
  if (const size_t grown = g.arena.restart()) {
    if (void* old = g.arena.base()) device_free_async(old);  // stream-ordered: behind its graphs
    g.arena.resized(nullptr, 0);
    g.arena.resized(device_alloc_async(grown, "scratch arena"), grown);
  }
}

void* scratch_alloc(size_t bytes, const char* what) {
  {
    GraphState& g = graph_state();
    std::lock_guard lock(g.mu);
    if (g.capturing && !g.mine()) g.end_capture();  // another thread's
    if (g.may_begin()) g.begin_capture();           // the launcher's operations follow
    if (g.capturing)
      if (void* p = g.arena.take(bytes)) return p;
  }
  // Not capturing, or the arena is full: stream-ordered memory (which ends the segment).
  return device_alloc_async(bytes, what);
}

void scratch_free(void* p) {
  {
    GraphState& g = graph_state();
    std::lock_guard lock(g.mu);
    if (g.arena.give(p)) return;  // the arena's: its graph may not have run yet
  }
  device_free_async(p);
}

}  // namespace lp::cuda
