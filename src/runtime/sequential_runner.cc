#include "runtime/sequential_runner.h"

#include <algorithm>
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

Result<CacheSizing> size_cache(const ModelConfig& c, uint64_t memory_bytes, int64_t max_sequences, int64_t page_size) {
  CacheSizing r;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (c.mixer(l) == Mixer::kKda)
      r.bytes_per_slot += static_cast<uint64_t>(c.kda_heads * c.kda_head_dim * c.kda_head_dim + (c.conv_kernel - 1) * 3 * c.kda_proj()) * 4;
    else
      r.bytes_per_token += static_cast<uint64_t>(c.kv_lora_rank + c.qk_rope_dim) * 4;
  }
  if (max_sequences < 1 || page_size < 1)
    return Status::InvalidArgument("max sequences and page size must be >= 1, got " + std::to_string(max_sequences) + " and " +
                                   std::to_string(page_size));
  const uint64_t slots = r.bytes_per_slot * static_cast<uint64_t>(max_sequences);
  const uint64_t page = std::max<uint64_t>(r.bytes_per_token, 1) * static_cast<uint64_t>(page_size);
  if (slots + page > memory_bytes)
    return Status::InvalidArgument("cache memory " + std::to_string(memory_bytes) + " bytes is too small: " +
                                   std::to_string(max_sequences) + " state slots take " + std::to_string(slots) +
                                   " bytes and one page of " + std::to_string(page_size) + " tokens " + std::to_string(page));
  r.options.max_sequences = max_sequences;
  r.options.page_size = page_size;
  r.options.cache_tokens = static_cast<int64_t>((memory_bytes - slots) / page) * page_size;
  return r;
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
