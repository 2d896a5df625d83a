// KL_CHECK: a broken invariant is our bug, never the user's input. It aborts with file:line and a
// message; input errors travel as Status (status.h) instead.
#pragma once

#include <string>

namespace klinear::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& message);
}  // namespace klinear::detail

#define KL_CHECK(cond, ...)                                                                   \
  do {                                                                                        \
    if (!(cond)) ::klinear::detail::check_failed(__FILE__, __LINE__, #cond, std::string{__VA_ARGS__}); \
  } while (0)

#ifdef NDEBUG
#define KL_DCHECK(cond, ...) \
  do {                       \
  } while (0)
#else
#define KL_DCHECK(cond, ...) KL_CHECK(cond, __VA_ARGS__)
#endif
