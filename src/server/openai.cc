#include "server/openai.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <span>
#include <string_view>

#include "server/openai_messages.h"

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
    return fail(key, Status::InvalidArgument("field '" + key + "' must be " + expected + ", got " + json_excerpt(v)));
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
  // A list of several prompts is split by the server before this (one request each); `run` takes one.
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

// A chat-template option given as a top-level field or in chat_template_kwargs (vLLM's way); null
// when neither holds it. Both given and different is an error naming the field.
Result<const Json*> template_option(Fields& f, const std::string& key) {
  const Json* top = f.body.contains(key) && !f.body[key].is_null() ? &f.body[key] : nullptr;
  const Json* kwarg = nullptr;
  if (f.body.contains("chat_template_kwargs") && !f.body["chat_template_kwargs"].is_null()) {
    const Json& k = f.body["chat_template_kwargs"];
    if (!k.is_object()) return f.out_of_range("chat_template_kwargs", "an object", k);
    if (k.contains(key) && !k[key].is_null()) kwarg = &k[key];
  }
  if (top && kwarg && *top != *kwarg)
    return f.fail(key, Status::InvalidArgument("field '" + key + "' is " + json_excerpt(*top) + " but chat_template_kwargs." + key +
                                               " is " + json_excerpt(*kwarg) + "; give one or make them equal"));
  return top ? top : kwarg;
}

Status not_in_k2(Fields& f, const std::string& key, const std::string& what) {
  return f.fail(key, Status::InvalidArgument("field '" + key + "': " + what + " is not supported for this model: its chat "
                                             "format (Kimi K2) does not render it, and klinear has no constrained decoding"));
}

Status parse_thinking(Fields& f, ChatFormat format, ApiRequest& r) {
  const bool k3 = format == ChatFormat::kK3;
  r.chat.thinking = k3;  // K3 thinks unless told not to; K2 has no thinking
  KL_ASSIGN_OR_RETURN(const Json* thinking, template_option(f, "thinking"));
  if (!thinking && f.body.contains("chat_template_kwargs") && f.body["chat_template_kwargs"].is_object() &&
      f.body["chat_template_kwargs"].contains("enable_thinking"))  // Qwen-style name vLLM users send
    thinking = &f.body["chat_template_kwargs"]["enable_thinking"];
  if (thinking) {
    if (!thinking->is_boolean()) return f.out_of_range("thinking", "true or false", *thinking);
    if (!k3 && thinking->get<bool>()) return not_in_k2(f, "thinking", "thinking");
    r.chat.thinking = thinking->get<bool>();
  }
  KL_ASSIGN_OR_RETURN(const Json* effort, template_option(f, "thinking_effort"));
  const Json* reasoning_effort = f.body.contains("reasoning_effort") && !f.body["reasoning_effort"].is_null()
                                     ? &f.body["reasoning_effort"] : nullptr;  // OpenAI's name for it
  if (effort && reasoning_effort && *effort != *reasoning_effort)
    return f.fail("reasoning_effort", Status::InvalidArgument("field 'reasoning_effort' is " + json_excerpt(*reasoning_effort) +
                                                              " but thinking_effort is " + json_excerpt(*effort) +
                                                              "; give one or make them equal"));
  if (reasoning_effort && !effort) {
    if (!reasoning_effort->is_string()) return f.out_of_range("reasoning_effort", "one of \"low\", \"high\", \"max\"", *reasoning_effort);
    if (!k3) return not_in_k2(f, "reasoning_effort", "a thinking effort");
    auto e = parse_thinking_effort(reasoning_effort->get<std::string>());
    if (!e.ok()) return f.fail("reasoning_effort", Status::InvalidArgument("field 'reasoning_effort': " + e.status().message()));
    r.chat.thinking_effort = *e;
  }
  if (effort) {
    if (!effort->is_string()) return f.out_of_range("thinking_effort", "one of \"low\", \"high\", \"max\"", *effort);
    if (!k3) return not_in_k2(f, "thinking_effort", "a thinking effort");
    auto e = parse_thinking_effort(effort->get<std::string>());
    if (!e.ok()) return f.fail("thinking_effort", Status::InvalidArgument("field 'thinking_effort': " + e.status().message()));
    r.chat.thinking_effort = *e;
  }
  return Status();
}

