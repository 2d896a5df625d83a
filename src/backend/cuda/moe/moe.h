// The four ways the CUDA backend runs the routed experts (MODEL.md 3.4). moe_experts picks one by the
// token count and the operands (moe_path_for); the benchmark times each to place the thresholds.
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
  // The routing stays on the device too: the plan also writes each expert's slot range, the tokens'
  // rows are gathered in that order, and CUTLASS's grouped GEMM (moe_gemm_sm90.cu) runs each
  // projection with the expert weights as the wide operand, the GLU and the combine in launches of
  // their own. Capturable; BF16 with widths that are multiples of 8 only.
  kSwappedGemm,
  // The routing stays on the device, unplanned: each (slot, feature) is a warp's matrix-vector
  // product of the slot's expert row and its token, gate and up with the GLU in one launch, down
  // with the weighted combine in a second (a warp per output feature walks the token's picks in
  // order). Every pick reads its expert's rows, shared or not: the small decode batches
  // (kMoeRowsMaxTokens), where the grouped path's plan and tiles cost more than they save; shared
  // experts join both launches. BF16 with widths of multiples of 8.
  kRows,
  // The routing is read back to the host (a synchronisation) to plan one grouped GEMM launch per
  // projection over the active experts (CudaBackend::gemm_grouped): the prefill path, where the
  // GEMMs are compute-bound.
  kPerExpertGemm,
};

// The largest token count the paths planned on the device serve: the largest decode batch, which a CUDA graph
// replays (the per-expert path reads the routing to the host, so it cannot be captured). Above it
// the per-expert GEMMs are faster; up to it the device-planned paths keep the step capturable
// (measured: docs/perf-log.md, "Notes moved from the CUDA sources").
inline constexpr int64_t kMoeGroupedMaxTokens = 256;

// The smallest token count that runs on the swapped path. From 16 tokens the swapped GEMM beats the
// grouped path; below, its extra launches cost more (measured: docs/perf-log.md, "Notes moved from
// the CUDA sources").
inline constexpr int64_t kMoeSwappedMinTokens = 16;

// The largest token count that runs on the rows path. Up to 8 tokens it is ahead of or level with
// the grouped path, and it saves the shared expert's three launches (measured: docs/perf-log.md,
// "Notes moved from the CUDA sources").
inline constexpr int64_t kMoeRowsMaxTokens = 8;

// "grouped", "swapped GEMM", "rows" or "per-expert GEMM".
const char* moe_path_name(MoePath path);

// Whether `path` can run experts w13 [E, 2F, D] and w2 [E, D_out, F] on x [N, D].
bool moe_path_fits(MoePath path, const Tensor& x, const ExpertMatrix& w13, const ExpertMatrix& w2);

// The path moe_experts takes for these operands.
MoePath moe_path_for(const Tensor& x, const ExpertMatrix& w13, const ExpertMatrix& w2);

// moe_experts (Backend interface, same arguments) on the given path; aborts naming the operands when
// the path does not fit them (moe_path_fits).
void moe_experts_on(CudaBackend& be, MoePath path, const Tensor& x, const Tensor& idx, const Tensor& weights,
                    const ExpertMatrix& w13, const ExpertMatrix& w2, const GluParams& p, const Tensor& out,
                    const SharedExperts& shared);

}  // namespace klinear::cuda
