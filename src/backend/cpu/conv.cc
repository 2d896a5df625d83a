// CPU short convolution (SPEC 4.2): causal depthwise conv over time + SiLU, continuing from a
// state that holds the last Kc−1 pre-conv inputs ([Kc−1, C], oldest first).
#include <vector>

#include "backend/cpu/backend.h"

namespace klinear::cpu {

void CpuBackend::short_conv(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& out) {
  const int64_t t_len = x.dim(0), c = x.dim(1), kc = w.dim(1);
  KL_CHECK(w.dim(0) == c && state.dim(0) == kc - 1 && state.dim(1) == c && out.numel() == x.numel(),
           "short_conv shapes x " + shape_to_string(x.shape()) + " w " + shape_to_string(w.shape()) + " state " +
               shape_to_string(state.shape()));
  // window = [state ; x] of (Kc−1 + T) rows; output t uses rows t .. t+Kc−1.
  const float* xs = x.f32();
  const float* st = state.f32();
  auto input = [&](int64_t row, int64_t ch) { return row < kc - 1 ? st[row * c + ch] : xs[(row - (kc - 1)) * c + ch]; };
#pragma omp parallel for if (t_len * c > 4096)
  for (int64_t ch = 0; ch < c; ++ch) {
    const float* wc = w.f32() + ch * kc;
    for (int64_t t = 0; t < t_len; ++t) {
      float acc = 0.0f;
      for (int64_t j = 0; j < kc; ++j) acc += wc[j] * input(t + j, ch);
      out.f32()[t * c + ch] = acc * sigmoidf(acc);
    }
  }
  // New state: the last Kc−1 rows of the window.
  std::vector<float> next(static_cast<size_t>((kc - 1) * c));
  for (int64_t r = 0; r < kc - 1; ++r)
    for (int64_t ch = 0; ch < c; ++ch) next[r * c + ch] = input(t_len + r, ch);
  std::copy(next.begin(), next.end(), state.f32());
}

}  // namespace klinear::cpu
