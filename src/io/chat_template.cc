// Chat formats rendered natively: Kimi K2 / Kimi Linear (mirrors the jinja chat_template of
// tokenizer_config.json line by line) and K3 (XTML, docs CHAT-FORMATS.md).
//
// Decision: JSON that the formats embed (tool declarations, tool-call argument values) is written
// by our own serializer that reproduces Python's json.dumps (separators, escapes, float repr,
// key order), because the K2 template's `tojson` is json.dumps and byte identity is the contract.
// To keep the caller's key order, tools and arguments are parsed with nlohmann's ordered_json.
#include "io/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
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

void k3_open(SegmentWriter& w, std::string_view tag, const Attributes& attrs = {}) {
  w.marker("<|open|>");
  w.text(tag);
  for (const auto& [key, value] : attrs) {
    w.text(" " + key + "=\"");
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

// `<|open|>tools<|sep|>` ... one `call` per tool call, one `argument` per top-level argument
// (strings verbatim, other values as json.dumps) ... `<|close|>tools<|sep|>`.
Status k3_tool_calls(SegmentWriter& w, const ChatMessage& m, size_t message_index) {
  k3_open(w, "tools");
  for (size_t k = 0; k < m.tool_calls.size(); ++k) {
    const ToolCall& call = m.tool_calls[k];
    const std::string where = "messages[" + std::to_string(message_index) + "].tool_calls[" + std::to_string(k) + "]";
    OrderedJson args = OrderedJson::object();
    if (!call.arguments_json.empty()) {
      KL_ASSIGN_OR_RETURN(args, parse_ordered_json(call.arguments_json, where + ".arguments"));
    }
    if (!args.is_object())
      return Status::InvalidArgument(where + ".arguments: expected a JSON object, got " + args.type_name());
    k3_open(w, "call", {{"tool", call.name}, {"index", std::to_string(k + 1)}});
    for (const auto& [key, value] : args.items()) {
      k3_open(w, "argument", {{"key", key}, {"type", k3_type_name(value)}});
      w.text(value.is_string() ? value.get<std::string>() : py_dumps(value, kPyDefault));
      k3_close(w, "argument");
    }
    k3_close(w, "call");
  }
  k3_close(w, "tools");
  return Status();
}

Result<std::vector<ChatSegment>> render_k3(const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  KL_ASSIGN_OR_RETURN(std::optional<OrderedJson> tools, parse_tools(options));
  SegmentWriter w(/*merge_text=*/false);
  if (tools) {
    k3_open(w, "message", {{"role", "system"}, {"type", "tool-declare"}});
    w.text("# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n" +
           py_dumps(*tools, kPyCompactSorted) + "\n```");
    k3_close(w, "message");
    w.marker("<|end_of_msg|>");
  }
  const ChatMessage* last_assistant = nullptr;
  size_t tool_index = 0;  // 1-based index of a tool result among those after the last assistant
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    Attributes attrs{{"role", m.role}};
    if (m.role == "tool") {
      ++tool_index;
      std::string tool = m.name;
      if (tool.empty() && last_assistant && tool_index <= last_assistant->tool_calls.size())
        tool = last_assistant->tool_calls[tool_index - 1].name;
      if (tool.empty())
        return Status::InvalidArgument("messages[" + std::to_string(i) +
                                       "]: expected a tool name ('name', or a preceding assistant tool call in the "
                                       "same position), found none");
      attrs.emplace_back("tool", tool);
      attrs.emplace_back("index", std::to_string(tool_index));
    } else if (!m.name.empty()) {
      attrs.emplace_back("name", m.name);
    }
    k3_open(w, "message", attrs);
    if (m.role == "assistant") {
      // Earlier thinking is not part of the history: only the response (and tool calls).
      last_assistant = &m;
      tool_index = 0;
      k3_open(w, "response");
      w.text(m.content);
      k3_close(w, "response");
      if (!m.tool_calls.empty()) KL_RETURN_IF_ERROR(k3_tool_calls(w, m, i));
    } else {
      w.text(m.content);
    }
    k3_close(w, "message");
    w.marker("<|end_of_msg|>");
  }
  if (options.add_generation_prompt) {
    k3_open(w, "message", {{"role", "assistant"}});
    k3_open(w, options.thinking ? "think" : "response");
  }
  return w.take();
}

}  // namespace

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

