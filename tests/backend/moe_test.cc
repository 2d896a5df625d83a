// Routed experts (SPEC 3.4) on every backend row against a plain per-token loop: out[t] = Σ_k w[t,k] ·
// down_e(glu(gate_up_e(x[t]))) with e = idx[t,k], for both activations and an expert used by
// several tokens, by one, and by none.
#include <gtest/gtest.h>

#include "backend/cpu/backend.h"
#include "backend_cases.h"
#include "test_util.h"

namespace klinear {
namespace {

class MoeExperts : public testing::BackendTest {};

TEST_P(MoeExperts, MatchPerTokenLoop) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 9, din = 20, f = 12, dout = 16, num_experts = 6, k = 3;
  Tensor x = testing::random_tensor(rng, {n, din});
  Tensor w13 = testing::random_tensor(rng, {num_experts, 2 * f, din}, -0.5f, 0.5f);
  Tensor w2 = testing::random_tensor(rng, {num_experts, dout, f}, -0.5f, 0.5f);
  Tensor idx = Tensor::empty(DType::kI32, {n, k});
  Tensor weights = testing::random_tensor(rng, {n, k}, 0.1f, 1.0f);
  // Expert 5 is never used; expert 0 by every token.
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> pool{1, 2, 3, 4};
    std::shuffle(pool.begin(), pool.end(), rng);
    const int32_t row[3] = {0, pool[0], pool[1]};
    for (int64_t i = 0; i < k; ++i) idx.data_as<int32_t>()[t * k + i] = row[i];
  }
  const Tensor dw13 = persistent(w13, act()), dw2 = persistent(w2, act());
  for (GluParams p : {GluParams{Activation::kSilu, 1.0f, std::nullopt}, GluParams{Activation::kSitu, 4.0f, 25.0f}}) {
    Tensor out = poisoned({n, dout}), expect = Tensor::zeros(DType::kF32, {n, dout});
    be().moe_experts(dev(x), dev(idx, DType::kI32), dev(weights, DType::kF32), dw13, dw2, p, out);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < k; ++i) {
        const int32_t e = idx.data_as<int32_t>()[t * k + i];
        std::vector<float> h(2 * f), a(f);
        for (int64_t r = 0; r < 2 * f; ++r) {
          double acc = 0;
          for (int64_t c = 0; c < din; ++c) acc += double(w13.f32()[(e * 2 * f + r) * din + c]) * x.f32()[t * din + c];
          h[r] = float(acc);
        }
        cpu::glu_rows(h.data(), 1, f, p, a.data());
        for (int64_t r = 0; r < dout; ++r) {
          double acc = 0;
          for (int64_t c = 0; c < f; ++c) acc += double(w2.f32()[(e * dout + r) * f + c]) * a[c];
          expect.f32()[t * dout + r] += float(weights.f32()[t * k + i] * acc);
        }
      }
    EXPECT_TRUE(testing::all_close(host(out), expect, tol()));
  }
}

KL_BACKEND_SUITE(MoeExperts);

}  // namespace
}  // namespace klinear
