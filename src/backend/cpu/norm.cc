// CPU norms. rms_norm is MODEL.md 3.1 in fp32 (where HF's bf16 rounding before the weight multiply is
// the identity); gated_rms_norm is FLA's FusedRMSNormGated with a sigmoid gate (MODEL.md 4.7);
// add_rms_norm is the residual add followed by rms_norm (MODEL.md 6), row by row, with the same sums.
#include "backend/cpu/backend.h"

namespace klinear::cpu {

namespace {
float inv_rms(const float* x, int64_t c, float eps) {
  double ss = 0.0;
  for (int64_t j = 0; j < c; ++j) ss += static_cast<double>(x[j]) * x[j];
  return 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(c)) + eps);
}
}  // namespace

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
  const int64_t c = w.numel(), n = x.numel() / c;
  KL_CHECK(x.dim(-1) == c && y.numel() == x.numel(), "rms_norm shapes");
#pragma omp parallel for if (n > 16)
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x.f32() + r * c;
    float* yr = y.f32() + r * c;
    const float s = inv_rms(xr, c, eps);
    for (int64_t j = 0; j < c; ++j) yr[j] = w.f32()[j] * (xr[j] * s);
  }
}

void CpuBackend::add_rms_norm(const AddNormArgs& a) {
  const int64_t c = a.w.numel(), n = c == 0 ? 0 : a.h.numel() / c;
  KL_CHECK(a.h.dim(-1) == c && a.x.numel() == a.h.numel() && a.y.numel() == a.h.numel(), "add_rms_norm shapes");
  KL_CHECK(a.y.data() != a.h.data() && a.y.data() != a.x.data(), "add_rms_norm: y aliases an input");
#pragma omp parallel for if (n > 16)
  for (int64_t r = 0; r < n; ++r) {
    float* hr = a.h.f32() + r * c;
    const float* xr = a.x.f32() + r * c;
    float* yr = a.y.f32() + r * c;
    for (int64_t j = 0; j < c; ++j) hr[j] += xr[j];
    const float s = inv_rms(hr, c, a.eps);
    for (int64_t j = 0; j < c; ++j) yr[j] = a.w.f32()[j] * (hr[j] * s);
  }
}

void CpuBackend::gated_rms_norm(const Tensor& o, const Tensor& w, const Tensor& gate, float eps, const Tensor& y) {
  const int64_t d = w.numel(), n = o.numel() / d;
  KL_CHECK(o.numel() % d == 0 && gate.numel() == o.numel() && y.numel() == o.numel(), "gated_rms_norm shapes");
#pragma omp parallel for if (n > 16)
  for (int64_t r = 0; r < n; ++r) {
    const float* orow = o.f32() + r * d;
    const float* grow = gate.f32() + r * d;
    float* yr = y.f32() + r * d;
    const float s = inv_rms(orow, d, eps);
    for (int64_t j = 0; j < d; ++j) yr[j] = orow[j] * s * w.f32()[j] * sigmoidf(grow[j]);
  }
}

}  // namespace klinear::cpu
