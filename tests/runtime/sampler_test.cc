// Sampler: greedy is argmax (lowest id on ties); sampled frequencies follow softmax(logits / T)
// by a chi-square bound that a wrong temperature fails; top-k, top-p and min_p never emit an id
// outside the set a plain full-sort reference keeps; a seed reproduces a run; penalties and
// log-probabilities match their formulas.
#include <gtest/gtest.h>

#include <algorithm>
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

TEST(Sampler, SeedReproduces) {
  const std::vector<float> logits{0.0f, 1.0f, 2.0f, 0.5f};
  const uint64_t seed = testing::fresh_seed();
  Sampler a(SamplingParams{1.5f, 0, 0.95f, seed}), b(SamplingParams{1.5f, 0, 0.95f, seed});
  std::set<int32_t> seen;
  for (int i = 0; i < 2000; ++i) {
    const int32_t x = a.sample(logits);
    ASSERT_EQ(x, b.sample(logits)) << "draw " << i;
    seen.insert(x);
  }
  EXPECT_GE(seen.size(), 3u);  // the runs really sampled
}

// Another seed gives another stream: 200 draws over 4 ids, each at least ~7 % likely, agree with
// the first seed's by chance with probability below 0.75^200 (a seed ignored would give the same).
TEST(Sampler, AnotherSeedGivesOtherIds) {
  const std::vector<float> logits{0.0f, 1.0f, 2.0f, 0.5f};
  const uint64_t seed = testing::fresh_seed();
  Sampler a(SamplingParams{1.5f, 0, 1.0f, seed}), b(SamplingParams{1.5f, 0, 1.0f, seed + 1});
  std::vector<int32_t> xs, ys;
  for (int i = 0; i < 200; ++i) {
    xs.push_back(a.sample(logits));
    ys.push_back(b.sample(logits));
  }
  EXPECT_NE(xs, ys) << "seeds " << seed << " and " << seed + 1 << " drew the same 200 ids";
}

// Pearson's statistic of `count` (n draws) against the distribution `p`.
double chi_square(const std::vector<int>& count, const std::vector<double>& p, int n) {
  double chi2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * n;
    chi2 += (count[i] - e) * (count[i] - e) / e;
  }
  return chi2;
}

std::vector<double> tempered_softmax(const std::vector<float>& logits, double t) {
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) z += p[i] = std::exp(logits[i] / t);
  for (double& x : p) x /= z;
  return p;
}

// 6 categories: 5 degrees of freedom; P(chi2 > 36) < 1e-6 when the sampler is right, so the test
// is not flaky, while sampling at the wrong temperature (checked below) lands far above it.
TEST(Sampler, FrequenciesFollowTheTemperedSoftmax) {
  const std::vector<float> logits{0.0f, 1.0f, 2.0f, -1.0f, 0.5f, 1.5f};
  const double kBound = 36.0;
  const int n = 30000;
  for (float t : {0.5f, 1.0f, 2.0f}) {
    Sampler s(SamplingParams{t, 0, 1.0f, testing::fresh_seed()});
    std::vector<int> count(logits.size(), 0);
    for (int i = 0; i < n; ++i) ++count[static_cast<size_t>(s.sample(logits))];
    EXPECT_LT(chi_square(count, tempered_softmax(logits, t), n), kBound) << "T=" << t;
    // The same counts against a neighbouring temperature fail the bound: the check has power.
    EXPECT_GT(chi_square(count, tempered_softmax(logits, t * 1.25), n), kBound) << "T=" << t;
  }
}

// The ids a plain full-sort reference keeps under top-k, then top-p, then min_p (file comment of
// sampler.h).
std::set<int32_t> allowed_ids(const std::vector<float>& logits, const SamplingParams& p) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size()) order.resize(static_cast<size_t>(p.top_k));
  std::vector<double> w;
  for (int32_t id : order) w.push_back(std::exp((logits[id] - logits[order[0]]) / p.temperature));
  const double z = std::accumulate(w.begin(), w.end(), 0.0);
  std::set<int32_t> keep;
  double cum = 0;
  for (size_t i = 0; i < order.size() && cum < p.top_p * z; ++i) {
    cum += w[i];
    if (w[i] >= p.min_p) keep.insert(order[i]);
  }
  return keep;
}

