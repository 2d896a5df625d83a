// Reading files that come from outside: only regular files, with a size limit fitting their
// kind, and every error naming the path and the reason (the errno text).
//
// Decision: one place for it. A FIFO, a directory, /dev/zero, a symlink loop, a permission error
// or an overlong path is an IOError here, never a hang, an endless read, an empty string or an
// uncaught std::filesystem_error. Files are opened O_NONBLOCK so that opening a FIFO cannot block
// before the type check rejects it.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace klinear {

// Size limits by kind of file. Real files are far below them (config.json: a few KB; an index
// of a 1T-parameter checkpoint: a few MB; tiktoken.model: 2.5 MB).
inline constexpr int64_t kMaxJsonFileBytes = 64ll << 20;
inline constexpr int64_t kMaxTokenizerFileBytes = 64ll << 20;
inline constexpr int64_t kMaxTextFileBytes = 256ll << 20;  // `klinear tokenize --file`
inline constexpr int64_t kMaxNpyFileBytes = 16ll << 30;

// An open regular file (read-only). Closes its descriptor when destroyed.
class RegularFile {
 public:
  // IOError naming `path` and the errno text when it cannot be opened, or naming what it is
  // (a directory, a FIFO, a character device, ...) when it is not a regular file.
  static Result<RegularFile> open(const std::string& path);

  RegularFile(RegularFile&& o) noexcept : fd_(o.fd_), size_(o.size_) { o.fd_ = -1; }
  RegularFile& operator=(RegularFile&& o) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();

  int fd() const { return fd_; }
  int64_t size() const { return size_; }  // from fstat when opened

 private:
  RegularFile(int fd, int64_t size) : fd_(fd), size_(size) {}
  int fd_ = -1;
  int64_t size_ = 0;
};

// The whole contents of the regular file `path`, which must hold at most `max_bytes` bytes
// (ResourceExhausted naming the path, the size and the limit otherwise; a file that grows while
// being read is caught too).
Result<std::string> read_regular_file(const std::string& path, int64_t max_bytes);
// read_regular_file with kMaxTextFileBytes.
Result<std::string> read_text_file(const std::string& path);

enum class PathKind { kMissing, kRegular, kDirectory, kOther };
// What `path` is (following symlinks). A path that does not exist (ENOENT, ENOTDIR) is kMissing;
// any other failure (ELOOP, ENAMETOOLONG, EACCES, ...) is an IOError naming the path and reason.
Result<PathKind> path_kind(const std::string& path);

}  // namespace klinear
