// Kimi K2 / Kimi Linear tool calls in generated text (see k2_tool_calls.h).
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

}  // namespace klinear
