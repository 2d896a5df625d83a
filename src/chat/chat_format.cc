// Chat formats rendered natively: Kimi K2 / Kimi Linear (mirrors the jinja chat_template of
// tokenizer_config.json line by line) and K3 (XTML, docs/DESIGN.md "Chat formats").
//
// Decision: JSON that the formats embed (tool declarations, tool-call argument values) is written
// by our own serializer that reproduces Python's json.dumps (separators, escapes, float repr,
// key order), because the K2 template's `tojson` is json.dumps and byte identity is the contract.
// To keep the caller's key order, tools and arguments are parsed with nlohmann's ordered_json.
#include "chat/chat_format.h"

#include "core/check.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <utility>

namespace klinear {

namespace {


// ---- Python json.dumps ------------------------------------------------------------------------

struct PyJsonStyle {
  const char* item_separator;
  const char* key_separator;
  bool sort_keys;
};
constexpr PyJsonStyle kPyDefault{", ", ": ", false};  // json.dumps defaults (transformers' tojson)
constexpr PyJsonStyle kPyCompactSorted{",", ":", true};  // K3: deep-sorted keys, compact

// json.dumps(s, ensure_ascii=False): escapes only '"', '\\' and control characters.
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
    if (ndigits > 1) out += "." + digits.substr(1);
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

std::string py_dumps(const OrderedJson& v, const PyJsonStyle& style) {
  std::string out;
  py_dump(v, style, out);
  return out;
}

// The tools array of `options`, or nullopt when there are none.
Result<std::optional<OrderedJson>> parse_tools(const ChatOptions& options) {
  if (options.tools_json.empty()) return std::optional<OrderedJson>{};
  KL_ASSIGN_OR_RETURN(OrderedJson tools, parse_ordered_json(options.tools_json, "tools_json"));
  if (!tools.is_array())
    return Status::InvalidArgument(std::string("tools_json: expected a JSON array, got ") + tools.type_name());
  if (tools.empty()) return std::optional<OrderedJson>{};
  return std::optional<OrderedJson>{std::move(tools)};
}

Status check_roles(const std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      return Status::InvalidArgument("messages[" + std::to_string(i) +
                                     "].role: expected one of system, user, assistant, tool; got '" + r + "'");
  }
  return Status();
}

// Collects segments; with `merge_text`, adjacent text is kept as one segment.
class SegmentWriter {
 public:
  explicit SegmentWriter(bool merge_text) : merge_text_(merge_text) {}
  void marker(std::string_view name) { segments_.push_back({SegmentKind::kMarker, std::string(name)}); }
  void text(std::string_view s) {
    if (s.empty()) return;
    if (merge_text_ && !segments_.empty() && segments_.back().kind == SegmentKind::kText) {
      segments_.back().text += s;
    } else {
      segments_.push_back({SegmentKind::kText, std::string(s)});
    }
  }
  std::vector<ChatSegment> take() { return std::move(segments_); }

 private:
  bool merge_text_;
  std::vector<ChatSegment> segments_;
};

// ---- Kimi K2 / Kimi Linear --------------------------------------------------------------------

// Each branch mirrors the template of tokenizer_config.json; comments quote what is surprising.
Result<std::vector<ChatSegment>> render_k2(const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  KL_ASSIGN_OR_RETURN(std::optional<OrderedJson> tools, parse_tools(options));
  SegmentWriter w(/*merge_text=*/true);
  if (tools) {
    w.marker("<|im_system|>");
    w.text("tool_declare");
    w.marker("<|im_middle|>");
    w.text(py_dumps(*tools, kPyDefault));
    w.marker("<|im_end|>");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (i == 0 && m.role != "system") {
      w.marker("<|im_system|>");
      w.text("system");
      w.marker("<|im_middle|>");
      w.text("You are a helpful assistant");
      w.marker("<|im_end|>");
    }
    if (m.role == "system") {
      w.marker("<|im_system|>");
      w.text("system");
    } else if (m.role == "user") {
      w.marker("<|im_user|>");
      w.text("user");
    } else if (m.role == "assistant") {
      w.marker("<|im_assistant|>");
      w.text("assistant");
    } else {
      w.marker("<|im_system|>");
      w.text("tool");
    }
    w.marker("<|im_middle|>");
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      w.text(m.content);
      w.marker("<|tool_calls_section_begin|>");
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        const ToolCall& call = m.tool_calls[k];
        w.marker("<|tool_call_begin|>");
        // The template ignores the OpenAI id: `'functions.' + func_name + ':' + loop.index0`.
        w.text("functions." + call.name + ":" + std::to_string(k));
        w.marker("<|tool_call_argument_begin|>");
        // `arguments | tojson` on the OpenAI string: a quoted JSON string, as the template does.
        std::string quoted;
        py_dump_string(call.arguments_json, quoted);
        w.text(quoted);
        w.marker("<|tool_call_end|>");
      }
      w.marker("<|tool_calls_section_end|>");
    } else if (m.role == "tool") {
      // The template text is `## Return of {{ id }}\n{{ content }}` where `\n` is a literal
      // backslash and 'n' (jinja does not unescape template text).
      w.text("## Return of " + m.tool_call_id + "\\n" + m.content);
    } else {
      w.text(m.content);
    }
    w.marker("<|im_end|>");
  }
  if (options.add_generation_prompt) {
    w.marker("<|im_assistant|>");
    w.text("assistant");
    w.marker("<|im_middle|>");
  }
  return w.take();
}

