// What every CUDA kernel file shares, below the PTX primitives (ptx.cuh): element access by run-time
// dtype (In / Out: F32 or BF16, so the small memory-bound ops need one instantiation, not one per
// dtype pair; values rounded once, to nearest even, where BF16 is stored), warp and block
// reductions (fp32), the scalar functions more than one family computes (sigmoid, softplus, the GLU,
// the KDA gate: MODEL.md's formulas), the row-chunk loads and stores of the row-wise kernels, the
// programmatic dependent launch (PDL, KLINEAR_PDL), the held-block frees around a graph capture,
// launch sizes, and the names of a family's kernel paths (path_name). Ownership: nothing here allocates; views borrow the tensors' device memory for a
// launch. Host-side checks abort with the op's name and the file and line (KL_CHECK).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "backend/cuda/backend.h"

namespace klinear::cuda {

// The name of a kernel path (a family's path enum, DESIGN.md's kernel dispatch): names[path], the
// names in the enum's order.
template <class Path, std::size_t N>
constexpr const char* path_name(Path path, const char* const (&names)[N]) {
  const auto i = static_cast<std::size_t>(path);
  return i < N ? names[i] : "?";
}

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

// The eight bf16 values of a 16-byte load, as floats.
__device__ __forceinline__ void unpack_bf16x8(const uint4& raw, float (&v)[8]) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}

// x as a tensor of that dtype stores it (rounded to bf16 when `bf16`), back as a float.
__device__ __forceinline__ float stored(float x, bool bf16) { return bf16 ? __bfloat162float(__float2bfloat16_rn(x)) : x; }

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

// rsqrt(mean(x[base, base + c)²) + eps) over the block: fp32 squares, each thread's columns j ≡
// threadIdx.x (mod blockDim.x) in order, then block_sum. rms_norm and the MLA cache write share it,
// so both store the same bits for the same row and block size.
__device__ __forceinline__ float block_inv_rms(In x, int64_t base, int64_t c, float eps, float* scratch) {
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float v = x[base + j];
    ss += v * v;
  }
  return rsqrtf(block_sum(ss, scratch) / static_cast<float>(c) + eps);
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// The KDA decay gate of one channel (MODEL.md 4.3): g from x (the projection plus dt_bias) and
// a = e^{A_log}, −a·softplus(x) or lower_bound·σ(a·x). The gate op and the fused decode.
__device__ __forceinline__ float kda_gate_value(KdaGate kind, float a, float x, float lower_bound) {
  return kind == KdaGate::kSoftplus ? -a * softplus(x) : lower_bound * sigmoid_f(a * x);
}

// The GLU of one gate/up pair (MODEL.md 3.2): the glu op and the MoE experts' epilogue.
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

// Programmatic dependent launch (PDL): `kernel` may start while the kernel before it on the stream
// is still running, once every block of that one has called cudaTriggerProgrammaticLaunchCompletion
// (pdl_enter) or exited. It must call cudaGridDependencySynchronize before it reads or writes
// anything an earlier kernel writes or reads; what it does before (loading weights no kernel writes)
// overlaps that kernel's tail, and its blocks are resident when the wait returns. A batch-1 decode
// step of the 48B runs ~370 launches, most of a few µs: the overlap took 4-5 % off it (docs/perf-log.md,
// twelfth round).
// KLINEAR_PDL=off launches them plainly (each then waits for the whole kernel before; pdl_enter
// is a no-op): the overlap timed against none in one build (docs/perf-log.md, twelfth round).
inline bool pdl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KLINEAR_PDL");
    return v == nullptr || std::string_view(v) != "off";
  }();
  return on;
}

template <typename... Params, typename... Args>
void launch_dependent(cudaStream_t stream, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                      const std::string& what, Args... args) {
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &overlap;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  KL_CUDA(cudaLaunchKernelEx(&cfg, kernel, args...), what);
}

// The first statement of a kernel launched through launch_dependent that reads or writes nothing
// before it: wait for the kernel before (its writes visible), then let the next one launch (its
// blocks wait in their own pdl_enter until this grid is done). A no-op under a plain launch.
__device__ __forceinline__ void pdl_enter() {
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
}

