#include "core/checked.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>

namespace klinear {

namespace {

std::string quoted(std::string_view text) {
  constexpr size_t kShown = 40;  // a hostile flag may be megabytes long
  std::string s(text.substr(0, kShown));
  if (text.size() > kShown) s += "...";
  return "'" + s + "'";
}

std::string number(double v) {
  std::ostringstream ss;
  ss << v;
  return ss.str();
}

}  // namespace

namespace {

// a `sign` b for sizes: both >= 0, and `overflows(a, b, &out)` (a __builtin_*_overflow) false.
template <typename Overflows>
Result<int64_t> checked_size_op(int64_t a, int64_t b, const std::string& what, const char* sign, Overflows overflows) {
  const std::string shown = std::to_string(a) + sign + std::to_string(b);
  if (a < 0 || b < 0) return Status::InvalidArgument(what + ": negative size in " + shown);
  int64_t out = 0;
  if (overflows(a, b, &out)) return Status::InvalidArgument(what + ": " + shown + " overflows a 64-bit size");
  return out;
}

}  // namespace

Result<int64_t> checked_mul(int64_t a, int64_t b, const std::string& what) {
  return checked_size_op(a, b, what, " x ", [](int64_t x, int64_t y, int64_t* o) { return __builtin_mul_overflow(x, y, o); });
}

Result<int64_t> checked_add(int64_t a, int64_t b, const std::string& what) {
  return checked_size_op(a, b, what, " + ", [](int64_t x, int64_t y, int64_t* o) { return __builtin_add_overflow(x, y, o); });
}

Result<int64_t> checked_product(std::initializer_list<int64_t> factors, int64_t limit, const std::string& what) {
  int64_t p = 1;
  std::string shown;
  for (int64_t f : factors) shown += (shown.empty() ? "" : " x ") + std::to_string(f);
  for (int64_t f : factors) {
    auto next = checked_mul(p, f, what + " (" + shown + ")");
    if (!next.ok()) return next.status();
    p = *next;
  }
  if (p > limit)
    return Status::InvalidArgument(what + ": " + shown + " = " + std::to_string(p) + " exceeds the limit of " +
                                   std::to_string(limit));
  return p;
}

Status check_range(int64_t v, IntRange range, const std::string& what) {
  if (v < range.min || v > range.max)
    return Status::InvalidArgument(what + " is " + std::to_string(v) + ", expected an integer in [" +
                                   std::to_string(range.min) + ", " + std::to_string(range.max) + "]");
  return Status();
}

Status check_range(double v, double min, double max, const std::string& what) {
  if (!std::isfinite(v) || v < min || v > max)
    return Status::InvalidArgument(what + " is " + number(v) + ", expected a finite number in [" + number(min) +
                                   ", " + number(max) + "]");
  return Status();
}

Result<int64_t> parse_int(std::string_view text, IntRange range, const std::string& what) {
  const std::string expected = ", expected a decimal integer in [" + std::to_string(range.min) + ", " +
                               std::to_string(range.max) + "]";
  const size_t sign = !text.empty() && text[0] == '-' ? 1 : 0;
  const size_t digits = text.size() - sign;
  bool ok = digits >= 1 && digits <= 19;
  for (size_t i = sign; ok && i < text.size(); ++i) ok = text[i] >= '0' && text[i] <= '9';
  int64_t v = 0;
  if (ok) {
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    ok = ec == std::errc() && end == text.data() + text.size();
  }
  if (!ok || v < range.min || v > range.max) return Status::InvalidArgument(what + " is " + quoted(text) + expected);
  return v;
}

Result<uint64_t> parse_uint64(std::string_view text, const std::string& what) {
  const std::string expected = ", expected a decimal integer in [0, " +
                               std::to_string(std::numeric_limits<uint64_t>::max()) + "]";
  bool ok = !text.empty() && text.size() <= 20;
  for (char c : text) ok = ok && c >= '0' && c <= '9';
  uint64_t v = 0;
  if (ok) {
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    ok = ec == std::errc() && end == text.data() + text.size();
  }
  if (!ok) return Status::InvalidArgument(what + " is " + quoted(text) + expected);
  return v;
}

Result<double> parse_double(std::string_view text, double min, double max, const std::string& what) {
  const std::string expected = ", expected a finite decimal number in [" + number(min) + ", " + number(max) + "]";
  bool ok = !text.empty() && text.size() <= 64;
  for (char c : text) ok = ok && ((c >= '0' && c <= '9') || c == '.' || c == '-' || c == '+' || c == 'e' || c == 'E');
  double v = 0;
  if (ok) {
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    ok = ec == std::errc() && end == text.data() + text.size();
  }
  if (!ok || !std::isfinite(v) || v < min || v > max) return Status::InvalidArgument(what + " is " + quoted(text) + expected);
  return v;
}

}  // namespace klinear
