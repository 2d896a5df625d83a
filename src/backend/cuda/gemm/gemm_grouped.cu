// The BF16 grouped GEMM of gemm_grouped (gemm.cu): CUTLASS's Hopper ptr-array grouped kernel
// (cutlass_grouped.cuh), one persistent launch over every problem of the list.
//
// Math: for each problem g, C_g[m_g, n_g] = A_g[m_g, k_g] · B_gᵀ, A row-major (lda), B stored
// [n_g, k_g] row-major (ldb), C row-major (ldc).
//
// Shapes (an MoE layer of Kimi-Linear-48B at a 2,048-token prefill step, moe.cu's per-expert path):
// 256 problems (experts) of m ≈ 64 rows on average (0..~300; empty experts are not passed),
// gate/up n = 2,048, k = 2,304; down n = 2,304, k = 1,024. At 8,192-token steps m ≈ 256.
//
// Cost and floor at 2,048 tokens (16,384 routed rows): gate/up 2·16,384·2,048·2,304 ≈ 155 GFLOP,
// down ≈ 77 GFLOP: ~0.30 ms at the H200's ~770 TFLOP/s dense BF16. But every expert's weights are
// read once per layer, 256·(2,048·2,304 + 2,304·1,024)·2 B ≈ 3.6 GB: ~0.86 ms at the 4.2 TB/s a copy
// reaches on the H200 (docs/PERF.md), so at m ≈ 64 (64 FLOP per weight byte) the layer is bound by
// weight bytes, floor ~0.9 ms with the activations; cuBLAS's grouped call measured ~1.5 ms (150-180 TFLOP/s). At 8,192 tokens (m ≈ 256)
// it is compute-bound: ~928 GFLOP, floor ~1.2 ms.
//
// Its configuration (cutlass_grouped.cuh: the cooperative mainloop, whose producer warp runs ahead
// into the next tile while the consumers store the last, so the weight stream does not stall on
// epilogues; 1×1 clusters, since a 2×1 cluster would leave a CTA idle on every expert of ≤ 128 rows
// and a 1×2 cluster only multicasts the token operand):
// - tile 128×256×64: the rows of one expert (m ≲ 128 at 2k-token steps) fit one M tile, so each
//   weight tile is read from HBM once; 256 weight rows per tile halve the re-reads of the (small)
//   token operand against 128, and both 2,048 and 2,304 are multiples of 256. It is CUTLASS's
//   large-tile BF16 choice for Hopper (example 57's FP8 tiles are 128 K-bytes deep, 64 in BF16);
// - D row-major: C[m, n] of the tokens' rows.
// Measured against these floors: docs/perf-log.md, "Notes moved from the CUDA sources".
//
// Per call: the problem shapes, the three pointer arrays and the three stride arrays are packed
// into one buffer uploaded into the step arena (cutlass_grouped.cuh launches it). Not capturable
// (an upload).
#include <cstring>
#include <vector>

#include "backend/cuda/gemm/cutlass_grouped.cuh"
#include "backend/cuda/gemm/gemm.h"

namespace klinear::cuda {

namespace {

using namespace cutlass_grouped;
using Prefill = Config<cute::Shape<cute::_128, cute::_256, cute::_64>, cutlass::layout::RowMajor>;

}  // namespace

bool gemm_grouped_path_fits(GemmGroupedPath path, std::span<const GemmArgs> problems) {
  if (path == GemmGroupedPath::kCublas) return true;
  for (const GemmArgs& g : problems) {
    const bool fits = g.ab_dtype == DType::kBF16 && g.c_dtype == DType::kBF16 && g.n % kAlignment == 0 &&
                      g.k % kAlignment == 0 && g.lda % kAlignment == 0 && g.ldb % kAlignment == 0 &&
                      g.ldc % kAlignment == 0 && aligned16(g.a) && aligned16(g.b) && aligned16(g.c);
    if (!fits) return false;
  }
  return !problems.empty();
}

void CudaBackend::gemm_grouped_cutlass(std::span<const GemmArgs> problems, const std::string& what) {
  const size_t groups = problems.size();
  const Packing<Prefill> pack(groups);
  std::vector<int64_t> words((pack.bytes + 7) / 8, 0);
  const Arrays<Prefill> host(pack, reinterpret_cast<char*>(words.data()));
  for (size_t i = 0; i < groups; ++i) {
    const GemmArgs& g = problems[i];
    host.set(static_cast<int64_t>(i), {static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k)}, g.a,
             g.lda, g.b, g.ldb, g.c, g.ldc);
  }
  const Tensor dev = to_device(Tensor::wrap(DType::kI64, {static_cast<int64_t>(words.size())}, words.data(), nullptr,
                                            Device::kCpu),
                               DType::kI64);
  launch<Prefill>(*this, static_cast<int>(groups), static_cast<char*>(dev.data()), host.shapes, what);
}

}  // namespace klinear::cuda
