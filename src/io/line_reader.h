// Reading text line by line in bounded memory: `klinear run`'s JSONL input, which may be larger
// than the memory of the machine (issue 34 item 9).
//
// Decision: a line is handed out whole (a JSON request cannot be parsed in pieces), but only up to
// a limit. A longer line is read through to its end without being kept and comes back as that
// line's error, naming its number, its length and the limit, so one bad line costs one error
// record and the lines after it still run. Memory: one read buffer (1 MiB) and the line being
// returned (at most the limit).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/file.h"

namespace klinear {

// The longest line kept (`klinear run`: one request).
inline constexpr int64_t kMaxLineBytes = 64ll << 20;

struct Line {
  int64_t number = 0;  // 1-based
  std::string text;    // without its '\n'; the last line may lack one
  Status error;        // not ok: the line was longer than the limit (ResourceExhausted); text is empty
};

// Reads one input front to back. Not thread-safe; owns its descriptor (stdin's is left open).
class LineReader {
 public:
  // `path` "-" is stdin (a pipe, a terminal or a file); any other path must be a regular file
  // (IOError naming the path otherwise, as RegularFile::open). `max_line_bytes` >= 1.
  static Result<LineReader> open(const std::string& path, int64_t max_line_bytes = kMaxLineBytes);

  // The next line, or nullopt at the end of the input. IOError naming the input and the errno text
  // when a read fails; reading is over then.
  Result<std::optional<Line>> next();

  const std::string& name() const { return name_; }  // the path, or "stdin"

 private:
  LineReader(std::optional<RegularFile> file, int fd, std::string name, int64_t max_line_bytes);
  // Refills the buffer: false at the end of the input.
  Result<bool> fill();

  std::optional<RegularFile> file_;  // empty for stdin
  int fd_;
  std::string name_;
  int64_t max_line_bytes_;
  std::vector<char> buffer_;
  size_t begin_ = 0, end_ = 0;  // unread bytes of buffer_
  int64_t lines_ = 0;           // lines returned so far
  bool at_end_ = false;
};

}  // namespace klinear
