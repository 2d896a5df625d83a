// OpenAI chat messages and chat options (see openai_messages.h).
#include "server/openai_messages.h"

#include <optional>
#include <string>
#include <utility>

namespace klinear {

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
  KL_RETURN_IF_ERROR(check_chat_roles(out));
  return out;
}

Result<std::vector<ChatMessage>> parse_chat_messages(const Json& openai_messages) {
  return parse_chat_messages(OrderedJson::parse(openai_messages.dump()));
}

}  // namespace klinear
