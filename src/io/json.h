// The one wrapper around nlohmann-json: parsing returns a Result instead of throwing, and typed
// getters name the field and the expected type when a document does not fit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "io/file.h"

namespace klinear {

using Json = nlohmann::json;
// Keeps object keys in document order (chat templates must re-serialize tools byte for byte).
using OrderedJson = nlohmann::ordered_json;

// Arrays and objects nested deeper than this are refused before parsing (InvalidArgument naming
// the limit): a parsed value is walked recursively (dump, comparison, the chat formats), and a
// request of 100k nested brackets would otherwise overflow the stack.
inline constexpr int kMaxJsonDepth = 512;

// Parses `text`; `what` names the document in error messages ("config.json"). Running out of
// memory partway is ResourceExhausted, the partial document freed (see release_json).
Result<Json> parse_json(std::string_view text, const std::string& what);
Result<OrderedJson> parse_ordered_json(std::string_view text, const std::string& what);
// Reads (a regular file of at most kMaxJsonFileBytes, see io/file.h) and parses a whole file.
Result<Json> read_json_file(const std::string& path);
// Frees `j`'s contents without allocating, leaving it empty. nlohmann's destructor first moves a
// container's children into a vector as large as the container (so that deep documents do not
// recurse), and when memory has run out that allocation throws from a destructor, which ends the
// process. A server request's body is released this way (ReleaseJsonOnExit) so that a failed
// allocation fails the request alone. Recurses once per level (parsed documents: kMaxJsonDepth).
void release_json(Json& j) noexcept;
struct ReleaseJsonOnExit {
  Json& doc;
  ~ReleaseJsonOnExit() { release_json(doc); }
};

// A value for an error message: its JSON text, cut after 80 bytes (an error never echoes a whole
// request).
std::string json_excerpt(const Json& v);

// Typed field access. `where` names the document or object for the message. A field that is
// absent or null yields `fallback` (the optional getters) or NotFound (the required ones); a
// field of the wrong type is InvalidArgument naming the field, the expected and the actual type.
Result<int64_t> json_int(const Json& obj, const std::string& key, const std::string& where);
Result<std::optional<int64_t>> json_opt_int(const Json& obj, const std::string& key, const std::string& where);
Result<std::optional<double>> json_opt_number(const Json& obj, const std::string& key, const std::string& where);
Result<std::optional<bool>> json_opt_bool(const Json& obj, const std::string& key, const std::string& where);
Result<std::optional<std::string>> json_opt_string(const Json& obj, const std::string& key, const std::string& where);
Result<std::optional<std::vector<int64_t>>> json_opt_int_list(const Json& obj, const std::string& key,
                                                             const std::string& where);

}  // namespace klinear
