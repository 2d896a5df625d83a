// Python's json.dumps reproduced: the JSON text the chat formats embed (tool declarations,
// tool-call argument values, response schemas).
//
// Decision: this is our own serializer, not nlohmann's dump, because the K2 template's `tojson` is
// json.dumps and byte identity is the contract: separators, escapes, float repr and key order all
// follow Python. Callers parse with nlohmann's ordered_json to keep the caller's key order.
#pragma once

#include <string>
#include <string_view>

#include "io/json.h"

namespace klinear {

struct PyJsonStyle {
  const char* item_separator;
  const char* key_separator;
  bool sort_keys;
};
constexpr PyJsonStyle kPyDefault{", ", ": ", false};  // json.dumps defaults (transformers' tojson)
constexpr PyJsonStyle kPyCompactSorted{",", ":", true};  // K3: deep-sorted keys, compact

// json.dumps(s, ensure_ascii=False) of a string, appended to `out`: escapes only '"', '\\' and
// control characters.
void py_dump_string(std::string_view s, std::string& out);

// json.dumps(v, ensure_ascii=False) with `style`'s separators and key order.
std::string py_dumps(const OrderedJson& v, const PyJsonStyle& style);

}  // namespace klinear
