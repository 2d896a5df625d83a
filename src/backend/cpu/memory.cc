// CPU memory ops: everything is host F32 (and I32 indices); uploads widen other float dtypes and
// dequantize MXFP4; step tensors come from the arena.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "backend/cpu/backend.h"
#include "core/counter_rng.h"

namespace klinear::cpu {

// MemAvailable from /proc/meminfo (what can be allocated without swapping), else free pages;
// under an address-space limit (ulimit -v) no more than what the limit leaves.
uint64_t CpuBackend::available_bytes() const {
  uint64_t avail = static_cast<uint64_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") {
      avail = kib * 1024;
      break;
    }
  rlimit lim{};
  if (getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    uint64_t pages = 0;
    std::ifstream("/proc/self/statm") >> pages;  // the address space in use, in pages
    const uint64_t used = pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    avail = std::min<uint64_t>(avail, lim.rlim_cur > used ? lim.rlim_cur - used : 0);
  }
  return avail;
}

CpuBackend::CpuBackend(BatchInvariance invariance)
    : arena_(Device::kCpu,
             [](size_t bytes) -> std::shared_ptr<void> {
               void* p = std::aligned_alloc(256, bytes);
               KL_CHECK(p != nullptr, "host allocation of " + std::to_string(bytes) + " bytes for the CPU arena failed");
               return std::shared_ptr<void>(p, std::free);
             }),
      gemm_order_(invariance == BatchInvariance::kOn ? GemmOrder::kRowStable : GemmOrder::kBlas) {
  // OpenBLAS maps its work buffers on first use and, when a mapping fails (an address-space
  // limit already taken by our pools), retries for ever. One GEMM on every thread now maps them
  // while the address space is still free.
  const float one = 1.0f;
  float out = 0.0f;
#pragma omp parallel
  {
    float mine = 0.0f;
    gemm(1, 1, 1, &one, 1, &one, 1, /*b_transposed=*/true, &mine, 1);
#pragma omp atomic
    out += mine;
  }
  KL_CHECK(out > 0.0f, "BLAS warm-up");
}

namespace {
// Copies a host tensor into dst: float dtypes widened to F32, I32 as it is.
void convert_into(const Tensor& host, const Tensor& dst) {
  KL_CHECK(host.device() == Device::kCpu && host.numel() == dst.numel(), "host copy of " + shape_to_string(host.shape()));
  if (dst.dtype() == DType::kI32) {
    KL_CHECK(host.dtype() == DType::kI32, "an I32 tensor takes I32 data");
    std::memcpy(dst.data(), host.data(), host.nbytes());
  } else {
    KL_CHECK(dst.dtype() == DType::kF32 && host.dtype() != DType::kI32, "the CPU backend holds F32 and I32 only");
    convert_to_f32(host.dtype(), host.data(), dst.f32(), static_cast<size_t>(host.numel()));
  }
}
}  // namespace

void CpuBackend::fill(const Tensor& t, float value) {
  if (t.dtype() == DType::kI32) {
    int32_t* p = t.data_as<int32_t>();
    std::fill(p, p + t.numel(), static_cast<int32_t>(value));
    return;
  }
  float* p = t.f32();
  std::fill(p, p + t.numel(), value);
}

void CpuBackend::random_fill(const Tensor& t, uint64_t seed, float lo, float hi, const FillWindow& w) {
  float* p = t.f32();
  const int64_t cols = t.numel() == 0 ? 1 : t.dim(-1), stride = w.stride > 0 ? w.stride : cols;
#pragma omp parallel for if (t.numel() > (1 << 16))
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = counter_uniform(seed, static_cast<uint64_t>(w.offset + i / cols * stride + i % cols), lo, hi);
}

Tensor CpuBackend::upload(const Tensor& host, DType dtype) {
  Tensor out = Tensor::empty(dtype == DType::kI32 ? DType::kI32 : DType::kF32, host.shape());
  convert_into(host, out);
  return out;
}

Tensor CpuBackend::to_device(const Tensor& host, DType dtype) {
  Tensor out = alloc(dtype == DType::kI32 ? DType::kI32 : DType::kF32, host.shape());
  convert_into(host, out);
  return out;
}

// The CPU reads the host arrays; the device mirrors view them.
void CpuBackend::upload_layout(SeqLayout& l) {
  auto view = [](std::vector<int32_t>& v) {
    return Tensor::wrap(DType::kI32, {static_cast<int64_t>(v.size())}, v.data(), nullptr, Device::kCpu);
  };
  l.dev = SeqLayout::Device{view(l.cu_seqlens), view(l.cached), view(l.slots),   view(l.page_table),
                            view(l.snap_seq),   view(l.snap_pos), view(l.snap_slot)};
}

// MODEL.md 2.3: W[r, c] = e2m1(nibble(r, c)) · 2^(scale[r, c/32] − 127); the low nibble is the even column.
ExpertMatrix CpuBackend::upload_mxfp4(const Tensor& packed, const Tensor& scale) {
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

Tensor CpuBackend::to_host(const Tensor& t) { return upload(t, t.dtype()); }

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  KL_CHECK(src.numel() == dst.numel() && src.dtype() == dst.dtype(), "copy size/dtype mismatch");
  std::memmove(dst.data(), src.data(), src.nbytes());
}

void CpuBackend::write(const Tensor& host, const Tensor& dst) {
  KL_CHECK(host.device() == Device::kCpu && host.numel() == dst.numel() && host.dtype() == dst.dtype() &&
               (dst.dtype() == DType::kF32 || dst.dtype() == DType::kI32),
           "write " + shape_to_string(host.shape()) + " " + dtype_name(host.dtype()) + " into " +
               shape_to_string(dst.shape()) + " " + dtype_name(dst.dtype()));
  std::memcpy(dst.data(), host.data(), host.nbytes());
}

void CpuBackend::copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width) {
  const int64_t sc = src.dim(-1), dc = dst.dim(-1), rows = src.numel() / sc;
  KL_CHECK(dst.numel() / dc == rows && src_col >= 0 && dst_col >= 0 && src_col + width <= sc && dst_col + width <= dc,
           "copy_columns src " + shape_to_string(src.shape()) + " dst " + shape_to_string(dst.shape()));
  for (int64_t r = 0; r < rows; ++r)
    std::memmove(dst.f32() + r * dc + dst_col, src.f32() + r * sc + src_col, static_cast<size_t>(width) * sizeof(float));
}


void CpuBackend::gather_rows(const Tensor& src, const Tensor& rows, const Tensor& out) {
  const int64_t c = src.dim(-1), n = src.numel() / c, r = rows.numel();
  KL_CHECK(rows.dtype() == DType::kI32 && out.numel() == r * c, "gather_rows shapes");
  for (int64_t i = 0; i < r; ++i) {
    const int32_t row = rows.data_as<const int32_t>()[i];
    KL_CHECK(row >= 0 && row < n, "gather_rows row " + std::to_string(row) + " outside [0, " + std::to_string(n) + ")");
    std::memcpy(out.f32() + i * c, src.f32() + row * c, static_cast<size_t>(c) * sizeof(float));
  }
}

}  // namespace klinear::cpu
