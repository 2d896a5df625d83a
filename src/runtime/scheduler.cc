#include "runtime/scheduler.h"

#include <algorithm>
#include <unordered_set>

namespace klinear {

void Scheduler::add(Sequence* seq) { waiting_.push_back(seq); }

void Scheduler::remove(Sequence* seq) {
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq), waiting_.end());
}

StepPlan Scheduler::schedule(const CacheUsage& usage) {
  StepPlan plan;
  int64_t budget = options_.max_num_tokens;
  int64_t pages_free = usage.pages_free, slots_free = usage.slots_free;
  const int64_t ps = usage.page_size;
  std::unordered_set<const Sequence*> scheduled, preempted;
  auto extra_pages = [&](const Sequence* s, int64_t n) {
    return usage.paged() ? pages_for(s->computed + n, ps) - pages_for(s->computed, ps) : 0;
  };
  auto preempt = [&](Sequence* v) {
    pages_free += usage.paged() ? pages_for(v->computed, ps) : 0;
    ++slots_free;
    v->computed = 0;
    running_.erase(std::find(running_.begin(), running_.end(), v));
    waiting_.push_front(v);  // victims go youngest first, so the oldest ends up at the front
    plan.preempted.push_back(v);
    preempted.insert(v);
    ++preemptions_;
  };
  // The youngest running sequence not yet given tokens in this step, other than `s`.
  auto victim_for = [&](const Sequence* s) -> Sequence* {
    for (auto it = running_.rbegin(); it != running_.rend(); ++it)
      if (*it != s && !scheduled.count(*it)) return *it;
    return nullptr;
  };

  const std::vector<Sequence*> snapshot = running_;
  for (const bool decode_pass : {true, false}) {
    for (Sequence* s : snapshot) {
      if (budget == 0) break;
      if (preempted.count(s) || (s->remaining() == 1) != decode_pass) continue;
      KL_CHECK(s->remaining() >= 1, "running sequence " + std::to_string(s->id) + " has no token to run");
      const int64_t n = std::min(s->remaining(), budget);
      while (extra_pages(s, n) > pages_free) {
        Sequence* v = victim_for(s);
        preempt(v ? v : s);
        if (!v) break;
      }
      if (preempted.count(s)) continue;
      pages_free -= extra_pages(s, n);
      budget -= n;
      scheduled.insert(s);
      plan.seqs.push_back({s, n, false});
    }
  }
  // Admission, oldest first, never in a step that had to preempt (it would only thrash).
  while (plan.preempted.empty() && !waiting_.empty() && budget > 0 && slots_free > 0 &&
         static_cast<int64_t>(running_.size()) < options_.max_num_seqs) {
    Sequence* s = waiting_.front();
    KL_CHECK(s->computed == 0 && !s->slot, "waiting sequence " + std::to_string(s->id) + " holds state");
    const int64_t n = std::min(s->remaining(), budget);
    if (extra_pages(s, n) > pages_free) break;
    waiting_.pop_front();
    running_.push_back(s);
    --slots_free;
    pages_free -= extra_pages(s, n);
    budget -= n;
    plan.seqs.push_back({s, n, true});
  }
  return plan;
}

}  // namespace klinear
