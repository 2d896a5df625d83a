// Warp-level tensor-core and async-copy primitives for the MLA attention kernels (sm_80+ PTX):
// 16-byte cp.async with zero fill, ldmatrix (plain and transposed) and the bf16 mma.sync
// m16n8k16 with fp32 accumulation. Fragment layouts are PTX's: for the mma, lane = 4·g + t holds
// A (16×16, row-major) rows g and g+8, columns 2t, 2t+1 and 2t+8, 2t+9; B (16×8, k × n) column g,
// rows 2t, 2t+1 and 2t+8, 2t+9; C (16×8) rows g and g+8, columns 2t, 2t+1.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace klinear::cuda::mma {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global → shared; `bytes` < 16 reads that many and zero-fills the rest (0: all zeros).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// The top of a two-stage tile loop: wait until every thread is done with the other stage, start
// `load_next` into it (when there is a next tile) and wait for this tile's copies, visible to all.
template <class LoadNext>
__device__ __forceinline__ void pipeline_step(bool has_next, LoadNext&& load_next) {
  __syncthreads();
  if (has_next) {
    load_next();
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

// Four 8×8 b16 matrices; lanes 8i .. 8i+7 give the row addresses of matrix i, r[i] its fragment.
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += a·b for one 16×8×16 bf16 tile, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as a bf16x2 register (lo in the low half), the A-operand packing of a C fragment.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace klinear::cuda::mma