TEST(Sampler, TruncationNeverEmitsAnExcludedId) {
  struct Case {
    const char* name;
    SamplingParams p;
  };
  const std::vector<Case> cases{
      {"top_k 10", {1.0f, 10, 1.0f, 0}},
      {"top_p 0.5", {1.0f, 0, 0.5f, 0}},
      {"top_p 0.9 at T 2", {2.0f, 0, 0.9f, 0}},
      {"min_p 0.2", {1.0f, 0, 1.0f, 0, 0.2f}},
      {"min_p 0.05 at T 0.7", {0.7f, 0, 1.0f, 0, 0.05f}},
      {"top_k 50 + top_p 0.8 + min_p 0.1", {1.0f, 50, 0.8f, 0, 0.1f}},
  };
  std::mt19937_64 rng(testing::fresh_seed());
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(1000);
  for (float& l : logits) l = normal(rng);
  // Eight ids within 0.3 of the top, so that every case keeps several ids whatever the draw (alone,
  // the top of 1,000 normal draws can stand far enough above the rest that top_p 0.5 or min_p 0.2
  // keep it alone, which the guard below rejects: about 1 draw in 18).
  const float top = *std::max_element(logits.begin(), logits.end());
  std::uniform_real_distribution<float> near(-0.3f, 0.0f);
  for (int i = 0; i < 8; ++i) logits[(rng() % 125) * 8 + i] = top + near(rng);
  for (const Case& c : cases) {
    SamplingParams p = c.p;
    p.seed = rng();
    const std::set<int32_t> allowed = allowed_ids(logits, p);
    ASSERT_GT(allowed.size(), 1u) << c.name << ": a case that keeps one id tests nothing";
    ASSERT_LT(allowed.size(), logits.size()) << c.name;
    Sampler s(p);
    std::set<int32_t> seen;
    for (int i = 0; i < 5000; ++i) {
      const int32_t x = s.sample(logits);
      ASSERT_TRUE(allowed.count(x)) << c.name << ": emitted excluded id " << x << " (draw " << i << ")";
      seen.insert(x);
    }
    EXPECT_GT(seen.size(), 1u) << c.name;
  }
}

TEST(Sampler, PenaltiesFollowTheirFormulas) {
  struct Case {
    const char* name;
    SamplingParams p;
    std::vector<float> expected;
  };
  // logits {2, -1, 0.5, 1}; prompt holds id 0; output holds id 1 once and id 2 twice.
  const std::vector<Case> cases{
      {"none", {}, {2.0f, -1.0f, 0.5f, 1.0f}},
      {"repetition 2", {0, 0, 1, 0, 0, 0, 0, 2.0f}, {1.0f, -2.0f, 0.25f, 1.0f}},
      {"presence 0.5", {0, 0, 1, 0, 0, 0.5f, 0, 1.0f}, {2.0f, -1.5f, 0.0f, 1.0f}},
      {"frequency 0.25", {0, 0, 1, 0, 0, 0, 0.25f, 1.0f}, {2.0f, -1.25f, 0.0f, 1.0f}},
      {"all three", {0, 0, 1, 0, 0, 0.5f, 0.25f, 2.0f}, {1.0f, -2.75f, -0.75f, 1.0f}},
  };
  TokenHistory h;
  h.prompt = {0};
  h.output = {{1, 1}, {2, 2}};
  for (const Case& c : cases) {
    std::vector<float> logits{2.0f, -1.0f, 0.5f, 1.0f};
    adjust_logits(c.p, h, logits);
    for (size_t i = 0; i < logits.size(); ++i) EXPECT_FLOAT_EQ(logits[i], c.expected[i]) << c.name << " id " << i;
  }
}

