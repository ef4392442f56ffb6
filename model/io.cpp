#include "model/io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "model/error.h"

namespace lp {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t j = std::min(s.find(',', i), s.size());
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

std::string escape_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(s[i + 1]) <= 0x9f) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(s[i + 1]));
      ++i;
    } else {
      out += char(c);
    }
  }
  return out;
}

namespace {
double mib(uint64_t b) {
  return double(b) / double(input_cap::kMiB);
}

// Opens `path` for reading after the checks every input gets (see read_input_file); the caller
// owns the descriptor.
int open_input(const std::string& path, const char* what, uint64_t max_bytes, uint64_t* size) {
  if (path.empty()) fail("the path of the {} is empty", what);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) fail("{}: cannot read {}: {}", path, what, std::strerror(errno));
  struct Guard {  // closes the descriptor when a check fails
    int fd;
    ~Guard() {
      if (fd >= 0) ::close(fd);
    }
  } guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("{}: cannot read {}: {}", path, what, std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail("{}: is a directory, not a {}", path, what);
  if (!S_ISREG(st.st_mode))
    fail("{}: the {} must be a regular file, not a device, FIFO or socket", path, what);
  if (uint64_t(st.st_size) > max_bytes)
    fail("{}: {:.1f} MiB is over the {:.0f} MiB limit for {}s", path, mib(uint64_t(st.st_size)),
         mib(max_bytes), what);
  guard.fd = -1;
  *size = uint64_t(st.st_size);
  return fd;
}

// One read(2) into `buf`, counted against the cap: 0 at the end of the file.
size_t read_some(int fd, char* buf, size_t n, uint64_t& total, uint64_t max_bytes, const std::string& path,
                 const char* what) {
  for (;;) {
    const ssize_t got = ::read(fd, buf, n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail("cannot read {} '{}': {}", what, path, std::strerror(errno));
    total += uint64_t(got);
    if (total > max_bytes)
      fail("{}: grew past the {:.0f} MiB limit for {}s while being read", path, mib(max_bytes), what);
    return size_t(got);
  }
}
}  // namespace

std::string read_input_file(const std::string& path, const char* what, uint64_t max_bytes) {
  uint64_t size = 0, total = 0;
  const int fd = open_input(path, what, max_bytes, &size);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  // Read to the end, not to st_size: a file that grows while read is still capped.
  std::string out;
  out.reserve(size_t(size));
  char buf[1 << 16];
  while (const size_t n = read_some(fd, buf, sizeof buf, total, max_bytes, path, what)) out.append(buf, n);
  return out;
}

InputLines::InputLines(const std::string& path, const char* what, uint64_t max_bytes)
    : path_(path), what_(what), max_(max_bytes) {
  uint64_t size = 0;
  fd_ = open_input(path, what, max_bytes, &size);
}

InputLines::~InputLines() {
  ::close(fd_);
}

bool InputLines::next(std::string& line) {
  for (;;) {
    const size_t nl = buf_.find('\n', pos_);
    if (nl != std::string::npos) {
      line.assign(buf_, pos_, nl - pos_);
      pos_ = nl + 1;
      return true;
    }
    if (eof_) {
      if (pos_ >= buf_.size()) return false;
      line.assign(buf_, pos_);  // a last line without its newline
      pos_ = buf_.size();
      return true;
    }
    buf_.erase(0, pos_);
    pos_ = 0;
    const size_t old = buf_.size();
    buf_.resize(old + (1 << 16));
    const size_t n = read_some(fd_, buf_.data() + old, 1 << 16, read_, max_, path_, what_);
    buf_.resize(old + n);
    eof_ = n == 0;
  }
}

namespace {
// Temporary files being written, removed by the SIGINT/SIGTERM handler (remove_temp_files_on_signal):
// fixed slots of fixed size, so the handler touches no allocator and takes no lock.
constexpr size_t kTempSlots = 16, kTempPath = 4096;
char g_temp[kTempSlots][kTempPath];
std::atomic<bool> g_temp_used[kTempSlots];

// Registers `path` for removal on a signal while it exists (-1: no slot free, or too long: then a
// kill leaves it).
int register_temp(const std::string& path) {
  if (path.size() + 1 > kTempPath) return -1;
  for (size_t i = 0; i < kTempSlots; ++i) {
    bool expected = false;
    if (g_temp_used[i].compare_exchange_strong(expected, true)) {
      std::memcpy(g_temp[i], path.c_str(), path.size() + 1);
      return int(i);
    }
  }
  return -1;
}
void unregister_temp(int slot) {
  if (slot >= 0) g_temp_used[size_t(slot)].store(false);
}

void on_signal(int sig) {
  for (size_t i = 0; i < kTempSlots; ++i)
    if (g_temp_used[i].load()) ::unlink(g_temp[i]);
  std::signal(sig, SIG_DFL);  // and die of it, as the caller expects
  ::raise(sig);
}

// Writes all of `data` to `fd`; false (errno set) when a write fails.
bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = ENOSPC;
      return false;
    }
    data.remove_prefix(size_t(n));
  }
  return true;
}
}  // namespace

TempFileGuard::TempFileGuard(const std::string& path) : path_(path), slot_(register_temp(path)) {}

