// SequentialRunner: the StepRunner over today's per-sequence Model::forward. Each open sequence
// owns a SequenceState; a step runs its sequences one after another. Capacity is a budget, not a
// pool: `max_sequences` slots and `cache_tokens` tokens counted in pages, so the scheduler's
// admission, waiting and preemption behave as they will over the pooled caches of the batched
// forward (issue 6), which replaces this runner with one that runs a whole step in one call.
#pragma once

#include <unordered_map>

#include "model/model.h"
#include "runtime/step_runner.h"

namespace klinear {

struct SequentialRunnerOptions {
  int64_t max_sequences = 16;    // slots, >= 1
  int64_t cache_tokens = 65536;  // tokens over all sequences, >= page_size
  int64_t page_size = 64;        // tokens per page, >= 1
};

// The two budgets from one memory budget: `max_sequences` state slots first (KDA recurrent +
// conv state of every KDA layer), the rest as MLA latent pages. Sizes are fp32 (the CPU
// backend's storage). InvalidArgument when the slots alone exceed the budget or no page fits.
struct CacheSizing {
  SequentialRunnerOptions options;
  uint64_t bytes_per_slot = 0, bytes_per_token = 0;
};
Result<CacheSizing> size_cache(const ModelConfig& config, uint64_t memory_bytes, int64_t max_sequences, int64_t page_size);

class SequentialRunner final : public StepRunner {
 public:
  // InvalidArgument naming the option when out of range. `model` must outlive the runner.
  static Result<std::unique_ptr<SequentialRunner>> create(Model& model, const SequentialRunnerOptions& options);

  int64_t vocab_size() const override { return model_.config().vocab_size; }
  int64_t max_model_len() const override;
  CacheUsage usage() const override;
  Result<RunnerSeq> open() override;
  void close(RunnerSeq seq) override;
  Result<Tensor> run(std::span<const RunnerStep> steps) override;

 private:
  SequentialRunner(Model& model, const SequentialRunnerOptions& options) : model_(model), options_(options) {}

  Model& model_;
  SequentialRunnerOptions options_;
  std::unordered_map<RunnerSeq, SequenceState> states_;
  RunnerSeq next_ = 1;
};

}  // namespace klinear
