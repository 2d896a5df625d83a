// Scalar formats (bf16, f16, fp8 e4m3, e8m0, fp4 e2m1), convert_to_f32, and MXFP4 dequantization via CpuBackend.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/backend.h"
#include "core/dtype.h"
#include "test_util.h"

namespace klinear {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(DTypeTest, NamesSizesAndParsing) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kU8, DType::kI8, DType::kI32, DType::kI64,
                  DType::kF8E4M3, DType::kF8E8M0}) {
    auto parsed = parse_dtype(dtype_name(t));
    ASSERT_TRUE(parsed.has_value()) << dtype_name(t);
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_EQ(dtype_size(DType::kF8E8M0), 1u);
  EXPECT_FALSE(parse_dtype("F8_E5M2").has_value());
  EXPECT_FALSE(parse_dtype("f32").has_value());
  EXPECT_FALSE(parse_dtype("").has_value());
}

TEST(DTypeTest, Bf16RoundTripsEveryNonNaNPattern) {
  int nans = 0;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    EXPECT_EQ(bits_of(f), h << 16);
    if (std::isnan(f)) {
      ++nans;
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f)))) << std::hex << h;
    } else {
      EXPECT_EQ(f32_to_bf16(f), h) << std::hex << h;
    }
  }
  EXPECT_EQ(nans, 2 * 127);  // exponent all ones, 127 non-zero mantissas, two signs
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xC000);
  // bf16 has 7 mantissa bits: the spacing at 1.0 is 2^-7, the halfway point 2^-8.
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);               // tie -> even (down)
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);           // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);    // above the tie
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f - 0x1p-20f), 0x3F80);    // below the tie
  EXPECT_EQ(f32_to_bf16(-(1.0f + 3 * 0x1p-8f)), 0xBF82);
  EXPECT_EQ(f32_to_bf16(float_of(0x3F80FFFF)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(float_of(0x00010000)), 0x0001);  // subnormals keep their bits
}

TEST(DTypeTest, Bf16NaNStaysNaN) {
  // NaNs whose payload lives only in the low 16 bits would become inf if rounded naively.
  for (uint32_t b : {0x7F800001u, 0x7FC00000u, 0xFF800001u, 0x7F80FFFFu, 0x7FFFFFFFu}) {
    const uint16_t h = f32_to_bf16(float_of(b));
    EXPECT_TRUE(std::isnan(bf16_to_f32(h))) << std::hex << b << " -> " << h;
    EXPECT_EQ(h >> 15, b >> 31) << "sign kept";
  }
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DTypeTest, F16KnownValues) {
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);          // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03FF), 1023 * 0x1p-24f);   // largest subnormal
  EXPECT_EQ(f16_to_f32(0x0400), 0x1p-14f);          // smallest normal
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);          // max
  EXPECT_EQ(f16_to_f32(0x3555), 0x1.554p-2f);       // ~1/3
  EXPECT_EQ(f16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_f32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0xFC01)));
  EXPECT_EQ(f16_to_f32(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
}

TEST(DTypeTest, Fp8E4M3KnownValues) {
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0xB8), -1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x40), 2.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x3C), 1.5f);
  EXPECT_EQ(f8e4m3_to_f32(0x7E), 448.0f);     // max finite
  EXPECT_EQ(f8e4m3_to_f32(0x01), 0x1p-9f);    // smallest subnormal
  EXPECT_EQ(f8e4m3_to_f32(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(f8e4m3_to_f32(0x08), 0x1p-6f);    // smallest normal
  EXPECT_EQ(f8e4m3_to_f32(0x78), 256.0f);     // exponent 15 is finite in E4M3FN
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0xFF)));
  int nans = 0;
  for (int v = 0; v < 256; ++v) nans += std::isnan(f8e4m3_to_f32(static_cast<uint8_t>(v)));
  EXPECT_EQ(nans, 2);  // no infinities, one NaN per sign
}

TEST(DTypeTest, E8M0KnownValues) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(128), 2.0f);
  EXPECT_EQ(e8m0_to_f32(120), 0x1p-7f);
  EXPECT_EQ(e8m0_to_f32(254), 0x1p127f);
  EXPECT_EQ(e8m0_to_f32(0), 0x1p-127f);
  EXPECT_GT(e8m0_to_f32(0), 0.0f);
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

TEST(DTypeTest, E2M1AllNibbles) {
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint8_t n = 0; n < 8; ++n) {
    EXPECT_EQ(e2m1_to_f32(n), mag[n]) << int(n);
    EXPECT_EQ(e2m1_to_f32(n | 8), -mag[n]) << int(n | 8);
  }
  EXPECT_TRUE(std::signbit(e2m1_to_f32(8)));  // negative zero
  EXPECT_EQ(e2m1_to_f32(0xF), -6.0f);
}

