// The cache budget by memory fraction (vLLM's --gpu-memory-utilization) and the step profile that
// grows the step arena to its peak before the budget is measured.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "runtime/cache_budget.h"
#include "test_util.h"

namespace klinear {
namespace {

constexpr uint64_t MiB = 1 << 20;

TEST(CacheBudget, FractionLessWeightsAndArena) {
  struct Case {
    const char* name;
    MemoryFraction m;
    uint64_t budget;   // expected when ok
    StatusCode code;   // kOk: accepted
  };
  const std::vector<Case> cases{
      {"0.9 of 1000 MiB, 300 taken", {0.9, 1000 * MiB, 700 * MiB}, 600 * MiB, StatusCode::kOk},
      {"all of it", {1.0, 1000 * MiB, 700 * MiB}, 700 * MiB, StatusCode::kOk},
      {"nothing taken", {0.5, 1000 * MiB, 1000 * MiB}, 500 * MiB, StatusCode::kOk},
      {"free grew meanwhile (others freed memory)", {0.5, 1000 * MiB, 1100 * MiB}, 500 * MiB, StatusCode::kOk},
      {"weights take the whole share", {0.3, 1000 * MiB, 700 * MiB}, 0, StatusCode::kResourceExhausted},
      {"fraction 0", {0.0, 1000 * MiB, 700 * MiB}, 0, StatusCode::kInvalidArgument},
      {"fraction over 1", {1.5, 1000 * MiB, 700 * MiB}, 0, StatusCode::kInvalidArgument},
  };
  for (const Case& c : cases) {
    auto b = cache_budget(c.m);
    if (c.code == StatusCode::kOk) {
      ASSERT_TRUE(b.ok()) << c.name << ": " << b.status().to_string();
      EXPECT_EQ(*b, c.budget) << c.name;
    } else {
      ASSERT_FALSE(b.ok()) << c.name;
      EXPECT_EQ(b.status().code(), c.code) << c.name << ": " << b.status().to_string();
    }
  }
}

// The profile runs a full step: more tokens than sequences, fewer, one.
TEST(CacheBudget, ProfileStepRuns) {
  auto backend = make_backend(BackendOptions{}).value();
  auto model = Model::load(testing::fixture_path("kimi-linear-tiny/model"), *backend);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  for (auto [tokens, seqs] : {std::pair<int64_t, int64_t>{100, 8}, {3, 8}, {1, 1}})
    EXPECT_TRUE(profile_step(**model, tokens, seqs, 16).ok()) << tokens << " tokens over " << seqs;
}

}  // namespace
}  // namespace klinear
