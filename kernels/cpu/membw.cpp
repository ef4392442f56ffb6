#include "kernels/cpu/membw.h"

#include <immintrin.h>
#include <sys/mman.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/context.h"
#include "model/error.h"

namespace lp {

namespace {

// The loops. Each is compiled for its instruction set whatever the build's -march and picked at
// run time; all are static, so no copy of them can stand in for another's (as in qgemm's files).
// Read: the slice as kStreams interleaved sequential streams (a decoding tile reads 8 rows at once;
// one stream per thread leaves 10-15% of the bandwidth unused here, 27.6 against 31.7 GB/s).
constexpr int64_t kStreams = 8;

__attribute__((target("avx512f"))) uint64_t read512(const uint8_t* p, int64_t n) {
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
  const int64_t sub = n / kStreams / 256 * 256;
  for (int64_t i = 0; i < sub; i += 256)
    for (int64_t s = 0; s < kStreams; ++s) {
      const uint8_t* q = p + s * sub + i;
      s0 = _mm512_add_epi64(s0, _mm512_load_si512(q));
      s1 = _mm512_add_epi64(s1, _mm512_load_si512(q + 64));
      s2 = _mm512_add_epi64(s2, _mm512_load_si512(q + 128));
      s3 = _mm512_add_epi64(s3, _mm512_load_si512(q + 192));
    }
  return uint64_t(
      _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3))));
}

__attribute__((target("avx2"))) uint64_t read256(const uint8_t* p, int64_t n) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  const int64_t sub = n / kStreams / 128 * 128;
  for (int64_t i = 0; i < sub; i += 128)
    for (int64_t s = 0; s < kStreams; ++s) {
      const auto* q = reinterpret_cast<const __m256i*>(p + s * sub + i);
      s0 = _mm256_add_epi64(s0, _mm256_load_si256(q));
      s1 = _mm256_add_epi64(s1, _mm256_load_si256(q + 1));
      s2 = _mm256_add_epi64(s2, _mm256_load_si256(q + 2));
      s3 = _mm256_add_epi64(s3, _mm256_load_si256(q + 3));
    }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t read_scalar(const uint8_t* p, int64_t n) {
  const int64_t sub = n / kStreams / 8;
  const auto* q = reinterpret_cast<const uint64_t*>(p);
  uint64_t sum = 0;
  for (int64_t i = 0; i < sub; ++i)
    for (int64_t s = 0; s < kStreams; ++s) sum += q[s * sub + i];
  return sum;
}

__attribute__((target("avx512f"))) void triad512(double* a, const double* b, const double* c, double s,
                                                 int64_t n) {
  const __m512d vs = _mm512_set1_pd(s);
  for (int64_t i = 0; i + 8 <= n; i += 8)
    _mm512_store_pd(a + i, _mm512_fmadd_pd(vs, _mm512_load_pd(c + i), _mm512_load_pd(b + i)));
}

__attribute__((target("avx2,fma"))) void triad256(double* a, const double* b, const double* c, double s,
                                                  int64_t n) {
  const __m256d vs = _mm256_set1_pd(s);
  for (int64_t i = 0; i + 4 <= n; i += 4)
    _mm256_store_pd(a + i, _mm256_fmadd_pd(vs, _mm256_load_pd(c + i), _mm256_load_pd(b + i)));
}

