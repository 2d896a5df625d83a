#include "runtime/sequential_runner.h"

#include <cstring>
#include <limits>

namespace klinear {

Result<std::unique_ptr<SequentialRunner>> SequentialRunner::create(Model& model, const SequentialRunnerOptions& o) {
  if (o.max_sequences < 1) return Status::InvalidArgument("max sequences must be >= 1, got " + std::to_string(o.max_sequences));
  if (o.page_size < 1) return Status::InvalidArgument("page size must be >= 1, got " + std::to_string(o.page_size));
  if (o.cache_tokens < o.page_size)
    return Status::InvalidArgument("cache tokens must be >= the page size " + std::to_string(o.page_size) + ", got " +
                                   std::to_string(o.cache_tokens));
  return std::unique_ptr<SequentialRunner>(new SequentialRunner(model, o));
}

int64_t SequentialRunner::max_model_len() const {
  const int64_t m = model_.config().max_position_embeddings;
  return m > 0 ? m : std::numeric_limits<int32_t>::max();
}

CacheUsage SequentialRunner::usage() const {
  CacheUsage u;
  u.page_size = options_.page_size;
  u.slots_total = options_.max_sequences;
  u.slots_free = options_.max_sequences - static_cast<int64_t>(states_.size());
  u.pages_total = options_.cache_tokens / options_.page_size;
  u.pages_free = u.pages_total;
  for (const auto& [id, s] : states_) u.pages_free -= pages_for(s.tokens, options_.page_size);
  return u;
}

Result<RunnerSeq> SequentialRunner::open() {
  if (static_cast<int64_t>(states_.size()) >= options_.max_sequences)
    return Status::ResourceExhausted("all " + std::to_string(options_.max_sequences) + " sequence slots are in use");
  const RunnerSeq id = next_++;
  states_.emplace(id, model_.new_sequence());
  return id;
}

void SequentialRunner::close(RunnerSeq seq) {
  KL_CHECK(states_.erase(seq) == 1, "close of sequence " + std::to_string(seq) + " that is not open");
}

Result<Tensor> SequentialRunner::run(std::span<const RunnerStep> steps) {
  const int64_t vocab = vocab_size();
  int64_t rows = 0;
  for (const RunnerStep& s : steps) rows += s.want_logits ? 1 : 0;
  Tensor out = Tensor::empty(DType::kF32, {rows, vocab});
  int64_t row = 0;
  for (const RunnerStep& s : steps) {
    auto it = states_.find(s.seq);
    KL_CHECK(it != states_.end(), "run of sequence " + std::to_string(s.seq) + " that is not open");
    KL_ASSIGN_OR_RETURN(Tensor logits, model_.forward(s.ids, it->second, LogitsMode::kLast));
    if (s.want_logits) std::memcpy(out.f32() + row++ * vocab, logits.f32(), static_cast<size_t>(vocab) * sizeof(float));
  }
  return out;
}

}  // namespace klinear
