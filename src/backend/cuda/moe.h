// The two ways the CUDA backend runs the routed experts (SPEC 3.4). moe_experts picks one by the
// token count (moe_path_for); the benchmark times both to place the threshold.
#pragma once

#include <cstdint>

#include "backend/cuda/backend.h"

namespace klinear::cuda {

enum class MoePath {
  // The routing stays on the device: a one-block launch plans the step (which experts are picked,
  // their slots), one launch runs gate/up with the GLU in its epilogue, one down with the weighted
  // combine. No host synchronisation; the grids depend only on N and the weight shapes, so a decode
  // step that runs it can be captured in a CUDA graph.
  kGrouped,
  // The routing is read back to the host (a synchronisation) to plan one grouped GEMM launch per
  // projection over the active experts (CudaBackend::gemm_grouped): the prefill path, where the
  // GEMMs are compute-bound.
  kPerExpertGemm,
};

// The largest token count the grouped path serves: the largest decode batch, which a CUDA graph
// replays (the per-expert path reads the routing to the host, so it cannot be captured). Measured
// on the H200 (ops_bench moe, 48B shape, 2026-12-01 18:07Z, every expert used), experts alone,
// grouped vs per-expert grouped-cuBLAS: N=256 1.098 (32 rows) vs 1.061 ms, N=512 1.564 (64 rows) vs
// 1.124 ms, N=1024 2.580 vs 1.254 ms; with CUTLASS's grouped kernel (21:48Z) the per-expert path
// is 1.016 ms at N=256 against the grouped path's 1.078, which stays for its graph capture.
inline constexpr int64_t kMoeGroupedMaxTokens = 256;

// The path moe_experts takes for n tokens routed to num_experts experts (any number per token).
MoePath moe_path_for(int64_t n, int64_t num_experts);

// moe_experts (Backend interface, same arguments) on the given path; kGrouped aborts naming the
// shape when num_experts is beyond what its planning launch holds in shared memory.
void moe_experts_on(CudaBackend& be, MoePath path, const Tensor& x, const Tensor& idx, const Tensor& weights,
                    const Tensor& w13, const Tensor& w2, const GluParams& p, const Tensor& out);

}  // namespace klinear::cuda
