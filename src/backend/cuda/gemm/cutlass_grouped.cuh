// CUTLASS's Hopper ptr-array grouped GEMM, the one kernel family behind both grouped GEMMs of the
// backend: gemm_grouped.cu (the tokens as the M operand: prefill's per-expert GEMMs, problems listed
// on the host) and moe_gemm_sm90.cu (the expert weights as the M operand: decode's, problems
// described on the device).
//
// Math: for each problem g, D_g[m_g, n_g] = A_g[m_g, k_g] · B_gᵀ, A stored [m, k] and B stored
// [n, k] (both K-major: the "TN" GEMM wgmma reads straight from shared memory). BF16 in, fp32
// accumulation, BF16 out (D = 1·acc, no source C); D row-major or column-major by configuration.
//
// Both configurations use the cooperative warp-specialized mainloop (two consumer warpgroups split
// an M tile of 128, one producer warp issues the TMA loads and runs ahead into the next tile while
// the consumers store the last) on 1×1 clusters (the grouped tile scheduler rounds each problem's
// tile count up to the cluster shape). Each configuration costs minutes of nvcc on CI's 2 cores.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include <string>

#include "backend/cuda/common/device.cuh"

namespace klinear::cuda::cutlass_grouped {

using Element = cutlass::bfloat16_t;  // A, B and D
using Accumulator = float;
constexpr int kAlignment = 8;  // elements per 16 bytes: TMA's alignment of addresses and strides
using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;  // (m, n, k) per problem
using Shape3 = ProblemShape::UnderlyingProblemShape;

template <class TileShape, class LayoutD>
struct Config {
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, Accumulator,
      void, LayoutD*, kAlignment,  // no source C
      Element, LayoutD*, kAlignment, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<Element, Accumulator, void, Accumulator>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      Element, cutlass::layout::RowMajor*, kAlignment,     // A [m, k]
      Element, cutlass::layout::ColumnMajor*, kAlignment,  // B [n, k]: K-major, CUTLASS's "column-major K×N"
      Accumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
};

// The stride of a matrix with leading dimension `ld` (elements) in CUTLASS's stride type: the one
// dynamic mode of a K-major, row-major or column-major operand gets `ld`.
template <class Stride>
CUTLASS_HOST_DEVICE Stride leading_stride(int64_t ld) {
  Stride s{};
  if constexpr (cute::is_static_v<cute::remove_cvref_t<decltype(cute::get<1>(Stride{}))>>)
    cute::get<0>(s) = ld;
  else
    cute::get<1>(s) = ld;
  return s;
}

// The device arrays one launch reads, in one buffer: each section starts on a 16-byte boundary.
template <class C>
struct Packing {
  size_t shapes = 0, a = 0, b = 0, d = 0, stride_a = 0, stride_b = 0, stride_d = 0, bytes = 0;
  explicit Packing(size_t groups) {
    auto section = [&](size_t& at, size_t element_bytes) {
      at = bytes;
      bytes += (groups * element_bytes + 15) / 16 * 16;
    };
    section(shapes, sizeof(Shape3));
    section(a, sizeof(const Element*));
    section(b, sizeof(const Element*));
    section(d, sizeof(Element*));
    section(stride_a, sizeof(typename C::StrideA));
    section(stride_b, sizeof(typename C::StrideB));
    section(stride_d, sizeof(typename C::StrideD));
  }
};

// The arrays of a packed buffer at `base` (device or host memory), typed.
template <class C>
struct Arrays {
  Shape3* shapes;
  const Element** a;
  const Element** b;
  Element** d;
  typename C::StrideA* stride_a;
  typename C::StrideB* stride_b;
  typename C::StrideD* stride_d;
  CUTLASS_HOST_DEVICE Arrays(const Packing<C>& p, char* base)
      : shapes(reinterpret_cast<Shape3*>(base + p.shapes)),
        a(reinterpret_cast<const Element**>(base + p.a)),
        b(reinterpret_cast<const Element**>(base + p.b)),
        d(reinterpret_cast<Element**>(base + p.d)),
        stride_a(reinterpret_cast<typename C::StrideA*>(base + p.stride_a)),
        stride_b(reinterpret_cast<typename C::StrideB*>(base + p.stride_b)),
        stride_d(reinterpret_cast<typename C::StrideD*>(base + p.stride_d)) {}
  // Problem g: an [m, k] A at `a_ptr` (leading dimension lda), and so on.
  CUTLASS_HOST_DEVICE void set(int64_t g, Shape3 shape, const void* a_ptr, int64_t lda, const void* b_ptr, int64_t ldb,
                               void* d_ptr, int64_t ldd) const {
    shapes[g] = shape;
    a[g] = static_cast<const Element*>(a_ptr);
    b[g] = static_cast<const Element*>(b_ptr);
    d[g] = static_cast<Element*>(d_ptr);
    stride_a[g] = leading_stride<typename C::StrideA>(lda);
    stride_b[g] = leading_stride<typename C::StrideB>(ldb);
    stride_d[g] = leading_stride<typename C::StrideD>(ldd);
  }
};

// Launches configuration C over `groups` problems whose arrays are packed on the device at `dev`.
// `host_shapes` (may be null) lets CUTLASS size the grid to the tiles; without it the grid is one
// persistent block per SM and the problem shapes are read on the device only, so the launch can be
// captured in a graph with the arrays written by an earlier kernel. CUTLASS's workspace (its per-SM
// TMA descriptors) comes from the step arena: no cudaMalloc on the hot path.
template <class C>
void launch(CudaBackend& be, int groups, char* dev, const Shape3* host_shapes, const std::string& what) {
  using Gemm = typename C::Gemm;
  const Arrays<C> arr(Packing<C>(groups), dev);
  int device = 0;
  KL_CUDA(cudaGetDevice(&device), what);
  typename Gemm::Arguments args;
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {groups, arr.shapes, host_shapes};
  args.mainloop = {arr.a, arr.stride_a, arr.b, arr.stride_b};
  args.epilogue.ptr_C = nullptr;
  args.epilogue.ptr_D = arr.d;
  args.epilogue.dD = arr.stride_d;
  args.hw_info.device_id = device;
  args.hw_info.sm_count = be.num_sms();

  Gemm gemm;
  const cutlass::Status can = gemm.can_implement(args);
  KL_CHECK(can == cutlass::Status::kSuccess,
           what + ": CUTLASS grouped gemm cannot implement: " + cutlassGetStatusString(can));
  const size_t workspace_bytes = Gemm::get_workspace_size(args);
  const Tensor workspace = be.alloc(DType::kU8, {static_cast<int64_t>(workspace_bytes)});
  const cutlass::Status init = gemm.initialize(args, workspace_bytes ? workspace.data() : nullptr, be.stream());
  KL_CHECK(init == cutlass::Status::kSuccess,
           what + ": CUTLASS grouped gemm initialize: " + cutlassGetStatusString(init));
  const cutlass::Status ran = gemm.run(be.stream());
  KL_CHECK(ran == cutlass::Status::kSuccess, what + ": CUTLASS grouped gemm launch: " + cutlassGetStatusString(ran));
  KL_LAUNCHED(what);
}

}  // namespace klinear::cuda::cutlass_grouped