// ---- K3 (XTML) --------------------------------------------------------------------------------

using Attributes = std::vector<std::pair<std::string, std::string>>;

// XTML attribute values escape '&' and '"' (the K3 encoder's rule).
std::string escape_attribute(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '"') {
      out += "&quot;";
    } else {
      out += c;
    }
  }
  return out;
}

// `<|open|>tag key="value"...<|sep|>`, each attribute as the four text segments ` key`, `="`,
// value, `"`.
void k3_open(SegmentWriter& w, std::string_view tag, const Attributes& attrs = {}) {
  w.marker("<|open|>");
  w.text(tag);
  for (const auto& [key, value] : attrs) {
    w.text(" " + key);
    w.text("=\"");
    w.text(escape_attribute(value));
    w.text("\"");
  }
  w.marker("<|sep|>");
}

void k3_close(SegmentWriter& w, std::string_view tag) {
  w.marker("<|close|>");
  w.text(tag);
  w.marker("<|sep|>");
}

void k3_content(SegmentWriter& w, const ChatMessage& m) {
  if (m.content_parts.empty()) {
    w.text(m.content);
  } else {
    for (const std::string& part : m.content_parts) w.text(part);
  }
}

// A system message of one of the encoder's own types; `body` has no surrounding whitespace.
void k3_system(SegmentWriter& w, std::string_view type, std::string_view body) {
  k3_open(w, "message", {{"role", "system"}, {"type", std::string(type)}});
  w.text(body);
  k3_close(w, "message");
  w.marker("<|end_of_msg|>");
}

enum class ToolDeclaration { kInitial, kDynamic };

void k3_declare_tools(SegmentWriter& w, const OrderedJson& tools, ToolDeclaration kind) {
  std::string body = kind == ToolDeclaration::kInitial
                         ? "# Tools\nHere are the available tools, described in JSONSchema.\n\n"
                         : "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
                           "You have access to all existing and extended tools.\n"
                           "Here are the specs for the extended tools.\n\n";
  k3_system(w, "tool-declare", body + "```json\n" + py_dumps(tools, kPyCompactSorted) + "\n```");
}

const char* k3_type_name(const OrderedJson& v) {
  switch (v.type()) {
    case OrderedJson::value_t::null: return "null";
    case OrderedJson::value_t::boolean: return "boolean";
    case OrderedJson::value_t::string: return "string";
    case OrderedJson::value_t::array: return "array";
    case OrderedJson::value_t::object: return "object";
    default: return "number";
  }
}

