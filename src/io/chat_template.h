// Chat formats: Kimi K2 / Kimi Linear (the jinja `chat_template` of tokenizer_config.json,
// reproduced natively) and K3 (XTML, built by code).
//
// Decision: rendering produces segments, each either a special-token marker or plain text, and
// render_chat() is only their concatenation. Encoding the segments (encode_chat) turns markers
// into their ids and encodes every text segment with specials as plain text, so a "<|im_end|>"
// typed by a user can never close a turn. For K2 the text between two markers is one segment,
// which gives the same ids as Hugging Face's encode of the rendered string (for content without
// special names); for K3 the text segments follow the official encoder's boundaries (tag, each
// ` key="`, value, `"`, content), which change BPE boundaries and so must be kept.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/json.h"
#include "io/tokenizer.h"

namespace klinear {

enum class ChatFormat { kKimiK2, kK3 };

struct ToolCall {
  std::string id;              // OpenAI tool_calls[].id (the K2 template ignores it)
  std::string name;            // function name
  std::string arguments_json;  // the function's arguments as JSON text (OpenAI sends a string)
};

struct ChatMessage {
  std::string role;                  // "system", "user", "assistant" or "tool"
  std::string content;               // text parts joined; "" for null
  std::vector<ToolCall> tool_calls;  // assistant only
  std::string tool_call_id;          // tool only: the call this result answers
  std::string name;                  // optional: K3 renders it as an attribute; tool: the tool's name
};

struct ChatOptions {
  bool add_generation_prompt = true;
  bool thinking = false;   // K3 only: the generation prompt opens <think> instead of <response>
  std::string tools_json;  // OpenAI tools array as JSON text; empty = no tools
};

enum class SegmentKind {
  kMarker,  // exactly one special-token name
  kText,    // ordinary text, encoded with specials as plain text
};

struct ChatSegment {
  SegmentKind kind;
  std::string text;
};

// Renders `messages` as segments (see the file comment). Errors: InvalidArgument naming the
// message and field for an unknown role, tools_json that is not a JSON array, K3 tool-call
// arguments that are not a JSON object, or a K3 tool result whose tool name cannot be resolved.
Result<std::vector<ChatSegment>> render_chat_segments(ChatFormat format, const std::vector<ChatMessage>& messages,
                                                      const ChatOptions& options);

// The rendered prompt as one string: for K2 byte-identical to transformers' apply_chat_template
// with the template of tokenizer_config.json (tests/io/chat_template_test.cc checks it against
// jinja2). Same errors as render_chat_segments().
Result<std::string> render_chat(ChatFormat format, const std::vector<ChatMessage>& messages,
                                const ChatOptions& options);

// Token ids of rendered segments: a marker becomes its special id, each text segment is encoded
// separately with Specials::kAsText. Error: NotFound when a marker is not a special token of
// `tokenizer` (e.g. K3 markers with the K2 tokenizer files).
Result<std::vector<int32_t>> encode_chat(const Tokenizer& tokenizer, const std::vector<ChatSegment>& segments);

// Converts an OpenAI-style `messages` array. `content` may be a string, null, or a list of
// {"type": "text", "text": ...} parts (joined without separator, as both formats do); other part
// types are NotSupported (the models are text-only). tool_calls[].function.arguments may be a
// string (kept verbatim) or an object (serialized compactly; key order is not preserved).
// Errors: InvalidArgument naming `messages[i].field`, the expected and the actual.
Result<std::vector<ChatMessage>> parse_chat_messages(const Json& openai_messages);

// The special-token name that ends an assistant turn: "<|im_end|>" (K2) or "<|end_of_msg|>" (K3).
std::string chat_stop_marker(ChatFormat format);

}  // namespace klinear