Status parse_tools(Fields& f, ChatFormat format, ApiRequest& r) {
  const Json& b = f.body;
  Json tools = Json::array();
  if (b.contains("tools") && !b["tools"].is_null()) {
    tools = b["tools"];
    const std::string expected = "a list of {\"type\": \"function\", \"function\": {\"name\": ...}}";
    if (!tools.is_array()) return f.out_of_range("tools", expected, tools);
    for (const Json& t : tools)
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
          !t["function"]["name"].is_string())
        return f.out_of_range("tools", expected, t);
  }
  ToolChoice choice = ToolChoice::kAuto;
  if (b.contains("tool_choice") && !b["tool_choice"].is_null()) {
    const Json& c = b["tool_choice"];
    if (c.is_string()) {
      auto parsed = parse_tool_choice(c.get<std::string>());
      if (!parsed.ok()) return f.fail("tool_choice", Status::InvalidArgument("field 'tool_choice': " + parsed.status().message()));
      choice = *parsed;
    } else if (c.is_object() && c.value("type", Json()) == "function" && c.contains("function") &&
               c["function"].is_object() && c["function"].contains("name") && c["function"]["name"].is_string()) {
      choice = ToolChoice::kRequired;
      r.forced_tool = c["function"]["name"].get<std::string>();
    } else {
      return f.out_of_range("tool_choice", "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}", c);
    }
    if (choice == ToolChoice::kRequired && tools.empty())
      return f.fail("tool_choice", Status::InvalidArgument("field 'tool_choice' asks for a tool call, but the request has no tools"));
    if (choice == ToolChoice::kRequired && format == ChatFormat::kKimiK2)
      return not_in_k2(f, "tool_choice", "forcing a tool call (" + json_excerpt(c) + ")");
  }
  if (!r.forced_tool.empty()) {  // K3 has no per-function choice: declare only that function, and require a call
    Json kept = Json::array();
    for (const Json& t : tools)
      if (t["function"]["name"] == r.forced_tool) kept.push_back(t);
    if (kept.empty())
      return f.fail("tool_choice", Status::InvalidArgument("field 'tool_choice' names the function '" + r.forced_tool +
                                                           "', which is not one of the request's tools"));
    tools = std::move(kept);
  }
  if (!tools.empty()) r.chat.tools_json = tools.dump();
  r.chat.tool_choice = format == ChatFormat::kK3 ? choice : ToolChoice::kAuto;
  r.parse_tool_calls = format == ChatFormat::kKimiK2 && !tools.empty() && choice == ToolChoice::kAuto;
  return Status();
}

Status parse_response_format_field(Fields& f, ChatFormat format, ApiRequest& r) {
  if (!f.body.contains("response_format") || f.body["response_format"].is_null()) return Status();
  auto ordered = parse_ordered_json(f.body["response_format"].dump(), "response_format");
  auto rf = ordered.ok() ? parse_response_format(*ordered) : Result<ResponseFormat>(ordered.status());
  if (!rf.ok()) return f.fail("response_format", rf.status());
  if (format == ChatFormat::kKimiK2 && rf->kind != ResponseFormat::Kind::kText)
    return not_in_k2(f, "response_format", "a JSON response format");
  r.chat.response_format = std::move(rf).value();
  return Status();
}


// The fields parse_api_request reads, by endpoint.
constexpr std::string_view kEveryRequestFields[] = {
    "model", "max_tokens", "max_completion_tokens", "n", "best_of", "seed", "top_k", "temperature", "top_p", "min_p",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "stop", "stop_token_ids",
    "include_stop_str_in_output", "min_tokens", "ignore_eos", "stream", "stream_options", "logprobs",
    "truncate_prompt_tokens", "user", "request_id", "return_token_ids", "return_tokens_as_token_ids",
    "skip_special_tokens", "prompt_logprobs"};
constexpr std::string_view kChatFields[] = {
    "messages", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "response_format",
    "chat_template_kwargs", "thinking", "thinking_effort", "reasoning_effort", "include_reasoning",
    "add_generation_prompt", "continue_final_message", "echo"};
constexpr std::string_view kCompletionFields[] = {"prompt", "echo"};