// One `call`: an `argument` element per top-level argument (strings raw, other values as
// json.dumps), or a `json` element holding arguments that are not JSON; blank arguments are none.
Status k3_tool_call(SegmentWriter& w, const ToolCall& call, size_t index, const std::string& where) {
  OrderedJson args = OrderedJson::object();
  std::optional<std::string> raw;
  if (!is_python_blank(call.arguments_json)) {
    Result<OrderedJson> parsed = parse_ordered_json(call.arguments_json, where + ".arguments");
    if (!parsed.ok()) {
      raw = call.arguments_json;
    } else if (!parsed.value().is_object()) {
      return Status::InvalidArgument(where + ".arguments: expected a JSON object, got " + parsed.value().type_name());
    } else {
      args = std::move(parsed).value();
    }
  }
  k3_open(w, "call", {{"tool", call.name}, {"index", std::to_string(index)}});
  if (raw) {
    k3_open(w, "json", {{"type", "object"}});
    w.text(*raw);
    k3_close(w, "json");
  }
  for (const auto& [key, value] : args.items()) {
    k3_open(w, "argument", {{"key", key}, {"type", k3_type_name(value)}});
    w.text(value.is_string() ? value.get_ref<const std::string&>() : py_dumps(value, kPyDefault));
    k3_close(w, "argument");
  }
  k3_close(w, "call");
  return Status();
}

// The messages in rendering order: each run of consecutive tool results whose tool_call_ids all
// match calls of the latest assistant message is sorted (stably) by the 1-based position of the
// call, and each takes that call's name; a run with any unmatched result keeps its order.
struct OrderedMessage {
  size_t index;           // into the caller's messages
  std::string call_name;  // the matched call's name, or "" when unmatched
};