void triad_scalar(double* a, const double* b, const double* c, double s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

const char* best_isa() {
  if (__builtin_cpu_supports("avx512f")) return "avx512";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
  return "scalar";
}

// A 2 MiB-aligned anonymous mapping, unmapped on scope exit.
class Mapping {
 public:
  Mapping(int64_t bytes, bool huge) : bytes_(size_t(bytes)) {
    void* p =
        mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail("memory bandwidth: cannot map a {} MiB buffer", bytes >> 20);
    p_ = static_cast<uint8_t*>(p);
    (void)madvise(p_, bytes_, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);  // advice: ignored where THP is off
  }
  ~Mapping() { munmap(p_, bytes_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  uint8_t* data() const { return p_; }

 private:
  size_t bytes_;
  uint8_t* p_ = nullptr;
};

// Runs f(t) once on each of the context's threads at the same time and returns the slowest one's
// seconds. The threads meet at a barrier first, so one that starts late does not shorten the pass.
template <class F>
double timed_on_each(CpuContext& ctx, F&& f) {
  const int n = ctx.threads();
  std::atomic<int> ready{0};
  std::vector<double> secs(size_t(n), 0.0);
  ctx.run([&] {
    tbb::parallel_for(
        tbb::blocked_range<int>(0, n, 1),
        [&](const tbb::blocked_range<int>& r) {
          for (int t = r.begin(); t < r.end(); ++t) {
            ready.fetch_add(1);
            // A thread of the arena that took two slices would wait forever: bounded spin.
            const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
            while (ready.load() < n && std::chrono::steady_clock::now() < give_up) _mm_pause();
            const auto t0 = std::chrono::steady_clock::now();
            f(t);
            secs[size_t(t)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          }
        },
        tbb::static_partitioner());
  });
  return *std::max_element(secs.begin(), secs.end());
}

}  // namespace

const char* mem_pattern_name(MemPattern p) {
  return p == MemPattern::Read ? "read" : "triad";
}

namespace {
// cpu0's highest data or unified cache in sysfs ("32768K"), 0 without one. Read before sysconf:
// glibc's _SC_LEVEL3_CACHE_SIZE gave 384 MiB on a 2-vCPU AMD EPYC Zen 5 guest whose sysfs (and
// lscpu) says 32 MiB (2026-11-30): what cpuid's leaf tells glibc, not the slice this guest shares.
int64_t sysfs_last_level_cache() {
  int best_level = 0;
  int64_t best = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level_in(dir + "level"), type_in(dir + "type"), size_in(dir + "size");
    int level = 0;
    std::string type, size;
    if (!(level_in >> level) || !(type_in >> type) || !(size_in >> size)) break;
    if (type == "Instruction" || level <= best_level || size.empty()) continue;
    char* end = nullptr;
    const long long v = std::strtoll(size.c_str(), &end, 10);
    const int64_t unit = *end == 'K' ? 1024 : *end == 'M' ? 1024 * 1024 : *end == 0 ? 1 : 0;
    if (v <= 0 || unit == 0 || v > (int64_t(1) << 40) / unit) continue;
    best_level = level;
    best = v * unit;
  }
  return best;
}
}  // namespace

int64_t last_level_cache_bytes() {
  if (const int64_t b = sysfs_last_level_cache(); b > 0) return b;
  for (const int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long v = sysconf(name);
    if (v > 0) return v;
  }
  return 0;
}

int64_t default_bandwidth_bytes() {
  return std::max<int64_t>(int64_t(1) << 30, 4 * last_level_cache_bytes());
}

Bandwidth measure_bandwidth(CpuContext& ctx, MemPattern pattern, const BandwidthOptions& opt) {
  const int n = ctx.threads();
  // Each thread's slice (each of a triad's three arrays' slices) a whole number of 4 KiB pages.
  const int64_t want = opt.bytes > 0 ? opt.bytes : default_bandwidth_bytes();
  const int64_t arrays = pattern == MemPattern::Triad ? 3 : 1;
  const int64_t slice = std::max<int64_t>(4096, want / (arrays * n) / 4096 * 4096);
  const int64_t array = slice * n;
  Mapping m(array * arrays, opt.huge_pages);
  const std::string isa = best_isa();
  const auto arr = [&](int64_t k) { return m.data() + k * array; };

  // First touch by the thread that will read the slice (its pages then live where it runs).
  timed_on_each(ctx, [&](int t) {
    for (int64_t k = 0; k < arrays; ++k) {
      auto* d = reinterpret_cast<double*>(arr(k) + t * slice);
      for (int64_t i = 0; i < slice / 8; ++i) d[i] = double(k + 1);
    }
  });

  std::atomic<uint64_t> sink{0};
  std::vector<double> gbs;
  const int64_t counted = array * arrays;  // bytes a pass moves as counted
  for (int pass = 0; pass < std::max(1, opt.passes); ++pass) {
    const double s = timed_on_each(ctx, [&](int t) {
      if (pattern == MemPattern::Read) {
        const uint8_t* p = arr(0) + t * slice;
        const uint64_t v = isa == "avx512" ? read512(p, slice)
                           : isa == "avx2" ? read256(p, slice)
                                           : read_scalar(p, slice);
        sink.fetch_add(v, std::memory_order_relaxed);
      } else {
        auto* a = reinterpret_cast<double*>(arr(0) + t * slice);
        const auto* b = reinterpret_cast<const double*>(arr(1) + t * slice);
        const auto* c = reinterpret_cast<const double*>(arr(2) + t * slice);
        if (isa == "avx512")
          triad512(a, b, c, 3.0, slice / 8);
        else if (isa == "avx2")
          triad256(a, b, c, 3.0, slice / 8);
        else
          triad_scalar(a, b, c, 3.0, slice / 8);
      }
    });
    gbs.push_back(double(counted) / s / 1e9);
  }
  std::sort(gbs.begin(), gbs.end());
  return Bandwidth{gbs.back(), gbs[gbs.size() / 2], counted, n, isa};
}

}  // namespace lp
