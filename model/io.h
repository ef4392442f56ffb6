// Small file helpers shared by every writer and by the benchmarks.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lp {

// Size caps per kind of input file (read_input_file). Generous for real files, small enough that
// a wrong path (a disk image, /dev/zero's regular-file cousins) is refused before it is read.
namespace input_cap {
inline constexpr uint64_t kMiB = 1 << 20;
inline constexpr uint64_t kPrompt = 64 * kMiB;     // a 1M-token prompt is about 4 MiB of text
inline constexpr uint64_t kSmallJson = 1 * kMiB;   // a schedule, hardware profile or sweep grid
inline constexpr uint64_t kModelFile = 16 * kMiB;  // a revival model
inline constexpr uint64_t kResults = 256 * kMiB;   // measurements, run --json, validate --json
inline constexpr uint64_t kTrace = 1024 * kMiB;    // a trace (JSON Lines) or a sweep's rows
inline constexpr uint64_t kCorpus = 64 * kMiB;     // an evaluation text (the KJV extract: 4.4 MiB)
}  // namespace input_cap

// `s` with every control character written out (\n, \t, \r, \x1b, and the C1 controls
// U+0080-U+009F as \u0080), so text from a file or an argument cannot forge extra lines or send
// terminal escapes when printed. Other UTF-8 passes through unchanged.
std::string escape_text(std::string_view s);

// The one way the project reads an input file whole. Only a regular file is read: a directory,
// device, FIFO or socket is refused from fstat before any read (the open is non-blocking, so a
// FIFO cannot hang it), and a file over `max_bytes` is refused from its size, before reading.
// Throws lp::Error naming `what` ("prompt file") and the path.
std::string read_input_file(const std::string& path, const char* what, uint64_t max_bytes);

// Writes `content` to a temporary file beside `path` and renames it into place, so a failure
// never leaves a partial file. Refuses a `path` that exists and is not a regular file (a symlink,
// device, FIFO or directory): the rename would replace it. `what` names the file's kind in the one-line error
// ("profile").
void write_file_atomic(const std::string& path, std::string_view content, const char* what);

// Real English text every Debian system has (the licence texts in /usr/share/common-licenses,
// about 150 KB), for benchmarks and validation prompts. Throws lp::Error if none is readable.
std::string builtin_english_text();

}  // namespace lp
