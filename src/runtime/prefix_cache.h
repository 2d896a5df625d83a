// PrefixCache: prefix caching over a Cache (docs/DESIGN.md "Serving").
//
// MLA pages: a chain of full pages, each keyed by (its parent page, its page_size tokens), so the
// key of page i covers every token up to the end of page i and a match is exact (tokens are
// compared, hashes only pick the bucket). KDA snapshots: the recurrent + conv state after t tokens,
// in a slot of its own, keyed by (the page node holding position t's page start, the t % page_size
// tokens after it). A snapshot whose t is not a page multiple also needs the page holding
// positions [t - t % page_size, t): the chain's page when the chain reaches past t, otherwise the
// producing sequence's page. While the producer runs it keeps writing that page at positions
// >= t only, so positions below t are final once the step that wrote them finished: a hit reads
// them from the producer's live page (Cache::adopt copies a partial last page, it never shares
// it), and when the producer closes the cache retains the page.
//
// Only prompt tokens are published, and only after the step that wrote them succeeded (the
// runner calls publish after the forward). A lookup finds the deepest snapshot at or below what
// the pages cover; open() adopts it. Everything the cache holds is evictable, least recently used
// first (snapshots and chain leaves), so pools report held-by-cache-only pages and snapshot slots
// as free and eviction makes them so on demand. Eviction candidates are kept ordered by last use
// (one set of snapshots, one of leaf pages), so evicting an entry costs O(log n), not a walk.
//
// Thread-safety: none; the engine thread owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/cache.h"
#include "runtime/step_runner.h"

namespace klinear {

class PrefixCache {
 public:
  // `interval`: snapshot grid in tokens (a multiple of 64, >= 64). `cache` must outlive this.
  // `invariance` kOn: snapshots on multiples of 64 only (a prompt's end elsewhere is not kept).
  PrefixCache(Cache& cache, int64_t interval, BatchInvariance invariance = BatchInvariance::kOff);
  ~PrefixCache();

  // The deepest usable prefix of `tokens` that leaves at least one token to run.
  PrefixHit lookup(std::span<const int32_t> tokens) const;
  // Opens a sequence starting from lookup(tokens) (which must still find `cached` tokens).
  Result<SeqId> open(std::span<const int32_t> tokens, int64_t cached);

  // Snapshots a step of `seq` should take: positions in (done, done + n] (done = tokens already in
  // its state) on the grid or at `prompt`'s end, not above `prompt`, where the step allows
  // (a multiple of 64 from done, or its end) and not already cached. Takes their slots (evicting
  // other snapshots; a snapshot with no slot is skipped). `history` = all tokens of seq so far
  // plus the step's.
  std::vector<Snapshot> plan_snapshots(SeqId seq, std::span<const int32_t> history, int64_t done, int64_t n, int64_t prompt);
  // After a successful step: publishes the pending snapshots and the full prompt pages of seq.
  void publish(SeqId seq, std::span<const int32_t> history, int64_t prompt);
  // After a failed step: gives back the pending snapshot slots.
  void abandon();
  // Closes seq in the Cache (in place of Cache::close), first attaching its pages to its
  // snapshots that need one.
  void close(SeqId seq);

  // Frees cached items (LRU first) until `pages` pages and `slots` slots are free in the Cache, or
  // nothing evictable is left. Returns whether the goal was reached.
  bool reclaim(int64_t pages, int64_t slots);
  void clear();  // evicts everything

  // Pages / slots held by the cache alone (what eviction can return). O(1): the engine asks every
  // step, and a scan of the held pages cost milliseconds per step with ~100k pages cached.
  int64_t evictable_pages() const { return evictable_pages_; }
  int64_t evictable_slots() const { return published_snapshots_; }

 private:
  struct Node;
  struct Snap;
  struct Found;
  Found find(std::span<const int32_t> tokens) const;
  void evict_snap(Snap* s);
  void evict_node(Node* n);
  int32_t tail_page(const Snap& s) const;  // the page holding a partial snapshot's last positions, or -1
  // Keep the LRU sets in step with a node's leaf status / an entry's last use.
  void update_leaf(Node* n);
  void touch(Node* n, uint64_t used);
  void touch(Snap* s, uint64_t used);
  std::vector<Node*> chain(std::span<const int32_t> tokens) const;
  void hold_page(int32_t page);
  void drop_page(int32_t page);
  // Whether `page` is held by the cache alone (its references are all ours).
  bool evictable(int32_t page) const;
  // Runs `change` (which alters the references of `pages`, and of no other held page) keeping
  // evictable_pages_ exact.
  template <typename F>
  void recount(std::span<const int32_t> pages, F&& change);

  Cache& cache_;
  int64_t interval_, page_size_;
  BatchInvariance invariance_;
  bool paged_;
  std::unique_ptr<Node> root_;
  std::unordered_map<int32_t, int64_t> holds_;  // page -> references the prefix cache holds on it
  std::vector<std::unique_ptr<Snap>> pending_;  // written by the running step
  std::vector<Snap*> awaiting_;                 // published, their tail still the producer's live page
  std::set<std::pair<uint64_t, Snap*>> snap_lru_;  // published, unpinned snapshots by last use
  std::set<std::pair<uint64_t, Node*>> leaf_lru_;  // page nodes nothing builds on, by last use
  int64_t published_snapshots_ = 0;
  int64_t evictable_pages_ = 0;  // held pages whose every reference is in holds_
  uint64_t clock_ = 0;
};

}  // namespace klinear
