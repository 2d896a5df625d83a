#include "server/openai.h"

#include <chrono>

namespace klinear {

Json error_json(const ApiError& e) {
  return Json{{"error",
               {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? Json(nullptr) : Json(e.param)},
                {"code", e.code.empty() ? Json(nullptr) : Json(e.code)}}}};
}

ApiError api_error(const Status& s, std::string param) {
  ApiError e;
  e.message = s.message();
  e.param = std::move(param);
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotSupported: e.status = 400; break;
    case StatusCode::kNotFound:
      e.status = 404;
      e.type = "not_found_error";
      break;
    case StatusCode::kResourceExhausted:
      e.status = 503;
      e.type = "server_overloaded";
      break;
    default:
      e.status = 500;
      e.type = "server_error";
  }
  return e;
}

namespace {

constexpr const char* kWhere = "request";

// Field getters that also record which field failed.
struct Fields {
  const Json& body;
  std::string* param;
  Status fail(const std::string& key, Status s) {
    if (param) *param = key;
    return s;
  }
  Status out_of_range(const std::string& key, const std::string& expected, const Json& v) {
    return fail(key, Status::InvalidArgument("field '" + key + "' must be " + expected + ", got " + v.dump()));
  }
};

#define KL_FIELD(lhs, getter, key)                        \
  auto KL_CONCAT(f_, __LINE__) = getter(f.body, key, kWhere); \
  if (!KL_CONCAT(f_, __LINE__).ok()) return f.fail(key, KL_CONCAT(f_, __LINE__).status()); \
  lhs = *KL_CONCAT(f_, __LINE__)

// A number field in [lo, hi] (both inclusive) stored into `out` when present.
Status number_in(Fields& f, const std::string& key, double lo, double hi, float& out) {
  KL_FIELD(std::optional<double> v, json_opt_number, key);
  if (!v) return Status();
  if (!(*v >= lo && *v <= hi))
    return f.out_of_range(key, "in [" + Json(lo).dump() + ", " + Json(hi).dump() + "]", f.body[key]);
  out = static_cast<float>(*v);
  return Status();
}

Status int_in(Fields& f, const std::string& key, int64_t lo, int64_t hi, std::optional<int64_t>& out) {
  KL_FIELD(out, json_opt_int, key);
  if (out && (*out < lo || *out > hi))
    return f.out_of_range(key, "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", f.body[key]);
  return Status();
}

Status parse_stop(Fields& f, StopOptions& stop) {
  if (!f.body.contains("stop") || f.body["stop"].is_null()) return Status();
  const Json& v = f.body["stop"];
  if (v.is_string()) {
    stop.stop.push_back(v.get<std::string>());
  } else if (v.is_array() && v.size() <= 16) {
    for (const Json& s : v) {
      if (!s.is_string()) return f.out_of_range("stop", "a string or a list of at most 16 strings", v);
      stop.stop.push_back(s.get<std::string>());
    }
  } else {
    return f.out_of_range("stop", "a string or a list of at most 16 strings", v);
  }
  for (const std::string& s : stop.stop)
    if (s.empty()) return f.out_of_range("stop", "non-empty strings", v);
  return Status();
}

Status parse_prompt(Fields& f, ApiRequest& r) {
  if (!f.body.contains("prompt") || f.body["prompt"].is_null())
    return f.fail("prompt", Status::InvalidArgument("field 'prompt' is required"));
  const Json& p = f.body["prompt"];
  const std::string expected = "a string, a list of token ids or a list holding one string";
  if (p.is_string()) {
    r.prompt_text = p.get<std::string>();
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    r.prompt_text = p[0].get<std::string>();
  } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
    for (const Json& id : p) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        return f.out_of_range("prompt", expected, p);
      r.prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  } else {
    return f.out_of_range("prompt", expected, p);
  }
  if (r.prompt_text && r.prompt_text->empty()) return f.out_of_range("prompt", "a non-empty prompt", p);
  return Status();
}

