// Prefix state for prefix caching, on every backend row: a prompt prefilled in one step leaves
// KDA + conv snapshots at chunk boundaries and at its end (no smaller prefill chunk), and a fresh
// sequence that adopts a snapshot and the shared pages of the prompt's prefix continues exactly
// like the prompt itself; shared pages are never written, reference counts and slots return to
// where they started, pools are poisoned with NaN first so a read of an unwritten slot or page fails.
#include <gtest/gtest.h>

#include <cmath>

#include "backend_cases.h"
#include "model/model.h"
#include "model_cases.h"
#include "test_util.h"

namespace klinear {
namespace {

class PrefixState : public testing::BackendTest {};

TEST_P(PrefixState, SnapshotsAndSharedPagesContinueExactly) {
  const uint64_t seed = testing::fresh_seed();
  const testing::ScratchDir scratch;
  const Json cfg = testing::patched_preset("kimi-linear-tiny", Json::object());
  const std::vector<int32_t> ids = testing::random_ids(cfg, 180, seed);  // 150 prompt + 30 continuation
  testing::write_untied_checkpoint(cfg, scratch.str(), {ids}, seed);
  auto model = Model::load(scratch.str(), be());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  Model& m = **model;
  auto created = Cache::create(m.config(), be(), CacheOptions{6, 16, 64 << 20});
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  Cache& c = **created;
  for (int64_t l = 0; l < m.config().num_layers; ++l)
    for (const Tensor* pool : {&c.kda_states(l), &c.conv_states(l), &c.mla_pages(l)})
      if (pool->defined()) be().fill(*pool, std::numeric_limits<float>::quiet_NaN());
  const int64_t free_pages = c.free_pages();
  const std::span<const int32_t> all(ids);

  // The reference: the whole sequence, prompt then continuation.
  const SeqId ref = c.open().value();
  ASSERT_TRUE(m.forward_one(c, ref, all.first(150), LogitsMode::kAll).ok());
  auto ref_tail = m.forward_one(c, ref, all.subspan(150), LogitsMode::kAll);
  ASSERT_TRUE(ref_tail.ok());
  c.close(ref);

  // The prompt in one step, with snapshots after 64, 128 and all 150 tokens.
  const SeqId a = c.open().value();
  std::vector<Snapshot> snaps;
  for (int64_t after : {64, 128, 150}) snaps.push_back(Snapshot{after, c.take_slot().value()});
  {
    const SeqStep step{a, all.first(150), LogitsMode::kLast, snaps};
    ASSERT_TRUE(c.reserve(std::span<const SeqStep>(&step, 1)).ok());
    auto batch = c.plan(std::span<const SeqStep>(&step, 1));
    ASSERT_TRUE(batch.ok()) << batch.status().to_string();
    ASSERT_TRUE(m.forward(*batch, c).ok());
  }
  // A prefix cache keeps the prompt's pages; the prompt's own sequence goes away.
  const std::vector<int32_t> prompt_pages = c.pages(a);
  for (int32_t p : prompt_pages) c.retain_page(p);
  c.close(a);

  for (const Snapshot& snap : snaps) {
    SCOPED_TRACE("snapshot after " + std::to_string(snap.after));
    const SeqId b = c.open().value();
    ASSERT_TRUE(c.adopt(b, snap.after, snap.slot, prompt_pages).ok());
    for (size_t i = 0; i + 1 < c.pages(b).size(); ++i) EXPECT_EQ(c.pages(b)[i], prompt_pages[i]);
    // The rest of the prompt (if any) and the continuation, in two steps.
    if (snap.after < 150) {
      ASSERT_TRUE(m.forward_one(c, b, all.subspan(snap.after, 150 - snap.after), LogitsMode::kLast).ok());
    }
    auto tail = m.forward_one(c, b, all.subspan(150), LogitsMode::kAll);
    ASSERT_TRUE(tail.ok()) << tail.status().to_string();
    // BLAS rows differ by row count: a model's rows in another batch shape.
    EXPECT_TRUE(testing::all_close(*tail, *ref_tail, tol(testing::kModelRows), testing::ErrorShape::kAmplified));
    c.close(b);
  }
  // A snapshot at an allowed position only, into a taken slot only.
  const SeqId d = c.open().value();
  const Snapshot bad_pos{50, snaps[0].slot}, bad_slot{10, c.slot(d)};
  for (const Snapshot* bad : {&bad_pos, &bad_slot}) {
    const SeqStep step{d, all.first(10), LogitsMode::kLast, std::span<const Snapshot>(bad, 1)};
    ASSERT_TRUE(c.reserve(std::span<const SeqStep>(&step, 1)).ok());  // so only the snapshot is wrong
    EXPECT_FALSE(c.plan(std::span<const SeqStep>(&step, 1)).ok());
  }
  c.close(d);

  for (int32_t p : prompt_pages) c.release_page(p);
  for (const Snapshot& snap : snaps) c.release_slot(snap.slot);
  EXPECT_EQ(c.free_pages(), free_pages);
  EXPECT_EQ(c.free_slots(), c.sizes().slots);
}

KL_BACKEND_SUITE(PrefixState);

}  // namespace
}  // namespace klinear
