// ModelRunner: the StepRunner over the batched forward. A step is one Cache::plan (pages reserved,
// decodes first) and one Model::forward over every scheduled sequence; the logits rows the
// engine asked for come back to the host. Capacity is the Cache's: its KDA state slots and its
// MLA latent pages (none for a model without MLA layers).
#pragma once

#include <memory>

#include "model/cache.h"
#include "model/model.h"
#include "runtime/step_runner.h"

namespace klinear {

class ModelRunner final : public StepRunner {
 public:
  // Creates the cache on the model's backend; errors are the Cache's (a budget too small for
  // max_sequences slots and one page). `model` must outlive the runner.
  static Result<std::unique_ptr<ModelRunner>> create(Model& model, const CacheOptions& options);

  int64_t vocab_size() const override { return model_.config().vocab_size; }
  int64_t max_model_len() const override;
  CacheUsage usage() const override;
  Result<RunnerSeq> open() override { return cache_->open(); }
  void close(RunnerSeq seq) override { cache_->close(seq); }
  Result<Tensor> run(std::span<const RunnerStep> steps) override;

  const CacheSizes& sizes() const { return cache_->sizes(); }

 private:
  ModelRunner(Model& model, std::unique_ptr<Cache> cache) : model_(model), cache_(std::move(cache)) {}

  Model& model_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace klinear
