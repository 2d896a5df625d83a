// Element types and scalar conversions. The conversions here are the one definition of each
// format's bit layout (bf16, fp16, fp8 e4m3, e8m0, fp4 e2m1) used by loaders and references.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace klinear {

enum class DType : uint8_t { kF32, kBF16, kF16, kU8, kI8, kI32, kI64, kF8E4M3, kF8E8M0 };

// Bytes per element.
size_t dtype_size(DType t);
// The safetensors spelling ("F32", "BF16", ...).
const char* dtype_name(DType t);
// Parses a safetensors dtype string; nullopt for unknown strings.
std::optional<DType> parse_dtype(std::string_view name);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t h);
float f8e4m3_to_f32(uint8_t v);
// E8M0: 2^(v - 127); 255 is NaN.
float e8m0_to_f32(uint8_t v);
// FP4 E2M1 nibble: bit 3 is the sign, bits 0..2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6} (MODEL.md 2.3).
float e2m1_to_f32(uint8_t nibble);

// Converts `n` elements of type `t` at `src` to float32 at `dst`. `t` must be a float type or an
// integer type (integers are converted by value).
void convert_to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace klinear