TEST(DTypeTest, ConvertToF32ByValue) {
  const int32_t i32[3] = {-5, 0, 1 << 24};
  const int64_t i64[2] = {-(1ll << 40), 7};
  const int8_t i8[2] = {-128, 127};
  const uint8_t u8[2] = {0, 255};
  const uint16_t bf[2] = {0x3F80, 0xC040};
  const uint16_t f16[2] = {0x3C00, 0x0001};
  const uint8_t e4m3[2] = {0x38, 0xC0};
  float out[3];
  convert_to_f32(DType::kI32, i32, out, 3);
  EXPECT_EQ(out[0], -5.0f); EXPECT_EQ(out[1], 0.0f); EXPECT_EQ(out[2], 16777216.0f);
  convert_to_f32(DType::kI64, i64, out, 2);
  EXPECT_EQ(out[0], -0x1p40f); EXPECT_EQ(out[1], 7.0f);
  convert_to_f32(DType::kI8, i8, out, 2);
  EXPECT_EQ(out[0], -128.0f); EXPECT_EQ(out[1], 127.0f);
  convert_to_f32(DType::kU8, u8, out, 2);
  EXPECT_EQ(out[0], 0.0f); EXPECT_EQ(out[1], 255.0f);
  convert_to_f32(DType::kBF16, bf, out, 2);
  EXPECT_EQ(out[0], 1.0f); EXPECT_EQ(out[1], -3.0f);
  convert_to_f32(DType::kF16, f16, out, 2);
  EXPECT_EQ(out[0], 1.0f); EXPECT_EQ(out[1], 0x1p-24f);
  convert_to_f32(DType::kF8E4M3, e4m3, out, 2);
  EXPECT_EQ(out[0], 1.0f); EXPECT_EQ(out[1], -2.0f);
}

// ---- MXFP4 (MODEL.md 2.3) through CpuBackend::upload_mxfp4

Tensor u8_tensor(Shape shape, uint8_t fill = 0) {
  Tensor t = Tensor::empty(DType::kU8, std::move(shape));
  std::memset(t.data(), fill, t.nbytes());
  return t;
}

TEST(Mxfp4Test, HandBuiltTwoRowsBy64) {
  Tensor packed = u8_tensor({2, 32}), scale = u8_tensor({2, 2});
  uint8_t* p = packed.data_as<uint8_t>();
  uint8_t* s = scale.data_as<uint8_t>();
  s[0] = 127;  // row 0, cols 0..31: x1
  s[1] = 129;  // row 0, cols 32..63: x4
  s[2] = 130;  // row 1, cols 0..31: x8
  s[3] = 126;  // row 1, cols 32..63: x0.5
  p[0] = 0x72;            // cols 0,1: low nibble 2 (1.0) is column 0, high nibble 7 (6.0) column 1
  p[1] = 0x9B;            // cols 2,3: 0xB = -1.5, 0x9 = -0.5
  p[16] = 0x35;           // cols 32,33: 0x5 = 3.0, 0x3 = 1.5 (second scale block)
  p[32 + 0] = 0x0C;       // row 1 cols 0,1: 0xC = -2.0, 0x0 = 0
  p[32 + 31] = 0xF1;      // row 1 cols 62,63: 0x1 = 0.5, 0xF = -6.0
  cpu::CpuBackend be;
  Tensor w = be.upload_mxfp4(packed, scale).w;
  ASSERT_EQ(w.dtype(), DType::kF32);
  ASSERT_EQ(w.shape(), (Shape{2, 64}));
  const float* W = w.f32();
  EXPECT_EQ(W[0], 1.0f);
  EXPECT_EQ(W[1], 6.0f);
  EXPECT_EQ(W[2], -1.5f);
  EXPECT_EQ(W[3], -0.5f);
  EXPECT_EQ(W[32], 12.0f);
  EXPECT_EQ(W[33], 6.0f);
  EXPECT_EQ(W[64 + 0], -16.0f);
  EXPECT_EQ(W[64 + 1], 0.0f);
  EXPECT_EQ(W[64 + 62], 0.25f);
  EXPECT_EQ(W[64 + 63], -3.0f);
  int nonzero = 0;
  for (int i = 0; i < 128; ++i) nonzero += W[i] != 0.0f;
  EXPECT_EQ(nonzero, 9);  // everything else is zero
}

TEST(Mxfp4Test, RandomMatchesPlainReimplementation) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t experts = 3, rows = 5, in = 96;
  Tensor packed = u8_tensor({experts, rows, in / 2}), scale = u8_tensor({experts, rows, in / 32});
  std::uniform_int_distribution<int> byte(0, 255), exp(100, 150);
  for (int64_t i = 0; i < packed.numel(); ++i) packed.data_as<uint8_t>()[i] = static_cast<uint8_t>(byte(rng));
  for (int64_t i = 0; i < scale.numel(); ++i) scale.data_as<uint8_t>()[i] = static_cast<uint8_t>(exp(rng));
  cpu::CpuBackend be;
  Tensor w = be.upload_mxfp4(packed, scale).w;
  ASSERT_EQ(w.shape(), (Shape{experts, rows, in}));
  static const double kMag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const uint8_t* p = packed.data_as<uint8_t>();
  const uint8_t* s = scale.data_as<uint8_t>();
  int64_t nonzero = 0;
  for (int64_t r = 0; r < experts * rows; ++r) {
    for (int64_t c = 0; c < in; ++c) {
      const int nib = (p[r * (in / 2) + c / 2] >> (4 * (c % 2))) & 0xF;
      const double v = ((nib & 8) ? -1.0 : 1.0) * kMag[nib & 7] * std::pow(2.0, s[r * (in / 32) + c / 32] - 127);
      ASSERT_EQ(w.f32()[r * in + c], static_cast<float>(v)) << "row " << r << " col " << c;
      nonzero += v != 0.0;
    }
  }
  EXPECT_GT(nonzero, experts * rows * in / 2);
}

}  // namespace
}  // namespace klinear