// Fields OpenAI or vLLM clients send that this server does not honour: refused when their value
// asks for something, i.e. is neither null nor `neutral` (JSON text).
struct Unhonoured {
  std::string_view name, neutral, why;
};
constexpr std::string_view kNoStructuredOutput = "structured output (constrained decoding) is not supported yet";
constexpr Unhonoured kUnhonoured[] = {
    {"suffix", "null", "the Kimi models have no fill-in-the-middle format"},
    {"use_beam_search", "false", "beam search is not supported"},
    {"length_penalty", "1", "beam search is not supported"},
    {"allowed_token_ids", "null", "a list of allowed ids is not supported (logit_bias is)"},
    {"bad_words", "[]", "bad words are not supported (logit_bias is)"},
    {"response_format", "{\"type\": \"text\"}", kNoStructuredOutput},
    {"structured_outputs", "null", kNoStructuredOutput},
    {"guided_json", "null", kNoStructuredOutput},
    {"guided_regex", "null", kNoStructuredOutput},
    {"guided_choice", "null", kNoStructuredOutput},
    {"guided_grammar", "null", kNoStructuredOutput},
    {"structural_tag", "null", kNoStructuredOutput},
    {"guided_decoding_backend", "null", kNoStructuredOutput},
    {"guided_whitespace_pattern", "null", kNoStructuredOutput},
    {"logits_processors", "null", "custom logits processors are not supported"},
    {"prompt_embeds", "null", "prompt embeddings are not supported"},
    {"priority", "0", "priority scheduling is not supported"},
    {"cache_salt", "null", "a prefix-cache salt is not supported"},
    {"kv_transfer_params", "null", "KV transfer (disaggregated prefill) is not supported"},
    {"vllm_xargs", "null", "vLLM's extra arguments are not supported"},
    {"documents", "null", "the Kimi chat formats render no documents"},
    {"chat_template", "null", "a per-request chat template is not supported"},
    {"mm_processor_kwargs", "null", "the models are text-only"},
    {"media_io_kwargs", "null", "the models are text-only"},
    {"modalities", "[\"text\"]", "the models are text-only"},
    {"audio", "null", "the models are text-only"},
    {"spaces_between_special_tokens", "true", "special tokens are always decoded without spaces between them"},
    {"add_special_tokens", "false", "the Kimi tokenizer adds no special tokens to a prompt"},
    {"service_tier", "\"auto\"", "service tiers are not supported"},
    {"store", "false", "stored completions are not supported"},
    {"metadata", "null", "stored completions are not supported"},
    {"prediction", "null", "predicted outputs are not supported"},
    {"web_search_options", "null", "web search is not supported"},
    {"functions", "null", "the deprecated 'functions' field is not supported: send 'tools'"},
    {"function_call", "null", "the deprecated 'function_call' field is not supported: send 'tool_choice'"},
};

// Every field of `f.body` is one parse_api_request honours for `kind`, or an unhonoured one whose
// value asks for nothing; else InvalidArgument naming it.
Status check_fields(Fields& f, ApiKind kind) {
  auto in = [](std::string_view key, std::span<const std::string_view> list) {
    return std::find(list.begin(), list.end(), key) != list.end();
  };
  const std::span<const std::string_view> own = kind == ApiKind::kChat ? std::span<const std::string_view>(kChatFields)
                                                                                  : std::span<const std::string_view>(kCompletionFields);
  for (const auto& item : f.body.items()) {
    const std::string& key = item.key();
    const Json& value = item.value();
    if (in(key, kEveryRequestFields) || in(key, own)) continue;
    auto rule = std::find_if(std::begin(kUnhonoured), std::end(kUnhonoured), [&](const Unhonoured& u) { return u.name == key; });
    if (rule == std::end(kUnhonoured))
      return f.fail(key, Status::InvalidArgument("field '" + key + "' is not a field of a " +
                                                 (kind == ApiKind::kChat ? "chat completion" : "completion") + " request"));
    if (value.is_null() || value == Json::parse(rule->neutral)) continue;
    return f.fail(key, Status::InvalidArgument("field '" + key + "' is not supported: " + std::string(rule->why)));
  }
  return Status();
}

// OpenAI's logit_bias: {"id": bias, ...}, ids as decimal strings, biases in [-100, 100].
Status parse_logit_bias(Fields& f, std::vector<TokenBias>& out) {
  if (!f.body.contains("logit_bias") || f.body["logit_bias"].is_null()) return Status();
  const Json& v = f.body["logit_bias"];
  const std::string expected = "an object mapping token ids (decimal strings) to biases in [-100, 100]";
  if (!v.is_object()) return f.out_of_range("logit_bias", expected, v);
  for (const auto& [key, bias] : v.items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > INT32_MAX || !bias.is_number() ||
        !(bias.get<double>() >= -100 && bias.get<double>() <= 100))
      return f.out_of_range("logit_bias", expected, v);
    out.push_back({static_cast<int32_t>(id), bias.get<float>()});
  }
  return Status();
}

// A bool field into `out` when present.
Status bool_field(Fields& f, const std::string& key, bool& out) {
  KL_FIELD(std::optional<bool> v, json_opt_bool, key);
  if (v) out = *v;
  return Status();
}

}  // namespace

