// StepRunner: what the serving engine needs from a model and its caches, and nothing more: open
// and close sequences (a state slot each, plus cache pages reserved as they grow) and run one step
// over many sequences, and (optionally) reuse a cached prefix. The scheduler and engine are written
// against this interface so that unit tests drive them with a fake (tests/runtime/engine_test.cc)
// and the model side (runtime/model_runner.h: one batched forward over pooled caches) can change
// without touching them.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include <optional>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"

namespace klinear {

using RunnerSeq = int64_t;  // a sequence open in a runner

// Cache capacity. A sequence holding T tokens holds ceil(T / page_size) pages; it needs one slot
// while open. pages_total = 0 means the model keeps no per-token cache (no MLA layer): pages never
// limit anything.
struct CacheUsage {
  int64_t slots_total = 0, slots_free = 0;
  int64_t pages_total = 0, pages_free = 0;
  int64_t page_size = 1;  // tokens per page
  bool paged() const { return pages_total > 0; }
};

inline int64_t pages_for(int64_t tokens, int64_t page_size) { return (tokens + page_size - 1) / page_size; }

// Which logits rows a step returns.
enum class StepLogits {
  kNone,  // none
  kLast,  // the last new token's (the next token's distribution)
  kAll,   // every new token's, in order (a prompt's log-probabilities); never drawn on the device
};

// One sequence's part of a step: `ids` continue the tokens already in its state.
struct RunnerStep {
  RunnerSeq seq = 0;
  std::span<const int32_t> ids;  // [T] new tokens, T >= 1
  StepLogits logits = StepLogits::kNone;
  int64_t prompt = 0;            // the sequence's first `prompt` tokens are prompt (prefix caching publishes only those)
  // With kLast, on a runner that samples on the device: draw the next token there
  // (Backend::sample) instead of returning the logits row.
  std::optional<SampleRow> draw;

  // The host logits rows the step returns.
  int64_t host_rows() const {
    return logits == StepLogits::kAll ? static_cast<int64_t>(ids.size()) : logits == StepLogits::kLast && !draw ? 1 : 0;
  }
};

// What run returns.
struct SampledStep {
  Tensor logits;             // [R, V] host F32: each step's host_rows(), in step order
  std::vector<int32_t> ids;  // one id per step with kLast and a draw, in step order (−1: non-finite logits)
};

// What a prefix-cache lookup found for a sequence's tokens: how many of them a sequence opened
// with open_prefix starts with, and how many pages counted free now (held by the prefix cache
// alone) the open pins. Opening from a hit also keeps the snapshot's slot busy during the open.
struct PrefixHit {
  int64_t tokens = 0;
  int64_t pinned_pages = 0;
};

// Thread-safety: none; one engine thread owns a runner.
class StepRunner {
 public:
  virtual ~StepRunner() = default;

  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_model_len() const = 0;  // the most tokens (prompt + generated) of a sequence
  virtual CacheUsage usage() const = 0;

  // A new sequence from zero state (never what its slot held before). ResourceExhausted when no
  // slot is free.
  virtual Result<RunnerSeq> open() = 0;
  // The cached prefix a sequence over `tokens` would start from (none without a prefix cache).
  virtual PrefixHit lookup(std::span<const int32_t> tokens) const {
    (void)tokens;
    return {};
  }
  // Opens a sequence holding the first `cached` tokens of `tokens` from the prefix cache; `cached`
  // is what lookup(tokens) returned with nothing changed since.
  virtual Result<RunnerSeq> open_prefix(std::span<const int32_t> tokens, int64_t cached) {
    (void)tokens;
    return Status::NotSupported("this runner has no prefix cache (asked for " + std::to_string(cached) + " cached tokens)");
  }
  // Frees its slot and pages. The handle is invalid afterwards.
  virtual void close(RunnerSeq seq) = 0;
  // Makes `seq` hold the cache pages of its first `tokens` positions (evicting cached prefixes as
  // needed). False, taking nothing, when they do not fit: the scheduler then preempts. Every
  // position a step writes must have been reserved.
  virtual bool reserve(RunnerSeq seq, int64_t tokens) = 0;
  // Whether run draws on the device (then the engine sets RunnerStep::draw where a request allows
  // it, and only the other rows' logits travel to the host).
  virtual bool samples_on_device() const { return false; }
  // Runs `steps` (each sequence at most once, its positions reserved; no draw in a step that has a
  // kAll) and advances their states. Returns host F32 logits [R, V], each step's host_rows() in
  // step order, and the ids drawn for the others. On error the states of the sequences in the step are
  // undefined: the caller closes them.
  virtual Result<SampledStep> run(std::span<const RunnerStep> steps) = 0;
};

}  // namespace klinear
