#include "model/io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "model/error.h"

namespace lp {

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

std::string read_input_file(const std::string& path, const char* what, uint64_t max_bytes) {
  if (path.empty()) fail("the path of the {} is empty", what);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) fail("{}: cannot read {}: {}", path, what, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("{}: cannot read {}: {}", path, what, std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail("{}: is a directory, not a {}", path, what);
  if (!S_ISREG(st.st_mode))
    fail("{}: the {} must be a regular file, not a device, FIFO or socket", path, what);
  const auto mib = [](uint64_t b) { return double(b) / double(input_cap::kMiB); };
  if (uint64_t(st.st_size) > max_bytes)
    fail("{}: {:.1f} MiB is over the {:.0f} MiB limit for {}s", path, mib(uint64_t(st.st_size)),
         mib(max_bytes), what);
  // Read to the end, not to st_size: a file that grows while read is still capped.
  std::string out;
  out.reserve(size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot read {} '{}': {}", what, path, std::strerror(errno));
    if (n == 0) break;
    if (out.size() + size_t(n) > max_bytes)
      fail("{}: grew past the {:.0f} MiB limit for {}s while being read", path, mib(max_bytes), what);
    out.append(buf, size_t(n));
  }
  return out;
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
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write {} '{}': {}", what, path, std::strerror(errno));
    out.write(content.data(), std::streamsize(content.size()));
    out.flush();
    if (!out) {
      out.close();
      std::remove(tmp.c_str());
      fail("cannot write {} '{}': write failed", what, path);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    fail("cannot write {} '{}': {}", what, path, std::strerror(e));
  }
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