namespace {

// OpenAI content: a string, null, or a list of text parts.
Result<std::string> parse_content(const Json& m, const std::string& where) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array())
    return Status::InvalidArgument(where + ".content: expected a string, null or a list of parts, got " +
                                   it->type_name());
  std::string text;
  for (size_t j = 0; j < it->size(); ++j) {
    const Json& part = (*it)[j];
    const std::string pw = where + ".content[" + std::to_string(j) + "]";
    if (!part.is_object()) return Status::InvalidArgument(pw + ": expected an object, got " + part.type_name());
    KL_ASSIGN_OR_RETURN(std::optional<std::string> type, json_opt_string(part, "type", pw));
    if (type && *type != "text")
      return Status::NotSupported(pw + ": part type '" + *type + "' is not supported (the model reads text only)");
    KL_ASSIGN_OR_RETURN(std::optional<std::string> part_text, json_opt_string(part, "text", pw));
    if (!part_text) return Status::InvalidArgument(pw + ": expected a string field 'text'");
    text += *part_text;
  }
  return text;
}

Result<std::vector<ToolCall>> parse_tool_calls(const Json& m, const std::string& where) {
  std::vector<ToolCall> calls;
  auto it = m.find("tool_calls");
  if (it == m.end() || it->is_null()) return calls;
  if (!it->is_array())
    return Status::InvalidArgument(where + ".tool_calls: expected an array, got " + std::string(it->type_name()));
  for (size_t k = 0; k < it->size(); ++k) {
    const Json& c = (*it)[k];
    const std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
    if (!c.is_object()) return Status::InvalidArgument(cw + ": expected an object, got " + c.type_name());
    ToolCall call;
    KL_ASSIGN_OR_RETURN(std::optional<std::string> id, json_opt_string(c, "id", cw));
    call.id = id.value_or("");
    auto fn = c.find("function");
    if (fn == c.end() || !fn->is_object())
      return Status::InvalidArgument(cw + ": expected an object field 'function'");
    KL_ASSIGN_OR_RETURN(std::optional<std::string> name, json_opt_string(*fn, "name", cw + ".function"));
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

Result<std::vector<ChatMessage>> parse_chat_messages(const Json& openai_messages) {
  if (!openai_messages.is_array())
    return Status::InvalidArgument(std::string("messages: expected an array, got ") + openai_messages.type_name());
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < openai_messages.size(); ++i) {
    const Json& m = openai_messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return Status::InvalidArgument(where + ": expected an object, got " + m.type_name());
    ChatMessage msg;
    KL_ASSIGN_OR_RETURN(std::optional<std::string> role, json_opt_string(m, "role", where));
    if (!role) return Status::InvalidArgument(where + ": expected a string field 'role'");
    msg.role = *role;
    KL_ASSIGN_OR_RETURN(msg.content, parse_content(m, where));
    KL_ASSIGN_OR_RETURN(msg.tool_calls, parse_tool_calls(m, where));
    KL_ASSIGN_OR_RETURN(std::optional<std::string> call_id, json_opt_string(m, "tool_call_id", where));
    msg.tool_call_id = call_id.value_or("");
    KL_ASSIGN_OR_RETURN(std::optional<std::string> name, json_opt_string(m, "name", where));
    msg.name = name.value_or("");
    out.push_back(std::move(msg));
  }
  KL_RETURN_IF_ERROR(check_roles(out));
  return out;
}

std::string chat_stop_marker(ChatFormat format) {
  return format == ChatFormat::kKimiK2 ? "<|im_end|>" : "<|end_of_msg|>";
}

}  // namespace klinear
