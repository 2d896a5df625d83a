// The sample op (backend.h, SampleArgs) on every backend row: each row's pick equals a plain
// reference written from the op's definition (a full sort, prefix sums) for greedy rows (ties
// included), temperature, top-k, top-p, both, ties at the cut-offs, tiny and large temperatures
// and non-finite rows, all mixed in one call over a small and the real (163,840) vocabulary; the
// CPU backend picks the same ids as the row's backend; and the draws' frequencies follow the
// tempered, truncated softmax.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend/cpu/backend.h"
#include "backend/sampling.h"
#include "backend_cases.h"
#include "test_util.h"

namespace klinear {
namespace {

// The definition in backend.h, step by step.
int32_t reference(const float* l, int64_t v, const SampleRow& p) {
  for (int64_t i = 0; i < v; ++i)
    if (!std::isfinite(l[i])) return -1;
  std::vector<int32_t> order(static_cast<size_t>(v));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  if (p.temperature <= 0.0f) return order[0];
  const float inv_t = 1.0f / p.temperature, mx = l[order[0]];
  auto w = [&](int32_t i) { return sample_weight(l[i], mx, inv_t); };
  const size_t k = p.top_k > 0 && p.top_k < v ? static_cast<size_t>(p.top_k) : order.size();
  uint64_t zk = 0;
  for (size_t i = 0; i < k; ++i) zk += w(order[i]);
  size_t n = k;
  if (p.top_p < 1.0f) {
    const uint64_t target = std::max<uint64_t>(1, static_cast<uint64_t>(double(p.top_p) * double(zk)));
    uint64_t cum = 0;
    for (n = 0; cum < target;) cum += w(order[n++]);
  }
  std::vector<int32_t> kept(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n));
  std::sort(kept.begin(), kept.end());
  uint64_t z = 0;
  for (int32_t i : kept) z += w(i);
  const uint64_t u = splitmix64(splitmix64(p.seed) ^ static_cast<uint32_t>(p.counter));
  const uint64_t x = static_cast<uint64_t>((static_cast<unsigned __int128>(u) * z) >> 64);
  uint64_t cum = 0;
  for (int32_t i : kept)
    if (x < (cum += w(i))) return i;
  ADD_FAILURE() << "reference: the draw fell outside";
  return -2;
}

class Sampling : public testing::BackendTest {
 protected:
  // Runs the op over `logits` [R, V] (host) with `rows` on `backend`, ids poisoned first.
  static std::vector<int32_t> run(Backend& be, const Tensor& logits, const std::vector<SampleRow>& rows) {
    const int64_t r = static_cast<int64_t>(rows.size());
    std::vector<float> t, p;
    std::vector<int32_t> k, seed, counter;
    for (const SampleRow& s : rows) {
      t.push_back(s.temperature), p.push_back(s.top_p), k.push_back(s.top_k), counter.push_back(s.counter);
      seed.push_back(static_cast<int32_t>(static_cast<uint32_t>(s.seed)));
      seed.push_back(static_cast<int32_t>(static_cast<uint32_t>(s.seed >> 32)));
    }
    auto i32 = [&](std::vector<int32_t>& v, Shape shape) {
      return be.to_device(Tensor::wrap(DType::kI32, std::move(shape), v.data(), nullptr, Device::kCpu), DType::kI32);
    };
    auto f32 = [&](std::vector<float>& v) {
      return be.to_device(Tensor::wrap(DType::kF32, {r}, v.data(), nullptr, Device::kCpu), DType::kF32);
    };
    Tensor ids = be.alloc(DType::kI32, {r});
    be.fill(ids, -2147483648.0f);
    be.sample(SampleArgs{be.to_device(logits, DType::kF32), f32(t), i32(k, {r}), f32(p), i32(seed, {r, 2}),
                         i32(counter, {r}), ids});
    const Tensor h = be.to_host(ids);
    return std::vector<int32_t>(h.data_as<const int32_t>(), h.data_as<const int32_t>() + r);
  }
};

TEST_P(Sampling, EveryKindOfRowEqualsTheDefinition) {
  const uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  for (const int64_t v : {int64_t{1000}, int64_t{163840}}) {
    SCOPED_TRACE("V " + std::to_string(v) + " seed " + std::to_string(seed));
    struct Case {
      const char* name;
      SampleRow p;
      float step;  // logits rounded to multiples of step (ties); 0: continuous
      float poison = 0.0f;  // a non-finite value put in the row
    };
    const std::vector<Case> cases = {
        {"greedy", {0.0f, 0, 1.0f}, 0},
        {"greedy with tied maxima", {0.0f, 0, 1.0f}, 1.0f},
        {"temperature 0.7", {0.7f, 0, 1.0f}, 0},
        {"temperature 1.5", {1.5f, 0, 1.0f}, 0},
        {"temperature 1e-4 with ties", {1e-4f, 0, 1.0f}, 1.0f},
        {"temperature 50", {50.0f, 0, 1.0f}, 0},
        {"top-k 1", {1.0f, 1, 1.0f}, 0},
        {"top-k 5", {0.9f, 5, 1.0f}, 0},
        {"top-k 50 with ties", {1.0f, 50, 1.0f}, 0.5f},
        {"top-k V-1", {1.2f, static_cast<int32_t>(v - 1), 1.0f}, 0},
        {"top-k over V", {1.0f, static_cast<int32_t>(v + 7), 1.0f}, 0},
        {"top-p 0.1", {1.0f, 0, 0.1f}, 0},
        {"top-p 0.5", {0.8f, 0, 0.5f}, 0},
        {"top-p 0.95", {1.0f, 0, 0.95f}, 0},
        {"top-p 0.9 with ties", {1.0f, 0, 0.9f}, 0.25f},
        {"top-k 40 top-p 0.8", {0.7f, 40, 0.8f}, 0},
        {"top-k 200 top-p 0.99 with ties", {1.0f, 200, 0.99f}, 0.5f},
        {"NaN row", {1.0f, 0, 1.0f}, 0, std::numeric_limits<float>::quiet_NaN()},
        {"inf row, greedy", {0.0f, 0, 1.0f}, 0, std::numeric_limits<float>::infinity()},
    };
    // Every case twice (two seeds and counters), in one call.
    std::vector<SampleRow> rows;
    Tensor logits = Tensor::empty(DType::kF32, {2 * static_cast<int64_t>(cases.size()), v});
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (size_t c = 0; c < 2 * cases.size(); ++c) {
      const Case& k = cases[c % cases.size()];
      float* l = logits.f32() + c * v;
      for (int64_t i = 0; i < v; ++i) l[i] = k.step > 0 ? std::round(normal(rng) / k.step) * k.step : normal(rng);
      if (k.poison != 0.0f || std::isnan(k.poison)) l[rng() % v] = k.poison;
      SampleRow p = k.p;
      p.seed = rng();
      p.counter = static_cast<int32_t>(rng() % 100000);
      rows.push_back(p);
    }
    const std::vector<int32_t> got = run(be(), logits, rows);
    cpu::CpuBackend cpu;
    const std::vector<int32_t> on_cpu = run(cpu, logits, rows);
    for (size_t c = 0; c < rows.size(); ++c) {
      const int32_t want = reference(logits.f32() + c * v, v, rows[c]);
      EXPECT_EQ(got[c], want) << cases[c % cases.size()].name;
      EXPECT_EQ(got[c], on_cpu[c]) << cases[c % cases.size()].name << ": the CPU picks another id";
    }
  }
}

// Draws 0 .. n−1 of one seed over the same logits: each kept id's frequency is its probability
// (tempered softmax over the candidates) within 5 standard deviations, and no other id is drawn.
TEST_P(Sampling, FrequenciesFollowTheDistribution) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t v = 24, n = 40000;
  std::vector<float> row(static_cast<size_t>(v));
  for (float& x : row) x = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p;
  };
  for (const Case& k : {Case{1.0f, 0, 1.0f}, Case{0.6f, 6, 1.0f}, Case{1.4f, 0, 0.7f}, Case{1.0f, 10, 0.9f}}) {
    SCOPED_TRACE("t " + std::to_string(k.temperature) + " k " + std::to_string(k.top_k) + " p " + std::to_string(k.top_p));
    // The candidates by the definition, with double-precision probabilities.
    std::vector<int32_t> order(static_cast<size_t>(v));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    std::vector<double> prob(static_cast<size_t>(v), 0.0);
    const size_t kk = k.top_k > 0 ? static_cast<size_t>(k.top_k) : order.size();
    double zk = 0;
    for (size_t i = 0; i < kk; ++i) zk += std::exp((row[order[i]] - row[order[0]]) / k.temperature);
    double cum = 0;
    for (size_t i = 0; i < kk && (k.top_p >= 1.0f || cum < k.top_p * zk); ++i) {
      prob[order[i]] = std::exp((row[order[i]] - row[order[0]]) / k.temperature);
      cum += prob[order[i]];
    }
    for (double& p : prob) p /= cum;
    Tensor logits = Tensor::empty(DType::kF32, {n, v});
    std::vector<SampleRow> rows;
    const uint64_t seed = rng();
    for (int64_t i = 0; i < n; ++i) {
      std::copy(row.begin(), row.end(), logits.f32() + i * v);
      rows.push_back(SampleRow{k.temperature, k.top_k, k.top_p, seed, static_cast<int32_t>(i)});
    }
    std::vector<int64_t> count(static_cast<size_t>(v), 0);
    for (int32_t id : run(be(), logits, rows)) {
      ASSERT_TRUE(id >= 0 && id < v) << id;
      ++count[id];
    }
    for (int64_t i = 0; i < v; ++i) {
      const double p = prob[i], f = double(count[i]) / n, sd = std::sqrt(p * (1 - p) / n);
      if (p == 0) EXPECT_EQ(count[i], 0) << "id " << i << " is not a candidate";
      else EXPECT_NEAR(f, p, 5 * sd + 1e-9) << "id " << i;
    }
  }
}

KL_BACKEND_SUITE(Sampling);

}  // namespace
}  // namespace klinear
