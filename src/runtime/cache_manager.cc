#include "runtime/cache_manager.h"

namespace klinear {

Result<std::unique_ptr<CacheManager>> CacheManager::create(const ModelConfig& config, Backend& backend,
                                                           const CacheOptions& options, const PrefixCacheOptions& prefix) {
  if (prefix.mode == PrefixCaching::kOn && (prefix.snapshot_interval < 64 || prefix.snapshot_interval % 64 != 0))
    return Status::InvalidArgument("prefix snapshot interval must be a positive multiple of 64 (a KDA chunk), got " +
                                   std::to_string(prefix.snapshot_interval));
  KL_ASSIGN_OR_RETURN(std::unique_ptr<Cache> cache, Cache::create(config, backend, options));
  std::unique_ptr<CacheManager> m(new CacheManager(std::move(cache)));
  if (prefix.mode == PrefixCaching::kOn) m->prefix_ = std::make_unique<PrefixCache>(*m->cache_, prefix.snapshot_interval, prefix.batch_invariance);
  return m;
}

CacheUsage CacheManager::usage() const {
  const CacheSizes& s = cache_->sizes();
  CacheUsage u{s.slots, cache_->free_slots(), s.pages, cache_->free_pages(), s.page_size};
  if (prefix_) {
    u.slots_free += prefix_->evictable_slots();
    u.pages_free += prefix_->evictable_pages();
  }
  return u;
}

Result<SeqId> CacheManager::open() {
  if (prefix_) prefix_->reclaim(0, 1);
  KL_ASSIGN_OR_RETURN(SeqId seq, cache_->open());
  if (prefix_) history_[seq];
  return seq;
}

PrefixHit CacheManager::lookup(std::span<const int32_t> tokens) const {
  return prefix_ ? prefix_->lookup(tokens) : PrefixHit{};
}

Result<SeqId> CacheManager::open_prefix(std::span<const int32_t> tokens, int64_t cached) {
  if (!prefix_) return Status::NotSupported("prefix caching is off (asked for " + std::to_string(cached) + " cached tokens)");
  KL_ASSIGN_OR_RETURN(SeqId seq, prefix_->open(tokens, cached));
  history_[seq].assign(tokens.begin(), tokens.begin() + cached);
  return seq;
}

void CacheManager::close(SeqId seq) {
  if (!prefix_) return cache_->close(seq);
  prefix_->close(seq);
  history_.erase(seq);
}

bool CacheManager::reserve(SeqId seq, int64_t positions) {
  const int64_t short_by = cache_->pages_short(seq, positions);
  if (short_by == 0) return true;
  if (prefix_) prefix_->reclaim(short_by, 0);  // cached pages give way to running sequences
  return cache_->reserve(seq, positions).ok();
}

void CacheManager::clear_prefix_cache() {
  if (prefix_) prefix_->clear();
}

std::vector<Snapshot> CacheManager::begin_step(const RunnerStep& step) {
  if (!prefix_) return {};
  std::vector<int32_t>& h = history_.at(step.seq);
  const int64_t done = static_cast<int64_t>(h.size());
  h.insert(h.end(), step.ids.begin(), step.ids.end());
  return prefix_->plan_snapshots(step.seq, h, done, static_cast<int64_t>(step.ids.size()), step.prompt);
}

void CacheManager::publish(std::span<const RunnerStep> steps) {
  if (!prefix_) return;
  for (const RunnerStep& s : steps)  // steps past the prompt publish nothing
    if (cache_->tokens(s.seq) - static_cast<int64_t>(s.ids.size()) < s.prompt) prefix_->publish(s.seq, history_.at(s.seq), s.prompt);
}

void CacheManager::abandon() {
  if (prefix_) prefix_->abandon();
}

}  // namespace klinear