// logit_bias moves an id's logit; min_tokens keeps the stop ids from being drawn until that many
// ids are generated; neither changes the reported log-probabilities; both send the request to the
// host sampler.
TEST(Sampler, LogitBiasAndMinTokens) {
  SamplingParams p;
  p.logit_bias = {{2, 1.0f}};
  p.min_tokens = 2;
  p.min_tokens_ids = {0};
  EXPECT_FALSE(device_samplable(p, -1));
  Sampler s(p);
  const std::vector<float> logits{3.0f, 1.0f, 0.5f, -1.0f};
  const Sampled first = s.next(logits, 1);
  EXPECT_EQ(first.id, 2) << "id 0 is a stop id inside min_tokens; id 2's 0.5 + 1 beats id 1";
  EXPECT_EQ(first.top[0].id, 0) << "log-probabilities are the model's";
  EXPECT_EQ(s.sample(logits), 2);
  EXPECT_EQ(s.sample(logits), 0) << "past min_tokens the stop id may be drawn";
  SamplingParams bias_only;
  bias_only.logit_bias = {{1, 100.0f}};
  EXPECT_FALSE(device_samplable(bias_only, -1));
  Sampler b(bias_only);
  EXPECT_EQ(b.sample(logits), 1);
  Sampler banned({1.0f, 0, 1.0f, 7, 0, 0, 0, 1.0f, {{0, -100.0f}, {1, -100.0f}, {2, -100.0f}}});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(banned.sample(logits), 3) << "bias -100 removes an id in practice";
}

// A presence penalty steers greedy decoding away from what it already generated.
TEST(Sampler, GreedyWithPresencePenaltyAvoidsRepeats) {
  SamplingParams p;
  p.presence_penalty = 1.0f;
  Sampler s(p);
  const std::vector<float> logits{3.0f, 2.5f, 2.2f, 0.0f};
  EXPECT_EQ(s.sample(logits), 0);
  EXPECT_EQ(s.sample(logits), 1);
  EXPECT_EQ(s.sample(logits), 2);
  EXPECT_EQ(s.sample(logits), 0);  // 3 - 1 beats 2.5 - 1 and 2.2 - 1
}

TEST(Sampler, LogprobsAreTheRawLogSoftmax) {
  const std::vector<float> logits{0.5f, 2.0f, -1.0f, 1.0f};
  SamplingParams p;
  p.repetition_penalty = 3.0f;  // changes the pick's odds, not the reported distribution
  Sampler s(p);
  const Sampled r = s.next(logits, 2);
  double z = 0;
  for (float l : logits) z += std::exp(l);
  EXPECT_EQ(r.id, 1);
  EXPECT_NEAR(r.logprob, 2.0 - std::log(z), 1e-6);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].id, 1);
  EXPECT_EQ(r.top[1].id, 3);
  EXPECT_NEAR(r.top[1].logprob, 1.0 - std::log(z), 1e-6);
  EXPECT_TRUE(s.next(logits, -1).top.empty());
}

TEST(Sampler, RejectsBadParameters) {
  struct Case {
    SamplingParams p;
    bool ok;
  };
  const std::vector<Case> cases{
      {{-1.0f, 0, 1.0f, 0}, false},
      {{1.0f, -1, 1.0f, 0}, false},
      {{1.0f, 0, 0.0f, 0}, false},
      {{1.0f, 0, 1.5f, 0}, false},
      {{1.0f, 0, 1.0f, 0, -0.1f}, false},
      {{1.0f, 0, 1.0f, 0, 1.1f}, false},
      {{1.0f, 0, 1.0f, 0, 0, 2.5f}, false},
      {{1.0f, 0, 1.0f, 0, 0, 0, -3.0f}, false},
      {{1.0f, 0, 1.0f, 0, 0, 0, 0, 0.0f}, false},
      {{0.7f, 50, 0.9f, 3, 0.05f, 1.0f, -1.0f, 1.2f}, true},
      {{1.0f, 0, 1.0f, 0, 0, 0, 0, 1.0f, {{5, -100.0f}, {6, 100.0f}}}, true},
      {{1.0f, 0, 1.0f, 0, 0, 0, 0, 1.0f, {{5, 100.5f}}}, false},
      {{1.0f, 0, 1.0f, 0, 0, 0, 0, 1.0f, {{-5, 1.0f}}}, false},
      {{1.0f, 0, 1.0f, 0, 0, 0, 0, 1.0f, {{5, 1.0f}, {5, 2.0f}}}, false},
      {{1.0f, 0, 1.0f, 0, 0, 0, 0, 1.0f, {}, -1}, false},
  };
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(validate_sampling(cases[i].p).ok(), cases[i].ok) << "case " << i;
}

}  // namespace
}  // namespace klinear
