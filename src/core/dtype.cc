#include "core/dtype.h"

#include <cmath>
#include <limits>

#include "core/check.h"

namespace klinear {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kBF16: case DType::kF16: return 2;
    case DType::kU8: case DType::kI8: case DType::kF8E4M3: case DType::kF8E8M0: return 1;
    case DType::kI64: return 8;
  }
  KL_CHECK(false, "unknown dtype");
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kU8: return "U8";
    case DType::kI8: return "I8";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E8M0: return "F8_E8M0";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  static constexpr DType kAll[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kU8, DType::kI8,
                                   DType::kI32, DType::kI64, DType::kF8E4M3, DType::kF8E8M0};
  for (DType t : kAll)
    if (name == dtype_name(t)) return t;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31) v = man ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else v = std::ldexp(static_cast<float>(man | 0x400), exp - 25);
  return sign ? -v : v;
}

float f8e4m3_to_f32(uint8_t b) {
  // E4M3FN: bias 7, no infinities, S.1111.111 is NaN.
  const int sign = b >> 7, exp = (b >> 3) & 0xf, man = b & 7;
  float v;
  if (exp == 15 && man == 7) v = std::numeric_limits<float>::quiet_NaN();
  else if (exp == 0) v = std::ldexp(static_cast<float>(man), -9);
  else v = std::ldexp(static_cast<float>(man | 8), exp - 10);
  return sign ? -v : v;
}

float e8m0_to_f32(uint8_t v) {
  if (v == 255) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(v) - 127);
}

float e2m1_to_f32(uint8_t nibble) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMag[nibble & 7];
  return (nibble & 8) ? -m : m;
}

void convert_to_f32(DType t, const void* src, float* dst, size_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  switch (t) {
    case DType::kF32: std::memcpy(dst, src, n * 4); return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) { uint16_t h; std::memcpy(&h, b + 2 * i, 2); dst[i] = bf16_to_f32(h); }
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) { uint16_t h; std::memcpy(&h, b + 2 * i, 2); dst[i] = f16_to_f32(h); }
      return;
    case DType::kF8E4M3: for (size_t i = 0; i < n; ++i) dst[i] = f8e4m3_to_f32(b[i]); return;
    case DType::kF8E8M0: for (size_t i = 0; i < n; ++i) dst[i] = e8m0_to_f32(b[i]); return;
    case DType::kU8: for (size_t i = 0; i < n; ++i) dst[i] = b[i]; return;
    case DType::kI8: for (size_t i = 0; i < n; ++i) dst[i] = static_cast<int8_t>(b[i]); return;
    case DType::kI32:
      for (size_t i = 0; i < n; ++i) { int32_t x; std::memcpy(&x, b + 4 * i, 4); dst[i] = static_cast<float>(x); }
      return;
    case DType::kI64:
      for (size_t i = 0; i < n; ++i) { int64_t x; std::memcpy(&x, b + 8 * i, 8); dst[i] = static_cast<float>(x); }
      return;
  }
}

}  // namespace klinear
