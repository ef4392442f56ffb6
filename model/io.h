// Small file helpers shared by every writer and by the benchmarks.
#pragma once

#include <string>
#include <string_view>

namespace lp {

// Writes `content` to a temporary file beside `path` and renames it into place, so a failure
// never leaves a partial file. `what` names the file's kind in the one-line error ("profile").
void write_file_atomic(const std::string& path, std::string_view content, const char* what);

// Real English text every Debian system has (the licence texts in /usr/share/common-licenses,
// about 150 KB), for benchmarks and validation prompts. Throws lp::Error if none is readable.
std::string builtin_english_text();

}  // namespace lp
