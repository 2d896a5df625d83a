// Python's json.dumps (see py_json.h).
#include "chat/py_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

namespace klinear {

void py_dump_string(std::string_view s, std::string& out) {
  out += '"';
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

namespace {

// Python's repr(float): the shortest round-trip digits, positional when the decimal point falls
// in (-4, 16], else d.ddde±XX.
std::string py_float_repr(double d) {
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view s(buf, res.ptr - buf);
  std::string out;
  if (s.front() == '-') {
    out += '-';
    s.remove_prefix(1);
  }
  size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e))
    if (c != '.') digits += c;
  int exp10 = 0;
  std::from_chars(s.data() + e + 1 + (s[e + 1] == '+'), s.data() + s.size(), exp10);
  int decpt = exp10 + 1;
  int ndigits = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= ndigits) {
      out += digits + std::string(decpt - ndigits, '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out += digits[0];
    if (ndigits > 1) {  // appended in two steps: GCC 12 warns (-Wrestrict, a false positive) on "." + substr
      out += '.';
      out.append(digits, 1);
    }
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += eb;
  }
  return out;
}

void py_dump(const OrderedJson& v, const PyJsonStyle& style, std::string& out) {
  switch (v.type()) {
    case OrderedJson::value_t::null: out += "null"; return;
    case OrderedJson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; return;
    case OrderedJson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); return;
    case OrderedJson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); return;
    case OrderedJson::value_t::number_float: out += py_float_repr(v.get<double>()); return;
    case OrderedJson::value_t::string: py_dump_string(v.get_ref<const std::string&>(), out); return;
    case OrderedJson::value_t::array: {
      out += '[';
      bool first = true;
      for (const OrderedJson& e : v) {
        if (!first) out += style.item_separator;
        first = false;
        py_dump(e, style, out);
      }
      out += ']';
      return;
    }
    case OrderedJson::value_t::object: {
      std::vector<std::pair<const std::string*, const OrderedJson*>> items;
      for (const auto& [key, value] : v.items()) items.emplace_back(&key, &value);
      // UTF-8 byte order is code point order, which is how Python sorts str keys.
      if (style.sort_keys)
        std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return *a.first < *b.first; });
      out += '{';
      bool first = true;
      for (const auto& [key, value] : items) {
        if (!first) out += style.item_separator;
        first = false;
        py_dump_string(*key, out);
        out += style.key_separator;
        py_dump(*value, style, out);
      }
      out += '}';
      return;
    }
    default: out += "null"; return;  // binary / discarded values cannot come from parsed text
  }
}

}  // namespace

std::string py_dumps(const OrderedJson& v, const PyJsonStyle& style) {
  std::string out;
  py_dump(v, style, out);
  return out;
}

}  // namespace klinear
