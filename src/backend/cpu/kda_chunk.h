// The pieces of the CPU KDA that its forward (kda.cc) and backward (kda_backward.cc) share: the
// q/k preparation and the chunk factors of MODEL.md 4.6.
#pragma once

#include <cstdint>
#include <vector>

#include "core/kinds.h"

namespace klinear::cpu {

inline constexpr int64_t kChunk = 64;

// Copies head h of q/k [T, H, d] into contiguous fp32 rows [T, d], L2-normalised when `norm` is
// kInside, times `scale` (dk^-1/2 for q, 1 for k).
void normalized_head(const float* src, int64_t t_len, int64_t h_count, int64_t h, int64_t d, float scale,
                     KdaQkNorm norm, float* dst);

// One chunk of one head as MODEL.md 4.6 reads it: L ≤ 64 rows (a short last chunk equals zero padding).
struct HeadChunk {
  const float* kn;    // [L, dk] normalised keys
  const float* qn;    // [L, dk] normalised, scaled queries; null when Aqk is not wanted
  const float* g;     // [L, H, dk] rows of the step, head h at offset h·dk
  const float* v;     // [L, H, dv]
  const float* beta;  // [L, H]
  int64_t L, heads, h, dk, dv;
};

// What the state pass of a chunk needs (MODEL.md 4.6 steps 1-5), fp32 scratch for 64 rows:
//   G = cumsum(g); Lm[i,m] = β_i Σ_j k_i k_m e^{G_i−G_m} (m < i); (I + Lm)·[W | U] = β ⊙ [e^G⊙K | V];
//   Aqk[i,m] = Σ_j q_i k_m e^{G_i−G_m} (m ≤ i); Kd = (K⊙e^{G_last−G})ᵀ [dk, 64]; γ = e^{G_last}.
// The chunk then maps a state S to γ⊙S + Kd·(U − W·S).
struct ChunkFactors {
  ChunkFactors(int64_t dk, int64_t dv)
      : G(kChunk * dk), eg(kChunk * dk), lm(kChunk * kChunk), aqk(kChunk * kChunk), W(kChunk * dk), U(kChunk * dv),
        kd(dk * kChunk), gamma(dk), dec(dk) {}
  std::vector<float> G, eg, lm, aqk, W, U, kd, gamma, dec;
};
void chunk_factors(const HeadChunk& c, ChunkFactors& f);

// S [dk, n] (leading dimension n) ← γ⊙S + Kd·Vn for Vn [L, n]: the state step of a chunk.
void chunk_state_step(const ChunkFactors& f, int64_t L, int64_t dk, int64_t n, const float* vn, float* S);

}  // namespace klinear::cpu