Status parse_tools(Fields& f, ApiRequest& r) {
  const Json& b = f.body;
  bool tools = false;
  if (b.contains("tools") && !b["tools"].is_null()) {
    if (!b["tools"].is_array()) return f.out_of_range("tools", "a list of tools", b["tools"]);
    tools = !b["tools"].empty();
    if (tools) r.tools_json = b["tools"].dump();
  }
  std::string choice = "auto";
  if (b.contains("tool_choice") && !b["tool_choice"].is_null()) {
    const Json& c = b["tool_choice"];
    if (!c.is_string() || (c != "none" && c != "auto"))
      return f.fail("tool_choice", Status::InvalidArgument("field 'tool_choice' must be \"none\" or \"auto\" (forcing a "
                                                           "tool is not supported), got " + c.dump()));
    choice = c.get<std::string>();
  }
  r.parse_tool_calls = tools && choice == "auto";
  return Status();
}

}  // namespace

Result<ApiRequest> parse_api_request(ApiKind kind, const Json& body, std::string* param) {
  Fields f{body, param};
  if (!body.is_object()) return f.fail("", Status::InvalidArgument("the request body must be a JSON object"));
  ApiRequest r;
  r.kind = kind;
  KL_FIELD(std::optional<std::string> model, json_opt_string, "model");
  r.model = model.value_or("");
  if (kind == ApiKind::kChat) {
    if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
      return f.fail("messages", Status::InvalidArgument("field 'messages' must be a non-empty list of messages"));
    auto messages = parse_chat_messages(body["messages"]);
    if (!messages.ok()) return f.fail("messages", messages.status());
    r.messages = std::move(messages).value();
    KL_RETURN_IF_ERROR(parse_tools(f, r));
  } else {
    KL_RETURN_IF_ERROR(parse_prompt(f, r));
    for (const char* unsupported : {"suffix", "echo", "best_of"}) {
      const bool set = body.contains(unsupported) && !body[unsupported].is_null() && body[unsupported] != false &&
                       body[unsupported] != 1;
      if (set) return f.fail(unsupported, Status::InvalidArgument(std::string("field '") + unsupported + "' is not supported"));
    }
  }
  std::optional<int64_t> max_tokens, max_completion_tokens, n, seed, top_k, top_logprobs;
  KL_RETURN_IF_ERROR(int_in(f, "max_tokens", 1, INT32_MAX, max_tokens));
  KL_RETURN_IF_ERROR(int_in(f, "max_completion_tokens", 1, INT32_MAX, max_completion_tokens));
  r.max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  KL_RETURN_IF_ERROR(int_in(f, "n", 1, 128, n));
  r.spec.n = static_cast<int>(n.value_or(1));
  KL_RETURN_IF_ERROR(int_in(f, "seed", INT64_MIN, INT64_MAX, seed));
  r.seed_given = seed.has_value();
  r.spec.sampling.seed = static_cast<uint64_t>(seed.value_or(0));
  KL_RETURN_IF_ERROR(int_in(f, "top_k", -1, INT32_MAX, top_k));
  r.spec.sampling.top_k = static_cast<int>(std::max<int64_t>(top_k.value_or(0), 0));
  r.spec.sampling.temperature = 1.0f;  // OpenAI's default
  KL_RETURN_IF_ERROR(number_in(f, "temperature", 0, 2, r.spec.sampling.temperature));
  KL_RETURN_IF_ERROR(number_in(f, "top_p", 1e-9, 1, r.spec.sampling.top_p));
  KL_RETURN_IF_ERROR(number_in(f, "min_p", 0, 1, r.spec.sampling.min_p));
  KL_RETURN_IF_ERROR(number_in(f, "presence_penalty", -2, 2, r.spec.sampling.presence_penalty));
  KL_RETURN_IF_ERROR(number_in(f, "frequency_penalty", -2, 2, r.spec.sampling.frequency_penalty));
  KL_RETURN_IF_ERROR(number_in(f, "repetition_penalty", 1e-3, 100, r.spec.sampling.repetition_penalty));
  KL_RETURN_IF_ERROR(parse_stop(f, r.spec.stop));
  KL_FIELD(std::optional<std::vector<int64_t>> stop_ids, json_opt_int_list, "stop_token_ids");
  for (int64_t id : stop_ids.value_or(std::vector<int64_t>{})) r.spec.stop.stop_ids.push_back(static_cast<int32_t>(id));
  KL_FIELD(std::optional<bool> ignore_eos, json_opt_bool, "ignore_eos");
  r.spec.stop.ignore_eos = ignore_eos.value_or(false);
  KL_FIELD(std::optional<bool> stream, json_opt_bool, "stream");
  r.stream = stream.value_or(false);
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const Json& so = body["stream_options"];
    if (!so.is_object()) return f.out_of_range("stream_options", "an object", so);
    if (!r.stream) return f.fail("stream_options", Status::InvalidArgument("field 'stream_options' is only allowed with stream: true"));
    auto usage = json_opt_bool(so, "include_usage", "stream_options");
    if (!usage.ok()) return f.fail("stream_options", usage.status());
    r.include_usage = usage->value_or(false);
  }
  if (kind == ApiKind::kChat) {
    KL_FIELD(std::optional<bool> logprobs, json_opt_bool, "logprobs");
    r.logprobs = logprobs.value_or(false);
    KL_RETURN_IF_ERROR(int_in(f, "top_logprobs", 0, 20, top_logprobs));
    if (top_logprobs && !r.logprobs)
      return f.fail("top_logprobs", Status::InvalidArgument("field 'top_logprobs' needs logprobs: true"));
  } else {
    KL_RETURN_IF_ERROR(int_in(f, "logprobs", 0, 20, top_logprobs));
    r.logprobs = top_logprobs.has_value();
  }
  r.spec.top_logprobs = r.logprobs ? static_cast<int>(top_logprobs.value_or(0)) : -1;
  return r;
}

