// The BF16 grouped GEMM of gemm_grouped (gemm.cu): CUTLASS's Hopper ptr-array grouped kernel, one
// persistent launch over every problem of the list.
//
// Math: for each problem g, C_g[m_g, n_g] = A_g[m_g, k_g] · B_gᵀ, A row-major (lda), B stored
// [n_g, k_g] row-major (ldb), C row-major (ldc): both operands K-major (the "TN" GEMM wgmma reads
// straight from shared memory). BF16 in, fp32 accumulation, BF16 out (D = 1·acc, no source C).
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
// The one configuration compiled (each one costs minutes of nvcc on CI's 2 cores):
// - cooperative warp-specialized mainloop (two consumer warpgroups split a 128×256 tile, one
//   producer warp issues the TMA loads, which run ahead into the next tile while the consumers
//   store the last one: the weight stream does not stall on epilogues);
// - tile 128×256×64: the rows of one expert (m ≲ 128 at 2k-token steps) fit one M tile, so each
//   weight tile is read from HBM once; 256 weight rows per tile halve the re-reads of the (small)
//   token operand against 128, and both 2,048 and 2,304 are multiples of 256. It is CUTLASS's
//   large-tile BF16 choice for Hopper (example 57's FP8 tiles are 128 K-bytes deep, 64 in BF16);
// - cluster 1×1: the grouped tile scheduler rounds each problem's tile count up to the cluster
//   shape, so a 2×1 cluster would leave a CTA idle on every expert of ≤ 128 rows, and a 1×2 cluster
//   only multicasts the token operand (no weight bytes are shared between the tiles of an expert).
// Measured on the H200 (2026-12-01, ops_bench grouped_gemm, a 48B layer's gate/up + down): 0.99-1.01
// ms at m ≈ 64 (cuBLAS's grouped call 1.22-1.24; floor 0.92 ms of weight bytes) and 1.72-1.73 ms at
// m ≈ 256 (cuBLAS 3.58-3.91; floor 1.20 ms of compute); predicted 0.9-1.0 and 1.9-2.1.
//
// Per call: the problem shapes, the three pointer arrays and the three stride arrays are packed
// into one buffer uploaded into the step arena, and CUTLASS's workspace (its per-SM TMA
// descriptors) comes from the arena too: no cudaMalloc on the hot path. Not capturable (an upload).
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include <cstring>

#include "backend/cuda/device.cuh"

