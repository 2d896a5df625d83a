// SegmentWriter: how the format renderers (k2_format.cc, k3_format.cc) collect the segments of a
// rendering (chat_format.h).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/chat_format.h"

namespace klinear {

// Collects segments; with `merge_text`, adjacent text is kept as one segment.
class SegmentWriter {
 public:
  explicit SegmentWriter(bool merge_text) : merge_text_(merge_text) {}
  void marker(std::string_view name) { segments_.push_back({SegmentKind::kMarker, std::string(name)}); }
  void text(std::string_view s) {
    if (s.empty()) return;
    if (merge_text_ && !segments_.empty() && segments_.back().kind == SegmentKind::kText) {
      segments_.back().text += s;
    } else {
      segments_.push_back({SegmentKind::kText, std::string(s)});
    }
  }
  std::vector<ChatSegment> take() { return std::move(segments_); }

 private:
  bool merge_text_;
  std::vector<ChatSegment> segments_;
};

}  // namespace klinear
