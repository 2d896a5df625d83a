// The OpenAI protocol layer without HTTP: request checks name the offending field, and responses
// carry usage, finish reasons, tool calls and log-probabilities in OpenAI's shapes (the K2 tool-call
// parser itself is tested in tests/chat/k2_tool_calls_test.cc).
#include <gtest/gtest.h>

#include <cstdint>

#include "chat/k2_tool_output.h"
#include "server/openai.h"
#include "test_util.h"

namespace klinear {
namespace {

Json chat_body(Json extra) {
  Json b{{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  if (!extra.is_null()) b.update(extra);
  return b;
}

TEST(OpenAIRequest, BadFieldsAreNamed) {
  struct Case {
    const char* name;
    ApiKind kind;
    Json body;
    std::string param;  // empty: accepted
  };
  const std::vector<Case> cases{
      {"minimal chat", ApiKind::kChat, chat_body(Json::object()), ""},
      {"temperature of the wrong type", ApiKind::kChat, chat_body({{"temperature", "hot"}}), "temperature"},
      {"temperature out of range", ApiKind::kChat, chat_body({{"temperature", 2.5}}), "temperature"},
      {"top_p 0", ApiKind::kChat, chat_body({{"top_p", 0}}), "top_p"},
      {"n 0", ApiKind::kChat, chat_body({{"n", 0}}), "n"},
      {"max_tokens 0", ApiKind::kChat, chat_body({{"max_tokens", 0}}), "max_tokens"},
      {"max_tokens a string", ApiKind::kChat, chat_body({{"max_tokens", "5"}}), "max_tokens"},
      {"stop list of numbers", ApiKind::kChat, chat_body({{"stop", {1, 2}}}), "stop"},
      {"empty stop string", ApiKind::kChat, chat_body({{"stop", ""}}), "stop"},
      {"stream_options without stream", ApiKind::kChat, chat_body({{"stream_options", {{"include_usage", true}}}}), "stream_options"},
      {"top_logprobs without logprobs", ApiKind::kChat, chat_body({{"top_logprobs", 2}}), "top_logprobs"},
      {"top_logprobs 21", ApiKind::kChat, chat_body({{"logprobs", true}, {"top_logprobs", 21}}), "top_logprobs"},
      {"tool_choice required", ApiKind::kChat, chat_body({{"tool_choice", "required"}}), "tool_choice"},
      {"no messages", ApiKind::kChat, Json{{"model", "m"}}, "messages"},
      {"unknown role", ApiKind::kChat, Json{{"messages", {{{"role", "robot"}, {"content", "x"}}}}}, "messages"},
      // No field is silently ignored: a field honoured is checked, one not honoured is refused when
      // its value asks for something, an unknown one is refused.
      {"user", ApiKind::kChat, chat_body({{"user", "u"}}), ""},
      {"user not a string", ApiKind::kChat, chat_body({{"user", 5}}), "user"},
      {"unknown field", ApiKind::kChat, chat_body({{"temprature", 0.5}}), "temprature"},
      {"metadata (stored completions)", ApiKind::kChat, chat_body({{"metadata", {{"a", 1}}}}), "metadata"},
      {"metadata null asks for nothing", ApiKind::kChat, chat_body({{"metadata", nullptr}}), ""},
      {"guided_json", ApiKind::kChat, chat_body({{"guided_json", {{"type", "object"}}}}), "guided_json"},
      {"chat echo", ApiKind::kChat, chat_body({{"echo", true}}), ""},
      {"chat echo not a bool", ApiKind::kChat, chat_body({{"echo", 1}}), "echo"},
      {"chat echo false", ApiKind::kChat, chat_body({{"echo", false}}), ""},
      {"use_beam_search false", ApiKind::kChat, chat_body({{"use_beam_search", false}}), ""},
      {"use_beam_search", ApiKind::kChat, chat_body({{"use_beam_search", true}}), "use_beam_search"},
      {"prompt_logprobs", ApiKind::kCompletion, Json{{"prompt", "x"}, {"prompt_logprobs", 1}}, ""},
      {"prompt_logprobs on chat", ApiKind::kChat, chat_body({{"prompt_logprobs", 0}}), ""},
      {"prompt_logprobs 21", ApiKind::kCompletion, Json{{"prompt", "x"}, {"prompt_logprobs", 21}}, "prompt_logprobs"},
      {"prompt_logprobs streamed", ApiKind::kCompletion, Json{{"prompt", "x"}, {"prompt_logprobs", 1}, {"stream", true}},
       "prompt_logprobs"},
      {"max_tokens 0 scores a prompt", ApiKind::kCompletion,
       Json{{"prompt", "x"}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 0}}, ""},
      {"max_tokens 0 without scores", ApiKind::kCompletion, Json{{"prompt", "x"}, {"max_tokens", 0}}, "max_tokens"},
      {"max_completion_tokens 0 without scores", ApiKind::kChat, chat_body({{"max_completion_tokens", 0}}),
       "max_completion_tokens"},
      {"tools on completions", ApiKind::kCompletion, Json{{"prompt", "x"}, {"tools", Json::array()}}, "tools"},
      {"best_of = n", ApiKind::kCompletion, Json{{"prompt", "x"}, {"best_of", 2}, {"n", 2}}, ""},
      {"best_of > n", ApiKind::kCompletion, Json{{"prompt", "x"}, {"best_of", 3}}, "best_of"},
      {"logit_bias", ApiKind::kChat, chat_body({{"logit_bias", {{"5", -100}, {"7", 3.5}}}}), ""},
      {"logit_bias over 100", ApiKind::kChat, chat_body({{"logit_bias", {{"5", 101}}}}), "logit_bias"},
      {"logit_bias id not a number", ApiKind::kChat, chat_body({{"logit_bias", {{"x5", 1}}}}), "logit_bias"},
      {"logit_bias negative id", ApiKind::kChat, chat_body({{"logit_bias", {{"-5", 1}}}}), "logit_bias"},
      {"logit_bias a list", ApiKind::kChat, chat_body({{"logit_bias", {5, 1}}}), "logit_bias"},
      {"min_tokens", ApiKind::kChat, chat_body({{"min_tokens", 4}, {"max_tokens", 4}}), ""},
      {"min_tokens over max_tokens", ApiKind::kChat, chat_body({{"min_tokens", 5}, {"max_tokens", 4}}), "min_tokens"},
      {"min_tokens negative", ApiKind::kChat, chat_body({{"min_tokens", -1}}), "min_tokens"},
      {"include_stop_str_in_output a string", ApiKind::kChat, chat_body({{"include_stop_str_in_output", "yes"}}),
       "include_stop_str_in_output"},
      {"request_id with a space", ApiKind::kChat, chat_body({{"request_id", "a b"}}), "request_id"},
      {"request_id", ApiKind::kChat, chat_body({{"request_id", "abc-1"}}), ""},
      {"unknown stream option", ApiKind::kChat, chat_body({{"stream", true}, {"stream_options", {{"usage", true}}}}),
       "stream_options"},
      {"continuous_usage_stats", ApiKind::kChat,
       chat_body({{"stream", true}, {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}}), ""},
      {"continue_final_message after a user turn", ApiKind::kChat, chat_body({{"continue_final_message", true}}),
       "continue_final_message"},
      {"continue_final_message with a generation prompt", ApiKind::kChat,
       Json{{"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "Hel"}}}},
            {"continue_final_message", true}, {"add_generation_prompt", true}},
       "continue_final_message"},
      {"continue_final_message", ApiKind::kChat,
       Json{{"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "Hel"}}}},
            {"continue_final_message", true}},
       ""},
      {"reasoning_effort on K2", ApiKind::kChat, chat_body({{"reasoning_effort", "low"}}), "reasoning_effort"},
      {"parallel_tool_calls a number", ApiKind::kChat, chat_body({{"parallel_tool_calls", 1}}), "parallel_tool_calls"},
      {"stop_token_ids", ApiKind::kChat, chat_body({{"stop_token_ids", {5, 6}}}), ""},
      {"completion text", ApiKind::kCompletion, Json{{"prompt", "x"}}, ""},
      {"completion ids", ApiKind::kCompletion, Json{{"prompt", {1, 2, 3}}}, ""},
      {"completion without prompt", ApiKind::kCompletion, Json{{"model", "m"}}, "prompt"},
      {"completion empty prompt", ApiKind::kCompletion, Json{{"prompt", ""}}, "prompt"},
      {"completion negative id", ApiKind::kCompletion, Json{{"prompt", {1, -2}}}, "prompt"},
      {"completion echo", ApiKind::kCompletion, Json{{"prompt", "x"}, {"echo", true}}, ""},
      {"completion echo with logprobs", ApiKind::kCompletion, Json{{"prompt", "x"}, {"echo", true}, {"logprobs", 1}}, ""},
      {"completion echo with logprobs streamed", ApiKind::kCompletion,
       Json{{"prompt", "x"}, {"echo", true}, {"logprobs", 1}, {"stream", true}}, "echo"},
      {"completion logprobs 21", ApiKind::kCompletion, Json{{"prompt", "x"}, {"logprobs", 21}}, "logprobs"},
      // Integers that wrapped: a seed above int64 became negative, stop ids were cut to 32 bits.
      {"seed 2^64 - 1", ApiKind::kChat, chat_body({{"seed", UINT64_MAX}}), "seed"},
      {"negative seed (vLLM's range)", ApiKind::kChat, chat_body({{"seed", -5}}), ""},
      {"stop_token_ids negative", ApiKind::kChat, chat_body({{"stop_token_ids", {5, -1}}}), "stop_token_ids"},
      {"stop_token_ids 2^32", ApiKind::kChat, chat_body({{"stop_token_ids", {int64_t{1} << 32}}}), "stop_token_ids"},
      {"stop_token_ids 2^64 - 1", ApiKind::kChat, chat_body({{"stop_token_ids", {UINT64_MAX}}}), "stop_token_ids"},
      {"truncate_prompt_tokens 0", ApiKind::kChat, chat_body({{"truncate_prompt_tokens", 0}}), "truncate_prompt_tokens"},
      {"truncate_prompt_tokens -2", ApiKind::kChat, chat_body({{"truncate_prompt_tokens", -2}}), "truncate_prompt_tokens"},
      {"truncate_prompt_tokens -1", ApiKind::kChat, chat_body({{"truncate_prompt_tokens", -1}}), ""},
  };
  for (const Case& c : cases) {
    std::string param;
    auto r = parse_api_request(c.kind, ChatFormat::kKimiK2, c.body, &param);
    EXPECT_EQ(r.ok(), c.param.empty()) << c.name << ": " << r.status().to_string();
    EXPECT_EQ(param, c.param) << c.name;
    if (!r.ok()) {
      EXPECT_EQ(api_error(r.status(), param).status, 400) << c.name;
    }
  }
}

// fit_prompt: a prompt that leaves no room for a token is refused naming its length and the
// limit, unless the request (or the server's default) truncates it to its last ids.
TEST(OpenAIRequest, PromptsFitTheModelLengthOrAreTruncated) {
  struct Case {
    const char* name;
    Json extra;                     // request fields besides the prompt
    std::optional<int64_t> server;  // --truncate-prompt: -1
    int64_t prompt_len;
    int64_t kept;  // -1: refused
  };
  const int64_t limit = 100;
  const std::vector<Case> cases{
      {"fits", Json::object(), std::nullopt, 99, 99},
      {"one too many", Json::object(), std::nullopt, 100, -1},
      {"far too many", Json::object(), std::nullopt, 1000000, -1},
      {"keep the last 10", {{"truncate_prompt_tokens", 10}}, std::nullopt, 1000, 10},
      {"keep 10 of 5", {{"truncate_prompt_tokens", 10}}, std::nullopt, 5, 5},
      {"as many as fit", {{"truncate_prompt_tokens", -1}}, std::nullopt, 1000, 99},
      {"as many as leave max_tokens", {{"truncate_prompt_tokens", -1}, {"max_tokens", 30}}, std::nullopt, 1000, 70},
      {"max_tokens leaves nothing", {{"truncate_prompt_tokens", -1}, {"max_tokens", 100}}, std::nullopt, 1000, -1},
      {"the server truncates", Json::object(), -1, 1000, 99},
      {"the request overrides the server", {{"truncate_prompt_tokens", 7}}, -1, 1000, 7},
      {"keeping more than fits is refused", {{"truncate_prompt_tokens", 500}}, std::nullopt, 1000, -1},
  };
  for (const Case& c : cases) {
    Json body{{"prompt", {1}}};
    body.update(c.extra);
    std::string param;
    auto r = parse_api_request(ApiKind::kCompletion, ChatFormat::kKimiK2, body, &param);
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.status().to_string();
    std::vector<int32_t> prompt(static_cast<size_t>(c.prompt_len));
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i);
    auto room = fit_prompt(*r, c.server, limit, prompt);
    if (c.kept < 0) {
      ASSERT_FALSE(room.ok()) << c.name;
      EXPECT_EQ(room.status().code(), StatusCode::kInvalidArgument) << c.name;
      continue;
    }
    ASSERT_TRUE(room.ok()) << c.name << ": " << room.status().to_string();
    ASSERT_EQ(static_cast<int64_t>(prompt.size()), c.kept) << c.name;
    EXPECT_EQ(*room, limit - c.kept) << c.name;
    EXPECT_EQ(prompt.back(), c.prompt_len - 1) << c.name << ": the last ids are kept";
  }
  std::vector<int32_t> prompt(1000, 1);
  auto r = parse_api_request(ApiKind::kCompletion, ChatFormat::kKimiK2, Json{{"prompt", {1}}}, nullptr);
  auto refused = fit_prompt(*r, std::nullopt, limit, prompt);
  EXPECT_NE(refused.status().message().find("the prompt has 1000 tokens; a sequence holds at most 100"), std::string::npos)
      << refused.status().to_string();
}

TEST(OpenAIRequest, FieldsReachTheSpec) {
  std::string param;
  auto r = parse_api_request(ApiKind::kChat, ChatFormat::kKimiK2,
                             chat_body({{"temperature", 0.5}, {"top_p", 0.9}, {"top_k", 40}, {"min_p", 0.1},
                                        {"seed", 7}, {"n", 2}, {"max_completion_tokens", 9}, {"stop", "END"},
                                        {"stop_token_ids", {5}}, {"ignore_eos", true}, {"logprobs", true},
                                        {"top_logprobs", 3}, {"presence_penalty", 0.5}, {"stream", true},
                                        {"stream_options", {{"include_usage", true}}}}),
                             &param);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const RequestSpec& s = r->spec;
  EXPECT_FLOAT_EQ(s.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(s.sampling.top_p, 0.9f);
  EXPECT_EQ(s.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(s.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(s.sampling.presence_penalty, 0.5f);
  EXPECT_EQ(s.sampling.seed, 7u);
  EXPECT_TRUE(r->seed_given);
  EXPECT_EQ(s.n, 2);
  EXPECT_EQ(r->max_tokens, 9);
  EXPECT_EQ(s.stop.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(s.stop.stop_ids, std::vector<int32_t>{5});
  EXPECT_TRUE(s.stop.ignore_eos);
  EXPECT_EQ(s.top_logprobs, 3);
  EXPECT_TRUE(r->stream && r->include_usage);
  // Defaults: OpenAI's temperature 1, no log-probabilities.
  auto d = parse_api_request(ApiKind::kCompletion, ChatFormat::kKimiK2, Json{{"prompt", "x"}}, &param);
  ASSERT_TRUE(d.ok());
  EXPECT_FLOAT_EQ(d->spec.sampling.temperature, 1.0f);
  EXPECT_EQ(d->spec.top_logprobs, -1);
  EXPECT_FALSE(d->max_tokens.has_value());
}

const Json kTools = {{{"type", "function"}, {"function", {{"name", "f"}}}},
                     {{"type", "function"}, {"function", {{"name", "g"}}}}};
const Json kNamedG = {{"type", "function"}, {"function", {{"name", "g"}}}};

TEST(OpenAIRequest, ChatOptionsPerFormat) {
  constexpr ChatFormat K2 = ChatFormat::kKimiK2, K3 = ChatFormat::kK3;
  struct Case {
    const char* name;
    ChatFormat format;
    Json extra;
    std::string param;  // empty: accepted
  };
  const std::vector<Case> cases{
      {"K3 defaults", K3, Json::object(), ""},
      {"K3 thinking off", K3, {{"thinking", false}}, ""},
      {"K3 thinking in kwargs, other kwargs ignored", K3, {{"chat_template_kwargs", {{"thinking", false}, {"x", 1}}}}, ""},
      {"K3 thinking top-level and kwargs agree", K3, {{"thinking", false}, {"chat_template_kwargs", {{"thinking", false}}}}, ""},
      {"K3 thinking top-level and kwargs differ", K3, {{"thinking", true}, {"chat_template_kwargs", {{"thinking", false}}}}, "thinking"},
      {"K3 thinking not a bool", K3, {{"thinking", "no"}}, "thinking"},
      {"kwargs not an object", K3, {{"chat_template_kwargs", 3}}, "chat_template_kwargs"},
      {"K3 effort high", K3, {{"thinking_effort", "high"}}, ""},
      {"K3 effort in kwargs", K3, {{"chat_template_kwargs", {{"thinking_effort", "low"}}}}, ""},
      {"K3 effort medium", K3, {{"thinking_effort", "medium"}}, "thinking_effort"},
      {"K3 effort a number", K3, {{"thinking_effort", 2}}, "thinking_effort"},
      {"K3 required", K3, {{"tools", kTools}, {"tool_choice", "required"}}, ""},
      {"K3 named", K3, {{"tools", kTools}, {"tool_choice", kNamedG}}, ""},
      {"K3 named, not a tool", K3, {{"tools", kTools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "h"}}}}}}, "tool_choice"},
      {"K3 required without tools", K3, {{"tool_choice", "required"}}, "tool_choice"},
      {"K3 none without tools", K3, {{"tool_choice", "none"}}, ""},
      {"tool_choice unknown word", K3, {{"tools", kTools}, {"tool_choice", "always"}}, "tool_choice"},
      {"tool_choice object without a name", K3, {{"tools", kTools}, {"tool_choice", {{"type", "function"}}}}, "tool_choice"},
      {"a tool without a name", K3, {{"tools", {{{"type", "function"}, {"function", Json::object()}}}}}, "tools"},
      {"K3 json_object", K3, {{"response_format", {{"type", "json_object"}}}}, ""},
      {"K3 json_schema", K3, {{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}}}}}}, ""},
      {"response_format unknown type", K3, {{"response_format", {{"type", "yaml"}}}}, "response_format"},
      {"response_format a number", K3, {{"response_format", 1}}, "response_format"},
      {"K2 thinking off", K2, {{"thinking", false}}, ""},
      {"K2 thinking on", K2, {{"thinking", true}}, "thinking"},
      {"K2 effort", K2, {{"chat_template_kwargs", {{"thinking_effort", "max"}}}}, "thinking_effort"},
      {"K2 auto", K2, {{"tools", kTools}, {"tool_choice", "auto"}}, ""},
      {"K2 none", K2, {{"tools", kTools}, {"tool_choice", "none"}}, ""},
      {"K2 required", K2, {{"tools", kTools}, {"tool_choice", "required"}}, "tool_choice"},
      {"K2 named", K2, {{"tools", kTools}, {"tool_choice", kNamedG}}, "tool_choice"},
      {"K2 text format", K2, {{"response_format", {{"type", "text"}}}}, ""},
      {"K2 json format", K2, {{"response_format", {{"type", "json_object"}}}}, "response_format"},
  };
  for (const Case& c : cases) {
    std::string param;
    auto r = parse_api_request(ApiKind::kChat, c.format, chat_body(c.extra), &param);
    EXPECT_EQ(r.ok(), c.param.empty()) << c.name << ": " << r.status().to_string();
    EXPECT_EQ(param, c.param) << c.name;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(c.param), std::string::npos) << c.name << ": " << r.status().to_string();
    }
  }
}

