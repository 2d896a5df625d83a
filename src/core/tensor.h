// Tensor: a dense, contiguous, row-major array of one dtype on one device.
//
// A Tensor is a shared handle: copies alias the same storage, and `owner` keeps that storage alive
// (a host allocation, a memory-mapped checkpoint, or a device buffer freed by its backend). There
// are no strides: every op in klinear works on contiguous rows, and views only reshape or take a
// range of the first dimension. Tensors do no math; the Backend does.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace klinear {

enum class Device : uint8_t { kCpu, kCuda };

using Shape = std::vector<int64_t>;

inline int64_t shape_numel(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<int64_t>());
}
std::string shape_to_string(const Shape& s);  // "[2, 3]"

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised host tensor (64-byte aligned); aborts naming the size if the host is out of memory.
  static Tensor empty(DType dtype, Shape shape);
  // Zero-filled host tensor.
  static Tensor zeros(DType dtype, Shape shape);
  // A tensor over memory owned by `owner` (kept alive as long as any alias lives).
  static Tensor wrap(DType dtype, Shape shape, void* data, std::shared_ptr<void> owner, Device device);
  // Host float32 tensor holding `values` (numel must match).
  static Tensor from_f32(Shape shape, const std::vector<float>& values);

  bool defined() const { return owner_ != nullptr || data_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const {
    KL_DCHECK(i >= -rank() && i < rank(), "dim index out of range");
    return shape_[i < 0 ? i + rank() : i];
  }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const { return static_cast<T*>(data_); }
  // Host float32 data; aborts if the tensor is not host F32 (a bug).
  float* f32() const {
    KL_CHECK(dtype_ == DType::kF32 && device_ == Device::kCpu, "f32() on a non-host-F32 tensor");
    return static_cast<float*>(data_);
  }

  // The same storage with another shape of the same numel.
  Tensor view(Shape shape) const;
  // Rows [begin, end) of the first dimension, sharing storage.
  Tensor rows(int64_t begin, int64_t end) const;

 private:
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
  Shape shape_;
  void* data_ = nullptr;
  std::shared_ptr<void> owner_;
};

}  // namespace klinear