Result<ApiRequest> parse_api_request(ApiKind kind, ChatFormat format, const Json& body, std::string* param) {
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
    KL_RETURN_IF_ERROR(parse_thinking(f, format, r));
    KL_RETURN_IF_ERROR(parse_tools(f, format, r));
    KL_RETURN_IF_ERROR(parse_response_format_field(f, format, r));
    KL_RETURN_IF_ERROR(bool_field(f, "parallel_tool_calls", r.parallel_tool_calls));
    KL_RETURN_IF_ERROR(bool_field(f, "include_reasoning", r.include_reasoning));
    KL_RETURN_IF_ERROR(bool_field(f, "add_generation_prompt", r.chat.add_generation_prompt));
    KL_RETURN_IF_ERROR(bool_field(f, "continue_final_message", r.chat.continue_final_message));
    if (r.chat.continue_final_message && r.chat.add_generation_prompt && !body.contains("add_generation_prompt"))
      r.chat.add_generation_prompt = false;  // continuing the last message opens no new one
    if (r.chat.continue_final_message && r.chat.add_generation_prompt)
      return f.fail("continue_final_message", Status::InvalidArgument("fields 'continue_final_message' and "
                                                                      "'add_generation_prompt' cannot both be true"));
    if (r.chat.continue_final_message && r.messages.back().role != "assistant")
      return f.fail("continue_final_message", Status::InvalidArgument("field 'continue_final_message' needs the last "
                                                                      "message to be the assistant's"));
    KL_RETURN_IF_ERROR(bool_field(f, "echo", r.echo));
  } else {
    KL_RETURN_IF_ERROR(parse_prompt(f, r));
    KL_RETURN_IF_ERROR(bool_field(f, "echo", r.echo));
  }
  KL_RETURN_IF_ERROR(check_fields(f, kind));
  std::optional<int64_t> max_tokens, max_completion_tokens, n, seed, top_k, top_logprobs;
  // max_tokens 0 scores the prompt alone (echo with logprobs, or prompt_logprobs): checked below.
  KL_RETURN_IF_ERROR(int_in(f, "max_tokens", 0, INT32_MAX, max_tokens));
  KL_RETURN_IF_ERROR(int_in(f, "max_completion_tokens", 0, INT32_MAX, max_completion_tokens));
  r.max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;
  KL_RETURN_IF_ERROR(int_in(f, "truncate_prompt_tokens", -1, INT32_MAX, r.truncate_prompt_tokens));
  if (r.truncate_prompt_tokens == 0)
    return f.out_of_range("truncate_prompt_tokens", "-1 (as many as fit) or a count of at least 1",
                          f.body["truncate_prompt_tokens"]);
  KL_RETURN_IF_ERROR(int_in(f, "n", 1, 128, n));
  r.spec.n = static_cast<int>(n.value_or(1));
  std::optional<int64_t> best_of, min_tokens;
  KL_RETURN_IF_ERROR(int_in(f, "best_of", 1, 128, best_of));
  if (best_of && *best_of != r.spec.n)
    return f.fail("best_of", Status::InvalidArgument("field 'best_of' other than n is not supported (best_of " +
                                                     std::to_string(*best_of) + ", n " + std::to_string(r.spec.n) + ")"));
  KL_RETURN_IF_ERROR(int_in(f, "min_tokens", 0, INT32_MAX, min_tokens));
  r.spec.stop.min_tokens = min_tokens.value_or(0);
  if (r.spec.stop.min_tokens > 0 && max_tokens.value_or(INT32_MAX) < r.spec.stop.min_tokens)
    return f.out_of_range("min_tokens", "at most max_tokens (" + std::to_string(*max_tokens) + ")", f.body["min_tokens"]);
  KL_RETURN_IF_ERROR(bool_field(f, "include_stop_str_in_output", r.spec.stop.include_stop_str_in_output));
  KL_RETURN_IF_ERROR(parse_logit_bias(f, r.spec.sampling.logit_bias));
  KL_FIELD(std::optional<std::string> user, json_opt_string, "user");
  if (user && user->size() > 256) return f.out_of_range("user", "at most 256 characters", f.body["user"]);
  r.user = user.value_or("");
  KL_FIELD(std::optional<std::string> request_id, json_opt_string, "request_id");
  if (request_id && (request_id->empty() || request_id->size() > 128 ||
                     !std::all_of(request_id->begin(), request_id->end(), [](char c) { return c > ' ' && c < 127; })))
    return f.out_of_range("request_id", "1 to 128 printable ASCII characters without spaces", f.body["request_id"]);
  r.request_id = request_id.value_or("");
  KL_RETURN_IF_ERROR(bool_field(f, "return_token_ids", r.return_token_ids));
  KL_RETURN_IF_ERROR(bool_field(f, "return_tokens_as_token_ids", r.tokens_as_ids));
  bool skip_special = true;  // vLLM's default
  KL_RETURN_IF_ERROR(bool_field(f, "skip_special_tokens", skip_special));
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
  for (int64_t id : stop_ids.value_or(std::vector<int64_t>{})) {
    if (id < 0 || id > INT32_MAX)  // a token id; it was cast to 32 bits and wrapped
      return f.out_of_range("stop_token_ids", "a list of token ids in [0, " + std::to_string(INT32_MAX) + "]",
                            f.body["stop_token_ids"]);
    r.spec.stop.stop_ids.push_back(static_cast<int32_t>(id));
  }
  KL_FIELD(std::optional<bool> ignore_eos, json_opt_bool, "ignore_eos");
  r.spec.stop.ignore_eos = ignore_eos.value_or(false);
  KL_FIELD(std::optional<bool> stream, json_opt_bool, "stream");
  r.stream = stream.value_or(false);
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const Json& so = body["stream_options"];
    if (!so.is_object()) return f.out_of_range("stream_options", "an object", so);
    if (!r.stream) return f.fail("stream_options", Status::InvalidArgument("field 'stream_options' is only allowed with stream: true"));
    for (const auto& [key, v] : so.items())
      if (key != "include_usage" && key != "continuous_usage_stats")
        return f.fail("stream_options", Status::InvalidArgument("field 'stream_options." + key + "' is not a stream option "
                                                                "(include_usage, continuous_usage_stats)"));
    auto usage = json_opt_bool(so, "include_usage", "stream_options");
    if (!usage.ok()) return f.fail("stream_options", usage.status());
    r.include_usage = usage->value_or(false);
    auto continuous = json_opt_bool(so, "continuous_usage_stats", "stream_options");
    if (!continuous.ok()) return f.fail("stream_options", continuous.status());
    r.continuous_usage = continuous->value_or(false);
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
  // prompt_logprobs (vLLM): each prompt token's log-probability and the k most likely at its
  // position; echo with logprobs lists the prompt's tokens before the generated ones (OpenAI's
  // legacy completions, what lm-evaluation-harness scores with).
  std::optional<int64_t> prompt_logprobs;
  KL_RETURN_IF_ERROR(int_in(f, "prompt_logprobs", 0, 20, prompt_logprobs));
  r.spec.prompt_logprobs = static_cast<int>(prompt_logprobs.value_or(-1));
  r.prompt_logprobs = prompt_logprobs.has_value();
  if (kind == ApiKind::kCompletion && r.echo && r.logprobs)
    r.spec.prompt_logprobs = std::max(r.spec.prompt_logprobs, r.spec.top_logprobs);
  if (r.max_tokens == 0 && r.spec.prompt_logprobs < 0)
    return f.out_of_range(max_completion_tokens ? "max_completion_tokens" : "max_tokens",
                          "at least 1 (0 only scores a prompt: with prompt_logprobs, or echo with logprobs)",
                          f.body[max_completion_tokens ? "max_completion_tokens" : "max_tokens"]);
  if (r.stream && r.spec.prompt_logprobs >= 0)
    return f.fail(r.prompt_logprobs ? "prompt_logprobs" : "echo",
                  Status::InvalidArgument("the prompt's log-probabilities are returned without streaming only "
                                          "(stream: false) for now"));
  // K2 tool calls are parsed from the text, whose section markers are special tokens (vLLM keeps
  // them for its Kimi tool parser too).
  r.spec.special_text = skip_special && !r.parse_tool_calls ? SpecialText::kSkip : SpecialText::kShow;
  return r;
}

