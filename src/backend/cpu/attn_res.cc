// CPU AttnRes read (MODEL.md 7.1): per token, a softmax over candidates of ρ_i·(v_i·e) mixes the raw
// candidates. Statistics and the mix in fp32.
#include <algorithm>
#include <limits>
#include <vector>

#include "backend/cpu/backend.h"

namespace klinear::cpu {

void CpuBackend::attn_res_read(std::span<const Tensor> candidates, const Tensor& e, float eps, const Tensor& out) {
  KL_CHECK(!candidates.empty(), "attn_res_read needs at least one candidate");
  const int64_t d = e.numel(), t = out.numel() / d, m = static_cast<int64_t>(candidates.size());
  for (const Tensor& c : candidates) KL_CHECK(c.numel() == t * d, "attn_res_read candidate shape");
#pragma omp parallel for if (t > 8)
  for (int64_t row = 0; row < t; ++row) {
    std::vector<float> logit(m);
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < m; ++i) {
      const float* v = candidates[i].f32() + row * d;
      double ss = 0.0, dot = 0.0;
      for (int64_t j = 0; j < d; ++j) {
        ss += static_cast<double>(v[j]) * v[j];
        dot += static_cast<double>(v[j]) * e.f32()[j];
      }
      logit[i] = static_cast<float>(dot) / std::sqrt(static_cast<float>(ss / static_cast<double>(d)) + eps);
      mx = std::max(mx, logit[i]);
    }
    float z = 0.0f;
    for (float& l : logit) z += (l = std::exp(l - mx));
    float* o = out.f32() + row * d;
    std::fill_n(o, d, 0.0f);
    for (int64_t i = 0; i < m; ++i) {
      const float pi = logit[i] / z;
      const float* v = candidates[i].f32() + row * d;
      for (int64_t j = 0; j < d; ++j) o[j] += pi * v[j];
    }
  }
}

}  // namespace klinear::cpu
