// MXFP4 expert weights in registers (MODEL.md 2.3), for the MoE kernels (moe.cu).
//
// Math: a 32-value block of a row is 16 packed bytes (value 2b in the low nibble of byte b, 2b + 1
// in the high one) and one E8M0 scale byte e: W = e2m1(nibble) · 2^(e − 127), NaN for e = 255.
// Every such product is a bf16 value exactly (3 significant bits) unless it leaves bf16's range,
// so dequantizing to bf16 and multiplying on bf16 tensor cores (or in fp32) computes what the
// widened weights compute.
// Form: mxfp4_bits.h (the integer half, checked on the CPU): a word of 8 nibbles becomes four bf16
// pairs (value i, value i + 4), scaled here by one or two bf16x2 multiplies; callers pair their
// activations the same way, which a dot product or mma allows since it sums over k.
// Cost: per pair three integer ops and one or two bf16x2 multiplies.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/moe/mxfp4_bits.h"

namespace klinear::cuda {

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// The bf16 pair (nibble 0 of t, nibble 4 of t), scaled.
__device__ __forceinline__ uint32_t mxfp4_pair(uint32_t t, const Mxfp4Scale& s) {
  uint32_t v = mxfp4_pair_bits(t);
  v = bf16x2_mul(v, s.first);
  if (s.second != 0u) v = bf16x2_mul(v, s.second);
  return v;
}

// out[i] = bf16 pair (value i, value i + 4) of the word q, scaled.
__device__ __forceinline__ void mxfp4_pairs(uint32_t q, const Mxfp4Scale& s, uint32_t (&out)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) out[i] = mxfp4_pair(q >> (4 * i), s);
}

// The activations paired as mxfp4_pairs pairs weights, from a 16-byte load of eight bf16 values.
__device__ __forceinline__ void x_pairs_0426(const uint4& x, uint32_t (&out)[4]) { x_pairs_0426(x.x, x.y, x.z, x.w, out); }

// One MXFP4 expert row: packed [in/2] and scales [in/32]; null: past the rows (reads as zeros).
struct Mxfp4Row {
  const uint8_t* q;
  const uint8_t* s;
};

// Value k of the row as a float (the f32 paths' scalar access).
__device__ __forceinline__ float mxfp4_value(const Mxfp4Row& r, int64_t k) {
  if (r.q == nullptr) return 0.0f;
  const uint32_t byte = r.q[k / 2];
  const uint32_t nib = k % 2 == 0 ? byte & 0xfu : byte >> 4;
  const uint32_t pair = mxfp4_pair(nib, mxfp4_scale(r.s[k / 32]));
  return __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(pair & 0xffffu)));
}

}  // namespace klinear::cuda
