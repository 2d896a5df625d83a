// The routed experts' GEMMs of a decode step (MODEL.md 3.4): per expert e, out[rows of e] = in[rows of
// e] · w[e]ᵀ, computed as D = w[e] · in[rows of e]ᵀ ("swap AB") on CUTLASS's Hopper grouped kernel
// (cutlass_grouped.cuh), so the expert's output features fill the 128-row M tile of the wgmma and
// its few tokens the narrow N tile. D is stored column-major, which is out[rows, n] row-major.
//
// Shapes (Kimi-Linear-48B, one decode step of N sequences, 8 picks each): 256 problems per
// projection, each of an expert's m = its slot count (N = 256: ~8 on average, Poisson-spread, ~0-20;
// empty experts have no tiles): gate/up n = 2,048, k = 2,304; down n = 2,304, k = 1,024.
//
// Cost and floor at N = 256: every expert is picked, so the layer reads all weights, 256 · 3 ·
// 2,304 · 1,024 · 2 B ≈ 3.6 GB: 0.86 ms at 4.2 TB/s; the tokens' rows and outputs add ~40 MB. The
// FLOPs at a 32-token N tile (2 · 32 · 3.6 G / 2 ≈ 116 GFLOP, 0.15 ms at 770 TFLOP/s) hide under
// the loads; the tokens-as-M tiling of gemm_grouped.cu would compute 128-row tiles, 464 GFLOP,
// 0.6 ms. moe.cu's grouped kernel reaches 78 % of this floor at N = 256 (1.10 ms, ninth round):
// mma.sync from registers leaves too few loads in flight per SM. Here one producer warp keeps
// ~10 stages of 20 KB in flight through TMA, so the bound is the copy rate.
//
// Configuration: tile 128×32×64 (M: 128 weight rows, two consumer warpgroups of 64; N: 32 token
// slots, so an expert of ≤ 32 slots reads each weight tile once; K: 64, CUTLASS's BF16 depth),
// D column-major.
//
// At N = 1 its five more launches and CUTLASS's per-SM TMA descriptor set-up lose to moe.cu's
// grouped kernel, so moe.h's threshold is 16 tokens; measured: docs/perf-log.md, "Notes moved from
// the CUDA sources".
//
// The problems are written on the device (describe_kernel, a thread per expert, from the plan's
// offsets) into the step arena and launched without host shapes: CUTLASS then runs one persistent
// block per SM and reads the shapes on the device, so the launch is capturable.
#include "backend/cuda/moe/moe_gemm_sm90.h"

#include "backend/cuda/gemm/cutlass_grouped.cuh"

namespace klinear::cuda {

namespace {

using namespace cutlass_grouped;
using Decode = Config<cute::Shape<cute::_128, cute::_32, cute::_64>, cutlass::layout::ColumnMajor>;

__global__ void describe_kernel(ExpertGemmArgs a, Packing<Decode> pack, char* dev) {
  const int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (e >= a.num_experts) return;
  const Arrays<Decode> arr(pack, dev);
  const int64_t r0 = a.offsets[e], rows = a.offsets[e + 1] - r0;
  const auto* w = static_cast<const Element*>(a.w) + e * a.n * a.k;
  const auto* in = static_cast<const Element*>(a.in) + r0 * a.k;
  auto* out = static_cast<Element*>(a.out) + r0 * a.n;
  arr.set(e, {static_cast<int>(a.n), static_cast<int>(rows), static_cast<int>(a.k)}, w, a.k, in, a.k, out, a.n);
}

}  // namespace

bool expert_gemm_sm90_fits(DType dtype, int64_t n, int64_t k, const void* w) {
  return dtype == DType::kBF16 && n % kAlignment == 0 && k % kAlignment == 0 && aligned16(w);
}

void expert_gemm_sm90(CudaBackend& be, const ExpertGemmArgs& a, const std::string& what) {
  KL_CHECK(expert_gemm_sm90_fits(DType::kBF16, a.n, a.k, a.w) && aligned16(a.in) && aligned16(a.out) &&
               a.num_experts > 0 &&
               a.num_experts <= INT_MAX && a.n <= INT_MAX && a.k <= INT_MAX,
           what + ": operands CUTLASS's grouped kernel cannot run (n " + std::to_string(a.n) + ", k " +
               std::to_string(a.k) + ", " + std::to_string(a.num_experts) + " experts)");
  const Packing<Decode> pack(a.num_experts);
  const Tensor arrays = be.alloc(DType::kU8, {static_cast<int64_t>(pack.bytes)});
  char* dev = static_cast<char*>(arrays.data());
  constexpr int kThreads = 256;
  describe_kernel<<<static_cast<unsigned>((a.num_experts + kThreads - 1) / kThreads), kThreads, 0, be.stream()>>>(
      a, pack, dev);
  KL_LAUNCHED(what + " (describe)");
  launch<Decode>(be, static_cast<int>(a.num_experts), dev, nullptr, what);
}

}  // namespace klinear::cuda
