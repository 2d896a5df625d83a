// The Kimi K2 / Kimi Linear chat format (see k2_format.h), mirroring the jinja chat_template of
// tokenizer_config.json line by line.
#include "chat/k2_format.h"

#include <string>

#include "chat/py_json.h"
#include "chat/segment_writer.h"

namespace klinear {

// Each branch mirrors the template of tokenizer_config.json; comments quote what is surprising.
std::vector<ChatSegment> render_k2_segments(const std::vector<ChatMessage>& messages, const ChatOptions& options,
                                            const std::optional<OrderedJson>& tools) {
  SegmentWriter w(/*merge_text=*/true);
  if (tools) {
    w.marker("<|im_system|>");
    w.text("tool_declare");
    w.marker("<|im_middle|>");
    w.text(py_dumps(*tools, kPyDefault));
    w.marker("<|im_end|>");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (i == 0 && m.role != "system") {
      w.marker("<|im_system|>");
      w.text("system");
      w.marker("<|im_middle|>");
      w.text("You are a helpful assistant");
      w.marker("<|im_end|>");
    }
    if (m.role == "system") {
      w.marker("<|im_system|>");
      w.text("system");
    } else if (m.role == "user") {
      w.marker("<|im_user|>");
      w.text("user");
    } else if (m.role == "assistant") {
      w.marker("<|im_assistant|>");
      w.text("assistant");
    } else {
      w.marker("<|im_system|>");
      w.text("tool");
    }
    w.marker("<|im_middle|>");
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      w.text(m.content);
      w.marker("<|tool_calls_section_begin|>");
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        const ToolCall& call = m.tool_calls[k];
        w.marker("<|tool_call_begin|>");
        // The template ignores the OpenAI id: `'functions.' + func_name + ':' + loop.index0`.
        w.text("functions." + call.name + ":" + std::to_string(k));
        w.marker("<|tool_call_argument_begin|>");
        // `arguments | tojson` on the OpenAI string: a quoted JSON string, as the template does.
        std::string quoted;
        py_dump_string(call.arguments_json, quoted);
        w.text(quoted);
        w.marker("<|tool_call_end|>");
      }
      w.marker("<|tool_calls_section_end|>");
    } else if (m.role == "tool") {
      // The template text is `## Return of {{ id }}\n{{ content }}` where `\n` is a literal
      // backslash and 'n' (jinja does not unescape template text).
      w.text("## Return of " + m.tool_call_id + "\\n" + m.content);
    } else {
      w.text(m.content);
    }
    w.marker("<|im_end|>");
  }
  if (options.add_generation_prompt) {
    w.marker("<|im_assistant|>");
    w.text("assistant");
    w.marker("<|im_middle|>");
  }
  return w.take();
}

}  // namespace klinear