Result<std::vector<int32_t>> request_prompt_ids(const ApiRequest& r, const Tokenizer* tokenizer, ChatFormat format) {
  if (r.kind == ApiKind::kCompletion && !r.prompt_text) return r.prompt_ids;
  if (!tokenizer) return Status::NotSupported("this model has no tokenizer: send token ids as the prompt");
  if (r.kind == ApiKind::kCompletion) return tokenizer->encode(*r.prompt_text);
  ChatOptions options;
  options.tools_json = r.tools_json;
  KL_ASSIGN_OR_RETURN(auto segments, render_chat_segments(format, r.messages, options));
  return encode_chat(*tokenizer, segments);
}

Json usage_json(const RequestStats& s) {
  return Json{{"prompt_tokens", s.prompt_tokens},
              {"completion_tokens", s.completion_tokens},
              {"total_tokens", s.prompt_tokens + s.completion_tokens}};
}

ResponseBuilder::ResponseBuilder(const ApiRequest& request, std::string id, std::string model, const Tokenizer* tokenizer)
    : kind_(request.kind),
      logprobs_(request.logprobs),
      parse_tool_calls_(request.parse_tool_calls),
      include_usage_(request.include_usage),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()),
      tokenizer_(tokenizer),
      choices_(static_cast<size_t>(request.spec.n)) {}

Json ResponseBuilder::chunk_base() const {
  Json j{{"id", id_},
         {"object", kind_ == ApiKind::kChat ? "chat.completion.chunk" : "text_completion"},
         {"created", created_},
         {"model", model_},
         {"choices", Json::array()}};
  if (include_usage_) j["usage"] = nullptr;
  return j;
}

std::string ResponseBuilder::finish_reason(const ChoiceState& c) const {
  if (!c.finish) return "";
  if (*c.finish == FinishReason::kLength) return "length";
  const bool calls = parse_tool_calls_ && !parse_kimi_tool_calls(c.text).calls.empty();
  return calls ? "tool_calls" : "stop";
}

// Token strings: the chosen token shows the text it added to the output (so the entries
// concatenate to the content); alternatives show their own bytes.
Json ResponseBuilder::logprobs_json(const std::vector<TokenOutput>& tokens, size_t text_offset) const {
  auto bytes_of = [&](int32_t id) {
    const std::string b = tokenizer_ ? tokenizer_->token_bytes(id) : std::string();
    return Json(std::vector<int>(b.begin(), b.end()));
  };
  auto name_of = [&](int32_t id) { return tokenizer_ ? tokenizer_->token_bytes(id) : std::to_string(id); };
  if (kind_ == ApiKind::kChat) {
    Json content = Json::array();
    for (const TokenOutput& t : tokens) {
      Json top = Json::array();
      for (const TokenLogprob& alt : t.logprobs.top)
        top.push_back({{"token", name_of(alt.id)}, {"logprob", alt.logprob}, {"bytes", bytes_of(alt.id)}});
      content.push_back({{"token", t.text}, {"logprob", t.logprobs.logprob}, {"bytes", bytes_of(t.id)}, {"top_logprobs", top}});
    }
    return Json{{"content", content}};
  }
  Json j{{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()}, {"text_offset", Json::array()}};
  for (const TokenOutput& t : tokens) {
    j["tokens"].push_back(t.text);
    j["token_logprobs"].push_back(t.logprobs.logprob);
    Json top = Json::object();
    for (const TokenLogprob& alt : t.logprobs.top) top[name_of(alt.id)] = alt.logprob;
    j["top_logprobs"].push_back(top);
    j["text_offset"].push_back(text_offset);
    text_offset += t.text.size();
  }
  return j;
}

