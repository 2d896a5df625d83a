// The K3 chat format: XTML messages built by code after Moonshot's encoder (encoding_k3.py),
// docs/DESIGN.md "Chat formats" (chat_format.h has the interface; render_chat_segments dispatches
// here).
#pragma once

#include <optional>
#include <vector>

#include "chat/chat_format.h"
#include "core/status.h"
#include "io/json.h"

namespace klinear {

// The segments of `messages` (roles already checked); `tools`: options.tools_json parsed, nullopt
// when there are none. Errors as render_chat_segments() lists them for K3.
Result<std::vector<ChatSegment>> render_k3_segments(const std::vector<ChatMessage>& messages,
                                                    const ChatOptions& options,
                                                    const std::optional<OrderedJson>& tools);

}  // namespace klinear