std::vector<OrderedMessage> k3_order(const std::vector<ChatMessage>& messages) {
  std::vector<OrderedMessage> out;
  std::map<std::string, std::pair<size_t, std::string>> calls;  // id -> (position, name); first id wins
  for (size_t i = 0; i < messages.size();) {
    const ChatMessage& m = messages[i];
    if (m.role != "tool") {
      if (m.role == "assistant") {
        calls.clear();
        for (size_t k = 0; k < m.tool_calls.size(); ++k)
          if (!m.tool_calls[k].id.empty()) calls.emplace(m.tool_calls[k].id, std::make_pair(k + 1, m.tool_calls[k].name));
      }
      out.push_back({i++, ""});
      continue;
    }
    size_t end = i;
    while (end < messages.size() && messages[end].role == "tool") ++end;
    std::vector<std::pair<size_t, OrderedMessage>> run;  // (call position, message)
    bool matched = true;
    for (size_t j = i; j < end; ++j) {
      auto it = messages[j].tool_call_id.empty() ? calls.end() : calls.find(messages[j].tool_call_id);
      if (it == calls.end()) {
        matched = false;
        break;
      }
      run.push_back({it->second.first, {j, it->second.second}});
    }
    if (matched) {
      std::stable_sort(run.begin(), run.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (auto& [position, om] : run) out.push_back(std::move(om));
    } else {
      for (size_t j = i; j < end; ++j) out.push_back({j, ""});
    }
    i = end;
  }
  return out;
}

const char* effort_name(ThinkingEffort e) {
  switch (e) {
    case ThinkingEffort::kLow: return "low";
    case ThinkingEffort::kHigh: return "high";
    case ThinkingEffort::kMax: return "max";
    case ThinkingEffort::kUnset: break;
  }
  KL_CHECK(false);
  return "";
}

constexpr const char* kRawJsonRule =
    "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.";

Result<std::vector<ChatSegment>> render_k3(const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  KL_ASSIGN_OR_RETURN(std::optional<OrderedJson> tools, parse_tools(options));
  SegmentWriter w(/*merge_text=*/false);
  if (tools) k3_declare_tools(w, *tools, ToolDeclaration::kInitial);
  if (options.thinking && options.thinking_effort != ThinkingEffort::kUnset)
    k3_system(w, "thinking-effort",
              std::string("`thinking_effort` guides on how much to think in your thinking channel (not including the "
                          "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
                          "Now the system is invoked with `thinking_effort=") +
                  effort_name(options.thinking_effort) + "`.");
  const ChatMessage* last_assistant = nullptr;
  size_t tool_index = 0;  // 1-based index of a tool result among those after the last assistant
  for (const OrderedMessage& om : k3_order(messages)) {
    const ChatMessage& m = messages[om.index];
    const std::string where = "messages[" + std::to_string(om.index) + "]";
    if (m.role == "system" && !m.tools_json.empty()) {
      KL_ASSIGN_OR_RETURN(OrderedJson declared, parse_ordered_json(m.tools_json, where + ".tools"));
      k3_declare_tools(w, declared, ToolDeclaration::kDynamic);
      continue;
    }
    Attributes attrs{{"role", m.role}};
    if (m.role == "tool") {
      ++tool_index;
      std::string tool = !om.call_name.empty() ? om.call_name : !m.tool.empty() ? m.tool : m.name;
      if (tool.empty() && last_assistant && tool_index <= last_assistant->tool_calls.size())
        tool = last_assistant->tool_calls[tool_index - 1].name;
      if (tool.empty())
        return Status::InvalidArgument(where + ": expected a tool name ('tool', 'name', a tool_call_id of the "
                                               "preceding assistant's calls, or a call at the same position), found none");
      attrs.emplace_back("tool", tool);
      attrs.emplace_back("index", std::to_string(tool_index));
    } else if (!m.name.empty()) {
      attrs.emplace_back("name", m.name);
    }
    k3_open(w, "message", attrs);
    if (m.role == "assistant") {
      last_assistant = &m;
      tool_index = 0;
      if (options.thinking) {
        k3_open(w, "think");
        if (!is_python_blank(m.reasoning)) w.text(m.reasoning);
        k3_close(w, "think");
      }
      k3_open(w, "response");
      k3_content(w, m);
      k3_close(w, "response");
      if (!m.tool_calls.empty()) {
        k3_open(w, "tools");
        for (size_t k = 0; k < m.tool_calls.size(); ++k)
          KL_RETURN_IF_ERROR(k3_tool_call(w, m.tool_calls[k], k + 1, where + ".tool_calls[" + std::to_string(k) + "]"));
        k3_close(w, "tools");
      }
    } else {
      k3_content(w, m);
    }
    k3_close(w, "message");
    w.marker("<|end_of_msg|>");
  }
  if (options.tool_choice == ToolChoice::kRequired)
    k3_system(w, "tool-choice",
              "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.");
  if (options.tool_choice == ToolChoice::kNone)
    k3_system(w, "tool-choice",
              "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.");
  const ResponseFormat& rf = options.response_format;
  if (rf.kind == ResponseFormat::Kind::kJsonObject)
    k3_system(w, "response-format",
              std::string("The system is invoked with `response_format=json_object`.\n") + kRawJsonRule);
  if (rf.kind == ResponseFormat::Kind::kJsonSchema) {
    KL_ASSIGN_OR_RETURN(OrderedJson schema, parse_ordered_json(rf.schema_json, "response_format schema"));
    k3_system(w, "response-format",
              std::string("The system is invoked with `response_format=json_schema`.\n") + kRawJsonRule +
                  "\nThe JSON data must match the following schema:\n```json\n" + py_dumps(schema, kPyCompactSorted) +
                  "\n```");
  }
  if (options.add_generation_prompt) {
    k3_open(w, "message", {{"role", "assistant"}});
    k3_open(w, options.thinking ? "think" : "response");
  }
  return w.take();
}

}  // namespace

Result<ThinkingEffort> parse_thinking_effort(std::string_view name) {
  if (name == "low") return ThinkingEffort::kLow;
  if (name == "high") return ThinkingEffort::kHigh;
  if (name == "max") return ThinkingEffort::kMax;
  return Status::InvalidArgument("thinking effort: expected one of low, high, max; got '" + std::string(name) + "'");
}

Result<ToolChoice> parse_tool_choice(std::string_view name) {
  if (name == "auto") return ToolChoice::kAuto;
  if (name == "required") return ToolChoice::kRequired;
  if (name == "none") return ToolChoice::kNone;
  return Status::InvalidArgument("tool choice: expected one of auto, required, none; got '" + std::string(name) + "'");
}

