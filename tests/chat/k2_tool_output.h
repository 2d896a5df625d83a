// A Kimi K2 assistant output, content then two tool calls, as the engine releases it: the K2
// tool-call parser's tests (k2_tool_calls_test.cc) and the server's response tests both read it.
#pragma once

#include <string>
#include <vector>

namespace klinear::testing {

// Output pieces as the engine releases them: a marker is always whole (one special token).
inline const std::vector<std::string> kToolPieces{
    "I will ", "look.", "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.", "get_weather", ":0",
    "<|tool_call_argument_begin|>", " {\"city\"", ": \"Par", "is\"}", " ", "<|tool_call_end|>", "<|tool_call_begin|>",
    "functions.add:1", "<|tool_call_argument_begin|>", "{\"a\": 1, ", "\"b\": 2}", "<|tool_call_end|>",
    "<|tool_calls_section_end|>"};

}  // namespace klinear::testing
