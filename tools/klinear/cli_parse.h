// Parsing and range-checking of the CLI's numeric input: token-id lists and numeric flags.
// Kept free of the model and runtime headers so that fuzz/cli_numbers_fuzz.cc can link it alone.
//
// Decision: every number on the command line goes through core/checked.h (decimal only, range
// checked, no wrapping): CLI11's own conversion would accept "-1" for an unsigned seed as
// 2^64 - 1 and "0x10" as 16. A flag's value is checked when the command line is parsed, before
// any file is read, so a bad flag fails at once with the flag, the value and the allowed range.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/checked.h"
#include "core/status.h"

namespace klinear::cli {

// "1,2,3", "1, 2, 3" or "[1, 2, 3]" (tokenize's own output) → ids; "" or "[]" → no ids.
// InvalidArgument naming `flag`, the item and its position otherwise.
inline Result<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& flag) {
  auto trim = [](std::string v) {
    const size_t b = v.find_first_not_of(" \t\r\n"), e = v.find_last_not_of(" \t\r\n");
    return b == std::string::npos ? std::string() : v.substr(b, e - b + 1);
  };
  std::string s = trim(text);
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') s = trim(s.substr(1, s.size() - 2));
  std::vector<int32_t> ids;
  if (s.empty()) return ids;
  size_t pos = 0;
  for (size_t item = 0;; ++item) {
    const size_t comma = s.find(',', pos);
    const std::string field = trim(s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
    auto v = parse_int(field, IntRange{0, INT32_MAX}, flag + ": item " + std::to_string(item));
    if (!v.ok()) return Status::InvalidArgument(v.status().message() + " (a token id; the list looks like 1,2,3)");
    ids.push_back(static_cast<int32_t>(*v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

// CLI11 validators running the checked parsers on a flag's text. The flag name is prefixed by
// CLI11 ("--seed: value is '-1', expected a decimal integer in [0, 18446744073709551615]").
inline CLI::Validator int_in(IntRange range) {
  return CLI::Validator(
      [range](std::string& text) {
        auto v = parse_int(text, range, "value");
        return v.ok() ? std::string() : v.status().message();
      },
      "INT in [" + std::to_string(range.min) + ", " + std::to_string(range.max) + "]");
}

inline CLI::Validator uint64_any() {
  return CLI::Validator(
      [](std::string& text) {
        auto v = parse_uint64(text, "value");
        return v.ok() ? std::string() : v.status().message();
      },
      "UINT64");
}

// A validator for a flag naming one of a few choices, running the same `parse` (text -> Result<T>)
// that later converts it, so the choices are written once: "--device: device 'gpu' is not one of:
// cpu, cuda" when the command line is parsed, before anything loads.
template <typename Parse>
CLI::Validator parsed_by(Parse parse, const std::string& choices) {
  return CLI::Validator(
      [parse](std::string& text) {
        auto v = parse(text);
        return v.ok() ? std::string() : v.status().message();
      },
      choices);
}

inline CLI::Validator number_in(double min, double max) {
  return CLI::Validator(
      [min, max](std::string& text) {
        auto v = parse_double(text, min, max, "value");
        return v.ok() ? std::string() : v.status().message();
      },
      "NUMBER");
}

}  // namespace klinear::cli
