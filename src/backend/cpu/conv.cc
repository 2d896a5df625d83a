// CPU short convolution (MODEL.md 4.2): causal depthwise conv over time + SiLU of each sequence,
// continuing from its state slot, which holds the last Kc−1 pre-conv inputs ([Kc−1, C], oldest first).
#include <vector>

#include "backend/cpu/backend.h"

namespace klinear::cpu {

void CpuBackend::short_conv(const ConvArgs& a, const SeqLayout& layout) {
  const int64_t c = a.x.dim(1), kc = a.w.dim(1);
  KL_CHECK(a.w.dim(0) == c && a.states.dim(1) == kc - 1 && a.states.dim(2) == c && a.out.numel() == a.x.numel() &&
               a.x.dim(0) == layout.num_rows(),
           "short_conv shapes x " + shape_to_string(a.x.shape()) + " w " + shape_to_string(a.w.shape()) + " states " +
               shape_to_string(a.states.shape()));
  for (int64_t b = 0; b < layout.num_seqs(); ++b) {
    const int64_t r0 = layout.cu_seqlens[b], t_len = layout.new_tokens(b);
    // window = [state ; x] of (Kc−1 + T) rows; output t uses rows t .. t+Kc−1.
    const float* xs = a.x.f32() + r0 * c;
    float* st = a.states.f32() + layout.slots[b] * (kc - 1) * c;
    float* out = a.out.f32() + r0 * c;
    auto input = [&](int64_t row, int64_t ch) { return row < kc - 1 ? st[row * c + ch] : xs[(row - (kc - 1)) * c + ch]; };
#pragma omp parallel for if (t_len * c > 4096)
    for (int64_t ch = 0; ch < c; ++ch) {
      const float* wc = a.w.f32() + ch * kc;
      for (int64_t t = 0; t < t_len; ++t) {
        float acc = 0.0f;
        for (int64_t j = 0; j < kc; ++j) acc += wc[j] * input(t + j, ch);
        out[t * c + ch] = acc * sigmoidf(acc);
      }
    }
    // The state after p rows is rows [p, p + Kc−1) of the window: first the snapshots, then the
    // slot's own new state (p = T), which overwrites the history the window reads.
    auto state_after = [&](int64_t p, float* dst) {
      std::vector<float> next(static_cast<size_t>((kc - 1) * c));
      for (int64_t r = 0; r < kc - 1; ++r)
        for (int64_t ch = 0; ch < c; ++ch) next[r * c + ch] = input(p + r, ch);
      std::copy(next.begin(), next.end(), dst);
    };
    for (size_t k = 0; k < layout.snap_seq.size(); ++k)
      if (layout.snap_seq[k] == b) state_after(layout.snap_pos[k], a.states.f32() + layout.snap_slot[k] * (kc - 1) * c);
    state_after(t_len, st);
  }
}

}  // namespace klinear::cpu
