// Chat formats: Kimi K2 / Kimi Linear (the jinja `chat_template` of tokenizer_config.json,
// reproduced natively, k2_format.cc) and K3 (XTML, built by code, k3_format.cc): the message types,
// rendering to segments, their encoding, and the marker that ends an assistant turn.
//
// Decision: rendering produces segments, each either a special-token marker or plain text, and
// render_chat() is only their concatenation. Encoding the segments (encode_chat) turns markers
// into their ids and encodes every text segment with specials as plain text, so a "<|im_end|>"
// typed by a user can never close a turn. For K2 the text between two markers is one segment,
// which gives the same ids as Hugging Face's encode of the rendered string (for content without
// special names); for K3 the text segments follow Moonshot's encoder (encoding_k3.py, main)
// exactly: tag name, each attribute as ` key`, `="`, escaped value, `"`, each content part, which
// change BPE boundaries and so must be kept. tests/chat/k3_reference_encoder.py is the K3 oracle.
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

// One streamed change of a choice's tool-call output (the K2 and K3 output streams).
struct ToolCallDelta {
  int index = 0;
  std::string id, name;   // set on the call's first delta only
  std::string arguments;  // the new part of the arguments
};

// One message. An empty string field counts as absent (the reference encoders test truthiness,
// except for a tool message's explicit empty `name`, which K3 would render as tool="").
struct ChatMessage {
  std::string role;                  // "system", "user", "assistant" or "tool"
  std::string content;               // text parts joined; "" for null
  std::vector<ToolCall> tool_calls;  // assistant only
  std::string tool_call_id;          // tool only: the call this result answers
  std::string name;                  // optional: K3 renders it as an attribute; tool: the tool's name
  std::string reasoning = {};        // assistant: reasoning_content (else reasoning); K3 <think> body
  // Content given as a list: each text part (K3 encodes each on its own); empty otherwise. When
  // set, `content` is their concatenation.
  std::vector<std::string> content_parts = {};
  std::string tool = {};             // tool only: the `tool` field (K3 prefers it over name)
  std::string tools_json = {};       // system only: tools it declares, a JSON array (K3 "New Tools Available")
};

// K3's thinking-effort system message (rendered only with thinking on).
enum class ThinkingEffort { kUnset, kLow, kHigh, kMax };
// K3: kRequired / kNone add a tool-choice system message after the conversation.
enum class ToolChoice { kAuto, kRequired, kNone };

// OpenAI `response_format`; K3 adds a response-format system message for the JSON kinds.
struct ResponseFormat {
  enum class Kind { kText, kJsonObject, kJsonSchema };
  Kind kind = Kind::kText;
  std::string schema_json;  // kJsonSchema: the schema as JSON text ("null" when the request has none)
};

struct ChatOptions {
  bool add_generation_prompt = true;
  // The last message is the assistant's and the rendering stops at the end of its content (no end
  // marker, no generation prompt), so the model continues it; InvalidArgument otherwise.
  bool continue_final_message = false;
  bool thinking = true;  // K3: assistant turns carry <think>; the generation prompt opens think, else response
  // K3, with thinking on: the thinking-effort system message only when one is asked for, as
  // Moonshot's encoder renders it (kUnset: none).
  ThinkingEffort thinking_effort = ThinkingEffort::kUnset;
  ToolChoice tool_choice = ToolChoice::kAuto;  // K3
  ResponseFormat response_format;              // K3
  std::string tools_json;  // OpenAI tools array as JSON text; empty = no tools
};

// Every role is system, user, assistant or tool; else InvalidArgument naming `messages[i].role`.
Status check_chat_roles(const std::vector<ChatMessage>& messages);

enum class SegmentKind {
  kMarker,  // exactly one special-token name
  kText,    // ordinary text, encoded with specials as plain text
};

struct ChatSegment {
  SegmentKind kind;
  std::string text;
};

// Renders `messages` as segments (see the file comment). One interface for both formats; K2 ignores
// the K3-only options (thinking, effort, tool choice, response format) and fields. K3 order: tool
// declaration, thinking-effort message, the messages (a run of tool results re-sorted by the
// position of the call each answers), tool-choice and response-format messages, generation prompt.
// Errors: InvalidArgument naming the message and field for an unknown role, tools_json that is not
// a JSON array, K3 tool-call arguments that are valid JSON but not an object, or a K3 tool result
// whose tool name cannot be resolved.
Result<std::vector<ChatSegment>> render_chat_segments(ChatFormat format, const std::vector<ChatMessage>& messages,
                                                      const ChatOptions& options);

// The rendered prompt as one string: for K2 byte-identical to transformers' apply_chat_template
// with the template of tokenizer_config.json (tests/chat/k2_format_test.cc checks it against
// jinja2). Same errors as render_chat_segments().
Result<std::string> render_chat(ChatFormat format, const std::vector<ChatMessage>& messages,
                                const ChatOptions& options);

// Token ids of rendered segments: a marker becomes its special id, each text segment is encoded
// separately with Specials::kAsText. Error: NotFound when a marker is not a special token of
// `tokenizer` (e.g. K3 markers with the K2 tokenizer files).
Result<std::vector<int32_t>> encode_chat(const Tokenizer& tokenizer, const std::vector<ChatSegment>& segments);

// Renders and encodes in one step: the ids the model reads and their decoded text.
struct RenderedChat {
  std::vector<int32_t> ids;
  std::string text;  // tokenizer.decode(ids)
};
Result<RenderedChat> render_chat_ids(const Tokenizer& tokenizer, ChatFormat format,
                                     const std::vector<ChatMessage>& messages, const ChatOptions& options);

// The special-token name that ends an assistant turn: "<|im_end|>" (K2) or "<|end_of_msg|>" (K3).
std::string chat_stop_marker(ChatFormat format);

}  // namespace klinear
