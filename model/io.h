// Small file helpers shared by every writer and by the benchmarks.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

// "a,b,,c" -> {"a", "b", "c"}: the comma lists of --hw, --prune, --prompt-lengths.
std::vector<std::string> split_list(const std::string& s);

// The one way the project reads an input file whole. Only a regular file is read: a directory,
// device, FIFO or socket is refused from fstat before any read (the open is non-blocking, so a
// FIFO cannot hang it), and a file over `max_bytes` is refused from its size, before reading.
// Throws lp::Error naming `what` ("prompt file") and the path.
std::string read_input_file(const std::string& path, const char* what, uint64_t max_bytes);

// An input file read line by line (JSON Lines), with read_input_file's checks and cap: memory is
// one line, not the file. Throws lp::Error naming `what` and the path.
class InputLines {
 public:
  InputLines(const std::string& path, const char* what, uint64_t max_bytes);
  ~InputLines();
  InputLines(const InputLines&) = delete;
  InputLines& operator=(const InputLines&) = delete;
  // The next line, without its newline; false at the end of the file.
  bool next(std::string& line);
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
  const char* what_;
  uint64_t max_, read_ = 0;
  std::string buf_;
  size_t pos_ = 0;
  bool eof_ = false;
};

// Writes `content` to a temporary file beside `path` and renames it into place, so a failure
// never leaves a partial file. Refuses a `path` that exists and is not a regular file (a symlink,
// device, FIFO or directory): the rename would replace it. `what` names the file's kind in the one-line error
// ("profile").
void write_file_atomic(const std::string& path, std::string_view content, const char* what);

// A temporary file being written: removed when the guard dies unreleased (an error) and, once
// remove_temp_files_on_signal has run, when the process gets SIGINT, SIGTERM or SIGHUP (up to 16
// at once). release() once it has been renamed into place.
class TempFileGuard {
 public:
  explicit TempFileGuard(const std::string& path);
  ~TempFileGuard();
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
  void release();

 private:
  std::string path_;
  int slot_;
  bool released_ = false;
};

// Refuses (usage error) an output path that is one of the command's input files (the same file by
// device and inode: another name or a link to it included): writing it would destroy an input.
// `option` names the output ("--trace"); inputs that do not exist, or that are not files, are
// skipped.
void refuse_output_over_input(const std::string& out, const char* option,
                              const std::vector<std::string>& inputs);

// Installs SIGINT, SIGTERM and SIGHUP handlers that remove the temporary files write_file_atomic
// is writing, then die of the signal as before: an interrupted command leaves no `*.tmp.*` beside
// its outputs. Called once by main.
void remove_temp_files_on_signal();

// An output that grows by whole lines (a sweep's JSON Lines), held under an exclusive lock
// (flock) for the object's life so that two processes cannot interleave their rows. Opened
// without following a symlink and without blocking; only a regular file (created if missing, at
// most `max_existing` bytes) is accepted. A failed append (a full disk) is cut back to where it
// began: the file never ends in a torn line of ours. Throws lp::Error naming `what` and the path.
class AppendFile {
 public:
  AppendFile(const std::string& path, const char* what, uint64_t max_existing);
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  std::string read_all();        // what the file held when opened
  void truncate(uint64_t size);  // drop everything from `size` on (a torn tail)
  void append(std::string_view text);

 private:
  int fd_ = -1;
  std::string path_;
  const char* what_;
  uint64_t size_ = 0;
};

// Real English text every Debian system has (the licence texts in /usr/share/common-licenses,
// about 150 KB), for benchmarks and validation prompts. Throws lp::Error if none is readable.
std::string builtin_english_text();

}  // namespace lp
