// AttnRes: the backend's direct read (MODEL.md 7.1) equals the two-phase online-softmax form (MODEL.md 7.3,
// a host reference) on random blocks, partial sums and queries, with and without a partial
// candidate, on every backend row.
#include <gtest/gtest.h>

#include "attn_res_reference.h"
#include "backend_cases.h"
#include "test_util.h"

namespace klinear {
namespace {

class AttnRes : public testing::BackendTest {};

TEST_P(AttnRes, DirectEqualsTwoPhase) {
  std::mt19937_64 rng(testing::fresh_seed());
  const float eps = 1e-5f;
  for (int blocks_n : {1, 2, 5, 8}) {
    const int64_t t = 7, d = 48;
    std::vector<Tensor> blocks;
    for (int i = 0; i < blocks_n; ++i) blocks.push_back(testing::random_tensor(rng, {t, d}, -2.0f, 2.0f));
    Tensor e = testing::random_tensor(rng, {d}, -1.0f, 1.0f);
    Tensor p = testing::random_tensor(rng, {t, d}, -3.0f, 3.0f);
    const testing::AttnResStats stats = testing::attn_res_phase1(blocks, e, eps);
    Tensor two = Tensor::empty(DType::kF32, {t, d});

    std::vector<Tensor> on_device;
    for (const Tensor& b : blocks) on_device.push_back(dev(b));
    Tensor out = poisoned({t, d});
    be().attn_res_read(on_device, dev(e, DType::kF32), eps, out);
    testing::attn_res_phase2(stats, nullptr, e, eps, two);
    EXPECT_TRUE(testing::all_close(host(out), two, tol())) << blocks_n << " blocks, no partial";

    on_device.push_back(dev(p));
    out = poisoned({t, d});
    be().attn_res_read(on_device, dev(e, DType::kF32), eps, out);
    testing::attn_res_phase2(stats, &p, e, eps, two);
    EXPECT_TRUE(testing::all_close(host(out), two, tol())) << blocks_n << " blocks + partial";
  }
}

KL_BACKEND_SUITE(AttnRes);

}  // namespace
}  // namespace klinear
