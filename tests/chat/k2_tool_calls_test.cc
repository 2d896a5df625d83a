// The Kimi K2 tool-call parser (chat/k2_tool_calls.h): calls parse one-shot and stream to the same
// calls whatever the delta boundaries.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "chat/k2_tool_calls.h"
#include "chat/k2_tool_output.h"

namespace klinear {
namespace {

using testing::kToolPieces;

TEST(ToolCalls, ParseOneShot) {
  std::string all;
  for (const std::string& p : kToolPieces) all += p;
  struct Case {
    const char* name;
    std::string text;
    std::string content;
    std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  };
  const std::vector<Case> cases{
      {"no section", "just text", "just text", {}},
      {"two calls after content", all, "I will look.", {{"get_weather", "{\"city\": \"Paris\"}"}, {"add", "{\"a\": 1, \"b\": 2}"}}},
      {"singular section marker",
       "<|tool_call_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
       "",
       {{"f", "{}"}}},
      {"header not complete", "x<|tool_calls_section_begin|><|tool_call_begin|>functions.f", "x", {}},
      {"arguments so far", "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a", "",
       {{"f", "{\"a"}}},
  };
  for (const Case& c : cases) {
    const ParsedToolCalls p = parse_kimi_tool_calls(c.text);
    EXPECT_EQ(p.content, c.content) << c.name;
    ASSERT_EQ(p.calls.size(), c.calls.size()) << c.name;
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(p.calls[i].name, c.calls[i].first) << c.name;
      EXPECT_EQ(p.calls[i].arguments_json, c.calls[i].second) << c.name;
    }
  }
  EXPECT_EQ(parse_kimi_tool_calls(all).calls[1].id, "functions.add:1");
}

// Every grouping of the pieces into deltas (each boundary cut or not: 2^19 is too many, so every
// single cut, every pair of cuts, and all pieces one by one) streams the one-shot result.
TEST(ToolCalls, StreamingEqualsOneShotForAnyDeltaBoundaries) {
  std::string all;
  for (const std::string& p : kToolPieces) all += p;
  const ParsedToolCalls expected = parse_kimi_tool_calls(all);
  auto stream = [&](const std::vector<size_t>& cuts) {
    ToolCallStream ts;
    std::string text, content;
    std::map<int, std::string> names, args;
    size_t prev = 0;
    std::vector<size_t> ends = cuts;
    ends.push_back(kToolPieces.size());
    for (size_t end : ends) {
      for (size_t i = prev; i < end; ++i) text += kToolPieces[i];
      prev = end;
      std::string delta;
      std::vector<ToolCallDelta> deltas;
      ts.update(text, delta, deltas);
      content += delta;
      for (const ToolCallDelta& d : deltas) {
        if (!d.name.empty()) {
          EXPECT_FALSE(names.count(d.index)) << "call " << d.index << " announced twice";
          names[d.index] = d.name;
        }
        args[d.index] += d.arguments;
      }
    }
    EXPECT_EQ(content, expected.content);
    ASSERT_EQ(names.size(), expected.calls.size());
    for (size_t i = 0; i < expected.calls.size(); ++i) {
      EXPECT_EQ(names[static_cast<int>(i)], expected.calls[i].name);
      EXPECT_EQ(args[static_cast<int>(i)], expected.calls[i].arguments_json);
    }
  };
  std::vector<size_t> every;
  for (size_t i = 1; i < kToolPieces.size(); ++i) every.push_back(i);
  stream(every);
  stream({});
  for (size_t a = 1; a < kToolPieces.size(); ++a) {
    stream({a});
    for (size_t b = a + 1; b < kToolPieces.size(); ++b) stream({a, b});
  }
}

}  // namespace
}  // namespace klinear
