// The routed experts' GEMMs of a decode step (moe.cu's MoePath::kSwappedGemm) on CUTLASS's Hopper
// grouped kernel with the expert weights as the M operand, described on the device.
#pragma once

#include <cstdint>
#include <string>

#include "backend/cuda/backend.h"

namespace klinear::cuda {

// out[r] = w[e] · in[r] for every row r of expert e, every expert in one launch.
struct ExpertGemmArgs {
  const void* in;          // [rows, k] bf16: the slots' input rows, grouped by expert
  const void* w;           // [E, n, k] bf16: expert e's weight, n output features
  void* out;               // [rows, n] bf16
  const int32_t* offsets;  // [E + 1] on the device: expert e's rows are offsets[e] .. offsets[e + 1]
  int64_t num_experts;     // E
  int64_t n, k;
};

// Whether expert_gemm_sm90 runs weights w [E, n, k] of this dtype: BF16, n and k multiples of 8
// elements, w 16-byte aligned (what TMA needs of every expert's rows). `in` and `out` must be
// 16-byte aligned too (arena blocks are).
bool expert_gemm_sm90_fits(DType dtype, int64_t n, int64_t k, const void* w);

// One kernel writes each expert's problem (n × its row count × k) into the step arena from
// `offsets`, then CUTLASS's grouped GEMM runs over all E problems (empty experts have no tiles). No
// host synchronisation and no upload: a CUDA graph can capture it.
void expert_gemm_sm90(CudaBackend& be, const ExpertGemmArgs& a, const std::string& what);

}  // namespace klinear::cuda
