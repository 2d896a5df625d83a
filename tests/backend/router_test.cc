// CpuBackend::moe_route (MODEL.md 3.3): biased selection, unbiased renormalised weights, grouped top-k.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "backend_cases.h"
#include "test_util.h"

namespace klinear {
namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

struct Routed {
  std::vector<std::map<int, float>> tokens;  // per token: expert index -> weight
};

// Runs moe_route on `logits` [N, E] and returns each token's {index -> weight}.
Routed route(testing::BackendTest& t, const std::vector<std::vector<float>>& logits, const std::vector<float>& bias,
             const RouteParams& p) {
  const int64_t n = static_cast<int64_t>(logits.size()), e = static_cast<int64_t>(bias.size());
  std::vector<float> flat;
  for (const auto& row : logits) flat.insert(flat.end(), row.begin(), row.end());
  Tensor idx = t.poisoned({n, p.top_k}, DType::kI32), w = t.poisoned({n, p.top_k}, DType::kF32);
  t.be().moe_route(t.dev(Tensor::from_f32({n, e}, flat), DType::kF32), t.dev(Tensor::from_f32({e}, bias), DType::kF32),
                   p, idx, w);
  idx = t.host(idx);
  w = t.host(w);
  Routed out;
  for (int64_t t = 0; t < n; ++t) {
    std::map<int, float> m;
    for (int k = 0; k < p.top_k; ++k) {
      const int i = idx.data_as<int32_t>()[t * p.top_k + k];
      EXPECT_TRUE(i >= 0 && i < e) << "index " << i;
      EXPECT_TRUE(m.emplace(i, w.f32()[t * p.top_k + k]).second) << "expert " << i << " chosen twice";
    }
    out.tokens.push_back(std::move(m));
  }
  return out;
}

std::set<int> keys(const std::map<int, float>& m) {
  std::set<int> s;
  for (const auto& [k, v] : m) s.insert(k);
  return s;
}

// The MODEL.md 3.3 weights of the chosen experts: σ(logit), renormalised with +1e-20 when asked, times scale.
std::map<int, double> expected_weights(const std::vector<float>& logits, const std::set<int>& chosen, bool renorm,
                                       double scale) {
  double sum = 0;
  for (int i : chosen) sum += sigmoid(logits[i]);
  std::map<int, double> out;
  for (int i : chosen) {
    double w = sigmoid(logits[i]);
    if (renorm && chosen.size() > 1) w /= (sum + 1e-20);
    out[i] = w * scale;
  }
  return out;
}

void expect_weights(const std::map<int, float>& got, const std::map<int, double>& want) {
  ASSERT_EQ(keys(got).size(), want.size());
  for (const auto& [i, w] : want) {
    ASSERT_TRUE(got.count(i)) << "expert " << i << " not chosen";
    EXPECT_NEAR(got.at(i), w, 1e-6 * std::max(1.0, std::fabs(w))) << "expert " << i;
  }
}

constexpr float kScale = 2.446f;

class RouterTest : public testing::BackendTest {};

TEST_P(RouterTest, BiasChangesSelectionNotWeights) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f};
  const RouteParams p{2, 1, 1, true, kScale};
  const Routed plain = route(*this, {logits}, {0, 0, 0, 0}, p);
  EXPECT_EQ(keys(plain.tokens[0]), (std::set<int>{0, 1}));
  expect_weights(plain.tokens[0], expected_weights(logits, {0, 1}, true, kScale));

  // σ(-1) + 1 = 1.27 now beats σ(1) = 0.73, but the weight of expert 3 is still σ(-1), renormalised.
  const Routed biased = route(*this, {logits}, {0, 0, 0, 1.0f}, p);
  EXPECT_EQ(keys(biased.tokens[0]), (std::set<int>{0, 3}));
  expect_weights(biased.tokens[0], expected_weights(logits, {0, 3}, true, kScale));
  EXPECT_LT(biased.tokens[0].at(3), biased.tokens[0].at(0));  // unbiased: σ(-1) < σ(2)
}

TEST_P(RouterTest, RenormalizeOff) {
  const std::vector<float> logits = {0.3f, -0.2f, 1.7f, 0.9f, -2.5f};
  const Routed r = route(*this, {logits}, {0, 0, 0, 0, 0}, RouteParams{3, 1, 1, false, kScale});
  EXPECT_EQ(keys(r.tokens[0]), (std::set<int>{0, 2, 3}));
  expect_weights(r.tokens[0], expected_weights(logits, {0, 2, 3}, false, kScale));
  EXPECT_NEAR(r.tokens[0].at(2), sigmoid(1.7) * kScale, 1e-6);
}

