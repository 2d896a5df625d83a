// CPU MLA attention: the expanded form against a plain per-head, per-position reference, and the
// absorbed form against the expanded one, over a case table (decode T=1 and multi-token steps
// with cached positions, q-head widths with and without a rope part).
#include <gtest/gtest.h>

#include "backend/cpu/backend.h"
#include "test_util.h"

namespace klinear {
namespace {

struct MlaCase {
  int64_t t, past, heads, nope, rope, v, latent;
};

class MlaOps : public ::testing::TestWithParam<MlaCase> {};

// out[t, h] = Σ_τ≤past+t softmax(scale · q[t,h]·[k_n[τ,h] ‖ k_r[τ]]) · val[τ, h]
Tensor reference(const Tensor& q, const Tensor& kv, const Tensor& k_r, int64_t nope, float scale) {
  const int64_t t = q.dim(0), heads = q.dim(1), tc = kv.dim(0), r = k_r.dim(1), vd = kv.dim(2) - nope;
  Tensor out = Tensor::zeros(DType::kF32, {t, heads, vd});
  for (int64_t i = 0; i < t; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      const float* qi = q.f32() + (i * heads + h) * (nope + r);
      std::vector<double> s(tc);
      double mx = -1e300;
      const int64_t visible = tc - t + i + 1;
      for (int64_t j = 0; j < visible; ++j) {
        const float* kj = kv.f32() + (j * heads + h) * (nope + vd);
        double dot = 0;
        for (int64_t c = 0; c < nope; ++c) dot += double(qi[c]) * kj[c];
        for (int64_t c = 0; c < r; ++c) dot += double(qi[nope + c]) * k_r.f32()[j * r + c];
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      double z = 0;
      for (int64_t j = 0; j < visible; ++j) z += (s[j] = std::exp(s[j] - mx));
      for (int64_t j = 0; j < visible; ++j)
        for (int64_t c = 0; c < vd; ++c)
          out.f32()[(i * heads + h) * vd + c] += float(s[j] / z * kv.f32()[(j * heads + h) * (nope + vd) + nope + c]);
    }
  return out;
}

TEST_P(MlaOps, ExpandedMatchesReferenceAndAbsorbedMatchesExpanded) {
  const MlaCase c = GetParam();
  std::printf("[ case ] T=%lld past=%lld H=%lld n=%lld r=%lld v=%lld c=%lld\n", (long long)c.t, (long long)c.past,
              (long long)c.heads, (long long)c.nope, (long long)c.rope, (long long)c.v, (long long)c.latent);
  std::mt19937_64 rng(testing::fresh_seed());
  cpu::CpuBackend be;
  const int64_t tc = c.past + c.t;
  Tensor q = testing::random_tensor(rng, {c.t, c.heads, c.nope + c.rope});
  Tensor latent = testing::random_tensor(rng, {tc, c.latent});
  Tensor k_r = testing::random_tensor(rng, {tc, c.rope});
  Tensor kv_b = testing::random_tensor(rng, {c.heads * (c.nope + c.v), c.latent}, -0.3f, 0.3f);
  Tensor kv = Tensor::empty(DType::kF32, {tc, c.heads, c.nope + c.v});
  be.linear(latent, kv_b, kv);
  const float scale = 1.0f / std::sqrt(float(c.nope + c.rope));
  Tensor expanded = Tensor::empty(DType::kF32, {c.t, c.heads, c.v}), absorbed = Tensor::empty(DType::kF32, {c.t, c.heads, c.v});
  be.mla_attention(q, kv, k_r, scale, expanded);
  be.mla_attention_absorbed(q, latent, k_r, kv_b, scale, absorbed);
  EXPECT_TRUE(testing::close_rel(expanded, reference(q, kv, k_r, c.nope, scale), 1e-5));
  EXPECT_TRUE(testing::close_rel(absorbed, expanded, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(MlaCases, MlaOps,
                         ::testing::Values(MlaCase{1, 0, 2, 16, 8, 16, 32}, MlaCase{1, 37, 4, 32, 16, 32, 64},
                                           MlaCase{9, 0, 3, 8, 8, 12, 24}, MlaCase{25, 40, 2, 16, 0, 16, 32},
                                           MlaCase{70, 5, 4, 32, 16, 32, 64}));

}  // namespace
}  // namespace klinear
