// Sampler: greedy is argmax (lowest id on ties), top-k and top-p keep exactly their candidate
// sets, a seed reproduces a run, and frequencies follow softmax(logits / T).
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "runtime/sampler.h"
#include "test_util.h"

namespace klinear {
namespace {

TEST(Sampler, GreedyIsArgmaxLowestIdOnTies) {
  Sampler s(SamplingParams{});
  const std::vector<float> logits{0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(s.sample(logits), 1);
}

TEST(Sampler, TopKAndTopPKeepTheirSets) {
  // softmax at T=1 of these logits: ids 4, 2, 0 hold ~0.64, 0.24, 0.09 of the mass.
  const std::vector<float> logits{1.0f, -2.0f, 2.0f, -3.0f, 3.0f, -1.0f};
  const uint64_t seed = testing::fresh_seed();
  Sampler top_k(SamplingParams{1.0f, 2, 1.0f, seed});
  Sampler top_p(SamplingParams{1.0f, 0, 0.85f, seed});
  std::set<int32_t> seen_k, seen_p;
  for (int i = 0; i < 2000; ++i) {
    seen_k.insert(top_k.sample(logits));
    seen_p.insert(top_p.sample(logits));
  }
  EXPECT_EQ(seen_k, (std::set<int32_t>{2, 4}));
  EXPECT_EQ(seen_p, (std::set<int32_t>{2, 4}));  // 0.64 < 0.85 <= 0.64 + 0.24
}

// A flat distribution whose nucleus is larger than the first sorted prefix (256 ids).
TEST(Sampler, TopPBeyondTheFirstSortedPrefix) {
  const std::vector<float> logits(2000, 0.5f);
  Sampler s(SamplingParams{1.0f, 0, 0.5f, testing::fresh_seed()});
  int32_t max_id = 0;
  for (int i = 0; i < 3000; ++i) {
    const int32_t x = s.sample(logits);
    ASSERT_LT(x, 1000);  // ties keep the lowest ids: the nucleus is ids 0..999
    max_id = std::max(max_id, x);
  }
  EXPECT_GT(max_id, 900);
}

TEST(Sampler, SeedReproducesAndFrequenciesFollowSoftmax) {
  const std::vector<float> logits{0.0f, 1.0f, 2.0f};
  const float t = 2.0f;
  const uint64_t seed = testing::fresh_seed();
  Sampler a(SamplingParams{t, 0, 1.0f, seed}), b(SamplingParams{t, 0, 1.0f, seed});
  std::map<int32_t, int> count;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const int32_t x = a.sample(logits);
    ASSERT_EQ(x, b.sample(logits));
    ++count[x];
  }
  double z = 0;
  for (float l : logits) z += std::exp(l / t);
  for (int id = 0; id < 3; ++id) EXPECT_NEAR(count[id] / double(n), std::exp(logits[id] / t) / z, 0.02) << id;
}

TEST(Sampler, RejectsBadParameters) {
  EXPECT_FALSE(validate_sampling({-1.0f, 0, 1.0f, 0}).ok());
  EXPECT_FALSE(validate_sampling({1.0f, -1, 1.0f, 0}).ok());
  EXPECT_FALSE(validate_sampling({1.0f, 0, 0.0f, 0}).ok());
  EXPECT_FALSE(validate_sampling({1.0f, 0, 1.5f, 0}).ok());
  EXPECT_TRUE(validate_sampling({0.7f, 50, 0.9f, 3}).ok());
}

}  // namespace
}  // namespace klinear
