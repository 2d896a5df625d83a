#include "runtime/prefix_cache.h"

#include <algorithm>
#include <map>
#include <optional>

namespace klinear {

struct PrefixCache::Snap {
  Node* node = nullptr;  // the chain node after t / page_size pages (published snapshots)
  int64_t tokens = 0;    // t
  int64_t slot = -1;
  int32_t tail = -1;     // held page with positions [t - t % page_size, t), when needed and attached
  SeqId producer = -1;   // the open sequence whose page holds those positions, until it closes
  std::vector<int32_t> key;  // the t % page_size tokens after `node` (its key there)
  uint64_t used = 0;
  bool pinned = false;   // being adopted: not evictable
};

struct PrefixCache::Node {
  Node* parent = nullptr;
  std::vector<int32_t> tokens;  // this page's tokens (key under parent)
  int32_t page = -1;            // -1 for the root and in a model without MLA pages
  int64_t depth = 0;            // pages from the root
  uint64_t used = 0;
  std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
  std::map<std::vector<int32_t>, std::unique_ptr<Snap>> snaps;  // by the t % page_size tokens after this node
};

struct PrefixCache::Found {
  int64_t tokens = 0;
  Snap* snap = nullptr;
  std::vector<Node*> nodes;    // chain nodes used, root excluded
  std::vector<int32_t> pages;  // covering [0, tokens)
};

PrefixCache::PrefixCache(Cache& cache, int64_t interval, BatchInvariance invariance)
    : cache_(cache), interval_(interval), page_size_(cache.sizes().page_size), invariance_(invariance),
      paged_(cache.sizes().pages > 0), root_(std::make_unique<Node>()) {
  KL_CHECK(interval_ >= 64 && interval_ % 64 == 0, "prefix snapshot interval " + std::to_string(interval_) + " is not a multiple of 64");
}

PrefixCache::~PrefixCache() { clear(); }

bool PrefixCache::evictable(int32_t page) const {
  const auto it = holds_.find(page);
  return it != holds_.end() && cache_.page_refs(page) == it->second;
}

template <typename F>
void PrefixCache::recount(std::span<const int32_t> pages, F&& change) {
  for (int32_t p : pages) evictable_pages_ -= evictable(p) ? 1 : 0;
  change();
  for (int32_t p : pages) evictable_pages_ += evictable(p) ? 1 : 0;
}

std::vector<PrefixCache::Node*> PrefixCache::chain(std::span<const int32_t> tokens) const {
  std::vector<Node*> nodes{root_.get()};
  for (int64_t i = 0; (i + 1) * page_size_ <= static_cast<int64_t>(tokens.size()); ++i) {
    const auto page = tokens.subspan(static_cast<size_t>(i * page_size_), static_cast<size_t>(page_size_));
    auto it = nodes.back()->children.find(std::vector<int32_t>(page.begin(), page.end()));
    if (it == nodes.back()->children.end()) break;
    nodes.push_back(it->second.get());
  }
  return nodes;
}

PrefixCache::Found PrefixCache::find(std::span<const int32_t> tokens) const {
  Found f;
  const int64_t limit = static_cast<int64_t>(tokens.size()) - 1;  // leave a token to run
  if (limit < 1) return f;
  const std::vector<Node*> nodes = chain(tokens);
  const int64_t a = static_cast<int64_t>(nodes.size()) - 1;  // full pages matched
  for (int64_t j = a; j >= 0 && !f.snap; --j) {
    for (const auto& [rest, snap] : nodes[j]->snaps) {
      const int64_t t = snap->tokens;
      if (t > limit || (snap->tokens <= f.tokens && f.snap)) continue;
      if (!std::equal(rest.begin(), rest.end(), tokens.begin() + j * page_size_)) continue;
      if (paged_ && !rest.empty() && j == a && tail_page(*snap) < 0) continue;  // no page holds its partial page
      f.tokens = t;
      f.snap = snap.get();
    }
    if (!f.snap) continue;
    const int64_t partial = f.tokens % page_size_;
    f.nodes.assign(nodes.begin() + 1, nodes.begin() + 1 + j + (partial && j < a ? 1 : 0));
    if (paged_) {
      for (Node* n : f.nodes) f.pages.push_back(n->page);
      if (partial && j == a) f.pages.push_back(tail_page(*f.snap));
    }
  }
  return f;
}

PrefixHit PrefixCache::lookup(std::span<const int32_t> tokens) const {
  const Found f = find(tokens);
  PrefixHit h{f.tokens, 0};
  std::vector<int32_t> pages = f.pages;
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  for (int32_t p : pages)
    if (auto it = holds_.find(p); it != holds_.end() && cache_.page_refs(p) == it->second) ++h.pinned_pages;
  return h;
}

Result<SeqId> PrefixCache::open(std::span<const int32_t> tokens, int64_t cached) {
  const Found f = find(tokens);
  KL_CHECK(f.tokens == cached && f.snap, "prefix lookup changed between lookup and open: " + std::to_string(f.tokens) +
                                             " tokens, expected " + std::to_string(cached));
  // Pin what the hit uses so the evictions below leave it alone: the snapshot by flag, its pages
  // by a reference of their own.
  f.snap->pinned = true;
  snap_lru_.erase({f.snap->used, f.snap});
  std::vector<int32_t> distinct = f.pages;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  Result<SeqId> seq = SeqId{-1};
  Status adopted;
  recount(distinct, [&] {
    for (int32_t p : f.pages) cache_.retain_page(p);
    reclaim(paged_ && cached % page_size_ ? 1 : 0, 1);
    seq = cache_.open();
    adopted = seq.ok() ? cache_.adopt(*seq, cached, f.snap->slot, f.pages) : seq.status();
    for (int32_t p : f.pages) cache_.release_page(p);
  });
  f.snap->pinned = false;
  snap_lru_.insert({f.snap->used, f.snap});
  if (!adopted.ok()) {
    if (seq.ok()) cache_.close(*seq);
    return adopted;
  }
  touch(f.snap, ++clock_);
  for (Node* n : f.nodes) touch(n, clock_);
  return seq;
}

std::vector<Snapshot> PrefixCache::plan_snapshots(SeqId seq, std::span<const int32_t> history, int64_t done, int64_t n,
                                                  int64_t prompt) {
  std::vector<Snapshot> out;
  const int64_t end = std::min(done + n, prompt);
  std::vector<int64_t> points;
  for (int64_t g = (done / interval_ + 1) * interval_; g <= end; g += interval_) points.push_back(g);
  if (prompt > done && prompt <= done + n && (points.empty() || points.back() != prompt)) points.push_back(prompt);
  if (points.empty()) return out;  // every decode step past the prompt: no walk down its pages
  const std::vector<Node*> nodes = chain(history.first(static_cast<size_t>(end)));
  for (int64_t g : points) {
    if ((g - done) % 64 != 0 && g != done + n) continue;  // the scheduler's chunks avoid this
    if (invariance_ == BatchInvariance::kOn && g % 64 != 0) continue;
    const int64_t j = g / page_size_;
    if (j < static_cast<int64_t>(nodes.size())) {
      const auto rest = history.subspan(static_cast<size_t>(j * page_size_), static_cast<size_t>(g - j * page_size_));
      if (nodes[j]->snaps.count(std::vector<int32_t>(rest.begin(), rest.end()))) continue;  // already cached
    }
    if (cache_.free_slots() == 0 && !reclaim(0, 1)) break;
    auto s = std::make_unique<Snap>();
    s->tokens = g;
    s->slot = cache_.take_slot().value();
    s->producer = seq;
    out.push_back(Snapshot{g - done, s->slot});
    pending_.push_back(std::move(s));
  }
  return out;
}

void PrefixCache::publish(SeqId seq, std::span<const int32_t> history, int64_t prompt) {
  const int64_t full = std::min<int64_t>(prompt, cache_.tokens(seq)) / page_size_;
  std::vector<Node*> nodes{root_.get()};
  ++clock_;
  for (int64_t i = 0; i < full; ++i) {
    const auto page = history.subspan(static_cast<size_t>(i * page_size_), static_cast<size_t>(page_size_));
    std::unique_ptr<Node>& slot = nodes.back()->children[std::vector<int32_t>(page.begin(), page.end())];
    if (!slot) {
      slot = std::make_unique<Node>();
      slot->parent = nodes.back();
      slot->tokens.assign(page.begin(), page.end());
      slot->depth = i + 1;
      slot->used = clock_;
      if (paged_) {
        slot->page = cache_.pages(seq)[static_cast<size_t>(i)];
        hold_page(slot->page);
      }
      update_leaf(slot->parent);
      update_leaf(slot.get());
    }
    touch(slot.get(), clock_);
    nodes.push_back(slot.get());
  }
  for (auto it = pending_.begin(); it != pending_.end();) {
    if ((*it)->producer != seq) {
      ++it;
      continue;
    }
    std::unique_ptr<Snap> s = std::move(*it);
    it = pending_.erase(it);
    const int64_t j = s->tokens / page_size_;
    KL_CHECK(j < static_cast<int64_t>(nodes.size()), "snapshot after " + std::to_string(s->tokens) + " tokens beyond the published pages");
    const auto rest = history.subspan(static_cast<size_t>(j * page_size_), static_cast<size_t>(s->tokens - j * page_size_));
    std::unique_ptr<Snap>& dst = nodes[j]->snaps[std::vector<int32_t>(rest.begin(), rest.end())];
    if (dst) {  // another sequence of the same step published it first
      cache_.release_slot(s->slot);
      continue;
    }
    s->node = nodes[j];
    s->key.assign(rest.begin(), rest.end());
    s->used = clock_;
    if (!paged_ || rest.empty()) s->producer = -1;
    else awaiting_.push_back(s.get());
    snap_lru_.insert({s->used, s.get()});
    dst = std::move(s);
    update_leaf(nodes[j]);
    ++published_snapshots_;
  }
}

void PrefixCache::abandon() {
  for (auto& s : pending_) cache_.release_slot(s->slot);
  pending_.clear();
}

void PrefixCache::close(SeqId seq) {
  for (auto it = awaiting_.begin(); it != awaiting_.end();) {
    Snap* s = *it;
    if (s->producer != seq) {
      ++it;
      continue;
    }
    s->tail = cache_.pages(seq)[static_cast<size_t>(s->tokens / page_size_)];
    hold_page(s->tail);
    s->producer = -1;
    it = awaiting_.erase(it);
  }
  const std::vector<int32_t> pages = cache_.pages(seq);
  recount(pages, [&] { cache_.close(seq); });
}

void PrefixCache::hold_page(int32_t page) {
  recount(std::span<const int32_t>(&page, 1), [&] {
    cache_.retain_page(page);
    ++holds_[page];
  });
}

void PrefixCache::drop_page(int32_t page) {
  recount(std::span<const int32_t>(&page, 1), [&] {
    auto it = holds_.find(page);
    KL_CHECK(it != holds_.end(), "prefix cache drops page " + std::to_string(page) + " it does not hold");
    if (--it->second == 0) holds_.erase(it);
    cache_.release_page(page);
  });
}

int32_t PrefixCache::tail_page(const Snap& s) const {
  if (s.tail >= 0) return s.tail;
  if (s.producer < 0) return -1;
  return cache_.pages(s.producer)[static_cast<size_t>(s.tokens / page_size_)];
}

void PrefixCache::update_leaf(Node* n) {
  if (n->parent && n->children.empty() && n->snaps.empty()) leaf_lru_.insert({n->used, n});
  else leaf_lru_.erase({n->used, n});
}

void PrefixCache::touch(Node* n, uint64_t used) {
  const bool leaf = leaf_lru_.erase({n->used, n}) > 0;
  n->used = used;
  if (leaf) leaf_lru_.insert({used, n});
}

void PrefixCache::touch(Snap* s, uint64_t used) {
  const bool listed = snap_lru_.erase({s->used, s}) > 0;
  s->used = used;
  if (listed) snap_lru_.insert({used, s});
}

void PrefixCache::evict_snap(Snap* s) {
  cache_.release_slot(s->slot);
  if (s->tail >= 0) drop_page(s->tail);
  if (s->producer >= 0) awaiting_.erase(std::remove(awaiting_.begin(), awaiting_.end(), s), awaiting_.end());
  snap_lru_.erase({s->used, s});
  --published_snapshots_;
  Node* node = s->node;
  const size_t erased = node->snaps.erase(s->key);  // destroys s
  KL_CHECK(erased == 1, "evicted snapshot not under its node");
  update_leaf(node);
}

void PrefixCache::evict_node(Node* n) {
  KL_CHECK(n->children.empty() && n->snaps.empty() && n->parent, "evicting a page node that others build on");
  if (n->page >= 0) drop_page(n->page);
  leaf_lru_.erase({n->used, n});
  Node* parent = n->parent;
  parent->children.erase(n->tokens);  // destroys n
  update_leaf(parent);
}

// Least recently used first; a slot can only come from a snapshot. On a tie the snapshot goes.
bool PrefixCache::reclaim(int64_t pages, int64_t slots) {
  while (cache_.free_pages() < pages || cache_.free_slots() < slots) {
    const bool need_slot = cache_.free_slots() < slots;
    const auto snap = snap_lru_.begin();
    const auto leaf = leaf_lru_.begin();
    if (snap != snap_lru_.end() && (need_slot || leaf == leaf_lru_.end() || snap->first <= leaf->first)) evict_snap(snap->second);
    else if (!need_slot && leaf != leaf_lru_.end()) evict_node(leaf->second);
    else return false;
  }
  return true;
}

void PrefixCache::clear() {
  abandon();
  while (!root_->children.empty() || !root_->snaps.empty()) {
    Node* n = root_.get();
    while (!n->children.empty()) n = n->children.begin()->second.get();
    while (!n->snaps.empty()) evict_snap(n->snaps.begin()->second.get());
    if (n != root_.get()) evict_node(n);
  }
}

}  // namespace klinear
