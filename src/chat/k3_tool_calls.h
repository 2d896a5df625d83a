// Parsing K3 (XTML) model output back into an OpenAI assistant message: the `think` text, the
// `response` text and the `tools` element's calls, with argument types restored; one-shot and
// streamed (K3TurnStream). K2's output parser is k2_tool_calls.h.
//
// Decision: the parser reads markers from token ids (or rendered segments), never from decoded
// text, because "<|close|>" typed inside content is text for the model and must stay text here.
// Generated output is parsed starting right after the generation prompt (inside `think` or
// `response`), and a turn cut off by a token limit gives what was complete (complete = false).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chat/chat_format.h"
#include "core/status.h"
#include "io/tokenizer.h"

namespace klinear {

// Which element the generation prompt opened (ChatOptions::thinking on: kThink).
enum class K3TurnStart { kThink, kResponse };

struct K3AssistantTurn {
  std::string reasoning;             // the think element's text ("" with thinking off)
  std::string content;               // the response element's text
  std::vector<ToolCall> tool_calls;  // id "" (the caller assigns ids); arguments_json: a JSON object
                                     // (argument types restored) or the raw text of a json element
  bool complete = false;             // the output reached <|close|>message<|sep|> (or <|end_of_msg|>)
};

// `generated`: the ids after the generation prompt. Errors: InvalidArgument naming the position
// for a structure the K3 format does not produce (an unexpected tag, an argument value that is not
// of its declared type, a call without a tool name).
Result<K3AssistantTurn> parse_k3_assistant_turn(const Tokenizer& tokenizer, std::span<const int32_t> generated,
                                                K3TurnStart start);

// The same from rendered segments (e.g. the segments of an assistant message after its open tag).
Result<K3AssistantTurn> parse_k3_assistant_segments(const std::vector<ChatSegment>& segments, K3TurnStart start);

// Streaming the assistant turn after the generation prompt, parsed with parse_k3_assistant_turn.
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
