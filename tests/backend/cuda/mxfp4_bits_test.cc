// The integer half of the CUDA kernels' MXFP4 dequantization (backend/cuda/moe/mxfp4_bits.h), on
// the CPU: for every scale byte and every nibble in both halves of a pair (the word's other
// nibbles random, so the masks are tested), the pair's bits times the scale factors, multiplied as
// bf16x2 (each half: the float product rounded to bf16, what the device's bf16 multiply does),
// equal the CPU's widened value (MODEL.md 2.3) bit for bit, NaN for 0xFF; the pairs of a word are
// its values (i, i + 4), and the activations' pairs match them, so a word's dot product is Σ w_k x_k.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cuda/moe/mxfp4_bits.h"
#include "core/dtype.h"
#include "test_util.h"

namespace klinear::cuda {
namespace {

float half(uint32_t pair, int h) { return bf16_to_f32(static_cast<uint16_t>(pair >> (16 * h))); }

// a · b per half as a bf16x2 multiply rounds it.
uint32_t mul(uint32_t a, uint32_t b) {
  uint32_t out = 0;
  for (int h = 0; h < 2; ++h) out |= static_cast<uint32_t>(f32_to_bf16(half(a, h) * half(b, h))) << (16 * h);
  return out;
}

uint32_t scaled(uint32_t t, const Mxfp4Scale& s) {
  uint32_t v = mul(mxfp4_pair_bits(t), s.first);
  if (s.second != 0u) v = mul(v, s.second);
  return v;
}

TEST(Mxfp4Bits, EveryNibbleAndScaleEqualsTheWidenedValue) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (uint32_t e = 0; e < 256; ++e)
    for (uint32_t lo = 0; lo < 16; ++lo)
      for (uint32_t hi = 0; hi < 16; ++hi) {
        // Nibbles 0 and 4 are the pair; the others are noise the masks must drop.
        const uint32_t t = (static_cast<uint32_t>(rng()) & 0xfff0fff0u) | lo | hi << 16;
        const uint32_t v = scaled(t, mxfp4_scale(e));
        for (int h = 0; h < 2; ++h) {
          const float want = e2m1_to_f32(static_cast<uint8_t>(h == 0 ? lo : hi)) * e8m0_to_f32(static_cast<uint8_t>(e));
          const float got = half(v, h);
          if (e == 255) {
            ASSERT_TRUE(std::isnan(got)) << "e " << e << " nibble " << (h == 0 ? lo : hi);
            continue;
          }
          ASSERT_FALSE(std::isnan(want));
          ASSERT_EQ(f32_to_bf16(want), static_cast<uint16_t>(v >> (16 * h)))
              << "e " << e << " nibble " << (h == 0 ? lo : hi) << " want " << want << " got " << got;
        }
      }
}

TEST(Mxfp4Bits, PairsOfAWordMatchThePairedActivations) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::uniform_real_distribution<float> xs(-2.0f, 2.0f);
  for (int trial = 0; trial < 1000; ++trial) {
    const auto q = static_cast<uint32_t>(rng());
    const uint32_t e = 118 + static_cast<uint32_t>(rng() % 8);
    float x[8];
    uint32_t packed[4] = {};  // (x0, x1), (x2, x3), ... as a 16-byte load holds them
    for (int k = 0; k < 8; ++k) {
      x[k] = bf16_to_f32(f32_to_bf16(xs(rng)));
      packed[k / 2] |= static_cast<uint32_t>(f32_to_bf16(x[k])) << (16 * (k % 2));
    }
    uint32_t xp[4];
    x_pairs_0426(packed[0], packed[1], packed[2], packed[3], xp);
    double dot = 0, want = 0;
    for (int i = 0; i < 4; ++i) {
      const uint32_t w = scaled(q >> (4 * i), mxfp4_scale(e));
      // Pair i is values i and i + 4 of the word, on both sides.
      ASSERT_EQ(half(w, 0), e2m1_to_f32(static_cast<uint8_t>(q >> (4 * i) & 0xfu)) * e8m0_to_f32(static_cast<uint8_t>(e)));
      ASSERT_EQ(half(w, 1), e2m1_to_f32(static_cast<uint8_t>(q >> (4 * i + 16) & 0xfu)) * e8m0_to_f32(static_cast<uint8_t>(e)));
      ASSERT_EQ(half(xp[i], 0), x[i]);
      ASSERT_EQ(half(xp[i], 1), x[i + 4]);
      dot += double(half(w, 0)) * half(xp[i], 0) + double(half(w, 1)) * half(xp[i], 1);
    }
    for (int k = 0; k < 8; ++k)
      want += double(e2m1_to_f32(static_cast<uint8_t>(q >> (4 * k) & 0xfu))) * e8m0_to_f32(static_cast<uint8_t>(e)) * x[k];
    EXPECT_EQ(dot, want);
  }
}

}  // namespace
}  // namespace klinear::cuda
