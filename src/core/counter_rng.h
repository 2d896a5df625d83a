// Counter-based random numbers: element i of a stream `seed` is a pure function of (seed, i), so a
// tensor filled on the CPU and on a GPU (any thread order) holds the same values. SplitMix64 of
// the pair; 24 random bits per float. Used for dummy weights (--load-format dummy).
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace klinear {

KL_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [lo, hi) for element `i` of stream `seed`.
KL_HOST_DEVICE inline float counter_uniform(uint64_t seed, uint64_t i, float lo, float hi) {
  const uint64_t bits = splitmix64(splitmix64(seed) ^ i);
  const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

}  // namespace klinear
