// Checked arithmetic and number parsing for every size or count that comes from outside
// (config.json, safetensors headers, tokenizer files, the command line, later HTTP requests).
//
// Decision: one place. A product or sum that would leave int64 (or a caller's bound) is an
// InvalidArgument naming what was being computed, never a wrapped value; a number in text is
// accepted only as plain decimal digits (an optional '-' where negatives are allowed) within the
// caller's range, never with std::stoll's exceptions or silent wrapping.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "core/status.h"

namespace klinear {

// a * b, or InvalidArgument "`what`: a x b overflows a 64-bit size". Negative factors are
// InvalidArgument too: sizes are never negative.
Result<int64_t> checked_mul(int64_t a, int64_t b, const std::string& what);
// a + b under the same rules.
Result<int64_t> checked_add(int64_t a, int64_t b, const std::string& what);
// The product of `factors`, each >= 0, that must also be <= `limit`; the message names `what`,
// the factors and the limit.
Result<int64_t> checked_product(std::initializer_list<int64_t> factors, int64_t limit, const std::string& what);

// An inclusive range for a parsed or configured integer.
struct IntRange {
  int64_t min;
  int64_t max;
};
// InvalidArgument "`what` is V, expected an integer in [min, max]" when `v` is outside `range`.
Status check_range(int64_t v, IntRange range, const std::string& what);
// The same for a floating-point value, which must also be finite: "expected a finite number in ...".
Status check_range(double v, double min, double max, const std::string& what);

// Parses decimal `text` (an optional leading '-', then 1..19 digits; no spaces, '+', hex or
// exponent) within `range`. Errors name `what`, the text and the allowed range.
Result<int64_t> parse_int(std::string_view text, IntRange range, const std::string& what);
// Parses an unsigned decimal up to UINT64_MAX (seeds); a '-' is an error, not a wrap.
Result<uint64_t> parse_uint64(std::string_view text, const std::string& what);
// Parses a finite decimal floating-point number (strtod syntax without hex, inf or nan) within
// [min, max].
Result<double> parse_double(std::string_view text, double min, double max, const std::string& what);

}  // namespace klinear
