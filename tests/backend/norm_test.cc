// Norms against their formulas on random inputs, on every backend row: RMSNorm (SPEC 3.1, also in
// place) and the sigmoid-gated RMSNorm of the KDA output (SPEC 4.7).
#include <gtest/gtest.h>

#include "backend_cases.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::sig;

class Norms : public testing::BackendTest {};

TEST_P(Norms, RmsNormAndGatedRmsNorm) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 7, d = 40;
  const float eps = 1e-5f;
  Tensor x = testing::random_tensor(rng, {n, d}, -3.0f, 3.0f), w = testing::random_tensor(rng, {d}, 0.5f, 1.5f);
  Tensor g = testing::random_tensor(rng, {n, d}, -4.0f, 4.0f);
  Tensor ey = Tensor::empty(DType::kF32, {n, d}), eg = Tensor::empty(DType::kF32, {n, d});
  for (int64_t r = 0; r < n; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += double(x.f32()[r * d + j]) * x.f32()[r * d + j];
    const double inv = 1.0 / std::sqrt(ss / d + eps);
    for (int64_t j = 0; j < d; ++j) {
      ey.f32()[r * d + j] = float(x.f32()[r * d + j] * inv * w.f32()[j]);
      eg.f32()[r * d + j] = float(x.f32()[r * d + j] * inv * w.f32()[j] * sig(g.f32()[r * d + j]));
    }
  }
  const Tensor dx = dev(x), dw = persistent(w, act());
  Tensor y = poisoned({n, d}), yg = poisoned({n, d});
  be().rms_norm(dx, dw, eps, y);
  be().gated_rms_norm(dx, dw, dev(g), eps, yg);
  EXPECT_TRUE(testing::all_close(host(y), ey, tol())) << "rms_norm";
  EXPECT_TRUE(testing::all_close(host(yg), eg, tol())) << "gated_rms_norm";
  be().rms_norm(dx, dw, eps, dx);  // in place is allowed
  EXPECT_TRUE(testing::all_close(host(dx), ey, tol())) << "rms_norm in place";
}

KL_BACKEND_SUITE(Norms);

}  // namespace
}  // namespace klinear
