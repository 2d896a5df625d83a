// CacheManager: the one owner of a Cache's slots and pages while serving. The scheduler calls it
// while it schedules (runtime/scheduler.h, through StepRunner): a running sequence's next chunk
// gets its pages from reserve() or the scheduler preempts; an admitted one is opened (from a
// cached prefix when lookup finds one) and reserved the same way. So by the time a step runs,
// every page it writes is held, and Cache::plan only lays the step out.
//
// With prefix caching on, prompt pages and KDA snapshots stay cached after their sequences
// (runtime/prefix_cache.h) and count as free: reserve() and open() evict them, least recently used
// first, when a sequence needs the room. The manager also keeps each open sequence's tokens (what
// the prefix cache keys by) and takes the snapshots a step should write.
//
// Thread-safety: none; the engine thread owns it.
#pragma once

#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/cache.h"
#include "runtime/prefix_cache.h"
#include "runtime/step_runner.h"

namespace klinear {

enum class PrefixCaching { kOff, kOn };

struct PrefixCacheOptions {
  PrefixCaching mode = PrefixCaching::kOn;
  int64_t snapshot_interval = 256;  // tokens between KDA snapshots, a multiple of 64
  // kOn: no snapshot at a prompt's end off the 64-token grid (a sequence resumed there would chunk
  // its KDA rows from another origin than one prefilled from the start).
  BatchInvariance batch_invariance = BatchInvariance::kOff;
};

class CacheManager {
 public:
  // Creates the cache on `backend`; errors are the Cache's (a budget too small for max_sequences
  // slots and one page) or a bad snapshot interval.
  static Result<std::unique_ptr<CacheManager>> create(const ModelConfig& config, Backend& backend,
                                                      const CacheOptions& options, const PrefixCacheOptions& prefix);

  Cache& cache() { return *cache_; }
  const Cache& cache() const { return *cache_; }
  // Capacity now; what the prefix cache alone holds counts as free.
  CacheUsage usage() const;

  Result<SeqId> open();
  PrefixHit lookup(std::span<const int32_t> tokens) const;
  Result<SeqId> open_prefix(std::span<const int32_t> tokens, int64_t cached);
  void close(SeqId seq);
  // Makes `seq` hold the pages of its first `positions` positions, evicting cached prefixes as
  // needed. False, taking nothing, when they do not fit.
  bool reserve(SeqId seq, int64_t positions);
  void clear_prefix_cache();  // evicts everything the prefix cache holds (no-op when off)

  // A step's prefix-cache work: before it, record each sequence's new tokens and take the
  // snapshots it should write; after it, publish (success) or give the snapshot slots back.
  std::vector<Snapshot> begin_step(const RunnerStep& step);
  void publish(std::span<const RunnerStep> steps);
  void abandon();

 private:
  explicit CacheManager(std::unique_ptr<Cache> cache) : cache_(std::move(cache)) {}

  std::unique_ptr<Cache> cache_;
  std::unique_ptr<PrefixCache> prefix_;                          // null when off
  std::unordered_map<SeqId, std::vector<int32_t>> history_;     // every token of each open sequence (prefix on)
};

}  // namespace klinear