Result<ResponseFormat> parse_response_format(const OrderedJson& rf) {
  const OrderedJson* type = &rf;
  if (rf.is_object()) {
    auto it = rf.find("type");
    if (it == rf.end()) return Status::InvalidArgument("response_format: expected a field 'type'");
    type = &*it;
  }
  if (!type->is_string())
    return Status::InvalidArgument(std::string("response_format.type: expected a string, got ") + type->type_name());
  const std::string& name = type->get_ref<const std::string&>();
  ResponseFormat out;
  if (name == "text") return out;
  if (name == "json_object") {
    out.kind = ResponseFormat::Kind::kJsonObject;
    return out;
  }
  if (name != "json_schema")
    return Status::InvalidArgument("response_format.type: expected one of text, json_object, json_schema; got '" +
                                   name + "'");
  out.kind = ResponseFormat::Kind::kJsonSchema;
  OrderedJson schema;  // null when absent
  if (rf.is_object() && rf.contains("json_schema") && !rf["json_schema"].is_null()) {
    const OrderedJson& holder = rf["json_schema"];
    schema = holder;
    if (holder.is_object()) {
      if (holder.contains("schema")) {
        schema = holder["schema"];
      } else if (holder.contains("json_schema")) {
        schema = holder["json_schema"];
      }
    }
  }
  out.schema_json = schema.dump();
  return out;
}

Result<std::vector<ChatSegment>> render_chat_segments(ChatFormat format, const std::vector<ChatMessage>& messages,
                                                      const ChatOptions& options) {
  KL_RETURN_IF_ERROR(check_roles(messages));
  return format == ChatFormat::kKimiK2 ? render_k2(messages, options) : render_k3(messages, options);
}

Result<std::string> render_chat(ChatFormat format, const std::vector<ChatMessage>& messages,
                                const ChatOptions& options) {
  KL_ASSIGN_OR_RETURN(std::vector<ChatSegment> segments, render_chat_segments(format, messages, options));
  std::string out;
  for (const ChatSegment& s : segments) out += s.text;
  return out;
}

Result<std::vector<int32_t>> encode_chat(const Tokenizer& tokenizer, const std::vector<ChatSegment>& segments) {
  std::vector<int32_t> ids;
  for (const ChatSegment& s : segments) {
    if (s.kind == SegmentKind::kText) {
      std::vector<int32_t> part = tokenizer.encode(s.text, Tokenizer::Specials::kAsText);
      ids.insert(ids.end(), part.begin(), part.end());
      continue;
    }
    std::optional<int32_t> id = tokenizer.special_id(s.text);
    if (!id)
      return Status::NotFound("chat marker '" + s.text +
                              "' is not a special token of this tokenizer (expected the tokenizer that matches the "
                              "chat format; K3 markers need K3's tokenizer_config.json)");
    ids.push_back(*id);
  }
  return ids;
}

Result<RenderedChat> render_chat_ids(const Tokenizer& tokenizer, ChatFormat format,
                                     const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  KL_ASSIGN_OR_RETURN(std::vector<ChatSegment> segments, render_chat_segments(format, messages, options));
  RenderedChat out;
  KL_ASSIGN_OR_RETURN(out.ids, encode_chat(tokenizer, segments));
  out.text = tokenizer.decode(out.ids);
  return out;
}

namespace {

// A string field of an OpenAI message object: nullopt when absent or null.
Result<std::optional<std::string>> opt_string(const OrderedJson& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::optional<std::string>{};
  if (!it->is_string())
    return Status::InvalidArgument(where + "." + key + ": expected a string, got " + it->type_name());
  return std::optional<std::string>{it->get<std::string>()};
}

// OpenAI content: a string, null, or a list of text parts (returned one by one in `parts`).
Status parse_content(const OrderedJson& m, const std::string& where, ChatMessage& msg) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return Status();
  if (it->is_string()) {
    msg.content = it->get<std::string>();
    return Status();
  }
  if (!it->is_array())
    return Status::InvalidArgument(where + ".content: expected a string, null or a list of parts, got " +
                                   it->type_name());
  for (size_t j = 0; j < it->size(); ++j) {
    const OrderedJson& part = (*it)[j];
    const std::string pw = where + ".content[" + std::to_string(j) + "]";
    if (!part.is_object()) return Status::InvalidArgument(pw + ": expected an object, got " + part.type_name());
    KL_ASSIGN_OR_RETURN(std::optional<std::string> type, opt_string(part, "type", pw));
    if (type && *type != "text")
      return Status::NotSupported(pw + ": part type '" + *type + "' is not supported (the model reads text only)");
    KL_ASSIGN_OR_RETURN(std::optional<std::string> part_text, opt_string(part, "text", pw));
    if (!part_text) return Status::InvalidArgument(pw + ": expected a string field 'text'");
    msg.content += *part_text;
    msg.content_parts.push_back(std::move(*part_text));
  }
  return Status();
}

