// Scheduler: which sequences run in the next step, and how many of their tokens.
//
// One step mixes the decode token of every running sequence that has one with prefill chunks of
// sequences whose tokens are not all in the cache yet, under a token budget (max_num_tokens), so a
// long prompt is prefilled in pieces. Decodes go first (they are latency), then running prefills,
// then waiting sequences are admitted in arrival order while a slot, the pages of their first
// chunk and the budget allow (the head of the queue is never skipped, so a large request cannot
// starve). When a running sequence needs a page and none is free, the most recently admitted
// running sequence is preempted: it gives back its slot and pages and returns to the front of the
// queue, to be recomputed from its tokens later (prompt and generated so far).
//
// The scheduler only decides; the engine opens and closes runner sequences accordingly.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "runtime/step_runner.h"

namespace klinear {

struct SchedulerOptions {
  int64_t max_num_tokens = 2048;  // tokens per step (decode + prefill), >= 1
  int64_t max_num_seqs = 256;     // running sequences at most, >= 1
};

// The scheduler's view of one sequence (owned by the engine).
struct Sequence {
  uint64_t id = 0;
  std::vector<int32_t> tokens;         // prompt, then generated ids
  int64_t computed = 0;                // tokens[0, computed) are in the runner's state
  std::optional<RunnerSeq> slot;       // open in the runner while running
  int64_t remaining() const { return static_cast<int64_t>(tokens.size()) - computed; }
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int64_t tokens = 0;  // run tokens[computed, computed + tokens)
  bool admit = false;  // newly admitted: the engine opens a runner sequence first
};

struct StepPlan {
  std::vector<Sequence*> preempted;  // close their runner sequences first (computed reset to 0)
  std::vector<ScheduledSeq> seqs;    // decodes first, then prefill chunks
  bool empty() const { return seqs.empty(); }
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerOptions options) : options_(options) {}

  void add(Sequence* seq);     // to the back of the waiting queue
  void remove(Sequence* seq);  // finished or cancelled: out of whichever queue holds it
  // Plans the next step against `usage` (the runner's capacity now). Marks preempted sequences
  // (computed = 0, slot cleared after the engine closes them) and moves them to the waiting front.
  StepPlan schedule(const CacheUsage& usage);

  size_t num_running() const { return running_.size(); }
  size_t num_waiting() const { return waiting_.size(); }
  int64_t num_preemptions() const { return preemptions_; }

 private:
  SchedulerOptions options_;
  std::vector<Sequence*> running_;  // admission order
  std::deque<Sequence*> waiting_;
  int64_t preemptions_ = 0;
};

}  // namespace klinear
