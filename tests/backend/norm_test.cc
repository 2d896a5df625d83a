// Norms against their formulas on random inputs, on every backend row: RMSNorm (MODEL.md 3.1, also in
// place), the sigmoid-gated RMSNorm of the KDA output (MODEL.md 4.7), and the fused residual add +
// RMSNorm (MODEL.md 6) against both the composition add → rms_norm and a double-precision loop.
#include <gtest/gtest.h>

#include <cstring>

#include "core/dtype.h"

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

// add_rms_norm over row counts (one, odd, a decode batch, more rows than a wave of blocks) and widths
// (the 48B model's 2,304, a multiple of the 16-byte chunk, an odd width that is none).
TEST_P(Norms, AddRmsNormEqualsAddThenRmsNorm) {
  std::mt19937_64 rng(testing::fresh_seed());
  const float eps = 1e-6f;
  const bool bf16 = act() == DType::kBF16;
  // The stream as stored in the activation dtype (what the norm reads after the add).
  auto stored = [&](float v) { return bf16 ? bf16_to_f32(f32_to_bf16(v)) : v; };
  // y against the composition: the same roundings, the sum of squares maybe in another order.
  const double order_tol = tol(testing::kReorder);
  for (const int64_t n : {1, 7, 64, 300})
    for (const int64_t d : {64, 2304, 100}) {
      SCOPED_TRACE("rows " + std::to_string(n) + " width " + std::to_string(d));
      const Tensor h0 = testing::random_tensor(rng, {n, d}, -2.0f, 2.0f);
      const Tensor x0 = testing::random_tensor(rng, {n, d}, -2.0f, 2.0f);
      const Tensor w0 = testing::random_tensor(rng, {d}, 0.5f, 1.5f);
      const Tensor dx = dev(x0), dw = persistent(w0, act());
      const Tensor h_in = host(dev(h0)), x_in = host(dx), w_in = host(dw);  // the inputs as the backend holds them

      const Tensor ch = dev(h0), cy = poisoned({n, d});
      be().add(ch, dx);
      be().rms_norm(ch, dw, eps, cy);
      const Tensor fh = dev(h0), fy = poisoned({n, d});
      be().add_rms_norm(AddNormArgs{fh, dx, dw, eps, fy});
      const Tensor got_h = host(fh), got_y = host(fy), want_h = host(ch), want_y = host(cy);

      // The double-precision loop over the stored inputs: h = stored(h + x) (the add in fp32,
      // rounded once), y = w·h / sqrt(mean(h²) + eps).
      Tensor ref_h = Tensor::empty(DType::kF32, {n, d}), ref_y = Tensor::empty(DType::kF32, {n, d});
      for (int64_t r = 0; r < n; ++r) {
        double ss = 0;
        for (int64_t j = 0; j < d; ++j) {
          const float v = stored(h_in.f32()[r * d + j] + x_in.f32()[r * d + j]);
          ref_h.f32()[r * d + j] = v;
          ss += double(v) * v;
        }
        const double inv = 1.0 / std::sqrt(ss / d + eps);
        for (int64_t j = 0; j < d; ++j) ref_y.f32()[r * d + j] = float(ref_h.f32()[r * d + j] * inv * w_in.f32()[j]);
      }

      EXPECT_EQ(std::memcmp(got_h.data(), ref_h.data(), ref_h.nbytes()), 0) << "h is not stored(h + x)";
      EXPECT_EQ(std::memcmp(got_h.data(), want_h.data(), want_h.nbytes()), 0) << "h differs from add's";
      EXPECT_TRUE(testing::all_close(got_y, want_y, order_tol)) << "y against add then rms_norm";
      EXPECT_TRUE(testing::all_close(got_y, ref_y, tol())) << "y against the double loop";
    }
}

KL_BACKEND_SUITE(Norms);

}  // namespace
}  // namespace klinear