Result<std::vector<ToolCall>> parse_tool_calls(const OrderedJson& m, const std::string& where) {
  std::vector<ToolCall> calls;
  auto it = m.find("tool_calls");
  if (it == m.end() || it->is_null()) return calls;
  if (!it->is_array())
    return Status::InvalidArgument(where + ".tool_calls: expected an array, got " + std::string(it->type_name()));
  for (size_t k = 0; k < it->size(); ++k) {
    const OrderedJson& c = (*it)[k];
    const std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
    if (!c.is_object()) return Status::InvalidArgument(cw + ": expected an object, got " + c.type_name());
    ToolCall call;
    KL_ASSIGN_OR_RETURN(std::optional<std::string> id, opt_string(c, "id", cw));
    call.id = id.value_or("");
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object())
      return Status::InvalidArgument(cw + ": expected an object field 'function'");
    KL_ASSIGN_OR_RETURN(std::optional<std::string> name, opt_string(*fn, "name", cw + ".function"));
    if (!name) return Status::InvalidArgument(cw + ".function: expected a string field 'name'");
    call.name = *name;
    auto args = fn->find("arguments");
    if (args == fn->end() || args->is_null()) {
      call.arguments_json = "{}";
    } else if (args->is_string()) {
      call.arguments_json = args->get<std::string>();
    } else if (args->is_object()) {
      call.arguments_json = args->dump();
    } else {
      return Status::InvalidArgument(cw + ".function.arguments: expected a string or an object, got " +
                                     args->type_name());
    }
    calls.push_back(std::move(call));
  }
  return calls;
}

}  // namespace

Result<std::vector<ChatMessage>> parse_chat_messages(const OrderedJson& openai_messages) {
  if (!openai_messages.is_array())
    return Status::InvalidArgument(std::string("messages: expected an array, got ") + openai_messages.type_name());
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < openai_messages.size(); ++i) {
    const OrderedJson& m = openai_messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return Status::InvalidArgument(where + ": expected an object, got " + m.type_name());
    ChatMessage msg;
    KL_ASSIGN_OR_RETURN(std::optional<std::string> role, opt_string(m, "role", where));
    if (!role) return Status::InvalidArgument(where + ": expected a string field 'role'");
    msg.role = *role;
    KL_RETURN_IF_ERROR(parse_content(m, where, msg));
    KL_ASSIGN_OR_RETURN(msg.tool_calls, parse_tool_calls(m, where));
    KL_ASSIGN_OR_RETURN(std::optional<std::string> call_id, opt_string(m, "tool_call_id", where));
    msg.tool_call_id = call_id.value_or("");
    KL_ASSIGN_OR_RETURN(std::optional<std::string> name, opt_string(m, "name", where));
    msg.name = name.value_or("");
    KL_ASSIGN_OR_RETURN(std::optional<std::string> tool, opt_string(m, "tool", where));
    msg.tool = tool.value_or("");
    KL_ASSIGN_OR_RETURN(std::optional<std::string> reasoning_content, opt_string(m, "reasoning_content", where));
    KL_ASSIGN_OR_RETURN(std::optional<std::string> reasoning, opt_string(m, "reasoning", where));
    msg.reasoning = reasoning_content.value_or("").empty() ? reasoning.value_or("") : *reasoning_content;
    auto tools = m.find("tools");
    if (tools != m.end() && !tools->is_null()) {
      if (!tools->is_array())
        return Status::InvalidArgument(where + ".tools: expected an array, got " + tools->type_name());
      if (!tools->empty()) msg.tools_json = tools->dump();
    }
    out.push_back(std::move(msg));
  }
  KL_RETURN_IF_ERROR(check_roles(out));
  return out;
}

Result<std::vector<ChatMessage>> parse_chat_messages(const Json& openai_messages) {
  return parse_chat_messages(OrderedJson::parse(openai_messages.dump()));
}

std::string chat_stop_marker(ChatFormat format) {
  return format == ChatFormat::kKimiK2 ? "<|im_end|>" : "<|end_of_msg|>";
}

}  // namespace klinear
