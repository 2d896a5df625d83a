#include "io/line_reader.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/check.h"

namespace klinear {

namespace {

// Big enough that a read costs little per byte (a 1 GiB line is read through in 1,024 calls),
// small beside the line limit.
constexpr size_t kReadBytes = 1 << 20;

}  // namespace

LineReader::LineReader(std::optional<RegularFile> file, int fd, std::string name, int64_t max_line_bytes)
    : file_(std::move(file)), fd_(fd), name_(std::move(name)), max_line_bytes_(max_line_bytes), buffer_(kReadBytes) {}

Result<LineReader> LineReader::open(const std::string& path, int64_t max_line_bytes) {
  KL_CHECK(max_line_bytes >= 1, "max_line_bytes " + std::to_string(max_line_bytes));
  if (path == "-") return LineReader(std::nullopt, STDIN_FILENO, "stdin", max_line_bytes);
  KL_ASSIGN_OR_RETURN(RegularFile file, RegularFile::open(path));
  const int fd = file.fd();
  return LineReader(std::move(file), fd, path, max_line_bytes);
}

Result<bool> LineReader::fill() {
  begin_ = end_ = 0;
  while (!at_end_) {
    const ssize_t n = ::read(fd_, buffer_.data(), buffer_.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IOError(name_ + ": read failed: " + std::strerror(errno));
    if (n == 0) at_end_ = true;
    end_ = static_cast<size_t>(n);
    return n > 0;
  }
  return false;
}

Result<std::optional<Line>> LineReader::next() {
  Line line;
  int64_t length = 0;  // bytes of this line so far, kept or not
  for (bool started = false;; started = true) {
    if (begin_ == end_) {
      KL_ASSIGN_OR_RETURN(const bool more, fill());
      if (!more) {
        if (!started) return std::optional<Line>();
        break;  // the last line, without a '\n'
      }
    }
    const char* from = buffer_.data() + begin_;
    const size_t available = end_ - begin_;
    const char* newline = static_cast<const char*>(std::memchr(from, '\n', available));
    const size_t take = newline ? static_cast<size_t>(newline - from) : available;
    length += static_cast<int64_t>(take);
    if (length <= max_line_bytes_) line.text.append(from, take);
    else if (line.text.capacity()) std::string().swap(line.text);  // over the limit: keep nothing
    begin_ += take + (newline ? 1 : 0);
    if (newline) break;
  }
  line.number = ++lines_;
  if (length > max_line_bytes_)
    line.error = Status::ResourceExhausted("line " + std::to_string(line.number) + " is " + std::to_string(length) +
                                           " bytes long, more than the limit of " + std::to_string(max_line_bytes_) +
                                           " bytes for one line");
  return std::optional<Line>(std::move(line));
}

}  // namespace klinear
