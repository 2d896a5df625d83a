// CPU activations against their formulas on random inputs: SwiGLU and SiTU-GLU (SPEC 3.2, with
// and without the linear beta) and the sigmoid output gate of MLA (SPEC 5.1 step 8).
#include <gtest/gtest.h>

#include "backend/cpu/backend.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::sig;

TEST(Activations, SwigluSituAndSigmoidGate) {
  std::mt19937_64 rng(testing::fresh_seed());
  cpu::CpuBackend be;
  const int64_t n = 5, f = 24;
  Tensor gu = testing::random_tensor(rng, {n, 2 * f}, -30.0f, 30.0f);  // wide: exercises both tanh saturations
  struct Case {
    GluParams p;
    const char* name;
  };
  for (const Case& c : {Case{{GluParams::Kind::kSilu, 1.0f, std::nullopt}, "silu"},
                        Case{{GluParams::Kind::kSitu, 4.0f, 25.0f}, "situ 4/25"},
                        Case{{GluParams::Kind::kSitu, 2.0f, std::nullopt}, "situ 2/none"}}) {
    Tensor out = Tensor::empty(DType::kF32, {n, f}), expect = Tensor::empty(DType::kF32, {n, f});
    be.glu(gu, c.p, out);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < f; ++j) {
        const double g = gu.f32()[r * 2 * f + j], u = gu.f32()[r * 2 * f + f + j];
        double v;
        if (c.p.kind == GluParams::Kind::kSilu) v = g * sig(g) * u;
        else v = c.p.beta * std::tanh(g / c.p.beta) * sig(g) * (c.p.linear_beta ? *c.p.linear_beta * std::tanh(u / *c.p.linear_beta) : u);
        expect.f32()[r * f + j] = float(v);
      }
    EXPECT_TRUE(testing::close_rel(out, expect, 1e-5)) << c.name;
  }
  Tensor x = testing::random_tensor(rng, {n, f}), gate = testing::random_tensor(rng, {n, f}, -5.0f, 5.0f);
  Tensor expect = Tensor::empty(DType::kF32, {n, f});
  for (int64_t i = 0; i < n * f; ++i) expect.f32()[i] = float(x.f32()[i] * sig(gate.f32()[i]));
  be.sigmoid_mul(x, gate);
  EXPECT_TRUE(testing::close_rel(x, expect, 1e-6));
}

}  // namespace
}  // namespace klinear
