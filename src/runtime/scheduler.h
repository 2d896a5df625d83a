// Scheduler: which sequences run in the next step, and how many of their tokens.
//
// One step mixes the decode token of every running sequence that has one with prefill chunks of
// sequences whose tokens are not all in the cache yet, under a token budget (max_num_tokens), so a
// long prompt is prefilled in pieces. Decodes go first (they are latency), then running prefills,
// then waiting sequences are admitted in arrival order while a slot, the pages of their first
// chunk and the budget allow (the head of the queue is never skipped, so a large request cannot
// starve). While a sequence waits for a free slot, each running prefill takes at most half of what
// is left of the step's budgets, so a long prompt's chunks leave room for the requests behind it
// (it took the whole budget, step after step, and a short request waited for all of its prefill).
// A step's time is bounded at long contexts too: its prefill chunks attend over at most
// max_step_attention query-key pairs (a chunk of n tokens from position p attends over
// n·p + n(n+1)/2), the first prefill chunk of a step running at least one token whatever its
// context (a 1M-token prompt in 2,048-token chunks made each step attend over up to 2·10⁹ pairs,
// stalling every other sequence's next token behind it). The step's pages are decided here and
// nowhere else: each scheduled sequence's chunk is reserved in the runner (StepRunner::reserve, the
// CacheManager) as it is scheduled. When a running sequence's pages cannot be reserved, the most
// recently admitted running sequence is preempted: it is closed at once (its slot and pages given
// back) and returns to the front of the queue, to be recomputed from its tokens later (prompt and
// generated so far).
//
// Admission goes through an Admitter (the engine): the scheduler asks it for the sequence's cached
// prefix (StepRunner::lookup), counts the pages that opening from it pins, and has it open the
// runner sequence at once (so nothing is evicted between lookup and open); the sequence then starts
// at `computed` = the cached tokens. With prefix snapshots on (snapshot_interval > 0), a prefill
// chunk that would cross a snapshot grid point or the prompt's end at a position the step cannot
// snapshot (not a multiple of 64 tokens from the chunk's start) ends there instead.
//
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "runtime/step_runner.h"

namespace klinear {

// The default token budget of a step (--max-num-tokens). On the H200 the 48B model's prefill runs at
// 40.1k tok/s in 8,192-token steps against 29.0k in 2,048-token steps, one command (the MoE's
// per-expert GEMMs get 4x the rows; docs/perf-log.md, seventh round); vLLM's default on cards of this
// size is 8,192 too. The price is the inter-token time of running sequences while a long prompt is
// cut in: a full step of 8,192 prompt tokens is ~0.2 s there. The CPU keeps steps short, its steps
// being far slower.
constexpr int64_t default_max_num_tokens(Device device) { return device == Device::kCuda ? 8192 : 2048; }

// The default bound on a step's prefill attention (--max-step-attention, query-key pairs): a full
// step's tokens at a context of 128k on CUDA (2³⁰ pairs: ~2·10¹³ FLOP in each MLA layer of the 48B
// model, ~40 ms at 500 TFLOP/s), at 2k on the CPU. Prefills below those contexts are not cut; past
// them the chunks shrink as the context grows.
constexpr int64_t default_max_step_attention(Device device) {
  return device == Device::kCuda ? int64_t{8192} * 131072 : int64_t{2048} * 2048;
}

struct SchedulerOptions {
  int64_t max_num_tokens = 2048;  // tokens per step (decode + prefill), >= 1
  int64_t max_num_seqs = 256;     // running sequences at most, >= 1
  int64_t snapshot_interval = 0;  // prefix-cache KDA snapshot grid in tokens (a multiple of 64), 0 = none
  int64_t max_step_attention = 0; // query-key pairs a step's prefill chunks attend over, 0 = no bound
  // kOn: a prefill chunk that leaves tokens of its sequence for later steps ends on a multiple of 64
  // positions (none this step when that leaves it empty; the first prefill of a step may attend as
  // 64 tokens do), so every sequence's KDA chunks start at multiples of 64 whatever its steps were.
  BatchInvariance batch_invariance = BatchInvariance::kOff;
};

// The scheduler's view of one sequence (owned by the engine).
struct Sequence {
  uint64_t id = 0;
  std::vector<int32_t> tokens;         // prompt, then generated ids
  int64_t prompt = 0;                  // tokens[0, prompt) are the prompt
  int64_t computed = 0;                // tokens[0, computed) are in the runner's state
  std::optional<RunnerSeq> slot;       // open in the runner while running
  int64_t max_piece = 0;               // > 0 (a multiple of 64): prefill pieces of at most this many tokens
  int64_t remaining() const { return static_cast<int64_t>(tokens.size()) - computed; }
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int64_t tokens = 0;  // run tokens[computed, computed + tokens)
  bool admit = false;  // newly admitted (opened through the Admitter, if one was given)
};

struct StepPlan {
  std::vector<Sequence*> preempted;  // closed in the runner, computed reset to 0, back in the queue
  std::vector<ScheduledSeq> seqs;    // decodes first, then prefill chunks
  bool empty() const { return seqs.empty(); }
};

// Opens admitted sequences in the runner (the engine implements it).
class Admitter {
 public:
  virtual ~Admitter() = default;
  virtual PrefixHit lookup(const Sequence& seq) = 0;
  // Opens seq's runner sequence from its first `cached` tokens (0: from zero state); sets seq.slot
  // and seq.computed.
  virtual void open(Sequence& seq, int64_t cached) = 0;
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerOptions options) : options_(options) {}

  void add(Sequence* seq);     // to the back of the waiting queue
  void remove(Sequence* seq);  // finished or cancelled: out of whichever queue holds it
  // Plans the next step over `runner`'s capacity, reserving every scheduled chunk's pages in it.
  // Preempted sequences are closed in the runner (computed = 0, slot cleared) and moved to the
  // waiting front. Admitted sequences are opened through `admitter` (without one, through the
  // runner, from zero state).
  StepPlan schedule(StepRunner& runner, Admitter* admitter = nullptr);

  size_t num_running() const { return running_.size(); }
  size_t num_waiting() const { return waiting_.size(); }
  int64_t num_preemptions() const { return preemptions_; }

 private:
  int64_t chunk(const Sequence* s, int64_t from, int64_t budget, int64_t pairs) const;

  SchedulerOptions options_;
  std::vector<Sequence*> running_;  // admission order
  std::deque<Sequence*> waiting_;
  int64_t preemptions_ = 0;
};

}  // namespace klinear
