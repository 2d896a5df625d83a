#include "core/tensor.h"

#include <cstring>
#include <string>

namespace klinear {

std::string shape_to_string(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Tensor Tensor::empty(DType dtype, Shape shape) {
  for (int64_t d : shape) KL_CHECK(d >= 0, "negative dimension in " + shape_to_string(shape));
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  // Host tensors are sized by checked inputs (a prompt within the context, a step within its
  // budget); running out of host memory for one is not an error a caller can act on.
  KL_CHECK(p != nullptr, "host allocation of " + std::to_string(rounded) + " bytes for a tensor " + shape_to_string(shape) +
                             " failed");
  return wrap(dtype, std::move(shape), p, std::shared_ptr<void>(p, std::free), Device::kCpu);
}

Tensor Tensor::zeros(DType dtype, Shape shape) {
  Tensor t = empty(dtype, std::move(shape));
  std::memset(t.data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(DType dtype, Shape shape, void* data, std::shared_ptr<void> owner, Device device) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.owner_ = std::move(owner);
  t.device_ = device;
  return t;
}

Tensor Tensor::from_f32(Shape shape, const std::vector<float>& values) {
  KL_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()), "from_f32: size mismatch");
  Tensor t = empty(DType::kF32, std::move(shape));
  std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor Tensor::view(Shape shape) const {
  KL_CHECK(shape_numel(shape) == numel(),
           "view " + shape_to_string(shape) + " of a tensor " + shape_to_string(shape_));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  KL_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
           "rows(" + std::to_string(begin) + ", " + std::to_string(end) + ") of " + shape_to_string(shape_));
  Tensor t = *this;
  t.shape_[0] = end - begin;
  const size_t row_bytes = shape_[0] == 0 ? 0 : nbytes() / static_cast<size_t>(shape_[0]);
  t.data_ = static_cast<uint8_t*>(data_) + static_cast<size_t>(begin) * row_bytes;
  return t;
}

}  // namespace klinear
