// The K3 chat format (see k3_format.h): XTML elements written as Moonshot's encoder writes them.
#include "chat/k3_format.h"

#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "chat/py_json.h"
#include "chat/segment_writer.h"
#include "core/check.h"

namespace klinear {

namespace {

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

}  // namespace

Result<std::vector<ChatSegment>> render_k3_segments(const std::vector<ChatMessage>& messages,
                                                    const ChatOptions& options,
                                                    const std::optional<OrderedJson>& tools) {
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

}  // namespace klinear
