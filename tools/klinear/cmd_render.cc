// `klinear render`: what a conversation renders to, as the model reads it (ids) and as text.
//
// Decision: the format comes from --format, else from the directory: its config.json's model_type
// when there is one (as for a checkpoint), else from the tokenizer's specials (<|open|> is K3,
// <|im_end|> is K2). K3 defaults follow Moonshot's encoder: thinking on, no thinking-effort message unless asked for.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "chat/chat_format.h"
#include "io/json.h"
#include "io/tokenizer.h"
#include "server/openai_messages.h"

namespace klinear::cli {
namespace {

struct RenderArgs {
  std::string dir, messages, tools, format, thinking_effort = "none", tool_choice = "auto", response_format;
  bool thinking = false, no_thinking = false, no_generation_prompt = false;
  std::vector<CLI::Option*> k3_only;  // options that only the K3 format reads
};

// `r`, with `flag` prefixed to its error.
template <class T>
Result<T> for_flag(Result<T> r, const char* flag) {
  if (!r.ok()) return r.status().with_context(flag);
  return r;
}

Result<OrderedJson> read_ordered_json(const std::string& path, const char* flag) {
  KL_ASSIGN_OR_RETURN(std::string text, for_flag(read_text_file(path), flag));
  return parse_ordered_json(text, std::string(flag) + " " + path);
}

Result<ChatFormat> pick_format(const RenderArgs& a, const Tokenizer& tok) {
  if (a.format == "k2") return ChatFormat::kKimiK2;
  if (a.format == "k3") return ChatFormat::kK3;
  if (!a.format.empty()) return Status::InvalidArgument("--format: expected k2 or k3, got '" + a.format + "'");
  const std::string config = (std::filesystem::path(a.dir) / "config.json").string();
  if (std::filesystem::exists(config)) {
    KL_ASSIGN_OR_RETURN(Json c, read_json_file(config));
    KL_ASSIGN_OR_RETURN(std::optional<std::string> type, json_opt_string(c, "model_type", config));
    return type.value_or("") == "kimi_k3" ? ChatFormat::kK3 : ChatFormat::kKimiK2;
  }
  if (tok.special_id("<|open|>")) return ChatFormat::kK3;
  if (tok.special_id("<|im_end|>")) return ChatFormat::kKimiK2;
  return Status::InvalidArgument(a.dir + ": cannot tell the chat format (no config.json, no <|open|> or <|im_end|> "
                                 "special token); give --format k2|k3");
}

Status run_render(const RenderArgs& a) {
  KL_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::load(a.dir));
  KL_ASSIGN_OR_RETURN(ChatFormat format, pick_format(a, tok));
  KL_ASSIGN_OR_RETURN(OrderedJson messages_json, read_ordered_json(a.messages, "--messages"));
  KL_ASSIGN_OR_RETURN(std::vector<ChatMessage> messages, parse_chat_messages(messages_json));
  ChatOptions options;
  options.add_generation_prompt = !a.no_generation_prompt;
  if (!a.tools.empty()) {
    KL_ASSIGN_OR_RETURN(OrderedJson tools, read_ordered_json(a.tools, "--tools"));
    options.tools_json = tools.dump();
  }
  if (format == ChatFormat::kKimiK2) {
    for (const CLI::Option* o : a.k3_only)
      if (o->count() > 0) return Status::InvalidArgument(o->get_name() + ": applies to the K3 chat format only");
  }
  options.thinking = !a.no_thinking;
  // As in Moonshot's encoder, the effort is read (and checked) only with thinking on.
  if (options.thinking) {
    if (a.thinking_effort == "none") {
      options.thinking_effort = ThinkingEffort::kUnset;
    } else {
      KL_ASSIGN_OR_RETURN(options.thinking_effort,
                          for_flag(parse_thinking_effort(a.thinking_effort), "--thinking-effort"));
    }
  }
  KL_ASSIGN_OR_RETURN(options.tool_choice, for_flag(parse_tool_choice(a.tool_choice), "--tool-choice"));
  if (!a.response_format.empty()) {
    KL_ASSIGN_OR_RETURN(OrderedJson rf, read_ordered_json(a.response_format, "--response-format"));
    KL_ASSIGN_OR_RETURN(options.response_format, for_flag(parse_response_format(rf), "--response-format"));
  }
  KL_ASSIGN_OR_RETURN(RenderedChat r, render_chat_ids(tok, format, messages, options));
  Json out;
  out["ids"] = r.ids;
  out["text"] = r.text;
  std::string line = out.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), stdout) != line.size() || std::fflush(stdout) != 0)
    return Status::IOError("stdout: write failed");
  return Status();
}

}  // namespace

void add_render_commands(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<RenderArgs>();
  CLI::App* sub = app.add_subcommand(
      "render",
      "Render a conversation with the chat format (K2 / Kimi Linear or K3) and print one JSON object "
      "{\"ids\": [...], \"text\": \"...\"}: the token ids the model reads and their decoded text.");
  sub->add_option("--tokenizer", a->dir, "Directory with tiktoken.model and tokenizer_config.json (a checkpoint "
                                         "directory also gives the format through its config.json)")
      ->required();
  sub->add_option("--messages", a->messages, "JSON file with the OpenAI-style messages array")->required();
  sub->add_option("--tools", a->tools, "JSON file with the OpenAI-style tools array");
  sub->add_option("--format", a->format, "Chat format: k2 or k3 (default: from the directory)");
  CLI::Option* on = sub->add_flag("--thinking", a->thinking, "K3: thinking on (the default)");
  CLI::Option* off = sub->add_flag("--no-thinking", a->no_thinking, "K3: thinking off (no think elements)");
  on->excludes(off);
  CLI::Option* effort = sub->add_option("--thinking-effort", a->thinking_effort,
                                        "K3 with thinking on: low, high or max, or none for no thinking-effort "
                                        "message")
                            ->capture_default_str();
  CLI::Option* choice =
      sub->add_option("--tool-choice", a->tool_choice, "K3: auto, required or none")->capture_default_str();
  CLI::Option* format =
      sub->add_option("--response-format", a->response_format,
                      "K3: JSON file with the OpenAI response_format (type text, json_object or json_schema)");
  sub->add_flag("--no-generation-prompt", a->no_generation_prompt, "Do not open the assistant's turn at the end");
  a->k3_only = {on, off, effort, choice, format};
  sub->callback([a, &exit_code] {
    Status s = run_render(*a);
    exit_code = s.ok() ? 0 : fail("render", s);
  });
}

}  // namespace klinear::cli
