// CPU norms against their formulas on random inputs: RMSNorm (SPEC 3.1) and the sigmoid-gated
// RMSNorm of the KDA output (SPEC 4.7).
#include <gtest/gtest.h>

#include "backend/cpu/backend.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::sig;

TEST(Norms, RmsNormAndGatedRmsNorm) {
  std::mt19937_64 rng(testing::fresh_seed());
  cpu::CpuBackend be;
  const int64_t n = 7, d = 40;
  const float eps = 1e-5f;
  Tensor x = testing::random_tensor(rng, {n, d}, -3.0f, 3.0f), w = testing::random_tensor(rng, {d}, 0.5f, 1.5f);
  Tensor g = testing::random_tensor(rng, {n, d}, -4.0f, 4.0f);
  Tensor y = Tensor::empty(DType::kF32, {n, d}), yg = Tensor::empty(DType::kF32, {n, d});
  be.rms_norm(x, w, eps, y);
  be.gated_rms_norm(x, w, g, eps, yg);
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
  EXPECT_TRUE(testing::close_rel(y, ey, 1e-5));
  EXPECT_TRUE(testing::close_rel(yg, eg, 1e-5));
  be.rms_norm(x, w, eps, x);  // in place is allowed
  EXPECT_TRUE(testing::close_rel(x, ey, 1e-5));
}

}  // namespace
}  // namespace klinear