const Tokenizer& k3_tokenizer() {
  static const Tokenizer t = Tokenizer::load(testing::source_path("tokenizers/kimi-k3")).value();
  return t;
}

// The options reach the renderer: the K3 prompt carries their system messages.
TEST(OpenAIRequest, K3OptionsAreRendered) {
  std::string param;
  ApiRequest r = parse_api_request(ApiKind::kChat, ChatFormat::kK3,
                                   chat_body({{"tools", kTools}, {"tool_choice", kNamedG},
                                              {"chat_template_kwargs", {{"thinking_effort", "high"}}},
                                              {"response_format", {{"type", "json_object"}}}}),
                                   &param)
                     .value();
  EXPECT_EQ(r.forced_tool, "g");
  EXPECT_EQ(r.chat.tool_choice, ToolChoice::kRequired);
  EXPECT_EQ(r.chat.tools_json, Json({kTools[1]}).dump());  // only the named function is declared
  EXPECT_FALSE(r.parse_tool_calls);                        // K3 output is parsed from ids, not K2 text
  const std::string prompt = k3_tokenizer().decode(request_prompt_ids(r, &k3_tokenizer(), ChatFormat::kK3).value());
  for (const char* want : {"`tool_choice=required`", "`thinking_effort=high`", "`response_format=json_object`",
                           "\"name\":\"g\"", "<|open|>think<|sep|>"})
    EXPECT_NE(prompt.find(want), std::string::npos) << want << " not in " << prompt;
  EXPECT_EQ(prompt.find("\"name\":\"f\""), std::string::npos);
  ApiRequest off = parse_api_request(ApiKind::kChat, ChatFormat::kK3, chat_body({{"thinking", false}}), &param).value();
  const std::string off_prompt = k3_tokenizer().decode(request_prompt_ids(off, &k3_tokenizer(), ChatFormat::kK3).value());
  EXPECT_EQ(off_prompt.find("thinking_effort"), std::string::npos);
  EXPECT_EQ(off_prompt.substr(off_prompt.size() - 23), "<|open|>response<|sep|>");
  // Thinking on renders an effort message only when one is asked for, by either name; the Qwen-style
  // chat_template_kwargs.enable_thinking turns thinking off as `thinking` does.
  auto prompt_of = [&](const Json& extra) {
    ApiRequest req = parse_api_request(ApiKind::kChat, ChatFormat::kK3, chat_body(extra), &param).value();
    return k3_tokenizer().decode(request_prompt_ids(req, &k3_tokenizer(), ChatFormat::kK3).value());
  };
  const std::string plain = prompt_of(Json::object());
  EXPECT_EQ(plain.find("thinking_effort"), std::string::npos) << plain;
  EXPECT_EQ(plain.substr(plain.size() - 20), "<|open|>think<|sep|>");
  EXPECT_NE(prompt_of({{"reasoning_effort", "low"}}).find("`thinking_effort=low`"), std::string::npos);
  EXPECT_EQ(prompt_of({{"chat_template_kwargs", {{"enable_thinking", false}}}}), off_prompt);
  EXPECT_FALSE(parse_api_request(ApiKind::kChat, ChatFormat::kK3,
                                 chat_body({{"reasoning_effort", "low"}, {"thinking_effort", "high"}}), &param)
                   .ok());
  EXPECT_EQ(param, "reasoning_effort");
}