Result<int64_t> fit_prompt(const ApiRequest& r, std::optional<int64_t> truncate_default, int64_t max_model_len,
                           std::vector<int32_t>& prompt) {
  const std::string field = r.kind == ApiKind::kChat ? "messages" : "prompt";
  if (const auto k = r.truncate_prompt_tokens ? r.truncate_prompt_tokens : truncate_default) {
    const int64_t keep = *k > 0 ? *k : max_model_len - r.max_tokens.value_or(1);
    if (keep < 1)
      return Status::InvalidArgument("max_tokens " + std::to_string(r.max_tokens.value_or(1)) + " leaves no room for a prompt in " +
                                     std::to_string(max_model_len) + " tokens");
    if (static_cast<int64_t>(prompt.size()) > keep) prompt.erase(prompt.begin(), prompt.end() - keep);
  }
  const int64_t room = max_model_len - static_cast<int64_t>(prompt.size());
  if (room < 1)
    return Status::InvalidArgument("field '" + field + "': the prompt has " + std::to_string(prompt.size()) +
                                   " tokens; a sequence holds at most " + std::to_string(max_model_len) +
                                   " here (--max-model-len; truncate_prompt_tokens keeps the last ones)");
  return room;
}

Result<std::vector<int32_t>> request_prompt_ids(const ApiRequest& r, const Tokenizer* tokenizer, ChatFormat format) {
  if (r.kind == ApiKind::kCompletion && !r.prompt_text) return r.prompt_ids;
  if (!tokenizer) return Status::NotSupported("this model has no tokenizer: send token ids as the prompt");
  if (r.kind == ApiKind::kCompletion) return tokenizer->encode(*r.prompt_text);
  KL_ASSIGN_OR_RETURN(auto segments, render_chat_segments(format, r.messages, r.chat));
  return encode_chat(*tokenizer, segments);
}

