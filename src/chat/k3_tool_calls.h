// Parsing K3 (XTML) model output back into an OpenAI assistant message: the `think` text, the
// `response` text and the `tools` element's calls, with argument types restored.
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

#include "core/status.h"
#include "chat/chat_format.h"
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

}  // namespace klinear
