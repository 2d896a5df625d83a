// The integer half of MXFP4 dequantization in registers (mxfp4.cuh), plain C++ so that the CPU
// tests check it bit for bit (tests/backend/cuda/mxfp4_bits_test.cc).
//
// A 32-bit word of a 32-value block holds values 8w .. 8w + 7, value 8w + i in nibble i (bits
// 4i .. 4i + 3: sign, then 2 exponent and 1 mantissa bits, MODEL.md 2.3). Nibbles i and i + 4 sit
// 16 bits apart, so one shift and two masks place both in a bf16x2 register: the sign on bf16's
// sign bit, the 3 magnitude bits on its 2 low exponent bits and top mantissa bit. That reads as the
// E2M1 value times 2^−126 (a subnormal for 0.5 and 0); a bf16x2 multiply by 2^(e − 1) then gives
// value · 2^(e − 127) exactly (two multiplies, by 2^126 and 2^(e − 127), when e > 128 puts 2^(e − 1)
// past bf16's range; e = 255 gives NaN). Activations are paired alike: (x_i, x_{i+4}).
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace klinear::cuda {

// bf16x2 bits (low half first) of (nibble 0 of t, nibble 4 of t), 2^−126 times their E2M1 values.
KL_HOST_DEVICE constexpr uint32_t mxfp4_pair_bits(uint32_t t) {
  return ((t << 6) & 0x01c001c0u) | ((t << 12) & 0x80008000u);
}

// The bf16x2 factors (both halves) that scale mxfp4_pair_bits' pairs by 2^126 · 2^(e − 127).
struct Mxfp4Scale {
  uint32_t first;   // 2^(e − 1), or 2^126 when e > 128, NaN when e = 255
  uint32_t second;  // 2^(e − 127) when 128 < e < 255, else 0 (no second multiply)
};

KL_HOST_DEVICE constexpr uint32_t bf16x2_pow2(int x) {  // 2^x for x in [−126, 127], both halves
  const uint32_t h = static_cast<uint32_t>(x + 127) << 7;
  return h | h << 16;
}

KL_HOST_DEVICE constexpr Mxfp4Scale mxfp4_scale(uint32_t e) {
  if (e == 255) return {0x7fc07fc0u, 0u};
  if (e <= 128) return {bf16x2_pow2(static_cast<int>(e) - 1), 0u};
  return {bf16x2_pow2(126), bf16x2_pow2(static_cast<int>(e) - 127)};
}

// The activations paired as the weights are: from eight bf16 values x0..x7 held as the pairs
// (x0, x1), (x2, x3), (x4, x5), (x6, x7) in a, b, c, d, out[i] = (x_i, x_{i+4}).
KL_HOST_DEVICE constexpr void x_pairs_0426(uint32_t a, uint32_t b, uint32_t c, uint32_t d, uint32_t (&out)[4]) {
  out[0] = (a & 0xffffu) | (c << 16);
  out[1] = (a >> 16) | (c & 0xffff0000u);
  out[2] = (b & 0xffffu) | (d << 16);
  out[3] = (b >> 16) | (d & 0xffff0000u);
}

}  // namespace klinear::cuda