Json usage_json(const RequestStats& s) {
  return Json{{"prompt_tokens", s.prompt_tokens},
              {"completion_tokens", s.completion_tokens},
              {"total_tokens", s.prompt_tokens + s.completion_tokens}};
}

namespace {
// What echo puts before each choice's output: a completion's prompt text; on chat, as vLLM does,
// the last message's content when it is the assistant's (the reply continues it), else nothing.
std::string echo_text(const ApiRequest& r, const Tokenizer* tokenizer, const std::vector<int32_t>& prompt) {
  if (!r.echo) return "";
  if (r.kind == ApiKind::kChat)
    return !r.messages.empty() && r.messages.back().role == "assistant" ? r.messages.back().content : "";
  return tokenizer ? tokenizer->decode(prompt) : "";
}
}  // namespace

ResponseBuilder::ResponseBuilder(const ApiRequest& request, ChatFormat format, std::string id, std::string model,
                                 const Tokenizer* tokenizer, std::vector<int32_t> prompt)
    : kind_(request.kind),
      logprobs_(request.logprobs),
      parse_tool_calls_(request.parse_tool_calls),
      include_usage_(request.include_usage),
      continuous_usage_(request.include_usage && request.continuous_usage),
      tokens_as_ids_(request.tokens_as_ids),
      return_token_ids_(request.return_token_ids),
      parallel_tool_calls_(request.parallel_tool_calls),
      include_reasoning_(request.include_reasoning),
      prompt_(std::move(prompt)),
      echo_(echo_text(request, tokenizer, prompt_)),
      echo_logprobs_(request.kind == ApiKind::kCompletion && request.echo && request.logprobs),
      list_prompt_logprobs_(request.prompt_logprobs),
      top_logprobs_(request.spec.top_logprobs),
      prompt_top_(request.spec.prompt_logprobs),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()),
      tokenizer_(tokenizer),
      choices_(static_cast<size_t>(request.spec.n)) {
  if (kind_ != ApiKind::kChat || format != ChatFormat::kK3) return;
  KL_CHECK(tokenizer_, "a K3 chat response needs the tokenizer");
  for (ChoiceState& c : choices_) c.k3.emplace(*tokenizer_, request.chat.thinking ? K3TurnStart::kThink : K3TurnStart::kResponse);
}

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
  const bool calls = c.k3 ? !c.k3->calls().empty() : parse_tool_calls_ && !parse_kimi_tool_calls(c.text).calls.empty();
  return calls ? "tool_calls" : "stop";
}

// Token strings: the chosen token shows the text it added to the output (so the entries
// concatenate to the content); alternatives show their own bytes.
Json ResponseBuilder::logprobs_json(const std::vector<TokenOutput>& tokens, size_t text_offset) const {
  auto bytes_of = [&](int32_t id) {
    const std::string b = tokenizer_ ? tokenizer_->token_bytes(id) : std::string();
    return Json(std::vector<unsigned char>(b.begin(), b.end()));  // OpenAI's bytes: integers 0-255
  };
  auto chosen = [&](const TokenOutput& t) { return tokens_as_ids_ ? token_name(t.id) : t.text; };
  if (kind_ == ApiKind::kChat) {
    Json content = Json::array();
    for (const TokenOutput& t : tokens) {
      Json top = Json::array();
      for (const TokenLogprob& alt : t.logprobs.top)
        top.push_back({{"token", token_name(alt.id)}, {"logprob", alt.logprob}, {"bytes", bytes_of(alt.id)}});
      content.push_back({{"token", chosen(t)}, {"logprob", t.logprobs.logprob}, {"bytes", bytes_of(t.id)}, {"top_logprobs", top}});
    }
    return Json{{"content", content}};
  }
  Json j{{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()}, {"text_offset", Json::array()}};
  for (const TokenOutput& t : tokens) {
    j["tokens"].push_back(chosen(t));
    j["token_logprobs"].push_back(t.logprobs.logprob);
    Json top = Json::object();
    for (const TokenLogprob& alt : t.logprobs.top) top[token_name(alt.id)] = alt.logprob;
    j["top_logprobs"].push_back(top);
    j["text_offset"].push_back(text_offset);
    text_offset += t.text.size();
  }
  return j;
}

