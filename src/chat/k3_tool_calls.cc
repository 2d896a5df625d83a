// Parser of K3 assistant output (see k3_tool_calls.h), one-shot and streamed: a cursor over
// marker / text pieces that follows the element grammar the renderer writes:
//   [think-text <|close|>think<|sep|> <|open|>response<|sep|>] response-text <|close|>response<|sep|>
//   [<|open|>tools<|sep|> (<|open|>call tool="N" index="i"<|sep|>
//        (<|open|>json type="object"<|sep|>RAW<|close|>json<|sep|> |
//         (<|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|>)*)
//    <|close|>call<|sep|>)* <|close|>tools<|sep|>]
//   <|close|>message<|sep|> [<|end_of_msg|>]
#include "chat/k3_tool_calls.h"

#include <algorithm>
#include <optional>
#include <string_view>
#include <utility>

#include "io/json.h"

namespace klinear {
namespace {

constexpr std::string_view kOpen = "<|open|>", kClose = "<|close|>", kSep = "<|sep|>", kEnd = "<|end_of_msg|>";

struct Tag {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;
  const std::string* attr(std::string_view key) const {
    for (const auto& [k, v] : attrs)
      if (k == key) return &v;
    return nullptr;
  }
};

std::string unescape_attribute(std::string_view v) {
  std::string out;
  for (size_t i = 0; i < v.size();) {
    if (v.substr(i, 6) == "&quot;") {
      out += '"';
      i += 6;
    } else if (v.substr(i, 5) == "&amp;") {
      out += '&';
      i += 5;
    } else {
      out += v[i++];
    }
  }
  return out;
}

// `name key="value" ...` (the text between <|open|> and <|sep|>).
Result<Tag> parse_tag_header(std::string_view h, size_t at) {
  auto bad = [&] { return Status::InvalidArgument("K3 output piece " + std::to_string(at) + ": malformed tag '" + std::string(h) + "'"); };
  Tag tag;
  size_t sp = h.find(' ');
  tag.name = std::string(h.substr(0, sp));
  if (tag.name.empty()) return bad();
  while (sp != std::string_view::npos) {
    size_t eq = h.find("=\"", sp);
    if (eq == std::string_view::npos) return bad();
    size_t end = h.find('"', eq + 2);
    if (end == std::string_view::npos) return bad();
    tag.attrs.emplace_back(std::string(h.substr(sp + 1, eq - sp - 1)), unescape_attribute(h.substr(eq + 2, end - eq - 2)));
    if (end + 1 == h.size()) break;
    if (h[end + 1] != ' ') return bad();
    sp = end + 1;
  }
  return tag;
}

class Cursor {
 public:
  explicit Cursor(const std::vector<ChatSegment>& pieces) : p_(pieces) {}
  bool at_end() const { return i_ >= p_.size(); }
  bool at_marker(std::string_view m) const { return !at_end() && p_[i_].kind == SegmentKind::kMarker && p_[i_].text == m; }
  size_t position() const { return i_; }

  // Consecutive text pieces, joined.
  std::string text() {
    std::string out;
    while (!at_end() && p_[i_].kind == SegmentKind::kText) out += p_[i_++].text;
    return out;
  }

  // `marker header <|sep|>`: the header, or nullopt when the input ends first.
  Result<std::optional<std::string>> element(std::string_view marker) {
    if (at_end()) return std::optional<std::string>{};
    if (!at_marker(marker)) return unexpected(marker);
    ++i_;
    std::string header = text();
    if (at_end()) return std::optional<std::string>{};
    if (!at_marker(kSep)) return unexpected(kSep);
    ++i_;
    return std::optional<std::string>{std::move(header)};
  }

  // `<|open|>...<|sep|>` parsed; nullopt at the end of input.
  Result<std::optional<Tag>> open() {
    size_t at = i_;
    KL_ASSIGN_OR_RETURN(std::optional<std::string> header, element(kOpen));
    if (!header) return std::optional<Tag>{};
    KL_ASSIGN_OR_RETURN(Tag tag, parse_tag_header(*header, at));
    return std::optional<Tag>{std::move(tag)};
  }

  // `<|close|>name<|sep|>`: true when read, false at the end of input.
  Result<bool> close(std::string_view name) {
    size_t at = i_;
    KL_ASSIGN_OR_RETURN(std::optional<std::string> header, element(kClose));
    if (!header) return false;
    if (*header != name)
      return Status::InvalidArgument("K3 output piece " + std::to_string(at) + ": expected </" + std::string(name) +
                                     ">, got </" + *header + ">");
    return true;
  }

  Status unexpected(std::string_view want) const {
    return Status::InvalidArgument("K3 output piece " + std::to_string(i_) + ": expected " + std::string(want) +
                                   ", got '" + p_[i_].text + "'");
  }

