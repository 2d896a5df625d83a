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
// replays (the per-expert path reads the routing to the host, so it cannot be captured). Measured
// on the H200 (ops_bench moe, 48B shape, 2026-12-01 18:07Z, every expert used), experts alone,
// grouped vs per-expert grouped-cuBLAS: N=256 1.098 (32 rows) vs 1.061 ms, N=512 1.564 (64 rows) vs
// 1.124 ms, N=1024 2.580 vs 1.254 ms; with CUTLASS's grouped kernel (21:48Z) the per-expert path
// is 1.016 ms at N=256 against the grouped path's 1.078, which stays for its graph capture.
inline constexpr int64_t kMoeGroupedMaxTokens = 256;

// The smallest token count that runs on the swapped path. Measured on the H200 (ops_bench moe, 48B
// shape, route + experts as a graph, 2026-12-02), grouped / swapped ms: N=1 0.0509 / 0.0651, N=8
// 0.2288 / 0.2341, N=16 0.3886 / 0.3488, N=32 0.6496 / 0.5731, N=64 0.8371 / 0.7643, N=128 0.9635
// / 0.8804, N=256 1.1035 / 0.9188 (floor 0.8635: 94 % against 78 %).
inline constexpr int64_t kMoeSwappedMinTokens = 16;

// The largest token count that runs on the rows path. Measured on the H200 (ops_bench moe, 48B
// shape, route + experts as a graph, 2026-12-02), grouped / rows ms: 12:15Z N=1 0.0507 / 0.0421,
// N=2 0.0824 / 0.0738, N=4 0.1393 / 0.1237, N=8 0.2262 / 0.2198 (swapped 0.2333); 12:41Z, with the
// down kernel held to 64 registers beside the shared row, N=1 0.0500 / 0.0454, N=2 0.0795 / 0.0791,
// N=4 0.1327 / 0.1314, N=8 0.2300 / 0.2315: a tie from 2, where rows still saves the shared
// expert's three launches.
inline constexpr int64_t kMoeRowsMaxTokens = 8;

// "grouped", "swapped GEMM", "rows" or "per-expert GEMM".
const char* moe_path_name(MoePath path);

// Whether `path` can run experts w13 [E, 2F, D] and w2 [E, D_out, F] on x [N, D].
bool moe_path_fits(MoePath path, const Tensor& x, const Tensor& w13, const Tensor& w2);

// The path moe_experts takes for these operands.
MoePath moe_path_for(const Tensor& x, const Tensor& w13, const Tensor& w2);

// moe_experts (Backend interface, same arguments) on the given path; aborts naming the operands when
// the path does not fit them (moe_path_fits).
void moe_experts_on(CudaBackend& be, MoePath path, const Tensor& x, const Tensor& idx, const Tensor& weights,
                    const Tensor& w13, const Tensor& w2, const GluParams& p, const Tensor& out,
                    const SharedExperts& shared);

}  // namespace klinear::cuda
