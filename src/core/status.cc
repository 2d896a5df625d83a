#include "core/status.h"

#include <cstdio>
#include <cstdlib>

namespace klinear {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kNotSupported: return "NotSupported";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kIOError: return "IOError";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return std::string(status_code_name(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& prefix) const {
  if (ok()) return *this;
  return Status(code_, prefix + ": " + message_);
}

namespace detail {
void check_failed(const char* file, int line, const char* expr, const std::string& message) {
  std::fprintf(stderr, "klinear: internal check failed at %s:%d: %s%s%s\n", file, line, expr,
               message.empty() ? "" : ": ", message.c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace klinear