namespace klinear::cuda {

namespace {

using Element = cutlass::bfloat16_t;  // A, B and D
using Accumulator = float;
constexpr int kAlignment = 8;  // elements per 16 bytes: TMA's alignment of addresses and row strides
using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;
using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;  // (m, n, k) per problem

using Epilogue = cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, Accumulator,
    void, cutlass::layout::RowMajor*, kAlignment,  // no source C
    Element, cutlass::layout::RowMajor*, kAlignment, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<Element, Accumulator, void, Accumulator>>::CollectiveOp;

using Mainloop = cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
    Element, cutlass::layout::RowMajor*, kAlignment,     // A [m, k]
    Element, cutlass::layout::ColumnMajor*, kAlignment,  // B [n, k]: K-major, CUTLASS's "column-major K×N"
    Accumulator, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

using StrideA = Kernel::InternalStrideA;
using StrideB = Kernel::InternalStrideB;
using StrideD = Kernel::InternalStrideD;

// A row stride `ld` (elements) in CUTLASS's stride type of a matrix whose second mode is contiguous.
template <class Stride>
Stride row_stride(int64_t ld) {
  static_assert(cute::is_static_v<cute::remove_cvref_t<decltype(cute::get<1>(Stride{}))>>,
                "the contiguous mode of a K-major or row-major operand is static");
  Stride s{};
  cute::get<0>(s) = ld;
  return s;
}

// The device arrays of one call, in one buffer: each section starts on a 16-byte boundary.
struct Packing {
  size_t shapes = 0, a = 0, b = 0, d = 0, stride_a = 0, stride_b = 0, stride_d = 0, bytes = 0;
  explicit Packing(size_t groups) {
    auto section = [&](size_t& at, size_t element_bytes) {
      at = bytes;
      bytes += (groups * element_bytes + 15) / 16 * 16;
    };
    section(shapes, sizeof(ProblemShape::UnderlyingProblemShape));
    section(a, sizeof(const Element*));
    section(b, sizeof(const Element*));
    section(d, sizeof(Element*));
    section(stride_a, sizeof(StrideA));
    section(stride_b, sizeof(StrideB));
    section(stride_d, sizeof(StrideD));
  }
};

const char* status_name(cutlass::Status s) { return cutlassGetStatusString(s); }

}  // namespace

bool CudaBackend::cutlass_grouped_fits(std::span<const GemmArgs> problems) {
  for (const GemmArgs& g : problems) {
    const bool fits = g.ab_dtype == DType::kBF16 && g.c_dtype == DType::kBF16 && g.n % kAlignment == 0 &&
                      g.k % kAlignment == 0 && g.lda % kAlignment == 0 && g.ldb % kAlignment == 0 &&
                      g.ldc % kAlignment == 0 && aligned16(g.a) && aligned16(g.b) && aligned16(g.c);
    if (!fits) return false;
  }
  return !problems.empty();
}

void CudaBackend::gemm_grouped_cutlass(std::span<const GemmArgs> problems, const std::string& what) {
  KL_CHECK(cutlass_grouped_fits(problems), what + ": problems CUTLASS's grouped kernel cannot run");
  const size_t groups = problems.size();
  const Packing pack(groups);
  std::vector<int64_t> words((pack.bytes + 7) / 8, 0);
  auto* base = reinterpret_cast<char*>(words.data());
  std::vector<ProblemShape::UnderlyingProblemShape> shapes(groups);
  for (size_t i = 0; i < groups; ++i) {
    const GemmArgs& g = problems[i];
    shapes[i] = {static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k)};
    const StrideA sa = row_stride<StrideA>(g.lda);
    const StrideB sb = row_stride<StrideB>(g.ldb);
    const StrideD sd = row_stride<StrideD>(g.ldc);
    std::memcpy(base + pack.a + i * sizeof(void*), &g.a, sizeof(void*));
    std::memcpy(base + pack.b + i * sizeof(void*), &g.b, sizeof(void*));
    std::memcpy(base + pack.d + i * sizeof(void*), &g.c, sizeof(void*));
    std::memcpy(base + pack.stride_a + i * sizeof(StrideA), &sa, sizeof(StrideA));
    std::memcpy(base + pack.stride_b + i * sizeof(StrideB), &sb, sizeof(StrideB));
    std::memcpy(base + pack.stride_d + i * sizeof(StrideD), &sd, sizeof(StrideD));
  }
  std::memcpy(base + pack.shapes, shapes.data(), groups * sizeof(shapes[0]));
  const Tensor dev = to_device(Tensor::wrap(DType::kI64, {static_cast<int64_t>(words.size())}, words.data(), nullptr,
                                            Device::kCpu),
                               DType::kI64);
  char* d = static_cast<char*>(dev.data());

  Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {static_cast<int>(groups), reinterpret_cast<ProblemShape::UnderlyingProblemShape*>(d + pack.shapes),
                        shapes.data()};
  args.mainloop = {reinterpret_cast<const Element**>(d + pack.a), reinterpret_cast<StrideA*>(d + pack.stride_a),
                   reinterpret_cast<const Element**>(d + pack.b), reinterpret_cast<StrideB*>(d + pack.stride_b)};
  args.epilogue.ptr_C = nullptr;
  args.epilogue.ptr_D = reinterpret_cast<Element**>(d + pack.d);
  args.epilogue.dD = reinterpret_cast<StrideD*>(d + pack.stride_d);
  args.hw_info.device_id = device_;
  args.hw_info.sm_count = num_sms_;

  Gemm gemm;
  const cutlass::Status can = gemm.can_implement(args);
  KL_CHECK(can == cutlass::Status::kSuccess, what + ": CUTLASS grouped gemm cannot implement: " + status_name(can));
  const size_t workspace_bytes = Gemm::get_workspace_size(args);
  const Tensor workspace = alloc(DType::kU8, {static_cast<int64_t>(workspace_bytes)});
  const cutlass::Status init = gemm.initialize(args, workspace_bytes ? workspace.data() : nullptr, stream_);
  KL_CHECK(init == cutlass::Status::kSuccess, what + ": CUTLASS grouped gemm initialize: " + status_name(init));
  const cutlass::Status ran = gemm.run(stream_);
  KL_CHECK(ran == cutlass::Status::kSuccess, what + ": CUTLASS grouped gemm launch: " + status_name(ran));
  KL_LAUNCHED(what);
}

}  // namespace klinear::cuda