std::vector<Json> ResponseBuilder::opening_chunks() const {
  std::vector<Json> out;
  if (kind_ != ApiKind::kChat) return out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    Json j = chunk_base();
    j["choices"].push_back({{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                            {"finish_reason", nullptr}});
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<Json> ResponseBuilder::chunks(const EngineEvent& e) {
  std::vector<Json> out;
  if (e.end != RequestEnd::kRunning && e.text.empty() && e.tokens.empty() && !e.finish) return out;
  ChoiceState& c = choices_.at(static_cast<size_t>(e.choice));
  const size_t offset = c.text.size();
  c.text += e.text;
  c.tokens.insert(c.tokens.end(), e.tokens.begin(), e.tokens.end());
  if (e.finish) c.finish = e.finish;
  Json choice{{"index", e.choice}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (logprobs_ && !e.tokens.empty()) choice["logprobs"] = logprobs_json(e.tokens, offset);
  if (kind_ == ApiKind::kCompletion) {
    choice["text"] = e.text;
  } else if (parse_tool_calls_) {
    std::string content;
    std::vector<ToolCallDelta> deltas;
    c.tool_stream.update(c.text, content, deltas);
    Json delta = Json::object();
    if (!content.empty()) delta["content"] = content;
    for (const ToolCallDelta& d : deltas) {
      Json call{{"index", d.index}, {"function", {{"arguments", d.arguments}}}};
      if (!d.id.empty()) {
        call["id"] = d.id;
        call["type"] = "function";
        call["function"]["name"] = d.name;
      }
      delta["tool_calls"].push_back(call);
    }
    choice["delta"] = delta;
  } else {
    choice["delta"] = e.text.empty() ? Json::object() : Json{{"content", e.text}};
  }
  if (c.finish) choice["finish_reason"] = finish_reason(c);
  const bool empty_delta = kind_ == ApiKind::kChat && choice["delta"].empty() && !c.finish && choice["logprobs"].is_null();
  if (empty_delta || (kind_ == ApiKind::kCompletion && e.text.empty() && !e.finish && choice["logprobs"].is_null()))
    return out;
  Json j = chunk_base();
  j["choices"].push_back(std::move(choice));
  out.push_back(std::move(j));
  return out;
}

Json ResponseBuilder::usage_chunk(const RequestStats& stats) const {
  Json j = chunk_base();
  j["usage"] = usage_json(stats);
  return j;
}

Json ResponseBuilder::response(const RequestStats& stats) const {
  Json j{{"id", id_},
         {"object", kind_ == ApiKind::kChat ? "chat.completion" : "text_completion"},
         {"created", created_},
         {"model", model_},
         {"choices", Json::array()},
         {"usage", usage_json(stats)}};
  for (size_t i = 0; i < choices_.size(); ++i) {
    const ChoiceState& c = choices_[i];
    Json choice{{"index", i}, {"logprobs", logprobs_ ? logprobs_json(c.tokens, 0) : Json(nullptr)},
                {"finish_reason", c.finish ? Json(finish_reason(c)) : Json(nullptr)}};
    if (kind_ == ApiKind::kCompletion) {
      choice["text"] = c.text;
    } else {
      Json message{{"role", "assistant"}, {"content", c.text}};
      if (parse_tool_calls_) {
        const ParsedToolCalls p = parse_kimi_tool_calls(c.text);
        if (!p.calls.empty()) {
          message["content"] = p.content.empty() ? Json(nullptr) : Json(p.content);
          for (const ToolCall& call : p.calls)
            message["tool_calls"].push_back(
                {{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments_json}}}});
        }
      }
      choice["message"] = message;
    }
    j["choices"].push_back(std::move(choice));
  }
  return j;
}

}  // namespace klinear
