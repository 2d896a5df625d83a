#include "chat/k2_tool_calls.h"

#include <algorithm>

namespace klinear {

namespace {
constexpr const char* kSectionBegin[] = {"<|tool_calls_section_begin|>", "<|tool_call_section_begin|>"};
constexpr const char* kSectionEnd = "<|tool_calls_section_end|>";
constexpr const char* kCallBegin = "<|tool_call_begin|>";
constexpr const char* kArgBegin = "<|tool_call_argument_begin|>";
constexpr const char* kCallEnd = "<|tool_call_end|>";

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}
}  // namespace

ParsedToolCalls parse_kimi_tool_calls(const std::string& text) {
  ParsedToolCalls r;
  size_t section = std::string::npos, marker_len = 0;
  for (const char* m : kSectionBegin) {
    const size_t at = text.find(m);
    if (at < section) section = at, marker_len = std::string(m).size();
  }
  if (section == std::string::npos) {
    r.content = text;
    return r;
  }
  r.content = text.substr(0, section);
  r.in_section = true;
  const size_t end = std::min(text.find(kSectionEnd, section), text.size());
  size_t pos = section + marker_len;
  while (true) {
    const size_t begin = text.find(kCallBegin, pos);
    if (begin == std::string::npos || begin >= end) break;
    const size_t header = begin + std::string(kCallBegin).size();
    const size_t arg = text.find(kArgBegin, header);
    if (arg == std::string::npos || arg >= end) break;  // header not complete yet
    ToolCall call;
    call.id = trim(text.substr(header, arg - header));  // "functions.NAME:IDX"
    std::string name = call.id;
    if (name.rfind("functions.", 0) == 0) name = name.substr(10);
    if (const size_t colon = name.rfind(':'); colon != std::string::npos) name = name.substr(0, colon);
    call.name = name;
    const size_t args = arg + std::string(kArgBegin).size();
    const size_t call_end = std::min(text.find(kCallEnd, args), end);
    // Whitespace around the JSON is dropped; trimming a prefix of the arguments gives a prefix of
    // the trimmed whole, so streamed deltas concatenate to the final arguments.
    call.arguments_json = trim(text.substr(args, call_end - args));
    r.calls.push_back(std::move(call));
    if (call_end >= end) break;
    pos = call_end + std::string(kCallEnd).size();
  }
  return r;
}

void ToolCallStream::update(const std::string& text, std::string& content_delta, std::vector<ToolCallDelta>& deltas) {
  const ParsedToolCalls p = parse_kimi_tool_calls(text);
  content_delta.clear();
  deltas.clear();
  if (p.content.size() > content_sent_) {
    content_delta = p.content.substr(content_sent_);
    content_sent_ = p.content.size();
  }
  for (size_t i = 0; i < p.calls.size(); ++i) {
    ToolCallDelta d;
    d.index = static_cast<int>(i);
    if (i >= args_sent_.size()) {
      args_sent_.push_back(0);
      d.id = p.calls[i].id;
      d.name = p.calls[i].name;
    }
    const std::string& args = p.calls[i].arguments_json;
    if (args.size() > args_sent_[i]) {
      d.arguments = args.substr(args_sent_[i]);
      args_sent_[i] = args.size();
    }
    if (!d.id.empty() || !d.arguments.empty()) deltas.push_back(std::move(d));
  }
}

namespace {

// Appends to `sent` what `now` adds to it (nothing when `now` does not extend it) and returns it.
// Unless `final`, a trailing U+FFFD is held back: it may be a character whose bytes are not all
// generated yet, and decodes differently once they are.
std::string grow(std::string& sent, std::string now, bool final) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  if (!final)
    while (now.size() >= kReplacement.size() && now.compare(now.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0)
      now.resize(now.size() - kReplacement.size());
  if (now.size() <= sent.size() || now.compare(0, sent.size(), sent) != 0) return std::string();
  std::string delta = now.substr(sent.size());
  sent = std::move(now);
  return delta;
}

}  // namespace

ChatDelta K3TurnStream::update(std::span<const int32_t> ids, bool final) {
  ChatDelta d;
  if (!broken_) {
    Result<K3AssistantTurn> turn = parse_k3_assistant_turn(*tokenizer_, ids, start_);
    if (turn.ok()) {
      // Settled up to the last <|open|> when the ids before it parse to the same turn (the element
      // it opens has given nothing yet), else up to the end.
      settled_ = ids.size();
      const std::optional<int32_t> open = tokenizer_->special_id("<|open|>");
      const auto last_open = std::find(ids.rbegin(), ids.rend(), open.value_or(-1));
      if (last_open != ids.rend()) {
        const size_t at = static_cast<size_t>(ids.rend() - last_open) - 1;
        auto before = parse_k3_assistant_turn(*tokenizer_, ids.first(at), start_);
        if (before.ok() && before->reasoning == turn->reasoning && before->content == turn->content &&
            before->tool_calls.size() == turn->tool_calls.size())
          settled_ = at;
      }
      d.reasoning = grow(reasoning_, std::move(turn->reasoning), final);
      d.content = grow(content_, std::move(turn->content), final);
      for (size_t i = calls_.size(); i < turn->tool_calls.size(); ++i) {
        ToolCall call = std::move(turn->tool_calls[i]);
        call.id = "functions." + call.name + ":" + std::to_string(i);
        d.calls.push_back(ToolCallDelta{static_cast<int>(i), call.id, call.name, call.arguments_json});
        calls_.push_back(std::move(call));
      }
      return d;
    }
    broken_ = true;
  }
  d.content = grow(passed_, tokenizer_->decode(ids.subspan(std::min(settled_, ids.size()))), final);
  content_ += d.content;
  return d;
}

}  // namespace klinear
