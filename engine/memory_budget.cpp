#include "engine/memory_budget.h"

#include <sys/resource.h>

#include <fstream>
#include <sstream>

#include "kernels/cpu/qgemm.h"
#include "model/error.h"
#include "model/gguf.h"

namespace lp {

namespace {

// "Key:   1234 kB" lines of a /proc file.
std::optional<int64_t> proc_kib(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
    std::istringstream v(line.substr(key.size() + 1));
    int64_t kib = 0;
    if (v >> kib && kib >= 0) return kib * 1024;
    return std::nullopt;
  }
  return std::nullopt;
}

// A cgroup v2 file of one number ("max": no limit).
std::optional<int64_t> cgroup_number(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (!(in >> s) || s == "max") return std::nullopt;
  try {
    size_t used = 0;
    const long long v = std::stoll(s, &used);
    if (used != s.size() || v < 0) return std::nullopt;
    return int64_t(v);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<int64_t> soft_limit(int resource) {
  struct rlimit r {};
  if (getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return std::nullopt;
  return r.rlim_cur > rlim_t(INT64_MAX) ? std::nullopt : std::optional<int64_t>(int64_t(r.rlim_cur));
}

std::string gib(int64_t b) {
  return fmt::format("{:.2f} GiB", double(b) / double(int64_t(1) << 30));
}

}  // namespace

MemorySources read_memory_sources() {
  MemorySources s;
  s.mem_available = proc_kib("/proc/meminfo", "MemAvailable");
  // The process's cgroup v2 path: the "0::/path" line of /proc/self/cgroup.
  std::ifstream cg("/proc/self/cgroup");
  std::string line;
  while (std::getline(cg, line))
    if (line.rfind("0::", 0) == 0) {
      const std::string dir = "/sys/fs/cgroup" + line.substr(3);
      s.cgroup_max = cgroup_number(dir + "/memory.max");
      if (s.cgroup_max) s.cgroup_current = cgroup_number(dir + "/memory.current");
    }
  s.rlimit_as = soft_limit(RLIMIT_AS);
  if (s.rlimit_as) s.address_space = proc_kib("/proc/self/status", "VmSize");
  s.rlimit_data = soft_limit(RLIMIT_DATA);
  if (s.rlimit_data) s.data = proc_kib("/proc/self/status", "VmData");
  return s;
}

MemoryBudget memory_budget(const MemorySources& s) {
  MemoryBudget b;
  const auto bound = [&](std::optional<int64_t> limit, std::optional<int64_t> used, const char* what) {
    if (!limit) return;
    const int64_t room = std::max<int64_t>(0, *limit - used.value_or(0));
    if (room < b.bytes) b = {room, what};
  };
  bound(s.mem_available, std::nullopt, "MemAvailable");
  bound(s.cgroup_max, s.cgroup_current, "the cgroup's memory.max");
  bound(s.rlimit_as, s.address_space, "RLIMIT_AS");
  bound(s.rlimit_data, s.data, "RLIMIT_DATA");
  return b;
}

int64_t resident_weight_bytes(const GgufFile& f, DType dtype) {
  bool untied = false;
  for (const GgufTensor& t : f.tensors()) untied = untied || t.name == "output.weight";
  int64_t b = 0;
  for (const GgufTensor& t : f.tensors()) {
    if (dtype == DType::F32 || t.ne.size() < 2)  // norms and biases are f32 in every dtype
      b += 4 * t.n_elems;
    else if (dtype == DType::Int8 && untied && t.name == "token_embd.weight" && qgemm_supports(t.type))
      continue;  // kept in the file's mapping, not packed: only the rows looked up come in (weights.cpp)
    else if (dtype == DType::BF16)
      b += 2 * t.n_elems;
    else if (qgemm_supports(t.type))
      b += t.n_bytes;
    else
      b += t.n_elems / 32 * 34;
  }
  return b;
}

void check_weights_fit(const GgufFile& f, DType dtype, const MemoryBudget& budget) {
  const int64_t need = resident_weight_bytes(f, dtype);
  if (need > budget.bytes)
    fail("{}: the weights need {} of memory as {} and {} is available ({}){}", f.path(), gib(need),
         dtype_name(dtype), gib(budget.bytes), budget.source,
         dtype == DType::Int8 ? "" : "; --dtype int8 holds a quantized file's blocks as they are");
}

}  // namespace lp
