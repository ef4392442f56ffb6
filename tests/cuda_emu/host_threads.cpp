// CUDA thread blocks on the host (host_threads.h): one fiber per CUDA thread, a scheduler that
// runs the block's fibers until each waits at a barrier or returns, then opens the barriers that
// every live thread has reached.
//
// The fibers switch with Boost.Context's fcontext layer (make_fcontext, jump_fcontext: the
// primitive its `fiber` and Boost.Coroutine2 are built on), not ucontext: glibc's swapcontext makes
// a sigprocmask system call at every switch, which was 90% of the emulated suite's time (issue 49).
// fcontext is used directly, not through boost::context::fiber, because fiber's constructor makes
// a switch of its own that the AddressSanitizer annotations below could not see. Under ASan every
// switch tells the sanitizer which stack it goes to (__sanitizer_start/finish_switch_fiber), so
// its reports stay right on the fibers' stacks.
#include "tests/cuda_emu/host_threads.h"

#include <algorithm>
#include <array>
#include <boost/context/detail/fcontext.hpp>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "model/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define LP_FIBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LP_FIBER_ASAN 1
#endif
#endif
#if defined(LP_FIBER_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif

namespace lp::host_threads {
namespace {

namespace bc = boost::context::detail;

// The sanitizer's side of a switch: start_switch before jumping to the stack [bottom, bottom +
// size) (`fake` keeps the leaving context's fake stack; nullptr when it never comes back),
// finish_switch right after arriving (reports the stack that was left).
void start_switch(void** fake, const void* bottom, size_t size) {
#if defined(LP_FIBER_ASAN)
  __sanitizer_start_switch_fiber(fake, bottom, size);
#else
  (void)fake, (void)bottom, (void)size;
#endif
}
void finish_switch(void* fake, const void** bottom_old, size_t* size_old) {
#if defined(LP_FIBER_ASAN)
  __sanitizer_finish_switch_fiber(fake, bottom_old, size_old);
#else
  (void)fake, (void)bottom_old, (void)size_old;
#endif
}

enum class State { Ready, AtBlockBarrier, AtWarpBarrier, Done };

struct Fiber {
  bc::fcontext_t ctx = nullptr;  // where the fiber resumes
  void* fake_stack = nullptr;    // ASan's fake stack of the fiber while it is switched out
  const char* stack = nullptr;   // the bottom of its stack (kStackBytes)
  State state = State::Ready;
  Dim3 idx;
  int linear = 0;
};

constexpr size_t kStackBytes = size_t(256) << 10;
constexpr int kWarp = 32;

struct Launch {
  Dim3 grid, block, block_idx;
  const std::function<void()>* body = nullptr;
  std::vector<Fiber> fibers;
  bc::fcontext_t scheduler = nullptr;  // where the scheduler resumes
  void* scheduler_fake_stack = nullptr;
  const void* scheduler_stack = nullptr;  // the scheduler's stack, as ASan reports it
  size_t scheduler_stack_bytes = 0;
  int current = -1;
  size_t shared_bytes = 0;
  std::vector<std::array<unsigned char, 16>> slots;  // shuffle exchange, one per thread
  std::exception_ptr error;                          // thrown by a thread: rethrown by the scheduler
};

Launch* g_launch = nullptr;  // the launch in progress: one at a time, on the calling thread
Order g_order = Order::Forward;
std::vector<std::unique_ptr<char[]>> g_stacks;  // reused across launches
std::unique_ptr<std::max_align_t[]> g_shared;
size_t g_shared_bytes = 0;

Launch& current() {
  if (!g_launch || g_launch->current < 0) fail("host_threads: a CUDA built-in used outside a kernel launch");
  return *g_launch;
}

// Back to the scheduler; returns when the scheduler runs this fiber again (unless `last`).
void to_scheduler(Launch& l, Fiber& f, bool last) {
  start_switch(last ? nullptr : &f.fake_stack, l.scheduler_stack, l.scheduler_stack_bytes);
  const bc::transfer_t t = bc::jump_fcontext(l.scheduler, nullptr);
  l.scheduler = t.fctx;
  finish_switch(f.fake_stack, &l.scheduler_stack, &l.scheduler_stack_bytes);
}

void trampoline(bc::transfer_t from) {
  Launch& l = *g_launch;
  l.scheduler = from.fctx;
  Fiber& f = l.fibers[size_t(l.current)];
  finish_switch(nullptr, &l.scheduler_stack, &l.scheduler_stack_bytes);
  try {
    (*l.body)();
  } catch (...) {  // an exception cannot leave a fiber: the scheduler rethrows it
    l.error = std::current_exception();
  }
  f.state = State::Done;
  to_scheduler(l, f, true);  // never resumed: the next block reuses the stack
}

void wait_at(State s) {
  Launch& l = current();
  Fiber& f = l.fibers[size_t(l.current)];
  f.state = s;
  to_scheduler(l, f, false);
}

std::vector<int> run_order(int n, uint64_t block_linear) {
  std::vector<int> o(static_cast<size_t>(n));
  std::iota(o.begin(), o.end(), 0);
  if (g_order == Order::Reverse) std::reverse(o.begin(), o.end());
  if (g_order == Order::Shuffled) {
    std::mt19937_64 rng(0x9e3779b97f4a7c15ull ^ block_linear);
    std::shuffle(o.begin(), o.end(), rng);
  }
  return o;
}

void run_block(Launch& l, uint64_t block_linear) {
  const int n = int(l.fibers.size());
  if (l.shared_bytes) std::memset(g_shared.get(), 0xff, l.shared_bytes);  // NaN for a read before a write
  for (int i = 0; i < n; ++i) {
    Fiber& f = l.fibers[size_t(i)];
    f.state = State::Ready;
    f.fake_stack = nullptr;
    f.stack = g_stacks[size_t(i)].get();
    f.ctx =
        bc::make_fcontext(g_stacks[size_t(i)].get() + kStackBytes, kStackBytes, trampoline);  // grows down
  }
  const std::vector<int> order = run_order(n, block_linear);
  const auto run = [&](int i) {
    if (l.fibers[size_t(i)].state != State::Ready) return;
    Fiber& f = l.fibers[size_t(i)];
    l.current = i;
    start_switch(&l.scheduler_fake_stack, f.stack, kStackBytes);
    f.ctx = bc::jump_fcontext(f.ctx, nullptr).fctx;
    finish_switch(l.scheduler_fake_stack, nullptr, nullptr);
    l.current = -1;
    if (l.error) std::rethrow_exception(l.error);
  };
  // Opens warp w's barrier if every live lane of the warp waits at it.
  const auto open_warp = [&](int w) {
    bool any = false, all = true;
    for (int i = w; i < std::min(n, w + kWarp); ++i) {
      const State s = l.fibers[size_t(i)].state;
      any |= s == State::AtWarpBarrier;
      all &= s == State::AtWarpBarrier || s == State::Done;
    }
    if (!any || !all) return false;
    for (int i = w; i < std::min(n, w + kWarp); ++i)
      if (l.fibers[size_t(i)].state == State::AtWarpBarrier) l.fibers[size_t(i)].state = State::Ready;
    return true;
  };
  for (;;) {
    if (g_order == Order::WarpByWarp) {
      // Each warp, last first, runs until all its lanes wait at the block barrier or return.
      for (int w = (n - 1) / kWarp * kWarp; w >= 0; w -= kWarp) do {
          for (int i = w; i < std::min(n, w + kWarp); ++i) run(i);
        } while (open_warp(w));
    } else {
      for (int i : order) run(i);
      // Every thread now waits at a barrier or has returned. Open each warp barrier that all live
      // lanes of the warp reached; else the block barrier if all live threads reached it.
      bool opened = false;
      for (int w = 0; w < n; w += kWarp) opened |= open_warp(w);
      if (opened) continue;
    }
    int done = 0, at_block = 0;
    for (const Fiber& f : l.fibers) {
      done += f.state == State::Done;
      at_block += f.state == State::AtBlockBarrier;
    }
    if (done == n) return;
    if (done + at_block != n)
      fail("host_threads: deadlock in block ({},{},{}): threads wait at different barriers", l.block_idx.x,
           l.block_idx.y, l.block_idx.z);
    for (Fiber& f : l.fibers)
      if (f.state == State::AtBlockBarrier) f.state = State::Ready;
  }
}

}  // namespace

void set_order(Order order) {
  g_order = order;
}
Order order() {
  return g_order;
}

const Dim3& thread_idx() {
  Launch& l = current();
  return l.fibers[size_t(l.current)].idx;
}
const Dim3& block_idx() {
  return current().block_idx;
}
const Dim3& block_dim() {
  return current().block;
}
const Dim3& grid_dim() {
  return current().grid;
}
int linear_thread() {
  Launch& l = current();
  return l.fibers[size_t(l.current)].linear;
}

void sync_block() {
  wait_at(State::AtBlockBarrier);
}
void sync_warp() {
  wait_at(State::AtWarpBarrier);
}

void fail_shuffle(unsigned mask, int lane_mask, int width) {
  fail(
      "host_threads: a shuffle with mask {:#x}, lane or lane mask {}, width {} (supported: the full mask, "
      "0 < lane mask < width, width a power of 2 up to 32, at most 16 bytes a lane)",
      mask, lane_mask, width);
}

void* shuffle_slot(int linear) {
  Launch& l = current();
  if (linear < 0 || linear >= int(l.slots.size()))
    fail("host_threads: a shuffle reads lane {} of a block of {} threads", linear, l.slots.size());
  return l.slots[size_t(linear)].data();
}

void* dynamic_shared() {
  current();
  return g_shared.get();
}

void run_grid(Dim3 grid, Dim3 block, size_t shared_bytes, const std::function<void()>& body) {
  if (g_launch) fail("host_threads: a launch inside a launch");
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0)
    fail("host_threads: launch with an empty grid ({},{},{}) or block ({},{},{})", grid.x, grid.y, grid.z,
         block.x, block.y, block.z);
  if (threads > 1024) fail("host_threads: {} threads per block (CUDA allows 1024)", threads);
  if (grid.y > 65535 || grid.z > 65535)
    fail("host_threads: grid ({},{},{}) over CUDA's y/z limit", grid.x, grid.y, grid.z);
  if (shared_bytes > (size_t(227) << 10))
    fail("host_threads: {} bytes of dynamic shared memory", shared_bytes);
  while (g_stacks.size() < threads) g_stacks.push_back(std::make_unique<char[]>(kStackBytes));
  if (shared_bytes > g_shared_bytes) {
    g_shared = std::make_unique<std::max_align_t[]>((shared_bytes + sizeof(std::max_align_t) - 1) /
                                                    sizeof(std::max_align_t));
    g_shared_bytes = shared_bytes;
  }
  Launch l;
  l.grid = grid;
  l.block = block;
  l.body = &body;
  l.shared_bytes = shared_bytes;
  l.fibers.resize(size_t(threads));
  l.slots.resize(size_t(threads));
  for (unsigned z = 0, i = 0; z < block.z; ++z)
    for (unsigned y = 0; y < block.y; ++y)
      for (unsigned x = 0; x < block.x; ++x, ++i) {
        l.fibers[i].idx = Dim3(x, y, z);
        l.fibers[i].linear = int(i);
      }
  g_launch = &l;
  struct Reset {
    ~Reset() { g_launch = nullptr; }
  } reset;
  uint64_t b = 0;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x, ++b) {
        l.block_idx = Dim3(x, y, z);
        run_block(l, b);
      }
}

}  // namespace lp::host_threads
