// The OpenAI HTTP protocol over the engine, without any HTTP: request bodies to RequestSpec (with
// the parameter checks and the error objects OpenAI clients expect) and engine events to response
// and server-sent-event chunk JSON, usage and log-probabilities included. Kimi K2 tool calls in
// the output become tool_calls (chat/k2_tool_calls.h; K3's turns: chat/k3_tool_calls.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chat/chat_format.h"
#include "chat/k2_tool_calls.h"
#include "chat/k3_tool_calls.h"
#include "io/json.h"
#include "io/tokenizer.h"
#include "runtime/engine.h"

namespace klinear {

enum class ApiKind { kChat, kCompletion };

// An OpenAI error object with its HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending request field, if any
  std::string code;
};
// {"error": {"message", "type", "param", "code"}} (param and code null when empty).
Json error_json(const ApiError& e);
// InvalidArgument/NotSupported -> 400, NotFound -> 404, ResourceExhausted -> 503, else 500.
ApiError api_error(const Status& s, std::string param = "");

struct ApiRequest {
  ApiKind kind = ApiKind::kChat;
  std::string model;                 // empty: the served model
  std::vector<ChatMessage> messages;  // chat
  ChatOptions chat;                  // chat: tools (declared ones only), thinking, tool choice, format
  std::string forced_tool;           // chat: the function a named tool_choice asks for; else empty
  bool parse_tool_calls = false;     // chat, K2: tools given and tool_choice is not "none"
  std::optional<std::string> prompt_text;  // completions: a text prompt ...
  std::vector<int32_t> prompt_ids;         // ... or token ids
  std::optional<int64_t> max_tokens;       // absent: up to the context
  std::optional<int64_t> truncate_prompt_tokens;  // keep the prompt's last k ids; -1: as many as fit
  RequestSpec spec;                  // everything but the prompt ids and max_tokens
  bool seed_given = false;
  bool stream = false, include_usage = false;
  bool logprobs = false;
};

// Parses and checks a request body for a model whose chat format is `format`. Unknown fields are
// ignored; a known field of the wrong type or out of range, or a chat option `format` cannot
// render, is InvalidArgument naming it (also stored in `*param`).
Result<ApiRequest> parse_api_request(ApiKind kind, ChatFormat format, const Json& body, std::string* param);

// The prompt ids of a request: chat messages rendered in `format` (with r.chat) and encoded;
// completion text encoded; completion ids as given. NotSupported without a tokenizer for text.
Result<std::vector<int32_t>> request_prompt_ids(const ApiRequest& r, const Tokenizer* tokenizer, ChatFormat format);

// Fits `prompt` into a sequence of at most `max_model_len` tokens: with r.truncate_prompt_tokens
// (or `truncate_default` when the request has none) it keeps the last k ids (-1: as many as leave
// room for max_tokens, or one token); then InvalidArgument naming the prompt's length when no
// generated token fits. Returns the room left (the default max_tokens).
Result<int64_t> fit_prompt(const ApiRequest& r, std::optional<int64_t> truncate_default, int64_t max_model_len,
                           std::vector<int32_t>& prompt);

// Turns engine events into OpenAI JSON for one request: SSE chunks while streaming, one response
// at the end otherwise. Not thread-safe.
class ResponseBuilder {
 public:
  // K3 chat output is parsed from ids, so a K3 chat request needs `tokenizer`.
  ResponseBuilder(const ApiRequest& request, ChatFormat format, std::string id, std::string model,
                  const Tokenizer* tokenizer);

  // The chunks an event produces (streaming); also accumulates for response().
  std::vector<Json> chunks(const EngineEvent& e);
  // The first chunk of each chat choice (role "assistant"); empty for completions.
  std::vector<Json> opening_chunks() const;
  // The usage-only final chunk (stream_options.include_usage).
  Json usage_chunk(const RequestStats& stats) const;
  // The whole response after the request ended.
  Json response(const RequestStats& stats) const;

 private:
  struct ChoiceState {
    std::string text;
    std::vector<TokenOutput> tokens;
    std::optional<FinishReason> finish;
    ToolCallStream tool_stream;       // K2 chat with tools
    std::optional<K3TurnStream> k3;   // K3 chat
    std::vector<int32_t> ids;         // K3 chat: every generated id
  };
  Json chunk_base() const;
  Json logprobs_json(const std::vector<TokenOutput>& tokens, size_t text_offset) const;
  ChatDelta chat_delta(ChoiceState& c, const EngineEvent& e);
  std::string finish_reason(const ChoiceState& c) const;

  ApiKind kind_;
  bool logprobs_, parse_tool_calls_, include_usage_;
  std::string id_, model_;
  int64_t created_;
  const Tokenizer* tokenizer_;
  std::vector<ChoiceState> choices_;
};

Json usage_json(const RequestStats& stats);

}  // namespace klinear