// ---- Row-wise kernels in chunks of kRowChunk consecutive elements of a row (conv, glu, the MoE
// combine; gather_rows copies rows in raw units the same way): a thread owns a chunk of a row and
// walks rows, so per element there is no 64-bit division and, where the launch allows it (`vec`: the data 16-byte aligned and every row width a
// multiple of kRowChunk, so every chunk starts 16-byte aligned), a chunk moves as one 16-byte access
// for BF16, two for F32. Otherwise it moves element by element, its first n ≤ kRowChunk elements.
// Either way the values are those of In / Out element access, bit for bit.
constexpr int kRowChunk = 8;

__device__ __forceinline__ void load_chunk(In t, int64_t i, int n, bool vec, float (&v)[kRowChunk]) {
  if (vec && t.bf16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(t.p) + i);
    const auto* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int k = 0; k < kRowChunk / 2; ++k) {
      const float2 f = __bfloat1622float2(h[k]);
      v[2 * k] = f.x, v[2 * k + 1] = f.y;
    }
  } else if (vec) {
    const auto* q = reinterpret_cast<const float4*>(static_cast<const float*>(t.p) + i);
    const float4 a = q[0], b = q[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int e = 0; e < kRowChunk; ++e)
      if (e < n) v[e] = t[i + e];
  }
}

__device__ __forceinline__ void store_chunk(Out t, int64_t i, int n, bool vec, const float (&v)[kRowChunk]) {
  // The vector stores through __stwb (st.global.wb.v4, the default cache policy): written as plain
  // stores, the compiler split them into 4-byte ones in kda_decode's prelude (not in conv's kernel).
  if (vec && t.bf16) {
    auto pair = [&](int k) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
      return *reinterpret_cast<const unsigned*>(&h);
    };
    __stwb(reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(t.p) + i),
           make_uint4(pair(0), pair(1), pair(2), pair(3)));
  } else if (vec) {
    auto* q = reinterpret_cast<float4*>(static_cast<float*>(t.p) + i);
    __stwb(q, make_float4(v[0], v[1], v[2], v[3]));
    __stwb(q + 1, make_float4(v[4], v[5], v[6], v[7]));
  } else {
#pragma unroll
    for (int e = 0; e < kRowChunk; ++e)
      if (e < n) t.set(i + e, v[e]);
  }
}

// The elements of the chunk starting at column `col` of a row `width` wide.
__device__ __forceinline__ int chunk_size(int64_t col, int64_t width) {
  return width - col < kRowChunk ? static_cast<int>(width - col) : kRowChunk;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Device blocks (the step arena's, persistent tensors) whose last holder lets go between
// hold_block_frees() and the matching free_held_blocks() are freed by the latter (memory.cu): a
// graph capture is bracketed by them, since a cudaFree inside a capture invalidates it, and a
// body drops blocks there when it replaces what it kept from the run before (StepExecutor::run_fixed
// keeps each bucket's outputs; the arena's blocks are merged at begin_step after a run grew it).
void hold_block_frees();
void free_held_blocks();

// Launch shape of a row-wise kernel: x over a row's `units` (chunks or copy units), in blocks of at
// most `max_threads` (a multiple of 32) sized so the last one is not mostly idle; y over `runs`
// (rows or runs of rows), at most 65535, the kernel striding over the rest
// (for (run = blockIdx.y; run < runs; run += gridDim.y)).
struct RowGrid {
  dim3 grid, block;
};
inline RowGrid row_grid(int64_t units, int64_t runs, int max_threads = 256) {
  const int64_t warps = units > 32 ? (units + 31) / 32 : 1, per_block = max_threads / 32;
  const int64_t blocks = (warps + per_block - 1) / per_block, threads = 32 * ((warps + blocks - 1) / blocks);
  const int64_t y = runs < 1 ? 1 : (runs < 65535 ? runs : 65535);  // no runs: one idle row of blocks
  return RowGrid{dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(y)), dim3(static_cast<unsigned>(threads))};
}

inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 32 ? 65535 * 32 : b));
}

}  // namespace klinear::cuda
