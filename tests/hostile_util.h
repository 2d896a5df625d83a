// Helpers of the hostile-input tests (tests/io/hostile_test.cc, tests/tools/hostile_cli_test.cc):
// running a case in a child process with bounded time and memory, and making the filesystem
// surprises (FIFO, directory, /dev/zero, symlink loop, oversized sparse file) where a file is
// expected.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "test_util.h"

namespace klinear::testing {

// Whether this build runs under AddressSanitizer, which reserves terabytes of address space and
// so cannot run under an address-space limit (the limit is then left out; ASan bounds itself).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAsan = true;
#else
inline constexpr bool kAsan = false;
#endif
#else
inline constexpr bool kAsan = false;
#endif

struct Bounded {
  bool finished = false;  // the child returned (was not killed by the time or memory limit)
  std::string result;     // what the case returned (a status message), or why it did not finish
  double seconds = 0;
};

// Runs `fn` in a forked child limited to `seconds` of wall time (SIGALRM) and `max_mb` of address
// space beyond what the process has mapped when it forks (RLIMIT_AS, not under ASan). A hang, an abort, a crash or a failed allocation comes back
// as finished=false with the reason; otherwise `result` is what `fn` returned.
inline Bounded run_bounded(const std::function<std::string()>& fn, int seconds, int64_t max_mb) {
  int fds[2];
  KL_CHECK(pipe(fds) == 0, "pipe");
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  KL_CHECK(pid >= 0, "fork");
  if (pid == 0) {
    close(fds[0]);
    alarm(static_cast<unsigned>(seconds));
    if (!kAsan) {
      // On top of what is mapped already: a CUDA build maps cuBLASLt (~0.5 GB) before fn runs.
      rlim_t mapped = 0;
      if (FILE* f = std::fopen("/proc/self/statm", "r")) {
        unsigned long pages = 0;
        if (std::fscanf(f, "%lu", &pages) == 1) mapped = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE));
        std::fclose(f);
      }
      const rlim_t cap = mapped + (static_cast<rlim_t>(max_mb) << 20);
      const rlimit lim{cap, cap};
      setrlimit(RLIMIT_AS, &lim);
    }
    const std::string r = fn();
    size_t off = 0;
    while (off < r.size()) {
      const ssize_t n = write(fds[1], r.data() + off, r.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  Bounded b;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) b.result.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  b.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  b.finished = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!b.finished)
    b.result = WIFSIGNALED(status) ? std::string("killed by signal ") + strsignal(WTERMSIG(status))
                                   : "exit status " + std::to_string(WEXITSTATUS(status));
  return b;
}

// What can stand where a regular file is expected.
enum class Hostile { kFifo, kDirectory, kDevZero, kSymlinkLoop, kOversize };

inline const char* hostile_name(Hostile h) {
  switch (h) {
    case Hostile::kFifo: return "fifo";
    case Hostile::kDirectory: return "directory";
    case Hostile::kDevZero: return "dev_zero";
    case Hostile::kSymlinkLoop: return "symlink_loop";
    case Hostile::kOversize: return "oversize";
  }
  return "?";
}

// The words the error must contain for each kind (besides the path).
inline std::string hostile_reason(Hostile h) {
  switch (h) {
    case Hostile::kFifo: return "a FIFO";
    case Hostile::kDirectory: return "a directory";
    case Hostile::kDevZero: return "a character device";
    case Hostile::kSymlinkLoop: return std::strerror(ELOOP);
    case Hostile::kOversize: return "limit";
  }
  return "?";
}

// Makes `path` (which must not exist) into `h`; kOversize is a sparse file of `oversize_bytes`.
inline void make_hostile(const std::string& path, Hostile h, int64_t oversize_bytes) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  switch (h) {
    case Hostile::kFifo: KL_CHECK(mkfifo(path.c_str(), 0600) == 0, "mkfifo " + path); break;
    case Hostile::kDirectory: std::filesystem::create_directory(path); break;
    case Hostile::kDevZero: std::filesystem::create_symlink("/dev/zero", path); break;
    case Hostile::kSymlinkLoop:
      std::filesystem::create_symlink(path + ".loop", path);
      std::filesystem::create_symlink(path, path + ".loop");
      break;
    case Hostile::kOversize: {
      const int fd = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
      KL_CHECK(fd >= 0 && ftruncate(fd, oversize_bytes) == 0, "sparse file " + path);
      close(fd);
      break;
    }
  }
}

inline std::vector<Hostile> all_hostile() {
  return {Hostile::kFifo, Hostile::kDirectory, Hostile::kDevZero, Hostile::kSymlinkLoop, Hostile::kOversize};
}

inline std::string base64(const std::string& in) {
  static const char* kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int k = 3; k >= 0; --k) out += kB64[(v >> (6 * k)) & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

// A valid tiktoken.model of the 256 single bytes and a few merges (259 tokens).
inline std::string small_ranks() {
  std::string s;
  for (int b = 0; b < 256; ++b) s += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  return s + base64("ab") + " 256\n" + base64("abab") + " 257\n" + base64("abc") + " 258\n";
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

}  // namespace klinear::testing
