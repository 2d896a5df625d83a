// The ways the CUDA backend runs a GEMM (gemm.cu) and a list of them (gemm_grouped, gemm.cu and
// gemm_grouped.cu). CudaBackend::gemm and gemm_grouped pick one by the operands (gemm_path_for,
// gemm_grouped_path_for); the tests and the benchmark name one (gemm_on, gemm_grouped_on).
#pragma once

#include <span>

#include "backend/cuda/backend.h"

namespace klinear::cuda {

// The kernel that runs one (batched) GEMM.
enum class GemmPath {
  // gemm.cu's `gemv_kernel`: a warp per output column, one row of A (the projections of a batch-1
  // decode step). A single problem (batch 1) of one row, B stored [n, k], not accumulating, BF16 A
  // and B, a BF16 or F32 C, A and B 16-byte aligned with k and ldb multiples of 8 elements, sizes in int.
  kSmallRow,
  // cuBLASLt, its algorithm cached per problem shape: every problem (the F32 exact mode's only
  // kernel; the reference the tests and benchmarks compare the others against).
  kCublasLt,
};

// The kernel that runs a list of GEMMs of different shapes in one launch.
enum class GemmGroupedPath {
  // CUTLASS's sm90 ptr-array grouped GEMM (gemm_grouped.cu): every problem BF16·BF16→BF16 with what
  // TMA needs, 16-byte aligned A, B and C, and n, k, lda, ldb, ldc multiples of 8 elements.
  kCutlass,
  // cublasGemmGroupedBatchedEx, or cuBLASLt problem by problem where an address is not 16-byte
  // aligned: every list.
  kCublas,
};

// "small-row" or "cuBLASLt".
const char* gemm_path_name(GemmPath path);

// Whether `path` can run `g`.
bool gemm_path_fits(GemmPath path, const GemmArgs& g);

// The path CudaBackend::gemm takes for `g`: the small-row kernel where it fits, else cuBLASLt.
GemmPath gemm_path_for(const GemmArgs& g);

// CudaBackend::gemm on the given path; aborts naming the problem when the path does not fit it
// (gemm_path_fits).
void gemm_on(CudaBackend& be, GemmPath path, const GemmArgs& g, const char* what);

// "CUTLASS" or "cuBLAS".
const char* gemm_grouped_path_name(GemmGroupedPath path);

// Whether `path` can run the list `problems` (CUTLASS: not an empty one).
bool gemm_grouped_path_fits(GemmGroupedPath path, std::span<const GemmArgs> problems);

// The path CudaBackend::gemm_grouped takes for `problems`: CUTLASS's where it fits, else cuBLAS.
GemmGroupedPath gemm_grouped_path_for(std::span<const GemmArgs> problems);

// CudaBackend::gemm_grouped on the given path; aborts naming the list when the path does not fit it
// (gemm_grouped_path_fits).
void gemm_grouped_on(CudaBackend& be, GemmGroupedPath path, std::span<const GemmArgs> problems, const char* what);

}  // namespace klinear::cuda