TempFileGuard::~TempFileGuard() {
  if (!released_) ::unlink(path_.c_str());
  unregister_temp(slot_);
}

void TempFileGuard::release() {
  released_ = true;
  unregister_temp(slot_);
  slot_ = -1;
}

void refuse_output_over_input(const std::string& out, const char* option,
                              const std::vector<std::string>& inputs) {
  struct stat o {};
  if (out.empty() || ::stat(out.c_str(), &o) != 0 || !S_ISREG(o.st_mode)) return;
  for (const std::string& in : inputs) {
    struct stat i {};
    if (!in.empty() && ::stat(in.c_str(), &i) == 0 && i.st_dev == o.st_dev && i.st_ino == o.st_ino)
      usage_fail("{} '{}' is the input file '{}'; writing it would destroy it", option, out, in);
  }
}

void remove_temp_files_on_signal() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
}

void write_file_atomic(const std::string& path, std::string_view content, const char* what) {
  // Replace a regular file or create one, never anything else: the rename would turn a symlink
  // or a device (/dev/null, /dev/stdout) into a regular file.
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    fail(
        "{}: exists and is not a regular file (a symlink, device, FIFO or directory); not replacing it with "
        "the {}",
        path, what);
  // The temporary file in the target's folder (the rename must not cross file systems), unique.
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) fail("cannot write {} '{}': {}", what, path, std::strerror(errno));
  TempFileGuard guard(tmp);  // removed on every error below, and on SIGINT/SIGTERM
  const auto give_up = [&](int e) { fail("cannot write {} '{}': {}", what, path, std::strerror(e)); };
  // mkstemp makes the file 0600; an output gets the usual 0666 less the umask.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(fd, 0666 & ~mask) != 0 || !write_all(fd, content)) {
    const int e = errno;
    ::close(fd);
    give_up(e);
  }
  if (::close(fd) != 0) give_up(errno);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) give_up(errno);
  guard.release();
}

AppendFile::AppendFile(const std::string& path, const char* what, uint64_t max_existing)
    : path_(path), what_(what) {
  if (path.empty()) fail("the path of the {} is empty", what);
  // Not following a symlink, not blocking on a FIFO; then only a regular file is kept.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW, 0666);
  if (fd_ < 0)
    fail("{}: cannot write the {}: {}", path, what,
         errno == ELOOP ? "it is a symlink" : std::strerror(errno));
  struct stat st {};
  const auto refuse = [&](const std::string& why) {
    ::close(fd_);
    fd_ = -1;
    fail("{}: {}", path, why);
  };
  if (::fstat(fd_, &st) != 0) refuse(fmt::format("cannot write the {}: {}", what, std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    refuse(fmt::format("the {} must be a regular file, not a directory, device, FIFO or socket", what));
  if (uint64_t(st.st_size) > max_existing)
    refuse(fmt::format("{:.1f} MiB is over the {:.0f} MiB limit for {}s", mib(uint64_t(st.st_size)),
                       mib(max_existing), what));
  // One writer at a time: a second run on the same file would interleave its rows with ours.
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0)
    refuse(errno == EWOULDBLOCK ? fmt::format("another process is writing this {} (it is locked)", what)
                                : fmt::format("cannot lock the {}: {}", what, std::strerror(errno)));
  size_ = uint64_t(st.st_size);
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

std::string AppendFile::read_all() {
  std::string out;
  out.reserve(size_t(size_));
  uint64_t total = 0;
  char buf[1 << 16];
  for (uint64_t at = 0;;) {
    const ssize_t n = ::pread(fd_, buf, sizeof buf, off_t(at));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot read the {} '{}': {}", what_, path_, std::strerror(errno));
    if (n == 0) break;
    total += uint64_t(n);
    if (total > size_) break;  // grown since it was opened: the lock holder is us, so not by a sweep
    out.append(buf, size_t(n));
    at += uint64_t(n);
  }
  return out;
}

void AppendFile::truncate(uint64_t size) {
  if (::ftruncate(fd_, off_t(size)) != 0)
    fail("cannot write the {} '{}': {}", what_, path_, std::strerror(errno));
  size_ = size;
}

void AppendFile::append(std::string_view text) {
  if (::lseek(fd_, off_t(size_), SEEK_SET) < 0 || !write_all(fd_, text)) {
    const int e = errno;
    // Whole lines or nothing: cut a partial write (a full disk) back to where it began. Shrinking
    // needs no space; should it still fail, the error below is the one to report.
    const bool cut = ::ftruncate(fd_, off_t(size_)) == 0;
    fail("cannot write the {} '{}': {}{}", what_, path_, std::strerror(e),
         cut ? "" : " (and a partial row could not be removed)");
  }
  size_ += text.size();
}

std::string builtin_english_text() {
  std::string text;
  for (const char* f : {"GPL-3", "GPL-2", "LGPL-2.1", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "Artistic"}) {
    std::ifstream in(std::string("/usr/share/common-licenses/") + f, std::ios::binary);
    if (in) text += std::string(std::istreambuf_iterator<char>(in), {}) + "\n\n";
  }
  if (text.size() < 10000) fail("no English text found in /usr/share/common-licenses (package base-files)");
  return text;
}

}  // namespace lp
