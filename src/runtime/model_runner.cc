#include "runtime/model_runner.h"

#include <cstring>
#include <limits>
#include <vector>

namespace klinear {

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(Model& model, const CacheOptions& options,
                                                         const PrefixCacheOptions& prefix) {
  if (prefix.mode == PrefixCaching::kOn && (prefix.snapshot_interval < 64 || prefix.snapshot_interval % 64 != 0))
    return Status::InvalidArgument("prefix snapshot interval must be a positive multiple of 64 (a KDA chunk), got " +
                                   std::to_string(prefix.snapshot_interval));
  KL_ASSIGN_OR_RETURN(std::unique_ptr<Cache> cache, Cache::create(model.config(), model.backend(), options));
  std::unique_ptr<ModelRunner> r(new ModelRunner(model, std::move(cache)));
  if (prefix.mode == PrefixCaching::kOn) r->prefix_ = std::make_unique<PrefixCache>(*r->cache_, prefix.snapshot_interval);
  return r;
}

int64_t ModelRunner::max_model_len() const {
  const int64_t m = model_.config().max_position_embeddings;
  return m > 0 ? m : std::numeric_limits<int32_t>::max();
}

CacheUsage ModelRunner::usage() const {
  const CacheSizes& s = cache_->sizes();
  CacheUsage u{s.slots, cache_->free_slots(), s.pages, cache_->free_pages(), s.page_size};
  if (prefix_) {
    u.slots_free += prefix_->evictable_slots();
    u.pages_free += prefix_->evictable_pages();
  }
  return u;
}

Result<RunnerSeq> ModelRunner::open() {
  if (prefix_) prefix_->reclaim(0, 1);
  KL_ASSIGN_OR_RETURN(RunnerSeq seq, cache_->open());
  if (prefix_) history_[seq];
  return seq;
}

PrefixHit ModelRunner::lookup(std::span<const int32_t> tokens) const { return prefix_ ? prefix_->lookup(tokens) : PrefixHit{}; }

Result<RunnerSeq> ModelRunner::open_prefix(std::span<const int32_t> tokens, int64_t cached) {
  if (!prefix_) return StepRunner::open_prefix(tokens, cached);
  KL_ASSIGN_OR_RETURN(RunnerSeq seq, prefix_->open(tokens, cached));
  history_[seq].assign(tokens.begin(), tokens.begin() + cached);
  return seq;
}

void ModelRunner::close(RunnerSeq seq) {
  if (prefix_) {
    prefix_->on_close(seq);
    history_.erase(seq);
  }
  cache_->close(seq);
}

void ModelRunner::clear_prefix_cache() {
  if (prefix_) prefix_->clear();
}

// Every step asks for its last row (the batch always has one per sequence); the rows the engine
// did not ask for (prefill chunks that do not reach the end of the known tokens) are dropped.
Result<Tensor> ModelRunner::run(std::span<const RunnerStep> steps) {
  std::vector<SeqStep> plan;
  std::vector<std::vector<Snapshot>> snaps(steps.size());
  plan.reserve(steps.size());
  int64_t rows = 0;
  if (prefix_) {
    const int64_t ps = cache_->sizes().page_size;
    int64_t pages = 0;
    for (const RunnerStep& s : steps)
      if (cache_->sizes().pages > 0)
        pages += std::max<int64_t>(0, pages_for(cache_->tokens(s.seq) + static_cast<int64_t>(s.ids.size()), ps) -
                                          static_cast<int64_t>(cache_->pages(s.seq).size()));
    prefix_->reclaim(pages, 0);  // cached pages give way to the step (plan reports what still does not fit)
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    const RunnerStep& s = steps[i];
    if (prefix_) {
      std::vector<int32_t>& h = history_.at(s.seq);
      const int64_t done = static_cast<int64_t>(h.size());
      h.insert(h.end(), s.ids.begin(), s.ids.end());
      snaps[i] = prefix_->plan_snapshots(s.seq, h, done, static_cast<int64_t>(s.ids.size()), s.prompt);
    }
    plan.push_back(SeqStep{s.seq, s.ids, LogitsMode::kLast, snaps[i]});
    rows += s.want_logits ? 1 : 0;
  }
  auto run_forward = [&]() -> Result<Tensor> {
    KL_ASSIGN_OR_RETURN(Batch batch, cache_->plan(plan));
    return model_.forward(batch, *cache_);
  };
  Result<Tensor> device_logits = run_forward();
  if (!device_logits.ok()) {
    if (prefix_) prefix_->abandon();
    return device_logits.status();
  }
  const Tensor all = model_.backend().to_host(*device_logits);  // the step has finished
  if (prefix_)
    for (const RunnerStep& s : steps)  // steps past the prompt publish nothing
      if (cache_->tokens(s.seq) - static_cast<int64_t>(s.ids.size()) < s.prompt) prefix_->publish(s.seq, history_.at(s.seq), s.prompt);
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
