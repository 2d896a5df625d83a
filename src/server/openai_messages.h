// The chat parts of an OpenAI request as the chat formats' types (chat/chat_format.h): the
// `messages` array, `tool_choice`, `response_format` and K3's thinking effort. openai.cc reads a
// request body with these; `klinear render` reads its flags and files with them too.
#pragma once

#include <string_view>
#include <vector>

#include "chat/chat_format.h"
#include "core/status.h"
#include "io/json.h"

namespace klinear {

// "low", "high" or "max"; anything else is InvalidArgument naming the accepted values.
Result<ThinkingEffort> parse_thinking_effort(std::string_view name);
// "auto", "required" or "none".
Result<ToolChoice> parse_tool_choice(std::string_view name);
// OpenAI `response_format`: a string type or an object {"type": ..., "json_schema": {...}} with type
// text, json_object or json_schema. The schema is `json_schema.schema` (else `json_schema.json_schema`,
// else `json_schema` itself), as Moonshot's encoder reads it.
Result<ResponseFormat> parse_response_format(const OrderedJson& response_format);

// Converts an OpenAI-style `messages` array. `content` may be a string, null, or a list of
// {"type": "text", "text": ...} parts (joined without separator, as both formats do); other part
// types are NotSupported (the models are text-only). tool_calls[].function.arguments may be a
// string (kept verbatim) or an object (serialized compactly, keys in document order). Also read:
// `reasoning_content` / `reasoning` (assistant), `tool` (tool), `tools` (system).
// Errors: InvalidArgument naming `messages[i].field`, the expected and the actual.
Result<std::vector<ChatMessage>> parse_chat_messages(const OrderedJson& openai_messages);
// The same from a Json value, whose objects have already lost their key order.
Result<std::vector<ChatMessage>> parse_chat_messages(const Json& openai_messages);

}  // namespace klinear
