// The Kimi K2 / Kimi Linear chat format: the jinja `chat_template` of tokenizer_config.json,
// rendered natively (chat_format.h has the interface; render_chat_segments dispatches here).
#pragma once

#include <optional>
#include <vector>

#include "chat/chat_format.h"
#include "io/json.h"

namespace klinear {

// The segments of `messages` (roles already checked); `tools`: options.tools_json parsed, nullopt
// when there are none. Ignores the K3-only options and fields.
std::vector<ChatSegment> render_k2_segments(const std::vector<ChatMessage>& messages, const ChatOptions& options,
                                            const std::optional<OrderedJson>& tools);

}  // namespace klinear
