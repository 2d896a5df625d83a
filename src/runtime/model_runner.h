// ModelRunner: the StepRunner over the batched forward. Its sequences, slots and pages are the
// CacheManager's (runtime/cache_manager.h), reserved while the scheduler schedules; a step is one
// Cache::plan (the layout, decodes first) and one StepExecutor::run over every scheduled sequence.
// The logits rows the engine asked for come back to the host, the drawn ids in one copy.
#pragma once

#include <memory>

#include "model/model.h"
#include "runtime/cache_manager.h"
#include "runtime/step_executor.h"
#include "runtime/step_runner.h"

namespace klinear {

class ModelRunner final : public StepRunner {
 public:
  // Creates the cache on the model's backend; errors are the CacheManager's. `model` must outlive
  // the runner.
  static Result<std::unique_ptr<ModelRunner>> create(Model& model, const CacheOptions& options,
                                                     const PrefixCacheOptions& prefix = {});

  int64_t vocab_size() const override { return model_.config().vocab_size; }
  int64_t max_model_len() const override;
  CacheUsage usage() const override { return manager_->usage(); }
  Result<RunnerSeq> open() override { return manager_->open(); }
  PrefixHit lookup(std::span<const int32_t> tokens) const override { return manager_->lookup(tokens); }
  Result<RunnerSeq> open_prefix(std::span<const int32_t> tokens, int64_t cached) override {
    return manager_->open_prefix(tokens, cached);
  }
  void close(RunnerSeq seq) override { manager_->close(seq); }
  bool reserve(RunnerSeq seq, int64_t tokens) override { return manager_->reserve(seq, tokens); }
  bool samples_on_device() const override { return true; }
  Result<SampledStep> run(std::span<const RunnerStep> steps) override;

  const CacheSizes& sizes() const { return manager_->cache().sizes(); }
  Cache& cache() { return manager_->cache(); }  // tests: poison and inspect the pools
  void clear_prefix_cache() { manager_->clear_prefix_cache(); }

 private:
  ModelRunner(Model& model, std::unique_ptr<CacheManager> manager)
      : model_(model), manager_(std::move(manager)), executor_(model, manager_->cache()) {}

  Model& model_;
  std::unique_ptr<CacheManager> manager_;
  StepExecutor executor_;
};

}  // namespace klinear
