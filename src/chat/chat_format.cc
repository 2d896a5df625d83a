// Chat formats (see chat_format.h): the checks and the tools array both formats share, the
// dispatch to k2_format.cc / k3_format.cc, and the encoding of the segments.
#include "chat/chat_format.h"

#include <optional>
#include <utility>

#include "chat/k2_format.h"
#include "chat/k3_format.h"

namespace klinear {

namespace {

// The tools array of `options`, or nullopt when there are none.
Result<std::optional<OrderedJson>> parse_tools(const ChatOptions& options) {
  if (options.tools_json.empty()) return std::optional<OrderedJson>{};
  KL_ASSIGN_OR_RETURN(OrderedJson tools, parse_ordered_json(options.tools_json, "tools_json"));
  if (!tools.is_array())
    return Status::InvalidArgument(std::string("tools_json: expected a JSON array, got ") + tools.type_name());
  if (tools.empty()) return std::optional<OrderedJson>{};
  return std::optional<OrderedJson>{std::move(tools)};
}

// continue_final_message: the rendering up to the end of the last message's content (the last
// place it stands, as Hugging Face's apply_chat_template cuts), so the model continues that text.
Result<std::vector<ChatSegment>> cut_after_final_content(std::vector<ChatSegment> segments, const ChatMessage& last) {
  const std::string& content = last.content_parts.empty() ? last.content : last.content_parts.back();
  if (content.empty())
    return Status::InvalidArgument("continue_final_message needs the last message to have text content to continue");
  for (size_t i = segments.size(); i-- > 0;) {
    if (segments[i].kind != SegmentKind::kText) continue;
    const size_t at = segments[i].text.rfind(content);
    if (at == std::string::npos) continue;
    segments[i].text.resize(at + content.size());
    segments.resize(i + 1);
    return segments;
  }
  return Status::InvalidArgument("continue_final_message: the last message's content is not in its rendering");
}

}  // namespace

Status check_chat_roles(const std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      return Status::InvalidArgument("messages[" + std::to_string(i) +
                                     "].role: expected one of system, user, assistant, tool; got '" + r + "'");
  }
  return Status();
}

Result<std::vector<ChatSegment>> render_chat_segments(ChatFormat format, const std::vector<ChatMessage>& messages,
                                                      const ChatOptions& options) {
  KL_RETURN_IF_ERROR(check_chat_roles(messages));
  KL_ASSIGN_OR_RETURN(std::optional<OrderedJson> tools, parse_tools(options));
  if (!options.continue_final_message) {
    if (format == ChatFormat::kKimiK2) return render_k2_segments(messages, options, tools);
    return render_k3_segments(messages, options, tools);
  }
  if (options.add_generation_prompt)
    return Status::InvalidArgument("continue_final_message and add_generation_prompt cannot both be true");
  if (messages.empty() || messages.back().role != "assistant")
    return Status::InvalidArgument("continue_final_message needs the last message to be the assistant's");
  KL_ASSIGN_OR_RETURN(std::vector<ChatSegment> segments, format == ChatFormat::kKimiK2
                                                            ? render_k2_segments(messages, options, tools)
                                                            : render_k3_segments(messages, options, tools));
  return cut_after_final_content(std::move(segments), messages.back());
}

Result<std::string> render_chat(ChatFormat format, const std::vector<ChatMessage>& messages,
                                const ChatOptions& options) {
  KL_ASSIGN_OR_RETURN(std::vector<ChatSegment> segments, render_chat_segments(format, messages, options));
  std::string out;
  for (const ChatSegment& s : segments) out += s.text;
  return out;
}

Result<std::vector<int32_t>> encode_chat(const Tokenizer& tokenizer, const std::vector<ChatSegment>& segments) {
  std::vector<int32_t> ids;
  for (const ChatSegment& s : segments) {
    if (s.kind == SegmentKind::kText) {
      std::vector<int32_t> part = tokenizer.encode(s.text, Tokenizer::Specials::kAsText);
      ids.insert(ids.end(), part.begin(), part.end());
      continue;
    }
    std::optional<int32_t> id = tokenizer.special_id(s.text);
    if (!id)
      return Status::NotFound("chat marker '" + s.text +
                              "' is not a special token of this tokenizer (expected the tokenizer that matches the "
                              "chat format; K3 markers need K3's tokenizer_config.json)");
    ids.push_back(*id);
  }
  return ids;
}

Result<RenderedChat> render_chat_ids(const Tokenizer& tokenizer, ChatFormat format,
                                     const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  KL_ASSIGN_OR_RETURN(std::vector<ChatSegment> segments, render_chat_segments(format, messages, options));
  RenderedChat out;
  KL_ASSIGN_OR_RETURN(out.ids, encode_chat(tokenizer, segments));
  out.text = tokenizer.decode(out.ids);
  return out;
}

std::string chat_stop_marker(ChatFormat format) {
  return format == ChatFormat::kKimiK2 ? "<|im_end|>" : "<|end_of_msg|>";
}

}  // namespace klinear
