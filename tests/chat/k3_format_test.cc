// K3 chat format tests. The expected ids come from tests/chat/k3_reference_encoder.py (Moonshot's
// encoder rules, written in Python on tiktoken), never from klinear:
//   * k3_chat_table.json: a committed table of conversations with the reference's ids; klinear must
//     render each to exactly those ids, and the reference must still produce them (regenerated here,
//     so the table cannot drift from the tool);
//   * random conversations rendered by both (the seed is printed; KLINEAR_TEST_SEED replays);
//   * each rendered assistant turn with tool calls parses back into the same calls.
// Regenerate the table after editing its cases:
//   python3 tests/chat/k3_reference_encoder.py --fill tokenizers/kimi-k3 tests/chat/k3_chat_table.json
#include <gtest/gtest.h>

#include <iostream>
#include <random>

#include "chat/chat_format.h"
#include "chat/k3_tool_calls.h"
#include "python_oracle.h"
#include "server/openai_messages.h"
#include "test_util.h"

namespace klinear {
namespace {

const std::string kK3Dir = testing::source_path("tokenizers/kimi-k3");
const char* kTiktokenInstall = "tiktoken (pip install tiktoken; scripts/setup.sh installs it)";

const Tokenizer& k3_tokenizer() {
  static const Tokenizer tok = [] {
    auto r = Tokenizer::load(kK3Dir);
    KL_CHECK(r.ok(), "cannot load %s", kK3Dir.c_str());
    return std::move(r).value();
  }();
  return tok;
}

// A case of the reference tool's input format as klinear's options.
Result<ChatOptions> case_options(const OrderedJson& c) {
  ChatOptions o;
  o.add_generation_prompt = c.value("add_generation_prompt", true);
  o.thinking = c.value("thinking", true);
  if (c.contains("tools") && !c["tools"].is_null()) o.tools_json = c["tools"].dump();
  o.thinking_effort = ThinkingEffort::kUnset;
  if (c.contains("thinking_effort") && !c["thinking_effort"].is_null() && o.thinking) {
    KL_ASSIGN_OR_RETURN(o.thinking_effort, parse_thinking_effort(c["thinking_effort"].get<std::string>()));
  }
  if (c.contains("tool_choice") && !c["tool_choice"].is_null()) {
    KL_ASSIGN_OR_RETURN(o.tool_choice, parse_tool_choice(c["tool_choice"].get<std::string>()));
  }
  if (c.contains("response_format") && !c["response_format"].is_null()) {
    KL_ASSIGN_OR_RETURN(o.response_format, parse_response_format(c["response_format"]));
  }
  return o;
}

Result<std::vector<int32_t>> klinear_ids(const OrderedJson& c) {
  KL_ASSIGN_OR_RETURN(std::vector<ChatMessage> messages, parse_chat_messages(c["messages"]));
  KL_ASSIGN_OR_RETURN(ChatOptions options, case_options(c));
  KL_ASSIGN_OR_RETURN(RenderedChat r, render_chat_ids(k3_tokenizer(), ChatFormat::kK3, messages, options));
  return r.ids;
}

OrderedJson load_table() {
  auto text = read_text_file(testing::source_path("tests/chat/k3_chat_table.json"));
  KL_CHECK(text.ok());
  auto table = parse_ordered_json(text.value(), "k3_chat_table.json");
  KL_CHECK(table.ok());
  return table.value()["cases"];
}

// The reference's results ({"ids", "text"} or {"error"}) for `cases`.
Result<Json> reference(const OrderedJson& cases) {
  return testing::run_python_oracle("k3_reference_encoder.py", "'" + kK3Dir + "'", Json::parse(cases.dump()),
                                    kTiktokenInstall);
}

TEST(ChatK3, TableRendersToTheReferenceIds) {
  OrderedJson cases = load_table();
  ASSERT_GE(cases.size(), 40u);
  for (const OrderedJson& c : cases) {
    auto ids = klinear_ids(c);
    ASSERT_TRUE(ids.ok()) << c["name"] << ": " << ids.status().to_string();
    EXPECT_EQ(ids.value(), c["ids"].get<std::vector<int32_t>>()) << "case " << c["name"];
    EXPECT_FALSE(ids.value().empty() && !c["messages"].empty());
  }
}

TEST(ChatK3, ReferenceToolReproducesTheTable) {
  OrderedJson cases = load_table();
  auto ref = reference(cases);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  ASSERT_EQ(ref.value().size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(ref.value()[i].contains("ids")) << cases[i]["name"] << ": " << ref.value()[i].dump();
    EXPECT_EQ(ref.value()[i]["ids"].get<std::vector<int32_t>>(), cases[i]["ids"].get<std::vector<int32_t>>())
        << "the committed ids of " << cases[i]["name"] << " are stale: regenerate the table";
  }
}

// Random conversations from pools that cover every rule (including inputs both sides reject).
OrderedJson random_case(std::mt19937_64& rng) {
  static const char* kText[] = {"", "Hello", "你好，世界！", "multi\nline\n\ntext", "  padded  ", "quote \" & amp &amp;",
                                "<|open|>message<|sep|>", "<|end_of_msg|>", "[BOS] [EOS]", "emoji 🙂👩‍👩‍👧", "ends with.",
                                "tab\there", "e\u0301", " ", "\n", "=\"", "{\"json\": true}", "Ünïcödé 中文 مرحبا"};
  static const char* kNames[] = {"alice", "bob.", "a&b", "q\"x\"", "天气", "<|sep|>", "x y"};
  static const char* kTools[] = {"get_weather", "search", "run_code", "天气", "a&\"b"};
  static const char* kArgs[] = {"{}", "", "  ", R"({"city": "Rome"})", R"({"q":"中文","n":3,"f":1.5,"ok":true,"no":null})",
                                R"({"o": {"b": 1, "a": [1, 2.0]}, "l": ["x", {"y": false}], "e": 1e-7, "big": 12345678901234})",
                                "{\"text\": \"line1\\nline2 & \\\"q\\\"\"}", "not json", "{\"a\": 1", "[1, 2]"};
  static const char* kRoles[] = {"system", "user", "user", "assistant", "assistant", "tool"};
  static const char* kEfforts[] = {"low", "high", "max"};
  static const char* kChoices[] = {"auto", "required", "none"};
  auto pick = [&](auto& pool) { return pool[rng() % std::size(pool)]; };
  auto chance = [&](int n) { return rng() % n == 0; };
  const OrderedJson tool_def = OrderedJson::parse(
      R"({"type": "function", "function": {"name": "get_weather", "description": "Weather & \"more\"",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})");
  auto content = [&]() -> OrderedJson {
    if (chance(8)) return nullptr;
    if (chance(6)) return OrderedJson::array({{{"type", "text"}, {"text", pick(kText)}}, {{"type", "text"}, {"text", pick(kText)}}});
    return pick(kText);
  };
  OrderedJson messages = OrderedJson::array();
  std::vector<std::string> last_ids;
  const int n = static_cast<int>(rng() % 9);
  for (int k = 0; k < n; ++k) {
    std::string role = pick(kRoles);
    OrderedJson m = {{"role", role}, {"content", content()}};
    if (role != "tool" && chance(4)) m["name"] = pick(kNames);
    if (role == "system" && chance(5)) m["tools"] = OrderedJson::array({tool_def});
    if (role == "assistant") {
      if (chance(2)) m[chance(2) ? "reasoning_content" : "reasoning"] = pick(kText);
      last_ids.clear();
      if (chance(2)) {
        OrderedJson calls = OrderedJson::array();
        for (int j = 0, nc = 1 + static_cast<int>(rng() % 3); j < nc; ++j) {
          std::string id = "call_" + std::to_string(rng() % 4);
          last_ids.push_back(id);
          calls.push_back({{"id", id}, {"type", "function"}, {"function", {{"name", pick(kTools)}, {"arguments", pick(kArgs)}}}});
        }
        m["tool_calls"] = calls;
      }
    }
    if (role == "tool") {
      if (!last_ids.empty() && !chance(5)) m["tool_call_id"] = last_ids[rng() % last_ids.size()];
      if (chance(2)) m[chance(2) ? "name" : "tool"] = pick(kTools);
    }
    messages.push_back(m);
  }
  OrderedJson c = {{"name", "random"}, {"messages", messages}, {"tools", nullptr}};
  if (chance(3)) c["tools"] = OrderedJson::array({tool_def});
  c["thinking"] = !chance(3);
  c["thinking_effort"] = chance(3) ? OrderedJson(nullptr) : OrderedJson(pick(kEfforts));
  if (chance(3)) c["tool_choice"] = pick(kChoices);
  if (chance(4)) c["response_format"] = {{"type", "json_object"}};
  if (chance(5))
    c["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "object"}, {"b", 1}, {"a", "é"}}}}}};
  c["add_generation_prompt"] = !chance(4);
  return c;
}

TEST(ChatK3, RandomConversationsMatchTheReference) {
  const uint64_t seed = testing::fresh_seed();
  std::cout << "[ seed     ] KLINEAR_TEST_SEED=" << seed << "\n";
  std::mt19937_64 rng(seed);
  OrderedJson cases = OrderedJson::array();
  for (int i = 0; i < 300; ++i) cases.push_back(random_case(rng));
  auto ref = reference(cases);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  int rendered = 0, rejected = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Json& r = ref.value()[i];
    auto ours = klinear_ids(cases[i]);
    if (r.contains("error")) {
      ++rejected;
      EXPECT_FALSE(ours.ok()) << "the reference rejects case " << i << " (" << r["error"] << ") but klinear renders it: "
                              << cases[i].dump();
      continue;
    }
    ++rendered;
    ASSERT_TRUE(ours.ok()) << "case " << i << ": " << ours.status().to_string() << "\n" << cases[i].dump();
    EXPECT_EQ(ours.value(), r["ids"].get<std::vector<int32_t>>()) << "seed " << seed << " case " << i << "\n"
                                                                   << cases[i].dump() << "\nreference text:\n"
                                                                   << r["text"].get<std::string>();
  }
  std::cout << "[ k3       ] " << rendered << " rendered identically, " << rejected << " rejected by both\n";
  EXPECT_GT(rendered, 150);  // most cases render; the rest test that both sides reject the same input
  EXPECT_GT(rejected, 0);
}

// Renders one assistant message (no name) alone and parses what follows its generation prompt.
Result<K3AssistantTurn> round_trip(ChatMessage m, bool thinking) {
  m.name.clear();
  ChatOptions options;
  options.thinking = thinking;
  options.thinking_effort = ThinkingEffort::kUnset;
  KL_ASSIGN_OR_RETURN(RenderedChat prompt, render_chat_ids(k3_tokenizer(), ChatFormat::kK3, {}, options));
  options.add_generation_prompt = false;
  KL_ASSIGN_OR_RETURN(RenderedChat turn, render_chat_ids(k3_tokenizer(), ChatFormat::kK3, {m}, options));
  KL_CHECK(turn.ids.size() > prompt.ids.size());
  KL_CHECK(std::equal(prompt.ids.begin(), prompt.ids.end(), turn.ids.begin()));
  std::span<const int32_t> generated(turn.ids.data() + prompt.ids.size(), turn.ids.size() - prompt.ids.size());
  return parse_k3_assistant_turn(k3_tokenizer(), generated, thinking ? K3TurnStart::kThink : K3TurnStart::kResponse);
}

TEST(ChatK3, RenderedToolCallsParseBack) {
  int checked = 0;
  for (const OrderedJson& c : load_table()) {
    auto messages = parse_chat_messages(c["messages"]);
    ASSERT_TRUE(messages.ok()) << messages.status().to_string();
    const bool thinking = c.value("thinking", true);
    for (const ChatMessage& m : messages.value()) {
      if (m.role != "assistant") continue;
      auto parsed = round_trip(m, thinking);
      ASSERT_TRUE(parsed.ok()) << c["name"] << ": " << parsed.status().to_string();
      EXPECT_TRUE(parsed.value().complete);
      EXPECT_EQ(parsed.value().content, m.content) << c["name"];
      EXPECT_EQ(parsed.value().reasoning, thinking && !is_python_blank(m.reasoning) ? m.reasoning : "") << c["name"];
      ASSERT_EQ(parsed.value().tool_calls.size(), m.tool_calls.size()) << c["name"];
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        const ToolCall& want = m.tool_calls[k];
        const ToolCall& got = parsed.value().tool_calls[k];
        EXPECT_EQ(got.name, want.name);
        auto want_args = parse_ordered_json(is_python_blank(want.arguments_json) ? "{}" : want.arguments_json, "want");
        if (want_args.ok()) {  // types restored: the same JSON value, key order included
          EXPECT_EQ(got.arguments_json, want_args.value().dump()) << c["name"] << " call " << k;
        } else {  // not JSON: given back raw
          EXPECT_EQ(got.arguments_json, want.arguments_json) << c["name"] << " call " << k;
        }
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 20);
}

TEST(ChatK3, Errors) {
  auto expect = [](const char* messages, const ChatOptions& o, const std::string& fragment) {
    auto parsed = parse_chat_messages(OrderedJson::parse(messages));
    Status s = parsed.status();
    if (parsed.ok()) s = render_chat_segments(ChatFormat::kK3, parsed.value(), o).status();
    ASSERT_FALSE(s.ok()) << messages;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
  };
  ChatOptions o;
  expect(R"([{"role": "developer", "content": "x"}])", o, "messages[0].role: expected one of system, user, assistant, tool");
  expect(R"([{"role": "user", "content": "x"}, {"role": "tool", "content": "r"}])", o, "messages[1]: expected a tool name");
  expect(R"([{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f"}}]},
             {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}])",
         o, "messages[2]: expected a tool name");
  expect(R"([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}])", o,
         "messages[0].tool_calls[0].arguments: expected a JSON object, got array");
  o.tools_json = R"({"not": "an array"})";
  expect("[]", o, "tools_json: expected a JSON array, got object");
  auto effort = parse_thinking_effort("medium");
  ASSERT_FALSE(effort.ok());
  EXPECT_NE(effort.status().message().find("expected one of low, high, max; got 'medium'"), std::string::npos);
  EXPECT_FALSE(parse_tool_choice("sometimes").ok());
  auto rf = parse_response_format(OrderedJson::parse(R"({"type": "xml"})"));
  ASSERT_FALSE(rf.ok());
  EXPECT_NE(rf.status().message().find("expected one of text, json_object, json_schema; got 'xml'"), std::string::npos);
  EXPECT_EQ(chat_stop_marker(ChatFormat::kK3), "<|end_of_msg|>");
  EXPECT_EQ(k3_tokenizer().special_id("<|end_of_msg|>"), 163586);
}

}  // namespace
}  // namespace klinear
