#include "runtime/stop.h"

#include <algorithm>

namespace klinear {

Status validate_stop(const StopOptions& o) {
  if (o.max_tokens < 1) return Status::InvalidArgument("max_tokens must be >= 1, got " + std::to_string(o.max_tokens));
  for (size_t i = 0; i < o.stop.size(); ++i)
    if (o.stop[i].empty()) return Status::InvalidArgument("stop[" + std::to_string(i) + "] is empty, expected a non-empty string");
  if (o.min_tokens < 0 || o.min_tokens > o.max_tokens)
    return Status::InvalidArgument("min_tokens must be in [0, max_tokens = " + std::to_string(o.max_tokens) + "], got " +
                                   std::to_string(o.min_tokens));
  return Status();
}

std::vector<int32_t> stop_ids_of(const StopOptions& o, const std::vector<int32_t>& eos_ids) {
  std::vector<int32_t> ids = o.stop_ids;
  if (!o.ignore_eos) ids.insert(ids.end(), eos_ids.begin(), eos_ids.end());
  return ids;
}

StopFilter::StopFilter(StopOptions options, std::vector<int32_t> eos_ids)
    : options_(std::move(options)), eos_ids_(std::move(eos_ids)) {}

bool StopFilter::is_stop_id(int32_t id) const {
  auto has = [id](const std::vector<int32_t>& v) { return std::find(v.begin(), v.end(), id) != v.end(); };
  return has(options_.stop_ids) || (!options_.ignore_eos && has(eos_ids_));
}

bool StopFilter::may_stop() const { return generated_ > options_.min_tokens; }

void StopFilter::release(size_t n, Released& out) {
  out.text += pending_.substr(0, n);
  pending_.erase(0, n);
  size_t done = 0;
  while (done < waiting_.size() && waiting_end_[done] <= n) out.tokens.push_back(std::move(waiting_[done++]));
  waiting_.erase(waiting_.begin(), waiting_.begin() + static_cast<std::ptrdiff_t>(done));
  waiting_end_.erase(waiting_end_.begin(), waiting_end_.begin() + static_cast<std::ptrdiff_t>(done));
  for (size_t& e : waiting_end_) e -= n;
}

Released StopFilter::push(TokenOutput token) {
  ++generated_;
  Released out;
  if (may_stop() && is_stop_id(token.id)) {
    release(pending_.size(), out);
    out.finish = FinishReason::kStop;
    return out;
  }
  pending_ += token.text;
  waiting_.push_back(std::move(token));
  waiting_end_.push_back(pending_.size());
  if (!may_stop()) {
    release(pending_.size(), out);
    return finish_at_max(out);
  }
  // The earliest match of any stop string ends the text there (or after it).
  size_t match = std::string::npos, end = 0;
  for (const std::string& s : options_.stop)
    if (const size_t at = pending_.find(s); at < match) {
      match = at;
      end = at + (options_.include_stop_str_in_output ? s.size() : 0);
    }
  if (match != std::string::npos) {
    release(end, out);
    pending_.clear();
    waiting_.clear();
    waiting_end_.clear();
    out.finish = FinishReason::kStop;
    return out;
  }
  // Hold back the longest tail that begins some stop string.
  size_t hold = 0;
  for (const std::string& s : options_.stop)
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len)
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  release(pending_.size() - hold, out);
  return finish_at_max(out);
}

Released StopFilter::finish_at_max(Released& out) {
  if (generated_ >= options_.max_tokens) {
    release(pending_.size(), out);
    out.finish = FinishReason::kLength;
  }
  return std::move(out);
}

Released StopFilter::flush(FinishReason reason) {
  Released out;
  release(pending_.size(), out);
  out.finish = reason;
  return out;
}

}  // namespace klinear
