// linear (y = x·wᵀ) against a double-precision loop on every backend row, for shapes around tile
// edges, one row, an F32 output from activation inputs (router logits, the lm_head) and an empty
// inner dimension (y = 0).
#include <gtest/gtest.h>

#include "backend_cases.h"
#include "test_util.h"

namespace klinear {
namespace {

class Gemm : public testing::BackendTest {};

TEST_P(Gemm, LinearMatchesLoop) {
  std::mt19937_64 rng(testing::fresh_seed());
  struct Shape3 {
    int64_t n, m, k;
  };
  for (const Shape3 s : {Shape3{1, 17, 33}, Shape3{5, 64, 64}, Shape3{65, 31, 130}, Shape3{3, 8, 0}}) {
    for (DType out_dtype : {act(), DType::kF32}) {
      Tensor x = testing::random_tensor(rng, {s.n, s.k}), w = testing::random_tensor(rng, {s.m, s.k});
      Tensor expect = Tensor::empty(DType::kF32, {s.n, s.m});
      for (int64_t i = 0; i < s.n; ++i)
        for (int64_t j = 0; j < s.m; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < s.k; ++c) acc += double(x.f32()[i * s.k + c]) * w.f32()[j * s.k + c];
          expect.f32()[i * s.m + j] = float(acc);
        }
      Tensor y = poisoned({s.n, s.m}, out_dtype);
      be().linear(dev(x), persistent(w, act()), y);
      const Tensor got = host(y);
      const std::string what = "n " + std::to_string(s.n) + " m " + std::to_string(s.m) + " k " + std::to_string(s.k);
      if (s.k == 0) {
        for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got.f32()[i], 0.0f) << what;
      } else {
        EXPECT_TRUE(testing::all_close(got, expect, tol())) << what;
      }
    }
  }
}

KL_BACKEND_SUITE(Gemm);

}  // namespace
}  // namespace klinear
