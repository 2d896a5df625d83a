// Activations and the small elementwise ops against their formulas on random inputs, on every
// backend row: SwiGLU and SiTU-GLU (MODEL.md 3.2, with and without the linear beta, over a table of
// shapes), the sigmoid output gate of MLA (MODEL.md 5.1 step 8), sigmoid, the residual add and the
// embedding lookup.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "backend_cases.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::sig;

class Activations : public testing::BackendTest {};

// (rows, F): F a multiple of 8 (CUDA's 16-byte chunks) and not, and more rows than a grid's 65,535 in y.
const std::pair<int64_t, int64_t> kGluShapes[] = {{5, 24}, {3, 13}, {70000, 8}};

TEST_P(Activations, SwigluAndSitu) {
  std::mt19937_64 rng(testing::fresh_seed());
  struct Case {
    GluParams p;
    const char* name;
  };
  for (const auto& [n, f] : kGluShapes) {
    SCOPED_TRACE(std::to_string(n) + " rows, F " + std::to_string(f));
    Tensor gu = testing::random_tensor(rng, {n, 2 * f}, -30.0f, 30.0f);  // wide: exercises both tanh saturations
    for (const Case& c : {Case{{Activation::kSilu, 1.0f, std::nullopt}, "silu"},
                          Case{{Activation::kSitu, 4.0f, 25.0f}, "situ 4/25"},
                          Case{{Activation::kSitu, 2.0f, std::nullopt}, "situ 2/none"}}) {
      Tensor out = poisoned({n, f}), expect = Tensor::empty(DType::kF32, {n, f});
      be().glu(dev(gu), c.p, out);
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < f; ++j) {
          const double g = gu.f32()[r * 2 * f + j], u = gu.f32()[r * 2 * f + f + j];
          double v;
          if (c.p.kind == Activation::kSilu) v = g * sig(g) * u;
          else v = c.p.beta * std::tanh(g / c.p.beta) * sig(g) * (c.p.linear_beta ? *c.p.linear_beta * std::tanh(u / *c.p.linear_beta) : u);
          expect.f32()[r * f + j] = float(v);
        }
      EXPECT_TRUE(testing::all_close(host(out), expect, tol())) << c.name;
    }
  }
}

TEST_P(Activations, SigmoidGateSigmoidAndAdd) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 6, f = 33;
  Tensor x = testing::random_tensor(rng, {n, f}), gate = testing::random_tensor(rng, {n, f}, -5.0f, 5.0f);
  Tensor gated = Tensor::empty(DType::kF32, {n, f}), s = Tensor::empty(DType::kF32, {n, f}),
         sum = Tensor::empty(DType::kF32, {n, f});
  for (int64_t i = 0; i < n * f; ++i) {
    gated.f32()[i] = float(x.f32()[i] * sig(gate.f32()[i]));
    s.f32()[i] = float(sig(x.f32()[i]));
    sum.f32()[i] = x.f32()[i] + gate.f32()[i];
  }
  Tensor dx = dev(x);
  be().sigmoid_mul(dx, dev(gate));
  EXPECT_TRUE(testing::all_close(host(dx), gated, tol())) << "sigmoid_mul";
  Tensor y = poisoned({n, f}, DType::kF32);
  be().sigmoid(dev(x, DType::kF32), y);
  EXPECT_TRUE(testing::all_close(host(y), s, tol())) << "sigmoid";
  Tensor inplace = dev(x, DType::kF32);
  be().sigmoid(inplace, inplace);
  EXPECT_TRUE(testing::all_close(host(inplace), s, tol())) << "sigmoid in place";
  Tensor acc = dev(x);
  be().add(acc, dev(gate));
  EXPECT_TRUE(testing::all_close(host(acc), sum, tol())) << "add";
}

// The whole table, and a vocab-parallel rank's window of it (ids outside give zero rows).
TEST_P(Activations, EmbeddingRows) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t vocab = 50, c = 17, n = 9;
  Tensor table = testing::random_tensor(rng, {vocab, c});
  Tensor ids = Tensor::empty(DType::kI32, {n});
  for (int64_t i = 0; i < n; ++i) ids.data_as<int32_t>()[i] = static_cast<int32_t>(rng() % vocab);
  ids.data_as<int32_t>()[3] = ids.data_as<int32_t>()[7];  // a repeated id
  ids.data_as<int32_t>()[5] = 12;                         // one inside the window, one outside
  ids.data_as<int32_t>()[6] = 40;
  struct Window {
    int64_t first, rows;
  };
  for (const Window w : {Window{0, vocab}, Window{10, 25}}) {
    SCOPED_TRACE("rows [" + std::to_string(w.first) + ", " + std::to_string(w.first + w.rows) + ")");
    Tensor out = poisoned({n, c});
    be().embedding(EmbeddingArgs{dev(ids, DType::kI32), persistent(table.rows(w.first, w.first + w.rows), act()),
                                 w.first, vocab, out});
    Tensor expect = Tensor::empty(DType::kF32, {n, c});
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = ids.data_as<int32_t>()[i];
      const bool mine = id >= w.first && id < w.first + w.rows;
      for (int64_t j = 0; j < c; ++j) expect.f32()[i * c + j] = mine ? table.f32()[id * c + j] : 0.0f;
    }
    EXPECT_TRUE(testing::all_close(host(out), expect, tol()));
  }
}

KL_BACKEND_SUITE(Activations);

}  // namespace
}  // namespace klinear