Json ResponseBuilder::echo_logprobs_json(const Json& generated) const {
  Json j{{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()}, {"text_offset", Json::array()}};
  size_t offset = 0;
  for (size_t i = 0; i < prompt_.size(); ++i) {
    j["tokens"].push_back(token_name(prompt_[i]));
    j["text_offset"].push_back(offset);
    offset += tokenizer_ ? tokenizer_->token_bytes(prompt_[i]).size() : 0;
    if (i == 0 || i - 1 >= prompt_logprobs_.size()) {
      j["token_logprobs"].push_back(nullptr);
      j["top_logprobs"].push_back(nullptr);
      continue;
    }
    const Sampled& s = prompt_logprobs_[i - 1];
    j["token_logprobs"].push_back(s.logprob);
    Json top = Json::object();
    for (size_t k = 0; k < s.top.size() && static_cast<int>(k) < top_logprobs_; ++k) top[token_name(s.top[k].id)] = s.top[k].logprob;
    j["top_logprobs"].push_back(top);
  }
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (const Json& v : generated[key]) j[key].push_back(v);
  return j;
}

Json ResponseBuilder::prompt_logprobs_json() const {
  Json list = Json::array({nullptr});
  auto decoded = [&](int32_t id) { return tokenizer_ ? tokenizer_->decode(std::vector<int32_t>{id}) : std::to_string(id); };
  for (const Sampled& s : prompt_logprobs_) {
    Json entry = Json::object();
    entry[std::to_string(s.id)] = {{"logprob", s.logprob}, {"rank", s.rank}, {"decoded_token", decoded(s.id)}};
    for (size_t k = 0; k < s.top.size() && static_cast<int>(k) < prompt_top_; ++k)
      entry[std::to_string(s.top[k].id)] = {
          {"logprob", s.top[k].logprob}, {"rank", static_cast<int64_t>(k) + 1}, {"decoded_token", decoded(s.top[k].id)}};
    list.push_back(std::move(entry));
  }
  return list;
}

// A token as logprobs name it: its bytes, or "token_id:N" (return_tokens_as_token_ids, or no tokenizer).
std::string ResponseBuilder::token_name(int32_t id) const {
  if (tokens_as_ids_ || !tokenizer_) return tokens_as_ids_ ? "token_id:" + std::to_string(id) : std::to_string(id);
  return tokenizer_->token_bytes(id);
}

std::vector<ToolCall> ResponseBuilder::allowed_calls(std::vector<ToolCall> calls) const {
  if (!parallel_tool_calls_ && calls.size() > 1) calls.resize(1);
  return calls;
}

namespace {
Json token_ids(const std::vector<TokenOutput>& tokens) {
  Json ids = Json::array();
  for (const TokenOutput& t : tokens) ids.push_back(t.id);
  return ids;
}
}  // namespace