 private:
  const std::vector<ChatSegment>& p_;
  size_t i_ = 0;
};

Status expect_tag(const Tag& tag, std::string_view name, size_t at) {
  if (tag.name == name) return Status();
  return Status::InvalidArgument("K3 output piece " + std::to_string(at) + ": expected <" + std::string(name) +
                                 ">, got <" + tag.name + ">");
}

// The value of an `argument` element as JSON of its declared type.
Result<OrderedJson> argument_value(const std::string& type, std::string text, const std::string& where) {
  if (type == "string") return OrderedJson(std::move(text));
  KL_ASSIGN_OR_RETURN(OrderedJson v, parse_ordered_json(text, where));
  bool ok = (type == "number" && v.is_number()) || (type == "boolean" && v.is_boolean()) ||
            (type == "null" && v.is_null()) || (type == "object" && v.is_object()) || (type == "array" && v.is_array());
  if (!ok)
    return Status::InvalidArgument(where + ": expected a value of type " + type + ", got " + v.type_name());
  return v;
}

// One `call` element after its open tag; nullopt when the input ends inside it.
Result<std::optional<ToolCall>> parse_call(Cursor& c, const Tag& call_tag, size_t at) {
  ToolCall call;
  const std::string* tool = call_tag.attr("tool");
  if (!tool || tool->empty())
    return Status::InvalidArgument("K3 output piece " + std::to_string(at) + ": a call without a tool name");
  call.name = *tool;
  OrderedJson args = OrderedJson::object();
  bool raw = false;
  while (true) {
    if (c.at_end()) return std::optional<ToolCall>{};
    if (c.at_marker(kClose)) {
      KL_ASSIGN_OR_RETURN(bool closed, c.close("call"));
      if (!closed) return std::optional<ToolCall>{};
      break;
    }
    size_t arg_at = c.position();
    KL_ASSIGN_OR_RETURN(std::optional<Tag> tag, c.open());
    if (!tag) return std::optional<ToolCall>{};
    std::string body = c.text();
    KL_ASSIGN_OR_RETURN(bool closed, c.close(tag->name));
    if (!closed) return std::optional<ToolCall>{};
    const std::string where = "K3 output piece " + std::to_string(arg_at) + " (call " + call.name + ")";
    if (tag->name == "json") {
      call.arguments_json = std::move(body);
      raw = true;
      continue;
    }
    KL_RETURN_IF_ERROR(expect_tag(*tag, "argument", arg_at));
    const std::string* key = tag->attr("key");
    const std::string* type = tag->attr("type");
    if (!key || !type) return Status::InvalidArgument(where + ": an argument needs key and type attributes");
    KL_ASSIGN_OR_RETURN(args[*key], argument_value(*type, std::move(body), where + " argument '" + *key + "'"));
  }
  if (raw && !args.empty())
    return Status::InvalidArgument("K3 output piece " + std::to_string(at) + ": a call with both json and argument elements");
  if (!raw) call.arguments_json = args.dump();
  return std::optional<ToolCall>{std::move(call)};
}

Result<K3AssistantTurn> parse_pieces(const std::vector<ChatSegment>& pieces, K3TurnStart start) {
  K3AssistantTurn turn;
  Cursor c(pieces);
  if (start == K3TurnStart::kThink) {
    turn.reasoning = c.text();
    KL_ASSIGN_OR_RETURN(bool closed, c.close("think"));
    if (!closed) return turn;
    size_t at = c.position();
    KL_ASSIGN_OR_RETURN(std::optional<Tag> response, c.open());
    if (!response) return turn;
    KL_RETURN_IF_ERROR(expect_tag(*response, "response", at));
  }
  turn.content = c.text();
  KL_ASSIGN_OR_RETURN(bool closed, c.close("response"));
  if (!closed) return turn;
  if (c.at_marker(kOpen)) {
    size_t at = c.position();
    KL_ASSIGN_OR_RETURN(std::optional<Tag> tools, c.open());
    if (!tools) return turn;
    KL_RETURN_IF_ERROR(expect_tag(*tools, "tools", at));
    while (!c.at_marker(kClose)) {
      if (c.at_end()) return turn;
      size_t call_at = c.position();
      KL_ASSIGN_OR_RETURN(std::optional<Tag> call_tag, c.open());
      if (!call_tag) return turn;
      KL_RETURN_IF_ERROR(expect_tag(*call_tag, "call", call_at));
      KL_ASSIGN_OR_RETURN(std::optional<ToolCall> call, parse_call(c, *call_tag, call_at));
      if (!call) return turn;
      turn.tool_calls.push_back(std::move(*call));
    }
    KL_ASSIGN_OR_RETURN(bool tools_closed, c.close("tools"));
    if (!tools_closed) return turn;
  }
  if (c.at_marker(kEnd)) {  // a model that skips the close tag still ends the turn
    turn.complete = true;
    return turn;
  }
  KL_ASSIGN_OR_RETURN(bool message_closed, c.close("message"));
  turn.complete = message_closed;
  return turn;
}

}  // namespace

Result<K3AssistantTurn> parse_k3_assistant_segments(const std::vector<ChatSegment>& segments, K3TurnStart start) {
  return parse_pieces(segments, start);
}

Result<K3AssistantTurn> parse_k3_assistant_turn(const Tokenizer& tokenizer, std::span<const int32_t> generated,
                                                K3TurnStart start) {
  constexpr std::string_view kNames[] = {kOpen, kClose, kSep, kEnd};
  std::vector<int32_t> markers;
  for (std::string_view name : kNames) {
    std::optional<int32_t> id = tokenizer.special_id(name);
    if (!id)
      return Status::NotFound("K3 marker '" + std::string(name) + "' is not a special token of this tokenizer");
    markers.push_back(*id);
  }
  std::vector<ChatSegment> pieces;
  size_t run = 0;  // start of the current run of non-marker ids
  auto flush = [&](size_t end) {
    if (end > run) pieces.push_back({SegmentKind::kText, tokenizer.decode(generated.subspan(run, end - run))});
  };
  for (size_t i = 0; i < generated.size(); ++i) {
    for (size_t k = 0; k < markers.size(); ++k) {
      if (generated[i] != markers[k]) continue;
      flush(i);
      run = i + 1;
      pieces.push_back({SegmentKind::kMarker, std::string(kNames[k])});
    }
  }
  flush(generated.size());
  return parse_pieces(pieces, start);
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
