#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace klinear {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

const char* kind_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

Result<RegularFile> RegularFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(path + ": cannot open: " + errno_text(errno));
  RegularFile f(fd, 0);
  struct stat st {};
  if (fstat(fd, &st) != 0) return Status::IOError(path + ": cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode))
    return Status::IOError(path + ": is " + kind_name(st.st_mode) + ", expected a regular file");
  // Back to blocking reads (they never block on a regular file; this only keeps the flags plain).
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
    return Status::IOError(path + ": fcntl failed: " + errno_text(errno));
  f.size_ = static_cast<int64_t>(st.st_size);
  return f;
}

RegularFile& RegularFile::operator=(RegularFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    size_ = o.size_;
    o.fd_ = -1;
  }
  return *this;
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::string> read_regular_file(const std::string& path, int64_t max_bytes) {
  KL_ASSIGN_OR_RETURN(RegularFile f, RegularFile::open(path));
  auto too_big = [&](const std::string& size) {
    return Status::ResourceExhausted(path + ": file is " + size + " bytes, more than the limit of " +
                                     std::to_string(max_bytes) + " for this kind of file");
  };
  if (f.size() > max_bytes) return too_big(std::to_string(f.size()));
  std::string out(static_cast<size_t>(f.size()), '\0');
  size_t have = 0;
  while (true) {
    if (have == out.size()) {  // the file may have grown since fstat: read on, up to the limit
      if (static_cast<int64_t>(have) > max_bytes) return too_big("more than " + std::to_string(max_bytes));
      out.resize(std::min<size_t>(have + (64 << 10), static_cast<size_t>(max_bytes) + 1));
    }
    const ssize_t n = ::read(f.fd(), out.data() + have, out.size() - have);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IOError(path + ": read failed: " + errno_text(errno));
    }
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  if (static_cast<int64_t>(have) > max_bytes) return too_big("more than " + std::to_string(max_bytes));
  out.resize(have);
  return out;
}

Result<std::string> read_text_file(const std::string& path) { return read_regular_file(path, kMaxTextFileBytes); }

Result<PathKind> path_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return PathKind::kMissing;
    return Status::IOError(path + ": cannot stat: " + errno_text(errno));
  }
  if (S_ISREG(st.st_mode)) return PathKind::kRegular;
  if (S_ISDIR(st.st_mode)) return PathKind::kDirectory;
  return PathKind::kOther;
}

}  // namespace klinear