std::vector<Json> ResponseBuilder::opening_chunks() const {
  std::vector<Json> out;
  if (kind_ != ApiKind::kChat) return out;
  for (size_t i = 0; i < choices_.size(); ++i) {
    Json j = chunk_base();
    j["choices"].push_back({{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                            {"finish_reason", nullptr}});
    if (return_token_ids_ && i == 0) j["prompt_token_ids"] = prompt_;
    if (continuous_usage_) j["usage"] = usage_json({static_cast<int64_t>(prompt_.size()), 0, 0, 0, 0});
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<Json> ResponseBuilder::chunks(const EngineEvent& e) {
  std::vector<Json> out;
  if (!e.prompt_logprobs.empty()) prompt_logprobs_ = e.prompt_logprobs;
  if (e.end != RequestEnd::kRunning && e.text.empty() && e.tokens.empty() && !e.finish) return out;
  ChoiceState& c = choices_.at(static_cast<size_t>(e.choice));
  const bool first = c.text.empty() && c.tokens.empty();
  completion_tokens_ += static_cast<int64_t>(e.tokens.size());
  const size_t offset = c.text.size();
  c.text += e.text;
  c.tokens.insert(c.tokens.end(), e.tokens.begin(), e.tokens.end());
  if (e.finish) c.finish = e.finish;
  Json choice{{"index", e.choice}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (logprobs_ && !e.tokens.empty()) choice["logprobs"] = logprobs_json(e.tokens, offset);
  if (kind_ == ApiKind::kCompletion) {
    choice["text"] = (c.echoed ? std::string() : echo_) + e.text;
    if (!tokenizer_ || return_token_ids_) choice["token_ids"] = token_ids(e.tokens);  // without a tokenizer the ids are the output
    if (return_token_ids_ && first) choice["prompt_token_ids"] = prompt_;
  } else {
    const ChatDelta d = chat_delta(c, e);
    Json delta = Json::object();
    if (!d.reasoning.empty() && include_reasoning_) delta["reasoning_content"] = delta["reasoning"] = d.reasoning;
    const std::string content = (c.echoed ? std::string() : echo_) + d.content;
    if (!content.empty()) delta["content"] = content;
    if (return_token_ids_) choice["token_ids"] = token_ids(e.tokens);
    for (const ToolCallDelta& t : d.calls) {
      if (!parallel_tool_calls_ && t.index > 0) continue;  // the first call only
      Json call{{"index", t.index}, {"function", {{"arguments", t.arguments}}}};
      if (!t.id.empty()) {
        call["id"] = t.id;
        call["type"] = "function";
        call["function"]["name"] = t.name;
      }
      delta["tool_calls"].push_back(call);
    }
    choice["delta"] = delta;
  }
  if (c.finish) choice["finish_reason"] = finish_reason(c);
  const bool empty_delta = kind_ == ApiKind::kChat && choice["delta"].empty() && !c.finish && choice["logprobs"].is_null();
  const bool empty_text = kind_ == ApiKind::kCompletion && choice["text"] == "" && (tokenizer_ || e.tokens.empty());
  if (empty_delta || (empty_text && !e.finish && choice["logprobs"].is_null()))
    return out;
  c.echoed = true;
  Json j = chunk_base();
  j["choices"].push_back(std::move(choice));
  if (continuous_usage_)
    j["usage"] = usage_json({static_cast<int64_t>(prompt_.size()), completion_tokens_, 0, 0, 0});
  out.push_back(std::move(j));
  return out;
}

ChatDelta ResponseBuilder::chat_delta(ChoiceState& c, const EngineEvent& e) {
  ChatDelta d;
  if (c.k3) {
    for (const TokenOutput& t : e.tokens) c.ids.push_back(t.id);
    return c.k3->update(c.ids, c.finish.has_value());
  }
  if (parse_tool_calls_) c.tool_stream.update(c.text, d.content, d.calls);
  else d.content = e.text;
  return d;
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
      choice["text"] = echo_ + c.text;
      if (echo_logprobs_) choice["logprobs"] = echo_logprobs_json(choice["logprobs"]);
      if (list_prompt_logprobs_) choice["prompt_logprobs"] = prompt_logprobs_json();
      if (!tokenizer_ || return_token_ids_) choice["token_ids"] = token_ids(c.tokens);
      if (return_token_ids_) choice["prompt_token_ids"] = prompt_;
    } else {
      Json message{{"role", "assistant"}, {"content", c.text}};
      std::vector<ToolCall> calls;
      if (c.k3) {
        message["content"] = c.k3->content();
        if (include_reasoning_)
          message["reasoning_content"] = message["reasoning"] =
              c.k3->reasoning().empty() ? Json(nullptr) : Json(c.k3->reasoning());
        calls = allowed_calls(c.k3->calls());
      } else if (parse_tool_calls_) {
        ParsedToolCalls p = parse_kimi_tool_calls(c.text);
        if (!p.calls.empty()) message["content"] = std::move(p.content);
        calls = allowed_calls(std::move(p.calls));
      }
      if (return_token_ids_) choice["token_ids"] = token_ids(c.tokens);
      if (!echo_.empty()) message["content"] = echo_ + message["content"].get<std::string>();
      if (!calls.empty() && message["content"] == "") message["content"] = nullptr;
      for (const ToolCall& call : calls)
        message["tool_calls"].push_back(
            {{"id", call.id}, {"type", "function"}, {"function", {{"name", call.name}, {"arguments", call.arguments_json}}}});
      choice["message"] = message;
    }
    j["choices"].push_back(std::move(choice));
  }
  if (return_token_ids_ && kind_ == ApiKind::kChat) j["prompt_token_ids"] = prompt_;
  if (list_prompt_logprobs_ && kind_ == ApiKind::kChat) j["prompt_logprobs"] = prompt_logprobs_json();
  return j;
}

}  // namespace klinear
