// Kimi K2 / Kimi Linear tool calls in generated text, one-shot and streamed, as OpenAI assistant
// fields (K3's output parser is k3_tool_calls.h).
//
// The model writes, after optional content:
//   <|tool_calls_section_begin|>
//   <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|> ...
//   <|tool_calls_section_end|>
// (some outputs spell the first marker <|tool_call_section_begin|>; both are accepted). The
// special tokens decode to their names, so parsing works on the text.
//
// Streaming re-parses the whole text on every delta and sends only what is new (content, then
// each call's header once and its arguments as they grow), so a delta that carries several
// markers at once, or a call split anywhere, streams the same calls as a one-shot parse.
#pragma once

#include <string>
#include <vector>

#include "chat/chat_format.h"

namespace klinear {

struct ParsedToolCalls {
  std::string content;          // text before the section (all of it when there is none)
  std::vector<ToolCall> calls;  // complete and, while streaming, partial calls (arguments so far)
  bool in_section = false;      // a section was opened
};

// Parses `text` (complete or a prefix of the output). A call whose header (name) is not complete
// yet is left out; a call without its end marker has the arguments written so far.
ParsedToolCalls parse_kimi_tool_calls(const std::string& text);

// Streaming state of one choice.
class ToolCallStream {
 public:
  // Given the whole text so far, returns the new content and the call deltas since last call.
  void update(const std::string& text, std::string& content_delta, std::vector<ToolCallDelta>& deltas);
  bool any_call() const { return !args_sent_.empty(); }

 private:
  size_t content_sent_ = 0;
  std::vector<size_t> args_sent_;  // per call announced so far
};

}  // namespace klinear
