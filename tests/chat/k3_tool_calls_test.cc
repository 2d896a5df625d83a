// The K3 output parser (chat/k3_tool_calls.h) on rendered segments: a turn cut anywhere parses to
// what was complete, and structure the format does not produce is an error naming it. The round
// trip of every rendered assistant turn is in k3_format_test.cc.
#include <gtest/gtest.h>

#include "chat/chat_format.h"
#include "chat/k3_tool_calls.h"

namespace klinear {
namespace {

TEST(ChatK3, ParserReportsTruncationAndBadStructure) {
  ChatMessage m{"assistant", "ok", {{"", "f", R"({"a": 1, "b": "x"})"}}, "", ""};
  ChatOptions options;
  options.thinking = false;
  options.thinking_effort = ThinkingEffort::kUnset;
  options.add_generation_prompt = false;
  auto segments = render_chat_segments(ChatFormat::kK3, {m}, options);
  ASSERT_TRUE(segments.ok());
  // Drop `<|open|>message role="assistant"<|sep|><|open|>response<|sep|>` (7 + 3 pieces).
  std::vector<ChatSegment> body(segments.value().begin() + 10, segments.value().end());
  ASSERT_EQ(body.front().text, "ok");
  auto full = parse_k3_assistant_segments(body, K3TurnStart::kResponse);
  ASSERT_TRUE(full.ok()) << full.status().to_string();
  EXPECT_TRUE(full.value().complete);
  ASSERT_EQ(full.value().tool_calls.size(), 1u);
  EXPECT_EQ(full.value().tool_calls[0].arguments_json, R"({"a":1,"b":"x"})");
  for (size_t cut = 0; cut < body.size(); ++cut) {
    std::vector<ChatSegment> part(body.begin(), body.begin() + static_cast<std::ptrdiff_t>(cut));
    auto r = parse_k3_assistant_segments(part, K3TurnStart::kResponse);
    ASSERT_TRUE(r.ok()) << "cut " << cut << ": " << r.status().to_string();
    // Everything before <|close|>message<|sep|> is incomplete; the final <|end_of_msg|> is optional.
    EXPECT_EQ(r.value().complete, cut + 1 == body.size()) << "cut " << cut;
    EXPECT_LE(r.value().tool_calls.size(), 1u);
  }
  std::vector<ChatSegment> wrong_close = body;
  wrong_close[2].text = "think";  // <|close|>think<|sep|> where </response> belongs
  auto r = parse_k3_assistant_segments(wrong_close, K3TurnStart::kResponse);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("expected </response>, got </think>"), std::string::npos) << r.status().message();
  auto typed = parse_k3_assistant_segments(
      {{SegmentKind::kMarker, "<|close|>"}, {SegmentKind::kText, "response"}, {SegmentKind::kMarker, "<|sep|>"},
       {SegmentKind::kMarker, "<|open|>"}, {SegmentKind::kText, "tools"}, {SegmentKind::kMarker, "<|sep|>"},
       {SegmentKind::kMarker, "<|open|>"}, {SegmentKind::kText, "call tool=\"f\" index=\"1\""}, {SegmentKind::kMarker, "<|sep|>"},
       {SegmentKind::kMarker, "<|open|>"}, {SegmentKind::kText, "argument key=\"n\" type=\"number\""},
       {SegmentKind::kMarker, "<|sep|>"}, {SegmentKind::kText, "\"three\""}, {SegmentKind::kMarker, "<|close|>"},
       {SegmentKind::kText, "argument"}, {SegmentKind::kMarker, "<|sep|>"}},
      K3TurnStart::kResponse);
  ASSERT_FALSE(typed.ok());
  EXPECT_NE(typed.status().message().find("argument 'n': expected a value of type number, got string"), std::string::npos)
      << typed.status().message();
}

}  // namespace
}  // namespace klinear
