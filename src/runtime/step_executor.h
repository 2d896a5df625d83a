// StepExecutor: runs planned steps of a Model over one Cache, and draws their tokens.
//
// A decode-only step (every sequence decodes one token; no snapshots, finite checks off, at most
// 256 sequences) runs at a fixed shape: padded to the next batch bucket (1, 2, 4, ..., 256; see
// Cache::pad), its inputs written into fixed device buffers, the forward, the logits and the
// sampling as one Backend::run_graph body per bucket, which CUDA captures and replays as a graph
// (docs/DESIGN.md "The decode step as a CUDA graph"). Padding happens with graphs off too, so a
// step gives the same bits with and without them. Other steps run eagerly (Model::forward).
//
// The executor owns the fixed buffers and its graphs (keyed by its own id, so two executors on
// one backend never replay each other's); destroying it drops the backend's graphs.
#pragma once

#include <cstdint>
#include <map>
#include <span>

#include "model/cache.h"
#include "model/model.h"

namespace klinear {

// The outputs of one step on the backend's device, valid until its next step.
struct StepOutput {
  Tensor logits;  // [R, V] F32: the batch's logit_rows
  Tensor ids;     // [R] I32: the tokens drawn (Backend::sample); undefined when no draws were given
};

class StepExecutor {
 public:
  // `model` and `cache` (on the model's backend) must outlive the executor.
  StepExecutor(Model& model, Cache& cache);
  ~StepExecutor();
  StepExecutor(const StepExecutor&) = delete;
  StepExecutor& operator=(const StepExecutor&) = delete;

  Model& model() const { return model_; }
  Cache& cache() const { return cache_; }

  // Runs `batch` (from cache().plan) and advances its sequences, drawing one token per logits row
  // with `draws` ([R], or empty for none).
  Result<StepOutput> run(Batch& batch, std::span<const SampleRow> draws = {});

 private:
  // Batch buckets of fixed-shape decode steps.
  static constexpr int64_t kMaxBucket = 256;
  bool fixed_shape(const Batch& batch) const;
  Result<StepOutput> run_fixed(Batch& batch, std::span<const SampleRow> draws);

  Model& model_;
  Cache& cache_;
  uint64_t id_ = 0;  // unique in the process: the high bits of this executor's graph keys
  // The fixed device inputs of decode steps (sized for the largest bucket the cache's slots
  // allow, and its page table), and the outputs each bucket's body produced.
  int64_t cols_ = 0;  // page table columns
  Tensor i32_, f32_;  // ids, cu_seqlens, cached, slots, logit_rows, top_k, seed, counter, page_table | temperature, top_p
  std::map<int64_t, StepOutput> out_;  // by bucket
};

}  // namespace klinear
