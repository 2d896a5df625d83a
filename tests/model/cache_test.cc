// Cache as a unit (CPU pools of the tiny Kimi Linear fixture, 4-position pages): handles are
// recycled without a stale one ever reaching the new sequence, reserve takes pages all or none,
// and plan only lays a step out: it takes no page and refuses positions nobody reserved.
#include <gtest/gtest.h>

#include <vector>

#include "io/config.h"
#include "model/cache.h"
#include "test_util.h"

namespace klinear {
namespace {

struct Pools {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Cache> cache;
};

Pools make_pools(int64_t slots, uint64_t pages) {
  Pools p;
  p.be = make_backend(BackendOptions{}).value();
  const ModelConfig config = load_model_config(testing::fixture_path("kimi-linear-tiny/model")).value();
  const CacheSizes unit = Cache::create(config, *p.be, CacheOptions{1, 4, 0}).value()->sizes();
  EXPECT_GT(unit.bytes_per_page, 0u) << "the fixture has MLA layers";
  p.cache = Cache::create(config, *p.be, CacheOptions{slots, 4, slots * unit.bytes_per_slot + pages * unit.bytes_per_page})
                .value();
  EXPECT_EQ(p.cache->sizes().pages, static_cast<int64_t>(pages));
  return p;
}

TEST(Cache, HandlesAreRecycledAndAStaleOneIsNotOpen) {
  Pools p = make_pools(2, 8);
  Cache& c = *p.cache;
  const SeqId a = c.open().value();
  c.close(a);
  const SeqId b = c.open().value();
  EXPECT_NE(a, b) << "a recycled record gets a new handle";
  EXPECT_EQ(a & 0xffffffff, b & 0xffffffff) << "the closed record is reused";
  EXPECT_FALSE(c.is_open(a));
  EXPECT_TRUE(c.is_open(b));
  const std::vector<int32_t> ids{1, 2, 3};
  const SeqStep stale{a, ids};
  const Status s = c.reserve(std::span<const SeqStep>(&stale, 1));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_EQ(c.free_pages(), 8) << "a stale handle took nothing";
  const SeqId d = c.open().value();
  EXPECT_NE(d & 0xffffffff, b & 0xffffffff) << "an open record is never handed out twice";
}

TEST(Cache, ReserveIsAllOrNoneAndPlanTakesNoPages) {
  Pools p = make_pools(2, 5);
  Cache& c = *p.cache;
  const SeqId a = c.open().value(), b = c.open().value();
  const std::vector<int32_t> ten(10, 1), nine(9, 2);
  const std::vector<SeqStep> both{{a, ten}, {b, nine}};  // 3 + 3 pages of 4 positions, 5 free
  Result<Batch> early = c.plan(both);
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(early.status().message().find("reserve"), std::string::npos) << early.status().to_string();
  const Status full = c.reserve(both);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted) << full.to_string();
  EXPECT_EQ(c.free_pages(), 5) << "a reserve that does not fit takes nothing";
  EXPECT_TRUE(c.pages(a).empty());

  ASSERT_TRUE(c.reserve(a, 10).ok());
  EXPECT_EQ(c.free_pages(), 2);
  EXPECT_EQ(c.pages_short(a, 12), 0);
  EXPECT_EQ(c.pages_short(a, 13), 1);
  Result<Batch> one = c.plan(std::vector<SeqStep>{{a, ten}});
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_EQ(c.free_pages(), 2) << "plan takes no pages";
  EXPECT_EQ(one->layout.max_pages, 3);
  c.close(a);
  c.close(b);
  EXPECT_EQ(c.free_pages(), 5);
}

}  // namespace
}  // namespace klinear
