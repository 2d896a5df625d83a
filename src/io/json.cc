#include "io/json.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <new>

namespace klinear {

namespace {
// The deepest nesting of arrays and objects in `text`, counting brackets outside strings.
Status check_depth(std::string_view text, const std::string& what) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        return Status::InvalidArgument(what + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return Status();
}
}  // namespace

std::string json_excerpt(const Json& v) {
  constexpr size_t kMax = 80;
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > kMax) s = s.substr(0, kMax) + "... (" + std::to_string(s.size()) + " bytes)";
  return s;
}

namespace {
template <class J>
void release(J& j) noexcept {
  if (j.is_array()) {
    auto& a = j.template get_ref<typename J::array_t&>();
    for (J& e : a) release(e);
    a.clear();
  } else if (j.is_object()) {
    auto& o = j.template get_ref<typename J::object_t&>();
    for (auto& kv : o) release(kv.second);
    o.clear();
  }
}

// nlohmann's own parse keeps the document it builds to itself, so a std::bad_alloc partway would
// destroy it with the allocating destructor (see release_json); here the document is ours.
template <class J>
Result<J> parse_as(std::string_view text, const std::string& what) {
  KL_RETURN_IF_ERROR(check_depth(text, what));
  J doc;
  try {
    nlohmann::detail::json_sax_dom_parser<J> builder(doc);
    J::sax_parse(text.begin(), text.end(), &builder);
    return doc;
  } catch (const typename J::exception& e) {
    release(doc);
    return Status::InvalidArgument(what + ": invalid JSON: " + e.what());
  } catch (const std::bad_alloc&) {
    release(doc);
    return Status::ResourceExhausted(what + ": out of memory parsing " + std::to_string(text.size()) + " bytes of JSON");
  }
}
}  // namespace

void release_json(Json& j) noexcept { release(j); }

Result<Json> parse_json(std::string_view text, const std::string& what) { return parse_as<Json>(text, what); }

Result<OrderedJson> parse_ordered_json(std::string_view text, const std::string& what) {
  return parse_as<OrderedJson>(text, what);
}

Result<Json> read_json_file(const std::string& path) {
  KL_ASSIGN_OR_RETURN(std::string text, read_regular_file(path, kMaxJsonFileBytes));
  return parse_json(text, path);
}

namespace {
const Json* find_field(const Json& obj, const std::string& key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}
Status wrong_type(const std::string& where, const std::string& key, const char* expected, const Json& v) {
  return Status::InvalidArgument(where + ": field '" + key + "' must be " + expected + ", got " +
                                 v.type_name() + " " + json_excerpt(v));
}
}  // namespace

// An integer JSON value that fits int64_t (an unsigned one above INT64_MAX would wrap to a negative).
bool is_int64(const Json& v) {
  return v.is_number_integer() &&
         (!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
}

Result<std::optional<int64_t>> json_opt_int(const Json& obj, const std::string& key, const std::string& where) {
  const Json* v = find_field(obj, key);
  if (!v) return std::optional<int64_t>{};
  if (is_int64(*v)) return std::optional<int64_t>{v->get<int64_t>()};
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d >= -0x1p63 && d < 0x1p63 && d == std::trunc(d))
      return std::optional<int64_t>{static_cast<int64_t>(d)};
  }
  return wrong_type(where, key, "an integer", *v);
}

Result<int64_t> json_int(const Json& obj, const std::string& key, const std::string& where) {
  KL_ASSIGN_OR_RETURN(auto v, json_opt_int(obj, key, where));
  if (!v) return Status::NotFound(where + ": required field '" + key + "' is missing");
  return *v;
}

Result<std::optional<double>> json_opt_number(const Json& obj, const std::string& key, const std::string& where) {
  const Json* v = find_field(obj, key);
  if (!v) return std::optional<double>{};
  if (!v->is_number()) return wrong_type(where, key, "a number", *v);
  return std::optional<double>{v->get<double>()};
}

Result<std::optional<bool>> json_opt_bool(const Json& obj, const std::string& key, const std::string& where) {
  const Json* v = find_field(obj, key);
  if (!v) return std::optional<bool>{};
  if (!v->is_boolean()) return wrong_type(where, key, "a boolean", *v);
  return std::optional<bool>{v->get<bool>()};
}

Result<std::optional<std::string>> json_opt_string(const Json& obj, const std::string& key,
                                                   const std::string& where) {
  const Json* v = find_field(obj, key);
  if (!v) return std::optional<std::string>{};
  if (!v->is_string()) return wrong_type(where, key, "a string", *v);
  return std::optional<std::string>{v->get<std::string>()};
}

Result<std::optional<std::vector<int64_t>>> json_opt_int_list(const Json& obj, const std::string& key,
                                                             const std::string& where) {
  const Json* v = find_field(obj, key);
  if (!v) return std::optional<std::vector<int64_t>>{};
  if (!v->is_array()) return wrong_type(where, key, "a list of integers", *v);
  std::vector<int64_t> out;
  for (const Json& e : *v) {
    if (!is_int64(e)) return wrong_type(where, key, "a list of integers", *v);
    out.push_back(e.get<int64_t>());
  }
  return std::optional<std::vector<int64_t>>{std::move(out)};
}

}  // namespace klinear
