// AttnRes two-phase form (SPEC 7.3): the sealed blocks of an AttnRes block are summarised once per
// read site (phase 1: max logit M, normaliser Z and weighted sum N over the blocks), then each read
// merges that summary with the live partial sum p by an online-softmax step (phase 2). It equals
// the direct read of SPEC 7.1 (Backend::attn_res_read) over blocks + [p]; the fused GPU path
// follows this form, and the host reference here is what tests compare the two with.
#pragma once

#include <span>

#include "core/tensor.h"

namespace klinear {

struct AttnResStats {
  Tensor max_logit;  // [T]
  Tensor norm;       // [T]   Σ_i exp(ℓ_i − M)
  Tensor sum;        // [T, D] Σ_i exp(ℓ_i − M) · b_i
};

// Phase 1 over sealed blocks b_i [T, D] (host F32) for the effective query e [D].
AttnResStats attn_res_phase1(std::span<const Tensor> blocks, const Tensor& e, float eps);
// Phase 2: out [T, D] = the read over blocks + [partial]; partial may be null (the first read of
// a block, which has no partial candidate).
void attn_res_phase2(const AttnResStats& stats, const Tensor* partial, const Tensor& e, float eps, const Tensor& out);

}  // namespace klinear