TEST_P(RouterTest, TopOneIsNotRenormalized) {
  const std::vector<float> logits = {0.3f, -0.2f, 1.7f, 0.9f};
  const Routed r = route(*this, {logits}, {0, 0, 0, 0}, RouteParams{1, 1, 1, true, kScale});
  ASSERT_EQ(keys(r.tokens[0]), (std::set<int>{2}));
  // Renormalising a single weight would give exactly the scale.
  EXPECT_NEAR(r.tokens[0].at(2), sigmoid(1.7) * kScale, 1e-6);
  EXPECT_LT(r.tokens[0].at(2), kScale * 0.9f);
}

TEST_P(RouterTest, RenormalizedWeightsSumToScale) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<std::vector<float>> logits(6, std::vector<float>(16));
  for (auto& row : logits)
    for (float& x : row) x = d(rng);
  std::vector<float> bias(16);
  for (float& b : bias) b = 0.1f * d(rng);
  const Routed r = route(*this, logits, bias, RouteParams{4, 1, 1, true, kScale});
  ASSERT_EQ(r.tokens.size(), 6u);
  for (const auto& tok : r.tokens) {
    double sum = 0;
    for (const auto& [i, w] : tok) sum += w;
    EXPECT_NEAR(sum, kScale, 1e-5);
  }
}

// 4 groups of 4 experts, keep 2 groups. Group scores (sum of top-2 σ):
//   g0 {5,-5,-5,-5}: 0.993+0.007 = 1.00   (holds the single best expert)
//   g1 {2,1.9,-3,-3.1}: 1.75
//   g2 {1.5,1.4,-2,-2.1}: 1.62
//   g3 {0.6,0.5,0.4,0.3}: 1.27 (but the largest sum over all four members, 2.44)
// Top-2 groups keep g1, g2; a max-based rule would keep g0, g1; an all-members sum g3, g1.
const std::vector<float> kGroupedLogits = {5.0f, -5.0f, -5.0f, -5.0f, 2.0f, 1.9f, -3.0f, -3.1f,
                                           1.5f, 1.4f,  -2.0f, -2.1f, 0.6f, 0.5f, 0.4f,  0.3f};

TEST_P(RouterTest, GroupedSelectionDropsGroupsBySumOfTopTwo) {
  const RouteParams p{4, 4, 2, true, kScale};
  const Routed r = route(*this, {kGroupedLogits}, std::vector<float>(16, 0.0f), p);
  EXPECT_EQ(keys(r.tokens[0]), (std::set<int>{4, 5, 8, 9}));
  EXPECT_EQ(r.tokens[0].count(0), 0u) << "expert 0 has the highest score but its group is dropped";
  expect_weights(r.tokens[0], expected_weights(kGroupedLogits, {4, 5, 8, 9}, true, kScale));

  // Without grouping, expert 0 wins.
  const Routed flat = route(*this, {kGroupedLogits}, std::vector<float>(16, 0.0f), RouteParams{4, 1, 1, true, kScale});
  EXPECT_EQ(keys(flat.tokens[0]), (std::set<int>{0, 4, 5, 8}));
  // num_groups == topk_group keeps every group: no change.
  const Routed all = route(*this, {kGroupedLogits}, std::vector<float>(16, 0.0f), RouteParams{4, 4, 4, true, kScale});
  EXPECT_EQ(keys(all.tokens[0]), (std::set<int>{0, 4, 5, 8}));
}

TEST_P(RouterTest, GroupScoresUseBiasedScores) {
  // +1 on experts 12, 13 lifts g3 to 1.65 + 1.62 = 3.27: kept with g1; g2 is dropped.
  std::vector<float> bias(16, 0.0f);
  bias[12] = bias[13] = 1.0f;
  const Routed r = route(*this, {kGroupedLogits}, bias, RouteParams{4, 4, 2, true, kScale});
  EXPECT_EQ(keys(r.tokens[0]), (std::set<int>{4, 5, 12, 13}));
  expect_weights(r.tokens[0], expected_weights(kGroupedLogits, {4, 5, 12, 13}, true, kScale));
}

