// AttnRes two-phase form (MODEL.md 7.3), a host reference for the tests: the sealed blocks of an
// AttnRes block are summarised once per read site (phase 1: max logit M, normaliser Z and weighted
// sum N over the blocks), then each read merges that summary with the live partial sum p by an
// online-softmax step (phase 2). It equals the direct read of MODEL.md 7.1 (Backend::attn_res_read)
// over blocks + [p]; a fused GPU path may follow this form.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace klinear::testing {

struct AttnResStats {
  Tensor max_logit;  // [T]
  Tensor norm;       // [T]   Σ_i exp(ℓ_i − M)
  Tensor sum;        // [T, D] Σ_i exp(ℓ_i − M) · b_i
};



namespace attn_res_detail {
// ℓ = ρ·(v·e) with ρ = rsqrt(mean v² + eps) (MODEL.md 7.1 step 3).
inline float logit(const float* v, const float* e, int64_t d, float eps) {
  double ss = 0, dot = 0;
  for (int64_t j = 0; j < d; ++j) {
    ss += static_cast<double>(v[j]) * v[j];
    dot += static_cast<double>(v[j]) * e[j];
  }
  return static_cast<float>(dot) / std::sqrt(static_cast<float>(ss / static_cast<double>(d)) + eps);
}
}  // namespace attn_res_detail

// Phase 1 over sealed blocks b_i [T, D] (host F32) for the effective query e [D].
inline AttnResStats attn_res_phase1(std::span<const Tensor> blocks, const Tensor& e, float eps) {
  KL_CHECK(!blocks.empty(), "phase 1 needs at least one sealed block");
  const int64_t d = e.numel(), t = blocks[0].numel() / d;
  AttnResStats s{Tensor::empty(DType::kF32, {t}), Tensor::empty(DType::kF32, {t}), Tensor::zeros(DType::kF32, {t, d})};
  for (int64_t row = 0; row < t; ++row) {
    std::vector<float> l(blocks.size());
    float mx = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < blocks.size(); ++i) mx = std::max(mx, l[i] = attn_res_detail::logit(blocks[i].f32() + row * d, e.f32(), d, eps));
    float z = 0;
    float* n = s.sum.f32() + row * d;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const float w = std::exp(l[i] - mx);
      z += w;
      const float* b = blocks[i].f32() + row * d;
      for (int64_t j = 0; j < d; ++j) n[j] += w * b[j];
    }
    s.max_logit.f32()[row] = mx;
    s.norm.f32()[row] = z;
  }
  return s;
}

// Phase 2: out [T, D] = the read over blocks + [partial]; partial may be null (the first read of
// a block, which has no partial candidate).
inline void attn_res_phase2(const AttnResStats& s, const Tensor* partial, const Tensor& e, float eps, const Tensor& out) {
  const int64_t d = e.numel(), t = out.numel() / d;
  for (int64_t row = 0; row < t; ++row) {
    const float m = s.max_logit.f32()[row];
    const float* n = s.sum.f32() + row * d;
    float* o = out.f32() + row * d;
    if (partial == nullptr) {
      for (int64_t j = 0; j < d; ++j) o[j] = n[j] / s.norm.f32()[row];
      continue;
    }
    const float* p = partial->f32() + row * d;
    const float lp = attn_res_detail::logit(p, e.f32(), d, eps);
    const float m2 = std::max(m, lp);
    const float wb = std::exp(m - m2), wp = std::exp(lp - m2);
    const float z = wb * s.norm.f32()[row] + wp;
    for (int64_t j = 0; j < d; ++j) o[j] = (wb * n[j] + wp * p[j]) / z;
  }
}

}  // namespace klinear::testing
