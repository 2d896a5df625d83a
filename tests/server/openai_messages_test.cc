// The OpenAI `messages` array as chat messages (server/openai_messages.h): every shape OpenAI
// clients send, and errors that name the offending field.
#include <gtest/gtest.h>

#include "server/openai_messages.h"
#include "test_util.h"

namespace klinear {
namespace {

TEST(ChatMessages, ParsesOpenAiShapes) {
  Json j = Json::parse(R"([
    {"role": "system", "content": "s"},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "bob"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
      {"id": "c2", "type": "function", "function": {"name": "g", "arguments": {"y": 2}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "r", "tool": "f"},
    {"role": "assistant", "content": "x", "reasoning_content": "", "reasoning": "why"},
    {"role": "system", "content": null, "tools": [{"z": 1, "a": 2}]}])");
  auto r = parse_chat_messages(j);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const auto& m = r.value();
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[1].content, "ab");
  EXPECT_EQ(m[1].name, "bob");
  EXPECT_EQ(m[2].content, "");
  ASSERT_EQ(m[2].tool_calls.size(), 2u);
  EXPECT_EQ(m[2].tool_calls[0].id, "c1");
  EXPECT_EQ(m[2].tool_calls[0].arguments_json, "{\"x\": 1}");
  EXPECT_EQ(m[2].tool_calls[1].arguments_json, "{\"y\":2}");
  EXPECT_EQ(m[3].tool_call_id, "c1");
  EXPECT_EQ(m[1].content_parts, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(m[0].content_parts.empty());
  EXPECT_EQ(m[3].tool, "f");
  EXPECT_EQ(m[4].reasoning, "why");  // an empty reasoning_content falls back to reasoning
  EXPECT_EQ(m[5].tools_json, R"([{"a":2,"z":1}])");  // a Json value has already sorted its keys
  auto ordered = parse_chat_messages(OrderedJson::parse(R"([{"role": "system", "tools": [{"z": 1, "a": 2}]}])"));
  ASSERT_TRUE(ordered.ok()) << ordered.status().to_string();
  EXPECT_EQ(ordered.value()[0].tools_json, R"([{"z":1,"a":2}])");  // document key order kept
}

TEST(ChatMessages, ErrorsNameTheField) {
  auto expect = [](const char* json, StatusCode code, const std::string& fragment) {
    auto r = parse_chat_messages(Json::parse(json));
    ASSERT_FALSE(r.ok()) << json;
    EXPECT_EQ(r.status().code(), code) << r.status().to_string();
    EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status().message();
  };
  expect(R"({"role": "user"})", StatusCode::kInvalidArgument, "messages: expected an array, got object");
  expect(R"([{"role": "user", "content": "x"}, {"role": "robot", "content": "x"}])", StatusCode::kInvalidArgument,
         "messages[1].role: expected one of system, user, assistant, tool; got 'robot'");
  expect(R"([{"content": "x"}])", StatusCode::kInvalidArgument, "messages[0]: expected a string field 'role'");
  expect(R"([{"role": "user", "content": 5}])", StatusCode::kInvalidArgument,
         "messages[0].content: expected a string, null or a list of parts, got number");
  expect(R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])",
         StatusCode::kNotSupported, "messages[0].content[0]: part type 'image_url' is not supported");
  expect(R"([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}])", StatusCode::kInvalidArgument,
         "messages[0].tool_calls[0].function: expected a string field 'name'");
  expect(R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}])",
         StatusCode::kInvalidArgument, "messages[0].tool_calls[0].function.arguments: expected a string or an object");
}

}  // namespace
}  // namespace klinear
