#include "model/io.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "model/error.h"

namespace lp {

void write_file_atomic(const std::string& path, std::string_view content, const char* what) {
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
