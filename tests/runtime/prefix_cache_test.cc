// PrefixCache as a unit over a Cache, with no forward (Cache::plan and advance stand in for a
// step): published prompts hit at their end snapshot; eviction takes the least recently used
// snapshot first and a hit (open) makes its entry the most recent; what is evicted returns to the
// pools, and clear() leaves them as they started.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "io/presets.h"
#include "model/cache.h"
#include "runtime/prefix_cache.h"

namespace klinear {
namespace {

constexpr int64_t kPrompt = 64;  // one snapshot-grid step and four pages of 16

TEST(PrefixCache, EvictsLeastRecentlyUsedFirst) {
  const ModelConfig config = parse_model_config(preset_config("kimi-linear-tiny").value(), "kimi-linear-tiny").value();
  auto backend = make_backend(BackendOptions{}).value();
  auto cache = Cache::create(config, *backend, CacheOptions{8, 16, 16 << 20}).value();
  const int64_t slots = cache->free_slots(), pages = cache->free_pages();
  PrefixCache prefix(*cache, kPrompt);

  // Prompts a, b, c (distinct from their first id), each followed by one more token to look up.
  auto prompt = [](int32_t first) {
    std::vector<int32_t> t(kPrompt + 1);
    std::iota(t.begin(), t.end(), first);
    return t;
  };
  const std::vector<int32_t> a = prompt(1), b = prompt(101), c = prompt(201);
  auto publish = [&](const std::vector<int32_t>& tokens) {
    const std::span<const int32_t> p(tokens.data(), kPrompt);
    const SeqId seq = cache->open().value();
    const std::vector<Snapshot> snaps = prefix.plan_snapshots(seq, p, 0, kPrompt, kPrompt);
    ASSERT_EQ(snaps.size(), 1u);
    const SeqStep step{seq, p, LogitsMode::kLast, snaps};
    ASSERT_TRUE(cache->reserve({&step, 1}).ok());
    const Batch batch = cache->plan({&step, 1}).value();
    cache->advance(batch);
    prefix.publish(seq, p, kPrompt);
    prefix.close(seq);
  };
  auto hit = [&](const std::vector<int32_t>& tokens) { return prefix.lookup(tokens).tokens; };
  publish(a);
  publish(b);
  publish(c);
  EXPECT_EQ(hit(a), kPrompt);
  EXPECT_EQ(hit(b), kPrompt);
  EXPECT_EQ(hit(c), kPrompt);
  EXPECT_EQ(prefix.evictable_slots(), 3);
  EXPECT_EQ(prefix.evictable_pages(), 3 * kPrompt / 16);

  // Using a's prefix makes it the most recent: b, then c, go first.
  const SeqId s = prefix.open(a, kPrompt).value();
  EXPECT_EQ(cache->tokens(s), kPrompt);
  prefix.close(s);
  ASSERT_TRUE(prefix.reclaim(0, cache->free_slots() + 1));
  EXPECT_EQ(hit(b), 0) << "b was the least recently used snapshot";
  EXPECT_EQ(hit(a), kPrompt);
  EXPECT_EQ(hit(c), kPrompt);
  ASSERT_TRUE(prefix.reclaim(0, cache->free_slots() + 1));
  EXPECT_EQ(hit(c), 0);
  EXPECT_EQ(hit(a), kPrompt);
  EXPECT_EQ(prefix.evictable_slots(), 1);

  // Pages: asking for every page evicts all the cached ones (nothing else holds them).
  ASSERT_TRUE(prefix.reclaim(pages, 0));
  EXPECT_EQ(prefix.evictable_pages(), 0);
  EXPECT_EQ(hit(a), 0);
  EXPECT_FALSE(prefix.reclaim(pages + 1, 0)) << "more pages than the pool has cannot be reclaimed";

  prefix.clear();
  EXPECT_EQ(prefix.evictable_slots(), 0);
  EXPECT_EQ(cache->free_slots(), slots);
  EXPECT_EQ(cache->free_pages(), pages);
}

}  // namespace
}  // namespace klinear
