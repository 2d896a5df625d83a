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
  if (!prefix_) return cache_->close(seq);
  prefix_->close(seq);
  history_.erase(seq);
}

void ModelRunner::clear_prefix_cache() {
  if (prefix_) prefix_->clear();
}

Result<Tensor> ModelRunner::run(std::span<const RunnerStep> steps) {
  for (const RunnerStep& s : steps) KL_CHECK(!s.draw, "run: a step asks for a draw (use run_sampled)");
  KL_ASSIGN_OR_RETURN(SampledStep out, run_sampled(steps));
  return out.logits;
}

// Every step asks for its last row (the batch always has one per sequence); the rows the engine
// did not ask for (prefill chunks that do not reach the end of the known tokens) are dropped.
// Drawn rows stay on the device: only their ids come back, in one copy at the end of the step,
// and only the other wanted rows' logits are copied.
Result<SampledStep> ModelRunner::run_sampled(std::span<const RunnerStep> steps) {
  std::vector<SeqStep> plan;
  std::vector<std::vector<Snapshot>> snaps(steps.size());
  plan.reserve(steps.size());
  int64_t rows = 0;
  bool any_draw = false;
  std::vector<SampleRow> draws;  // one per step (greedy where none is asked)
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
    const bool draw = s.want_logits && s.draw;
    rows += s.want_logits && !draw ? 1 : 0;
    any_draw = any_draw || draw;
    draws.push_back(draw ? *s.draw : SampleRow{});
  }
  auto run_step = [&]() -> Result<StepOutput> {
    KL_ASSIGN_OR_RETURN(Batch batch, cache_->plan(plan));
    return model_.step(batch, *cache_, any_draw ? std::span<const SampleRow>(draws) : std::span<const SampleRow>());
  };
  Result<StepOutput> step = run_step();
  if (!step.ok()) {
    if (prefix_) prefix_->abandon();
    return step.status();
  }
  Backend& be = model_.backend();
  const int64_t vocab = vocab_size();
  KL_CHECK(step->logits.dim(0) == static_cast<int64_t>(steps.size()) && step->logits.dim(1) == vocab,
           "forward returned logits " + shape_to_string(step->logits.shape()) + " for " + std::to_string(steps.size()) +
               " steps");
  SampledStep out;
  out.logits = Tensor::empty(DType::kF32, {rows, vocab});
  // Runs of consecutive wanted host rows, one copy each.
  int64_t row = 0;
  for (size_t i = 0; i < steps.size();) {
    auto host_row = [&](size_t j) { return steps[j].want_logits && !steps[j].draw; };
    if (!host_row(i)) {
      ++i;
      continue;
    }
    size_t e = i;
    while (e < steps.size() && host_row(e)) ++e;
    const Tensor part = be.to_host(step->logits.rows(static_cast<int64_t>(i), static_cast<int64_t>(e)));
    std::memcpy(out.logits.f32() + row * vocab, part.f32(), part.nbytes());
    row += static_cast<int64_t>(e - i);
    i = e;
  }
  if (any_draw) {
    const Tensor ids = be.to_host(step->ids);  // the step has finished
    for (size_t i = 0; i < steps.size(); ++i)
      if (steps[i].want_logits && steps[i].draw) out.ids.push_back(ids.data_as<const int32_t>()[i]);
  }
  if (prefix_)
    for (const RunnerStep& s : steps)  // steps past the prompt publish nothing
      if (cache_->tokens(s.seq) - static_cast<int64_t>(s.ids.size()) < s.prompt) prefix_->publish(s.seq, history_.at(s.seq), s.prompt);
  return out;
}

}  // namespace klinear
