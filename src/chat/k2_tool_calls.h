// Model output as OpenAI assistant fields: Kimi K2 / Kimi Linear tool calls in generated text, and
// K3 (XTML) turns (reasoning, content, tool calls) parsed from the generated ids.
//
// K2:
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

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chat/chat_format.h"
#include "chat/k3_tool_calls.h"
#include "io/tokenizer.h"

namespace klinear {

struct ParsedToolCalls {
  std::string content;          // text before the section (all of it when there is none)
  std::vector<ToolCall> calls;  // complete and, while streaming, partial calls (arguments so far)
  bool in_section = false;      // a section was opened
};

// Parses `text` (complete or a prefix of the output). A call whose header (name) is not complete
// yet is left out; a call without its end marker has the arguments written so far.
ParsedToolCalls parse_kimi_tool_calls(const std::string& text);

// One streamed change of a choice's tool-call output.
struct ToolCallDelta {
  int index = 0;
  std::string id, name;   // set on the call's first delta only
  std::string arguments;  // the new part of the arguments
};

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

// ---- K3: the assistant turn after the generation prompt, parsed with parse_k3_assistant_turn.
//
// Each update re-parses every generated id and sends what is new: reasoning (the think element)
// and content (the response element) as they grow, a trailing incomplete UTF-8 character held
// back until the choice ends; each tool call once it is complete (K3 restores argument types only
// from whole argument elements, so a call streams as one delta with its name and arguments). Call
// ids are "functions.NAME:IDX" (IDX counting the turn's calls from 0), as in K2. Output that breaks
// the K3 grammar (an unexpected tag, a value not of its declared type) is not dropped: from the
// element the parse had not finished when it broke, the output's text passes through as content.
struct ChatDelta {
  std::string reasoning, content;
  std::vector<ToolCallDelta> calls;
};

class K3TurnStream {
 public:
  // `tokenizer` must outlive this.
  K3TurnStream(const Tokenizer& tokenizer, K3TurnStart start) : tokenizer_(&tokenizer), start_(start) {}
  // `ids`: every generated id so far; `final`: the choice ended.
  ChatDelta update(std::span<const int32_t> ids, bool final);

  const std::string& reasoning() const { return reasoning_; }
  const std::string& content() const { return content_; }
  const std::vector<ToolCall>& calls() const { return calls_; }

 private:
  const Tokenizer* tokenizer_;
  K3TurnStart start_;
  std::string reasoning_, content_;  // sent so far
  std::vector<ToolCall> calls_;      // sent so far
  bool broken_ = false;              // the parse failed: pass the text through
  size_t settled_ = 0;               // ids whose effect was sent (before an element not finished yet)
  std::string passed_;               // broken: the text of ids[settled_:] sent so far
};

}  // namespace klinear