TEST_P(RouterTest, GroupedTopOneAndSeveralTokens) {
  // Token 0: the grouped case above with k = 1 (expert 4, the best of the kept groups).
  // Token 1: the same logits rotated by one group: g0 now holds {0.6,..}, g1 {5,-5,..}, g2 {2,1.9,..}, g3 {1.5,..}.
  std::vector<float> rotated(16);
  for (int i = 0; i < 16; ++i) rotated[(i + 4) % 16] = kGroupedLogits[i];
  // Rotation: kGroupedLogits group g moves to group (g+1)%4, so g1 -> 2, g2 -> 3.
  const Routed r = route(*this, {kGroupedLogits, rotated}, std::vector<float>(16, 0.0f), RouteParams{1, 4, 2, true, kScale});
  ASSERT_EQ(r.tokens.size(), 2u);
  EXPECT_EQ(keys(r.tokens[0]), (std::set<int>{4}));
  EXPECT_NEAR(r.tokens[0].at(4), sigmoid(2.0) * kScale, 1e-6);
  EXPECT_EQ(keys(r.tokens[1]), (std::set<int>{8}));
  EXPECT_NEAR(r.tokens[1].at(8), sigmoid(2.0) * kScale, 1e-6);
}

// A plain MODEL.md 3.3 reference for random cases (ties have probability ~0 with continuous logits).
std::set<int> reference_selection(const std::vector<float>& logits, const std::vector<float>& bias, int k, int groups,
                                  int keep) {
  const int e = static_cast<int>(logits.size()), per = e / groups;
  std::vector<double> s(e);
  for (int i = 0; i < e; ++i) s[i] = sigmoid(logits[i]) + bias[i];
  if (groups > keep) {
    std::vector<std::pair<double, int>> gs;
    for (int g = 0; g < groups; ++g) {
      std::vector<double> m(s.begin() + g * per, s.begin() + (g + 1) * per);
      std::sort(m.rbegin(), m.rend());
      gs.emplace_back(m[0] + m[1], g);
    }
    std::sort(gs.rbegin(), gs.rend());
    std::set<int> kept;
    for (int i = 0; i < keep; ++i) kept.insert(gs[i].second);
    for (int i = 0; i < e; ++i)
      if (!kept.count(i / per)) s[i] = -INFINITY;
  }
  std::vector<int> order(e);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return s[a] > s[b]; });
  return std::set<int>(order.begin(), order.begin() + k);
}

TEST_P(RouterTest, RandomGroupedMatchesReference) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::normal_distribution<float> d(0.0f, 1.5f);
  const int n = 32, e = 16;
  std::vector<std::vector<float>> logits(n, std::vector<float>(e));
  for (auto& row : logits)
    for (float& x : row) x = d(rng);
  std::vector<float> bias(e);
  for (float& b : bias) b = 0.2f * d(rng);
  const Routed r = route(*this, logits, bias, RouteParams{4, 4, 2, true, kScale});
  for (int t = 0; t < n; ++t) {
    const std::set<int> want = reference_selection(logits[t], bias, 4, 4, 2);
    EXPECT_EQ(keys(r.tokens[t]), want) << "token " << t;
    if (keys(r.tokens[t]) == want) {
      expect_weights(r.tokens[t], expected_weights(logits[t], want, true, kScale));
    }
  }
}

// Under expert parallelism a rank routes over every expert and keeps the picks of its block: the
// index within the block, −1 for another rank's expert, the weights as the whole route's.
TEST_P(RouterTest, ExpertParallelRankKeepsItsBlock) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::normal_distribution<float> d(0.0f, 1.5f);
  const int n = 24, e = 16, k = 4, first = 4, local = 4;
  std::vector<float> flat(n * e), bias(e);
  for (float& x : flat) x = d(rng);
  for (float& b : bias) b = 0.2f * d(rng);
  auto run = [&](RouteParams p) {
    Tensor idx = poisoned({n, k}, DType::kI32), w = poisoned({n, k}, DType::kF32);
    be().moe_route(dev(Tensor::from_f32({n, e}, flat), DType::kF32), dev(Tensor::from_f32({e}, bias), DType::kF32), p,
                   idx, w);
    return std::pair{host(idx), host(w)};
  };
  const auto [all_idx, all_w] = run(RouteParams{k, 4, 2, true, kScale});
  const auto [idx, w] = run(RouteParams{k, 4, 2, true, kScale, first, local});
  for (int64_t i = 0; i < n * k; ++i) {
    const int32_t global = all_idx.data_as<int32_t>()[i];
    const bool mine = global >= first && global < first + local;
    EXPECT_EQ(idx.data_as<int32_t>()[i], mine ? global - first : -1) << "pick " << i;
    EXPECT_EQ(w.f32()[i], all_w.f32()[i]) << "pick " << i;
  }
}

KL_BACKEND_SUITE(RouterTest);

}  // namespace
}  // namespace klinear
