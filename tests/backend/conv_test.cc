// CPU short conv (SPEC 4.2): the causal depthwise conv + SiLU against its formula, and a sequence
// run in pieces through the conv state equal to the whole sequence at once.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cpu/backend.h"
#include "test_util.h"

namespace klinear {
namespace {

TEST(ShortConv, FormulaAndPiecesThroughTheState) {
  std::mt19937_64 rng(testing::fresh_seed());
  cpu::CpuBackend be;
  for (int64_t kc : {2, 3, 4}) {
    const int64_t t = 23, c = 12;
    Tensor x = testing::random_tensor(rng, {t, c}), w = testing::random_tensor(rng, {c, kc});
    Tensor s0 = testing::random_tensor(rng, {kc - 1, c});  // a non-empty history
    Tensor state = Tensor::empty(DType::kF32, s0.shape());
    std::memcpy(state.data(), s0.data(), s0.nbytes());
    Tensor whole = Tensor::empty(DType::kF32, {t, c});
    be.short_conv(x, w, state, whole);
    // Formula: out[t, ch] = silu(Σ_j w[ch, j] · in[t − (kc−1) + j, ch]) over [s0 ; x].
    Tensor expect = Tensor::empty(DType::kF32, {t, c});
    for (int64_t i = 0; i < t; ++i)
      for (int64_t ch = 0; ch < c; ++ch) {
        double acc = 0;
        for (int64_t j = 0; j < kc; ++j) {
          const int64_t row = i - (kc - 1) + j;
          acc += double(w.f32()[ch * kc + j]) * (row < 0 ? s0.f32()[(row + kc - 1) * c + ch] : x.f32()[row * c + ch]);
        }
        expect.f32()[i * c + ch] = float(acc / (1 + std::exp(-acc)));
      }
    EXPECT_TRUE(testing::close_rel(whole, expect, 1e-6)) << "kc " << kc;
    // The final state holds the last kc−1 inputs.
    EXPECT_EQ(std::memcmp(state.data(), x.rows(t - (kc - 1), t).data(), state.nbytes()), 0);

    // Pieces 1 + 9 + 13 through the state.
    std::memcpy(state.data(), s0.data(), s0.nbytes());
    Tensor pieces = Tensor::empty(DType::kF32, {t, c});
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 1}, {1, 10}, {10, t}})
      be.short_conv(x.rows(b, e), w, state, pieces.rows(b, e));
    EXPECT_TRUE(testing::close_rel(pieces, whole, 1e-6)) << "kc " << kc;
  }
}

}  // namespace
}  // namespace klinear
