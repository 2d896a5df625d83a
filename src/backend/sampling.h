// The per-element arithmetic of Backend::sample (backend.h, SampleArgs), written once for the CPU
// and the CUDA implementations so that both pick the same id for the same logits and draw:
// weights are integers (exact sums in any order), the order key is an integer, the random bits
// come from core/counter_rng.h. Only expf may differ by an ulp between the two (it can move a
// weight by one unit of 2^-40, which changes a pick only when the draw lands on that unit).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/counter_rng.h"

namespace klinear {

// A 32-bit key in the order of the float (−0 and +0 equal): larger float, larger key; every
// finite value and ±inf has a key > 0.
KL_HOST_DEVICE inline uint32_t sample_key(float x) {
  if (x == 0.0f) x = 0.0f;
#if defined(__CUDA_ARCH__)
  const uint32_t u = __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The float of a key (the inverse of sample_key).
KL_HOST_DEVICE inline float sample_key_value(uint32_t key) {
  const uint32_t u = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

// floor(exp((x − max) · inv_t) · 2^40): the row's largest logit weighs exactly 2^40, so a row's
// total fits 64 bits for any vocabulary below 2^23 ids.
KL_HOST_DEVICE inline uint64_t sample_weight(float x, float max, float inv_t) {
  const float e = expf((x - max) * inv_t);
  return static_cast<uint64_t>(e * 1099511627776.0f);
}

// The 64 random bits of draw `counter` of stream `seed`.
KL_HOST_DEVICE inline uint64_t sample_bits(uint64_t seed, uint32_t counter) {
  return splitmix64(splitmix64(seed) ^ counter);
}

// floor(bits · total / 2^64): a point in [0, total).
KL_HOST_DEVICE inline uint64_t sample_point(uint64_t bits, uint64_t total) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(bits, total);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(bits) * total) >> 64);
#endif
}

// The weight the top-p prefix must reach: max(1, floor(top_p · total)) in double.
KL_HOST_DEVICE inline uint64_t top_p_target(float top_p, uint64_t total) {
  const uint64_t t = static_cast<uint64_t>(static_cast<double>(top_p) * static_cast<double>(total));
  return t < 1 ? 1 : t;
}

// The seed of a SampleArgs row from its two I32 halves.
KL_HOST_DEVICE inline uint64_t sample_seed(int32_t lo, int32_t hi) {
  return static_cast<uint64_t>(static_cast<uint32_t>(lo)) | (static_cast<uint64_t>(static_cast<uint32_t>(hi)) << 32);
}

}  // namespace klinear
