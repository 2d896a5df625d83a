// SequenceState: everything one sequence carries between forward steps (SPEC 8 "Decode state").
// KDA layers: the conv state [Kc−1, 3P] (the last pre-conv q/k/v rows) and the recurrent state
// S [H, dk, dv] (fp32, K-first). MLA layers: the latent cache (c after kv_a_layernorm, [Tc, c])
// and the shared key part k_r ([Tc, r]) of every past token. AttnRes needs nothing across tokens.
//
// The caches grow by doubling; the paged, batched cache manager of the serving runtime replaces
// this per-sequence storage without changing the layer math.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace klinear {

struct KdaLayerState {
  Tensor conv;       // [Kc−1, 3P]
  Tensor recurrent;  // [H, dk, dv]
};

struct MlaLayerState {
  Tensor latent;  // [capacity, c]; rows [0, tokens) valid
  Tensor k_r;     // [capacity, r]
};

struct SequenceState {
  int64_t tokens = 0;  // tokens already processed
  std::vector<KdaLayerState> kda;  // indexed by layer (undefined for MLA layers)
  std::vector<MlaLayerState> mla;  // indexed by layer (undefined for KDA layers)
};

}  // namespace klinear
