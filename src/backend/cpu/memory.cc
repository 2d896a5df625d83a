// CPU memory ops: everything is host F32; uploads widen other float dtypes and dequantize MXFP4.
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "backend/cpu/backend.h"

namespace klinear::cpu {

// MemAvailable from /proc/meminfo (what can be allocated without swapping), else free pages.
uint64_t CpuBackend::available_bytes() const {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return static_cast<uint64_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

Tensor CpuBackend::alloc(const Shape& shape) { return Tensor::empty(DType::kF32, shape); }
Tensor CpuBackend::zeros(const Shape& shape) { return Tensor::zeros(DType::kF32, shape); }
Tensor CpuBackend::alloc_i32(const Shape& shape) { return Tensor::empty(DType::kI32, shape); }

Tensor CpuBackend::upload(const Tensor& host) {
  KL_CHECK(host.device() == Device::kCpu, "upload from a non-host tensor");
  Tensor out = Tensor::empty(DType::kF32, host.shape());
  convert_to_f32(host.dtype(), host.data(), out.f32(), static_cast<size_t>(host.numel()));
  return out;
}

// SPEC 2.3: W[r, c] = e2m1(nibble(r, c)) · 2^(scale[r, c/32] − 127); the low nibble is the even column.
Tensor CpuBackend::upload_mxfp4(const Tensor& packed, const Tensor& scale) {
  KL_CHECK(packed.dtype() == DType::kU8 && scale.dtype() == DType::kU8, "MXFP4 parts must be U8");
  const int64_t in = packed.dim(-1) * 2;
  KL_CHECK(scale.dim(-1) * 32 == in && scale.numel() / scale.dim(-1) == packed.numel() / packed.dim(-1),
           "MXFP4 scale " + shape_to_string(scale.shape()) + " does not fit packed " + shape_to_string(packed.shape()));
  Shape shape = packed.shape();
  shape.back() = in;
  Tensor out = Tensor::empty(DType::kF32, shape);
  const int64_t rows = packed.numel() / packed.dim(-1);
  const auto* p = packed.data_as<const uint8_t>();
  const auto* s = scale.data_as<const uint8_t>();
  float* w = out.f32();
#pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < in; ++c) {
      const uint8_t byte = p[r * (in / 2) + c / 2];
      const uint8_t nibble = (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
      w[r * in + c] = e2m1_to_f32(nibble) * e8m0_to_f32(s[r * (in / 32) + c / 32]);
    }
  }
  return out;
}

Tensor CpuBackend::to_host(const Tensor& t) { return upload(t); }

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  KL_CHECK(src.numel() == dst.numel() && src.dtype() == dst.dtype(), "copy size/dtype mismatch");
  std::memmove(dst.data(), src.data(), src.nbytes());
}

void CpuBackend::copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width) {
  const int64_t sc = src.dim(-1), dc = dst.dim(-1), rows = src.numel() / sc;
  KL_CHECK(dst.numel() / dc == rows && src_col >= 0 && dst_col >= 0 && src_col + width <= sc && dst_col + width <= dc,
           "copy_columns src " + shape_to_string(src.shape()) + " dst " + shape_to_string(dst.shape()));
  for (int64_t r = 0; r < rows; ++r)
    std::memmove(dst.f32() + r * dc + dst_col, src.f32() + r * sc + src_col, static_cast<size_t>(width) * sizeof(float));
}

}  // namespace klinear::cpu