TEST(OpenAIError, StatusesAndShape) {
  EXPECT_EQ(api_error(Status::InvalidArgument("x")).status, 400);
  EXPECT_EQ(api_error(Status::NotFound("x")).status, 404);
  EXPECT_EQ(api_error(Status::ResourceExhausted("x")).status, 503);
  EXPECT_EQ(api_error(Status::IOError("x")).status, 500);
  const Json j = error_json(api_error(Status::InvalidArgument("bad"), "top_p"));
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["param"], "top_p");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

// A K2 chat request declaring one tool (plus `extra` fields), and the one event that ends its
// answer: the text of testing::kToolPieces (content and two tool calls) as one token.
ApiRequest k2_tool_request(const Json& extra) {
  std::string param;
  Json body = chat_body({{"tools", {{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}});
  body.update(extra);
  return parse_api_request(ApiKind::kChat, ChatFormat::kKimiK2, body, &param).value();
}
EngineEvent k2_tool_event() {
  std::string all;
  for (const std::string& p : testing::kToolPieces) all += p;
  EngineEvent e;
  e.text = all;
  e.tokens.push_back(TokenOutput{7, all, Sampled{7, -0.5f, {{7, -0.5f}}}});
  e.finish = FinishReason::kStop;
  return e;
}

TEST(OpenAIResponse, ChatToolCallsUsageAndLogprobs) {
  ResponseBuilder b(k2_tool_request({{"logprobs", true}}), ChatFormat::kKimiK2, "chatcmpl-1", "m", nullptr);
  const std::vector<Json> chunks = b.chunks(k2_tool_event());
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["content"], "I will look.");
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["tool_calls"].size(), 2u);
  const Json r = b.response(RequestStats{10, 4, 0, 0, 0});
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["usage"]["total_tokens"], 14);
  const Json& msg = r["choices"][0]["message"];
  EXPECT_EQ(msg["content"], "I will look.");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(msg["tool_calls"][1]["function"]["arguments"], "{\"a\": 1, \"b\": 2}");
  EXPECT_EQ(r["choices"][0]["logprobs"]["content"][0]["logprob"], -0.5f);
}

