// Fuzzes the CLI's numeric parsers (cli_parse.h, core/checked.h): accepted values must be in
// range; everything else is a Status.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "cli_parse.h"
#include "core/check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (auto ids = klinear::cli::parse_id_list(text, "--ids"); ids.ok())
    for (int32_t id : *ids) KL_CHECK(id >= 0, "negative id accepted");
  if (auto v = klinear::parse_int(text, {-1000, 1 << 30}, "--max-tokens"); v.ok()) {
    KL_CHECK(*v >= -1000 && *v <= (1 << 30), "out of range");
  }
  if (auto v = klinear::parse_uint64(text, "--seed"); v.ok())
    KL_CHECK(text.find('-') == std::string::npos, "negative seed accepted");
  if (auto v = klinear::parse_double(text, 0, 1, "--top-p"); v.ok())
    KL_CHECK(std::isfinite(*v) && *v >= 0 && *v <= 1, "out of range");
  for (const auto& check : {klinear::cli::int_in({0, 100}), klinear::cli::uint64_any(), klinear::cli::number_in(0, 1)}) {
    std::string copy = text;
    (void)check(copy);
  }
  return 0;
}
