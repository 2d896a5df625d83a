// CPU MLA attention (SPEC 5): the expanded prefill form and the absorbed decode form over the
// latent cache, one sequence at a time. Queries are the last T of Tc positions (causal: query i
// sees keys 0 .. Tc−T+i). Softmax in fp32; per-head GEMMs through gemm() with strided operands.
#include <algorithm>
#include <limits>
#include <vector>

#include "backend/cpu/backend.h"

namespace klinear::cpu {

void causal_softmax(float* scores, int64_t t, int64_t tc) {
  const int64_t past = tc - t;
  for (int64_t i = 0; i < t; ++i) {
    float* row = scores + i * tc;
    const int64_t visible = past + i + 1;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, row[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < visible; ++j) sum += (row[j] = std::exp(row[j] - mx));
    for (int64_t j = 0; j < visible; ++j) row[j] /= sum;
    for (int64_t j = visible; j < tc; ++j) row[j] = 0.0f;
  }
}

void CpuBackend::mla_attention(const Tensor& q, const Tensor& kv, const Tensor& k_r, float scale, const Tensor& out) {
  const int64_t t = q.dim(0), heads = q.dim(1), qk = q.dim(2), tc = kv.dim(0), r = k_r.dim(1), n = qk - r;
  const int64_t vd = kv.dim(2) - n;
  KL_CHECK(kv.dim(1) == heads && k_r.dim(0) == tc && tc >= t && out.shape() == Shape({t, heads, vd}),
           "mla_attention shapes q " + shape_to_string(q.shape()) + " kv " + shape_to_string(kv.shape()) + " k_r " +
               shape_to_string(k_r.shape()));
#pragma omp parallel for
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<float> key(tc * qk), scores(t * tc);
    for (int64_t j = 0; j < tc; ++j) {
      std::copy_n(kv.f32() + (j * heads + h) * (n + vd), n, key.data() + j * qk);
      std::copy_n(k_r.f32() + j * r, r, key.data() + j * qk + n);
    }
    gemm(t, tc, qk, q.f32() + h * qk, heads * qk, key.data(), qk, /*b_transposed=*/true, scores.data(), tc);
    for (float& x : scores) x *= scale;
    causal_softmax(scores.data(), t, tc);
    gemm(t, vd, tc, scores.data(), tc, kv.f32() + h * (n + vd) + n, heads * (n + vd), /*b_transposed=*/false,
         out.f32() + h * vd, heads * vd);
  }
}

// Per head: q_lat = q_n·W_UK [T, c]; scores = (q_lat·latentᵀ + q_r·k_rᵀ)·scale; o_lat = P·latent;
// out = o_lat·W_UVᵀ, with W_UK = kv_b rows h(n+v)+[0,n) and W_UV = rows h(n+v)+n+[0,v).
void CpuBackend::mla_attention_absorbed(const Tensor& q, const Tensor& latent, const Tensor& k_r, const Tensor& kv_b,
                                        float scale, const Tensor& out) {
  const int64_t t = q.dim(0), heads = q.dim(1), qk = q.dim(2), tc = latent.dim(0), c = latent.dim(1);
  const int64_t r = k_r.dim(1), n = qk - r, vd = out.dim(2);
  KL_CHECK(k_r.dim(0) == tc && kv_b.dim(0) == heads * (n + vd) && kv_b.dim(1) == c && tc >= t,
           "mla_attention_absorbed shapes");
#pragma omp parallel for
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<float> q_lat(t * c), scores(t * tc), o_lat(t * c);
    const float* w_uk = kv_b.f32() + h * (n + vd) * c;
    const float* w_uv = w_uk + n * c;
    gemm(t, c, n, q.f32() + h * qk, heads * qk, w_uk, c, /*b_transposed=*/false, q_lat.data(), c);
    gemm(t, tc, c, q_lat.data(), c, latent.f32(), c, /*b_transposed=*/true, scores.data(), tc);
    gemm(t, tc, r, q.f32() + h * qk + n, heads * qk, k_r.f32(), r, /*b_transposed=*/true, scores.data(), tc,
         /*beta=*/1.0f);
    for (float& x : scores) x *= scale;
    causal_softmax(scores.data(), t, tc);
    gemm(t, c, tc, scores.data(), tc, latent.f32(), c, /*b_transposed=*/false, o_lat.data(), c);
    gemm(t, vd, c, o_lat.data(), c, w_uv, c, /*b_transposed=*/true, out.f32() + h * vd, heads * vd);
  }
}

}  // namespace klinear::cpu
