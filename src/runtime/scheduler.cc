#include "runtime/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

namespace klinear {

void Scheduler::add(Sequence* seq) { waiting_.push_back(seq); }

void Scheduler::remove(Sequence* seq) {
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq), waiting_.end());
}

namespace {

// Query-key pairs a chunk of n tokens from position `from` attends over (causal: token from + i sees
// from + i + 1 positions).
int64_t chunk_pairs(int64_t from, int64_t n) { return n * from + n * (n + 1) / 2; }

// The most tokens from `from` whose chunk attends over at most `pairs` pairs, at most 2³¹ − 1 (a
// sequence's length; the products stay inside int64).
int64_t tokens_within(int64_t from, int64_t pairs) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (pairs < from + 1) return 0;
  const double b = 2.0 * static_cast<double>(from) + 1.0;
  int64_t n = std::min(kMax, static_cast<int64_t>((std::sqrt(b * b + 8.0 * static_cast<double>(pairs)) - b) / 2.0));
  while (n > 0 && chunk_pairs(from, n) > pairs) --n;
  while (n < kMax && chunk_pairs(from, n + 1) <= pairs) ++n;
  return n;
}

}  // namespace

// Tokens of s to run from `from` within `budget` tokens and `pairs` query-key pairs, ended at the
// first snapshot point (grid or prompt end) the step could not snapshot at.
int64_t Scheduler::chunk(const Sequence* s, int64_t from, int64_t budget, int64_t pairs) const {
  const int64_t total = static_cast<int64_t>(s->tokens.size());
  const int64_t n = std::min({total - from, budget, tokens_within(from, pairs),
                              s->max_piece > 0 ? s->max_piece : std::numeric_limits<int64_t>::max()});
  const int64_t iv = options_.snapshot_interval;
  int64_t cut = from + n;
  if (iv > 0 && n > 1) {
    for (int64_t g = (from / iv + 1) * iv; g < cut && g <= s->prompt; g += iv)
      if ((g - from) % 64 != 0) cut = g;
    if (s->prompt > from && s->prompt < cut && (s->prompt - from) % 64 != 0) cut = s->prompt;
  }
  if (options_.batch_invariance == BatchInvariance::kOn && cut < total) cut = std::max(from, cut / 64 * 64);
  return cut - from;
}

StepPlan Scheduler::schedule(StepRunner& runner, Admitter* admitter) {
  StepPlan plan;
  int64_t budget = options_.max_num_tokens;
  int64_t attention = options_.max_step_attention > 0 ? options_.max_step_attention : std::numeric_limits<int64_t>::max();
  bool prefilled = false;  // a prefill chunk is in the step (later ones may get no pairs)
  // The pairs a prefill chunk from `from` may take: what is left, and one token's worth (64 with
  // batch invariance) for the step's first prefill, so a sequence at any context moves.
  const int64_t least = options_.batch_invariance == BatchInvariance::kOn ? 64 : 1;
  auto pairs_for = [&](int64_t from, int64_t left) { return prefilled ? left : std::max(left, chunk_pairs(from, least)); };
  std::unordered_set<const Sequence*> scheduled, preempted;
  auto preempt = [&](Sequence* v) {
    runner.close(*v->slot);
    v->slot.reset();
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
  const CacheUsage before = runner.usage();
  // Whether a waiting sequence could take a slot in this step (running prefills then leave it room).
  const bool admissible = !waiting_.empty() && before.slots_free > 0 &&
                          static_cast<int64_t>(running_.size()) < options_.max_num_seqs;
  for (const bool decode_pass : {true, false}) {
    for (Sequence* s : snapshot) {
      if (budget == 0) break;
      if (preempted.count(s) || (s->remaining() == 1) != decode_pass) continue;
      KL_CHECK(s->remaining() >= 1, "running sequence " + std::to_string(s->id) + " has no token to run");
      int64_t n = 1;  // a decode, whatever its context
      if (!decode_pass) {
        const int64_t share = admissible ? (budget + 1) / 2 : budget;
        n = chunk(s, s->computed, share, pairs_for(s->computed, admissible ? attention / 2 : attention));
        if (n == 0) continue;  // no pairs left in this step
      }
      while (!runner.reserve(*s->slot, s->computed + n)) {
        Sequence* v = victim_for(s);
        preempt(v ? v : s);
        if (!v) break;
      }
      if (preempted.count(s)) continue;
      budget -= n;
      if (!decode_pass) {
        attention -= chunk_pairs(s->computed, n);
        prefilled = true;
      }
      scheduled.insert(s);
      plan.seqs.push_back({s, n, false});
    }
  }
  // Admission, oldest first, never in a step that had to preempt (it would only thrash).
  const CacheUsage usage = runner.usage();
  int64_t pages_free = usage.pages_free, slots_free = usage.slots_free;
  const int64_t ps = usage.page_size;
  while (plan.preempted.empty() && !waiting_.empty() && budget > 0 && slots_free > 0 &&
         static_cast<int64_t>(running_.size()) < options_.max_num_seqs) {
    Sequence* s = waiting_.front();
    KL_CHECK(s->computed == 0 && !s->slot, "waiting sequence " + std::to_string(s->id) + " holds state");
    // Pages and slots an open from `hit` takes: the pinned cached pages, the pages from the hit's
    // last full page to the chunk's end, its slot (and the snapshot's, kept while it is copied).
    auto cost = [&](const PrefixHit& hit, int64_t& n, int64_t& pages, int64_t& slots) {
      n = chunk(s, hit.tokens, budget, pairs_for(hit.tokens, attention));
      pages = usage.paged() ? hit.pinned_pages + pages_for(hit.tokens + n, ps) - hit.tokens / ps : 0;
      slots = hit.tokens > 0 ? 2 : 1;
      return n > 0 && pages <= pages_free && slots <= slots_free;
    };
    PrefixHit hit = admitter ? admitter->lookup(*s) : PrefixHit{};
    int64_t n = 0, pages = 0, slots = 0;
    if (!cost(hit, n, pages, slots)) {
      if (n == 0) break;  // no pairs left in this step: the cached prefix waits for the next
      hit = PrefixHit{};
      if (!cost(hit, n, pages, slots)) break;
    }
    if (admitter) {
      admitter->open(*s, hit.tokens);
    } else {
      Result<RunnerSeq> seq = runner.open();
      KL_CHECK(seq.ok(), "the runner cannot open a sequence it counted a slot for: " + seq.status().to_string());
      s->slot = *seq;
    }
    // The count above is the runner's own; its reserve is what holds the pages. Should they
    // differ, the sequence waits at the queue's head rather than fail.
    if (!runner.reserve(*s->slot, s->computed + n)) {
      runner.close(*s->slot);
      s->slot.reset();
      s->computed = 0;
      break;
    }
    waiting_.pop_front();
    running_.push_back(s);
    --slots_free;
    pages_free -= pages;
    budget -= n;
    attention -= chunk_pairs(s->computed, n);
    prefilled = true;
    plan.seqs.push_back({s, n, true});
  }
  return plan;
}

}  // namespace klinear
