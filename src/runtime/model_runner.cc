#include "runtime/model_runner.h"

#include <cstring>
#include <limits>
#include <vector>

namespace klinear {

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(Model& model, const CacheOptions& options) {
  KL_ASSIGN_OR_RETURN(std::unique_ptr<Cache> cache, Cache::create(model.config(), model.backend(), options));
  return std::unique_ptr<ModelRunner>(new ModelRunner(model, std::move(cache)));
}

int64_t ModelRunner::max_model_len() const {
  const int64_t m = model_.config().max_position_embeddings;
  return m > 0 ? m : std::numeric_limits<int32_t>::max();
}

CacheUsage ModelRunner::usage() const {
  const CacheSizes& s = cache_->sizes();
  return CacheUsage{s.slots, cache_->free_slots(), s.pages, cache_->free_pages(), s.page_size};
}

// Every step asks for its last row (the batch always has one per sequence); the rows the engine
// did not ask for (prefill chunks that do not reach the end of the known tokens) are dropped.
Result<Tensor> ModelRunner::run(std::span<const RunnerStep> steps) {
  std::vector<SeqStep> plan;
  plan.reserve(steps.size());
  int64_t rows = 0;
  for (const RunnerStep& s : steps) {
    plan.push_back(SeqStep{s.seq, s.ids, LogitsMode::kLast});
    rows += s.want_logits ? 1 : 0;
  }
  KL_ASSIGN_OR_RETURN(Batch batch, cache_->plan(plan));
  KL_ASSIGN_OR_RETURN(Tensor device_logits, model_.forward(batch, *cache_));
  const Tensor all = model_.backend().to_host(device_logits);
  const int64_t vocab = vocab_size();
  KL_CHECK(all.dim(0) == static_cast<int64_t>(steps.size()) && all.dim(1) == vocab,
           "forward returned logits " + shape_to_string(all.shape()) + " for " + std::to_string(steps.size()) + " steps");
  Tensor out = Tensor::empty(DType::kF32, {rows, vocab});
  int64_t row = 0;
  for (size_t i = 0; i < steps.size(); ++i)
    if (steps[i].want_logits)
      std::memcpy(out.f32() + row++ * vocab, all.f32() + static_cast<int64_t>(i) * vocab, static_cast<size_t>(vocab) * sizeof(float));
  return out;
}

}  // namespace klinear
