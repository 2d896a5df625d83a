// Device-side helpers for the CUDA op files: element access by run-time dtype (F32 or BF16, so the
// small memory-bound ops need one instantiation, not one per dtype pair), warp and block
// reductions, and launch sizes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backend/cuda/backend.h"

namespace klinear::cuda {

// A float tensor's data read as float whatever its dtype (F32 or BF16).
struct In {
  const void* p;
  bool bf16;
  __device__ __forceinline__ float operator[](int64_t i) const {
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
  }
};
// A float tensor's data written from float (rounded to nearest even for BF16).
struct Out {
  void* p;
  bool bf16;
  __device__ __forceinline__ void set(int64_t i, float v) const {
    if (bf16)
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
    else
      static_cast<float*>(p)[i] = v;
  }
  __device__ __forceinline__ float operator[](int64_t i) const { return In{p, bf16}[i]; }
};

// Host side: views of a tensor for the kernels; aborts unless it is F32 or BF16 on this device.
In in(const Tensor& t, const char* what);
Out out(const Tensor& t, const char* what);

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats; the call ends with a barrier so scratch can be reused.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  t = warp_sum(t);
  __syncthreads();
  return t;
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// The GLU of one gate/up pair (SPEC 3.2): the glu op and the MoE experts' epilogue.
__device__ __forceinline__ float glu_value(float g, float u, Activation kind, float beta, bool has_linear_beta,
                                           float linear_beta) {
  if (kind == Activation::kSilu) return g * sigmoid_f(g) * u;
  const float ag = beta * tanhf(g / beta) * sigmoid_f(g);
  return ag * (has_linear_beta ? linear_beta * tanhf(u / linear_beta) : u);
}

// Index of the sequence owning row `row` of a step: the b with cu[b] ≤ row < cu[b+1].
__device__ __forceinline__ int seq_of_row(const int32_t* cu, int num_seqs, int64_t row) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Programmatic dependent launch: `kernel` may start while the kernel before it on the stream is still
// running (once every block of that one has called cudaTriggerProgrammaticLaunchCompletion or
// exited); it must call cudaGridDependencySynchronize before reading anything that one writes.
template <typename... Params, typename... Args>
void launch_dependent(cudaStream_t stream, void (*kernel)(Params...), dim3 grid, dim3 block, const std::string& what,
                      Args... args) {
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = stream;
  cfg.attrs = &overlap;
  cfg.numAttrs = 1;
  KL_CUDA(cudaLaunchKernelEx(&cfg, kernel, args...), what);
}

inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 32 ? 65535 * 32 : b));
}

}  // namespace klinear::cuda
