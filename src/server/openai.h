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
  bool continuous_usage = false;     // stream_options.continuous_usage_stats: usage in every chunk
  bool logprobs = false;
  bool tokens_as_ids = false;        // return_tokens_as_token_ids: logprob tokens as "token_id:N"
  bool return_token_ids = false;     // the prompt's and each choice's token ids in the response
  bool parallel_tool_calls = true;   // chat: false keeps a choice's first tool call only
  bool include_reasoning = true;     // chat, K3: false leaves the reasoning out
  bool echo = false;                 // completions: each choice's text starts with the prompt's; chat:
                                     // with the last message's content when it is the assistant's
  bool prompt_logprobs = false;      // prompt_logprobs given: the response lists them (vLLM's field)
  std::string request_id;            // the response id after its prefix; empty: a fresh one
  std::string user;                  // the caller's end user (OpenAI's abuse tracing): in the request's log line
};

// Parses and checks a request body for a model whose chat format is `format`. Every field is one
// OpenAI or vLLM clients send: a field this server honours is checked (wrong type or out of range,
// or a chat option `format` cannot render, is InvalidArgument naming it, also stored in `*param`);
// one it does not honour is InvalidArgument naming it unless its value asks for nothing (null or
// the neutral value, e.g. "echo": false); a field neither knows is InvalidArgument naming it.
// docs/DESIGN.md lists the fields and what each does.
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
  // `prompt`: the request's prompt ids (return_token_ids, continuous usage, echo).
  ResponseBuilder(const ApiRequest& request, ChatFormat format, std::string id, std::string model,
                  const Tokenizer* tokenizer, std::vector<int32_t> prompt = {});

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
    bool echoed = false;              // echo: the prompt's text went out
  };
  Json chunk_base() const;
  Json logprobs_json(const std::vector<TokenOutput>& tokens, size_t text_offset) const;
  // echo with logprobs: the prompt's tokens as logprobs_json lists them (the first without a
  // log-probability), then `generated`'s.
  Json echo_logprobs_json(const Json& generated) const;
  // prompt_logprobs as vLLM returns them: null for the first token, then per token an object of
  // id → {logprob, rank, decoded_token} for the token and the k most likely.
  Json prompt_logprobs_json() const;
  ChatDelta chat_delta(ChoiceState& c, const EngineEvent& e);
  std::string finish_reason(const ChoiceState& c) const;

  ApiKind kind_;
  // The choice's tool calls as the request allows them (parallel_tool_calls false: the first).
  std::vector<ToolCall> allowed_calls(std::vector<ToolCall> calls) const;
  std::string token_name(int32_t id) const;

  bool logprobs_, parse_tool_calls_, include_usage_, continuous_usage_, tokens_as_ids_, return_token_ids_,
      parallel_tool_calls_, include_reasoning_;
  std::vector<int32_t> prompt_;
  std::string echo_;  // echo: the prompt's text, which each choice's text starts with
  bool echo_logprobs_, list_prompt_logprobs_;
  int top_logprobs_, prompt_top_;
  std::vector<Sampled> prompt_logprobs_;  // from the engine (RequestSpec::prompt_logprobs)
  int64_t completion_tokens_ = 0;
  std::string id_, model_;
  int64_t created_;
  const Tokenizer* tokenizer_;
  std::vector<ChoiceState> choices_;
};

Json usage_json(const RequestStats& stats);

}  // namespace klinear