// The response fields a request turns on: return_token_ids, return_tokens_as_token_ids,
// continuous usage, parallel_tool_calls false; and logprob bytes as OpenAI's integers 0-255.
TEST(OpenAIResponse, RequestedFieldsAndUnsignedBytes) {
  const Tokenizer& tok = k3_tokenizer();
  const std::vector<int32_t> e_acute = tok.encode("é");  // bytes 0xC3 0xA9
  ASSERT_FALSE(e_acute.empty());
  const int32_t id = e_acute[0];
  const std::string raw = tok.token_bytes(id);
  std::string param;
  ApiRequest req = parse_api_request(ApiKind::kCompletion, ChatFormat::kK3,
                                     Json{{"prompt", "x"}, {"logprobs", 1}, {"stream", true}, {"return_token_ids", true},
                                          {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}},
                                     &param)
                       .value();
  ResponseBuilder b(req, ChatFormat::kK3, "cmpl-1", "m", &tok, {11, 12, 13});
  EngineEvent e1, e2;
  e1.text = "é";
  e1.tokens = {TokenOutput{id, "é", Sampled{id, -1, {{id, -1}}}}};
  e2.text = "é";
  e2.tokens = {TokenOutput{id, "é", Sampled{id, -1, {{id, -1}}}}};
  e2.finish = FinishReason::kLength;
  const Json c1 = b.chunks(e1).at(0), c2 = b.chunks(e2).at(0);
  EXPECT_EQ(c1["choices"][0]["prompt_token_ids"], Json({11, 12, 13}));
  EXPECT_FALSE(c2["choices"][0].contains("prompt_token_ids"));
  EXPECT_EQ(c1["choices"][0]["token_ids"], Json({id}));
  EXPECT_EQ(c1["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(c1["usage"]["completion_tokens"], 1);
  EXPECT_EQ(c2["usage"]["completion_tokens"], 2);
  const Json r = b.response(RequestStats{3, 2, 0, 0, 0});
  EXPECT_EQ(r["choices"][0]["token_ids"], Json({id, id}));
  EXPECT_EQ(r["choices"][0]["prompt_token_ids"], Json({11, 12, 13}));

  // echo: the prompt's text opens the choice's text, streamed and whole.
  ApiRequest echo = parse_api_request(ApiKind::kCompletion, ChatFormat::kK3,
                                      Json{{"prompt", "x"}, {"echo", true}, {"stream", true}}, &param)
                        .value();
  const std::vector<int32_t> echoed = tok.encode("Once upon");
  ResponseBuilder eb(echo, ChatFormat::kK3, "cmpl-2", "m", &tok, echoed);
  EngineEvent partial;  // a token whose text is not out yet: the echo goes out alone, once
  partial.tokens = {TokenOutput{id, "", Sampled{id, 0, {}}}};
  EXPECT_EQ(eb.chunks(partial).at(0)["choices"][0]["text"], "Once upon");
  EXPECT_TRUE(eb.chunks(partial).empty());
  EXPECT_EQ(eb.chunks(e1).at(0)["choices"][0]["text"], "é");
  EXPECT_EQ(eb.response(RequestStats{})["choices"][0]["text"], "Once uponé");

  // echo with logprobs (lm-evaluation-harness's loglikelihood shape: max_tokens 0 or 1): the
  // prompt's tokens lead the logprobs, the first without a log-probability, the rest the engine's
  // scores with the top logprobs entries; prompt_logprobs adds vLLM's list (the token with its rank
  // and the k most likely).
  ApiRequest scored = parse_api_request(ApiKind::kCompletion, ChatFormat::kK3,
                                        Json{{"prompt", "x"}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 0},
                                             {"prompt_logprobs", 2}},
                                        &param)
                          .value();
  EXPECT_EQ(scored.spec.prompt_logprobs, 2);
  EXPECT_EQ(scored.max_tokens, 0);
  ResponseBuilder sb(scored, ChatFormat::kK3, "cmpl-3", "m", &tok, echoed);
  ASSERT_GE(echoed.size(), 2u);
  EngineEvent scores;
  for (size_t i = 1; i < echoed.size(); ++i)
    scores.prompt_logprobs.push_back(
        Sampled{echoed[i], -0.5f * static_cast<float>(i), {{id, -0.1f}, {echoed[i], -0.5f * static_cast<float>(i)}}, 2});
  scores.finish = FinishReason::kLength;
  sb.chunks(scores);
  const Json sr = sb.response(RequestStats{static_cast<int64_t>(echoed.size()), 0, 0, 0, 0});
  const Json& lp = sr["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), echoed.size());
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (size_t i = 1; i < echoed.size(); ++i) {
    EXPECT_EQ(lp["token_logprobs"][i].get<float>(), -0.5f * static_cast<float>(i)) << i;
    EXPECT_EQ(lp["top_logprobs"][i].size(), 1u) << i;  // logprobs 1
  }
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(sr["choices"][0]["text"], "Once upon");
  const Json& pl = sr["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(pl.size(), echoed.size());
  EXPECT_TRUE(pl[0].is_null());
  EXPECT_EQ(pl[1][std::to_string(echoed[1])]["rank"], 2);
  EXPECT_EQ(pl[1][std::to_string(id)]["rank"], 1);
  EXPECT_EQ(pl[1][std::to_string(echoed[1])]["logprob"].get<float>(), -0.5f);

  // Chat echo (vLLM's): the reply continues the last message when it is the assistant's, which
  // opens the content, streamed and whole; after a user message there is nothing to echo.
  for (const bool assistant_last : {true, false}) {
    Json messages = {{{"role", "user"}, {"content", "hi"}}};
    if (assistant_last) messages.push_back({{"role", "assistant"}, {"content", "Once upon"}});
    ApiRequest ce = parse_api_request(ApiKind::kChat, ChatFormat::kKimiK2,
                                      Json{{"messages", messages}, {"echo", true}, {"stream", true},
                                           {"continue_final_message", assistant_last}},
                                      &param)
                        .value();
    ResponseBuilder cbe(ce, ChatFormat::kKimiK2, "chatcmpl-e", "m", &tok, {11});
    const std::string opening = assistant_last ? "Once upon" : "";
    EXPECT_EQ(cbe.chunks(e1).at(0)["choices"][0]["delta"]["content"], opening + "é");
    EXPECT_EQ(cbe.chunks(e2).at(0)["choices"][0]["delta"]["content"], "é");
    EXPECT_EQ(cbe.response(RequestStats{})["choices"][0]["message"]["content"], opening + "éé");
  }

  // Chat logprobs carry bytes; each is in [0, 255] and they spell the token.
  ApiRequest chat = parse_api_request(ApiKind::kChat, ChatFormat::kK3,
                                      chat_body({{"logprobs", true}, {"top_logprobs", 1}, {"return_token_ids", true}}), &param)
                        .value();
  ResponseBuilder cb(chat, ChatFormat::kK3, "chatcmpl-1", "m", &tok, {11});
  cb.chunks(e1);
  const Json cr = cb.response(RequestStats{1, 1, 0, 0, 0});
  const Json& bytes = cr["choices"][0]["logprobs"]["content"][0]["bytes"];
  ASSERT_EQ(bytes.size(), raw.size());
  for (size_t i = 0; i < raw.size(); ++i) EXPECT_EQ(bytes[i].get<int>(), static_cast<unsigned char>(raw[i])) << i;
  EXPECT_GT(bytes[0].get<int>(), 127) << "a non-ASCII lead byte";
  EXPECT_EQ(cr["prompt_token_ids"], Json({11}));
  EXPECT_EQ(cr["choices"][0]["token_ids"], Json({id}));

  // return_tokens_as_token_ids names every token "token_id:N".
  ApiRequest as_ids = parse_api_request(ApiKind::kChat, ChatFormat::kK3,
                                        chat_body({{"logprobs", true}, {"top_logprobs", 1}, {"return_tokens_as_token_ids", true}}),
                                        &param)
                          .value();
  ResponseBuilder ib(as_ids, ChatFormat::kK3, "chatcmpl-2", "m", &tok);
  ib.chunks(e1);
  const Json ir = ib.response(RequestStats{});
  const Json& entry = ir["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(entry["token"], "token_id:" + std::to_string(id));
  EXPECT_EQ(entry["top_logprobs"][0]["token"], "token_id:" + std::to_string(id));
}

TEST(OpenAIResponse, ParallelToolCallsFalseKeepsTheFirstCall) {
  ResponseBuilder b(k2_tool_request({{"parallel_tool_calls", false}}), ChatFormat::kKimiK2, "chatcmpl-1", "m", nullptr);
  const std::vector<Json> chunks = b.chunks(k2_tool_event());
  ASSERT_EQ(chunks.size(), 1u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["tool_calls"].size(), 1u);
  const Json r = b.response(RequestStats{});
  const Json& msg = r["choices"][0]["message"];
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
}

TEST(OpenAIResponse, CompletionChunksAndUsage) {
  std::string param;
  ApiRequest req = parse_api_request(ApiKind::kCompletion, ChatFormat::kKimiK2,
                                     Json{{"prompt", "x"}, {"logprobs", 1}, {"stream", true},
                                          {"stream_options", {{"include_usage", true}}}},
                                     &param)
                       .value();
  ResponseBuilder b(req, ChatFormat::kKimiK2, "cmpl-1", "m", nullptr);
  EXPECT_TRUE(b.opening_chunks().empty());
  EngineEvent e1, e2;
  e1.text = "ab";
  e1.tokens = {TokenOutput{1, "a", Sampled{1, -1, {{1, -1}}}}, TokenOutput{2, "b", Sampled{2, -2, {{3, -1}}}}};
  e2.text = "c";
  e2.tokens = {TokenOutput{4, "c", Sampled{4, -3, {{4, -3}}}}};
  e2.finish = FinishReason::kLength;
  b.chunks(e1);
  const Json last = b.chunks(e2).at(0);
  EXPECT_EQ(last["object"], "text_completion");
  EXPECT_EQ(last["choices"][0]["text"], "c");
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(last["choices"][0]["logprobs"]["text_offset"][0], 2);
  EXPECT_TRUE(last["usage"].is_null());
  const Json u = b.usage_chunk(RequestStats{3, 3, 0, 0, 0});
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["completion_tokens"], 3);
  const Json r = b.response(RequestStats{3, 3, 0, 0, 0});
  EXPECT_EQ(r["choices"][0]["text"], "abc");
  EXPECT_EQ(r["choices"][0]["logprobs"]["tokens"], Json({"a", "b", "c"}));
  EXPECT_EQ(r["choices"][0]["logprobs"]["text_offset"], Json({0, 1, 2}));
}

// A server without a tokenizer (token-id prompts only) has no text to send: each chunk carries the
// event's token ids instead of being held back until the end, and the response all of them.
TEST(OpenAIResponse, CompletionWithoutTokenizerCarriesTokenIds) {
  std::string param;
  ApiRequest req = parse_api_request(ApiKind::kCompletion, ChatFormat::kKimiK2, Json{{"prompt", {5, 6}}, {"stream", true}}, &param)
                       .value();
  ResponseBuilder b(req, ChatFormat::kKimiK2, "cmpl-1", "m", nullptr);
  EngineEvent e1, e2;
  e1.tokens = {TokenOutput{7, "", {}}, TokenOutput{8, "", {}}};
  e2.tokens = {TokenOutput{9, "", {}}};
  e2.finish = FinishReason::kLength;
  const std::vector<Json> c1 = b.chunks(e1), c2 = b.chunks(e2);
  ASSERT_EQ(c1.size(), 1u);
  EXPECT_EQ(c1[0]["choices"][0]["token_ids"], Json({7, 8}));
  EXPECT_TRUE(c1[0]["choices"][0]["finish_reason"].is_null());
  ASSERT_EQ(c2.size(), 1u);
  EXPECT_EQ(c2[0]["choices"][0]["token_ids"], Json({9}));
  EXPECT_EQ(c2[0]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(b.response(RequestStats{2, 3, 0, 0, 0})["choices"][0]["token_ids"], Json({7, 8, 9}));
}

// A K3 assistant turn as the model writes it after the generation prompt (thinking on).
std::vector<int32_t> k3_turn_ids(const std::string& reasoning, const std::string& content, const std::vector<ToolCall>& calls) {
  const Tokenizer& tok = k3_tokenizer();
  ChatOptions options;
  options.thinking_effort = ThinkingEffort::kUnset;
  const std::vector<int32_t> prompt = render_chat_ids(tok, ChatFormat::kK3, {}, options).value().ids;
  options.add_generation_prompt = false;
  ChatMessage m{"assistant", content, calls, "", ""};
  m.reasoning = reasoning;
  std::vector<int32_t> turn = render_chat_ids(tok, ChatFormat::kK3, {m}, options).value().ids;
  KL_CHECK(std::equal(prompt.begin(), prompt.end(), turn.begin()));
  turn.erase(turn.begin(), turn.begin() + static_cast<std::ptrdiff_t>(prompt.size()));
  turn.pop_back();  // <|end_of_msg|>: the engine stops on it without emitting it
  return turn;
}

struct Streamed {
  std::string reasoning, content, finish;
  std::map<int, std::string> names, ids, args;
  Json response;
};

// Feeds `ids` to a K3 chat ResponseBuilder in events of `group` tokens and collects the deltas.
Streamed stream_k3(const std::vector<int32_t>& ids, size_t group, const Json& extra) {
  std::string param;
  ApiRequest req = parse_api_request(ApiKind::kChat, ChatFormat::kK3, chat_body(extra), &param).value();
  ResponseBuilder b(req, ChatFormat::kK3, "chatcmpl-1", "m", &k3_tokenizer());
  StreamDecoder dec(k3_tokenizer());
  Streamed out;
  for (size_t i = 0; i < ids.size(); i += group) {
    EngineEvent e;
    for (size_t k = i; k < std::min(ids.size(), i + group); ++k) {
      const std::string text = dec.push(ids[k]);
      e.text += text;
      e.tokens.push_back(TokenOutput{ids[k], text, Sampled{ids[k], 0, {}}});
    }
    if (i + group >= ids.size()) e.finish = FinishReason::kStop;
    for (const Json& chunk : b.chunks(e)) {
      const Json& ch = chunk["choices"][0];
      const Json& d = ch["delta"];
      out.reasoning += d.value("reasoning_content", "");
      out.content += d.value("content", "");
      for (const Json& t : d.value("tool_calls", Json::array())) {
        const int index = t["index"];
        if (t.contains("id")) {
          EXPECT_FALSE(out.names.count(index)) << "call " << index << " announced twice";
          out.names[index] = t["function"]["name"];
          out.ids[index] = t["id"];
        }
        out.args[index] += t["function"]["arguments"].get<std::string>();
      }
      if (!ch["finish_reason"].is_null()) out.finish = ch["finish_reason"];
    }
  }
  out.response = b.response(RequestStats{});
  return out;
}

TEST(OpenAIResponse, K3TurnStreamsReasoningContentAndToolCalls) {
  const std::vector<ToolCall> calls{{"", "get_weather", R"({"city": "Paris", "days": 3})"}, {"", "get_time", R"({"tz": "CET"})"}};
  const std::vector<int32_t> ids = k3_turn_ids("I should call both. Ça va?", "Checking both — 天气.", calls);
  for (size_t group : {size_t{1}, size_t{2}, size_t{5}, ids.size()}) {
    const Streamed s = stream_k3(ids, group, {{"tools", kTools}});
    EXPECT_EQ(s.reasoning, "I should call both. Ça va?") << group;
    EXPECT_EQ(s.content, "Checking both — 天气.") << group;
    EXPECT_EQ(s.finish, "tool_calls") << group;
    EXPECT_EQ(s.names, (std::map<int, std::string>{{0, "get_weather"}, {1, "get_time"}})) << group;
    EXPECT_EQ(s.ids, (std::map<int, std::string>{{0, "functions.get_weather:0"}, {1, "functions.get_time:1"}})) << group;
    EXPECT_EQ(s.args, (std::map<int, std::string>{{0, R"({"city":"Paris","days":3})"}, {1, R"({"tz":"CET"})"}})) << group;
    const Json& m = s.response["choices"][0]["message"];
    EXPECT_EQ(m["reasoning_content"], s.reasoning);
    EXPECT_EQ(m["content"], s.content);
    ASSERT_EQ(m["tool_calls"].size(), 2u);
    EXPECT_EQ(m["tool_calls"][1]["function"]["arguments"], R"({"tz":"CET"})");
    EXPECT_EQ(s.response["choices"][0]["finish_reason"], "tool_calls");
  }
}

TEST(OpenAIResponse, K3ForcedToolWithoutCallAndBrokenOutput) {
  // tool_choice asked for a call; the model answered in text: a plain answer, finish_reason stop.
  const Streamed plain = stream_k3(k3_turn_ids("", "No tool needed.", {}), 3, {{"tools", kTools}, {"tool_choice", "required"}});
  EXPECT_EQ(plain.content, "No tool needed.");
  EXPECT_EQ(plain.finish, "stop");
  EXPECT_TRUE(plain.names.empty());
  EXPECT_FALSE(plain.response["choices"][0]["message"].contains("tool_calls"));
  EXPECT_TRUE(plain.response["choices"][0]["message"]["reasoning_content"].is_null());
  // Output that breaks the grammar after the response element: nothing is lost, the rest passes through.
  std::vector<int32_t> ids = k3_turn_ids("", "Start.", {});
  const int32_t close = *k3_tokenizer().special_id("<|close|>");
  ids.erase(std::find(ids.rbegin(), ids.rend(), close).base() - 1, ids.end());  // drop <|close|>message<|sep|>
  const std::vector<int32_t> bad = k3_tokenizer().encode("<|open|>bogus<|sep|>tail", Tokenizer::Specials::kParse);
  ids.insert(ids.end(), bad.begin(), bad.end());
  for (size_t group : {size_t{1}, ids.size()}) {
    const Streamed s = stream_k3(ids, group, Json::object());
    EXPECT_NE(s.content.find("Start."), std::string::npos) << group << ": " << s.content;
    EXPECT_NE(s.content.find("bogus"), std::string::npos) << group << ": " << s.content;
    EXPECT_NE(s.content.find("tail"), std::string::npos) << group << ": " << s.content;
    EXPECT_EQ(s.response["choices"][0]["message"]["content"], s.content) << group;
  }
}

}  // namespace
}  // namespace klinear
