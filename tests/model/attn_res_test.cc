// AttnRes: the two-phase (online-softmax) form equals the direct read (SPEC 7.3 vs 7.1) on random
// blocks, partial sums and queries, with and without a partial candidate; one candidate is the
// identity.
#include <gtest/gtest.h>

#include "backend/cpu/backend.h"
#include "model/attn_res.h"
#include "test_util.h"

namespace klinear {
namespace {

TEST(AttnRes, TwoPhaseEqualsDirect) {
  std::mt19937_64 rng(testing::fresh_seed());
  cpu::CpuBackend be;
  const float eps = 1e-5f;
  for (int blocks_n : {1, 2, 5, 8}) {
    const int64_t t = 7, d = 48;
    std::vector<Tensor> blocks;
    for (int i = 0; i < blocks_n; ++i) blocks.push_back(testing::random_tensor(rng, {t, d}, -2.0f, 2.0f));
    Tensor e = testing::random_tensor(rng, {d}, -1.0f, 1.0f);
    Tensor p = testing::random_tensor(rng, {t, d}, -3.0f, 3.0f);
    const AttnResStats stats = attn_res_phase1(blocks, e, eps);

    std::vector<Tensor> with_p = blocks;
    with_p.push_back(p);
    Tensor direct = Tensor::empty(DType::kF32, {t, d}), two = Tensor::empty(DType::kF32, {t, d});
    be.attn_res_read(with_p, e, eps, direct);
    attn_res_phase2(stats, &p, e, eps, two);
    EXPECT_TRUE(testing::close_rel(two, direct, 1e-5)) << blocks_n << " blocks + partial";

    be.attn_res_read(blocks, e, eps, direct);
    attn_res_phase2(stats, nullptr, e, eps, two);
    EXPECT_TRUE(testing::close_rel(two, direct, 1e-5)) << blocks_n << " blocks, no partial";
  }
}

TEST(AttnRes, SingleCandidateIsIdentity) {
  std::mt19937_64 rng(testing::fresh_seed());
  cpu::CpuBackend be;
  Tensor v = testing::random_tensor(rng, {3, 16});
  Tensor e = testing::random_tensor(rng, {16});
  Tensor out = Tensor::empty(DType::kF32, {3, 16});
  be.attn_res_read(std::vector<Tensor>{v}, e, 1e-5f, out);
  EXPECT_TRUE(testing::close_rel(out, v, 1e-6));
}

}  // namespace
}  // namespace klinear
