// ModelRunner: the StepRunner over the batched forward. A step is one Cache::plan (pages reserved,
// decodes first) and one Model::forward over every scheduled sequence; the logits rows the
// engine asked for come back to the host. Capacity is the Cache's: its KDA state slots and its
// MLA latent pages (none for a model without MLA layers). With prefix caching on, prompt pages
// and KDA snapshots stay cached after their sequences (runtime/prefix_cache.h) and count as free:
// they are evicted, least recently used first, when a sequence or a step needs the room.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "model/cache.h"
#include "model/model.h"
#include "runtime/prefix_cache.h"
#include "runtime/step_runner.h"

namespace klinear {

enum class PrefixCaching { kOff, kOn };

struct PrefixCacheOptions {
  PrefixCaching mode = PrefixCaching::kOn;
  int64_t snapshot_interval = 256;  // tokens between KDA snapshots, a multiple of 64
};

class ModelRunner final : public StepRunner {
 public:
  // Creates the cache on the model's backend; errors are the Cache's (a budget too small for
  // max_sequences slots and one page) or a bad snapshot interval. `model` must outlive the runner.
  static Result<std::unique_ptr<ModelRunner>> create(Model& model, const CacheOptions& options,
                                                     const PrefixCacheOptions& prefix = {});

  int64_t vocab_size() const override { return model_.config().vocab_size; }
  int64_t max_model_len() const override;
  CacheUsage usage() const override;
  Result<RunnerSeq> open() override;
  PrefixHit lookup(std::span<const int32_t> tokens) const override;
  Result<RunnerSeq> open_prefix(std::span<const int32_t> tokens, int64_t cached) override;
  void close(RunnerSeq seq) override;
  Result<Tensor> run(std::span<const RunnerStep> steps) override;
  bool samples_on_device() const override { return true; }
  Result<SampledStep> run_sampled(std::span<const RunnerStep> steps) override;

  const CacheSizes& sizes() const { return cache_->sizes(); }
  Cache& cache() { return *cache_; }  // tests: poison and inspect the pools
  // Evicts everything the prefix cache holds (no-op when off).
  void clear_prefix_cache();

 private:
  ModelRunner(Model& model, std::unique_ptr<Cache> cache) : model_(model), cache_(std::move(cache)) {}

  Model& model_;
  std::unique_ptr<Cache> cache_;
  std::unique_ptr<PrefixCache> prefix_;                               // null when off
  std::unordered_map<RunnerSeq, std::vector<int32_t>> history_;       // every token of each open sequence (prefix on)
};

}  // namespace klinear
