#include "backend/arena.h"

#include <algorithm>

namespace klinear {

namespace {
constexpr size_t kAlign = 256;
constexpr size_t kMinBlock = size_t{1} << 20;
size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

Tensor Arena::alloc(DType dtype, const Shape& shape) {
  for (int64_t d : shape) KL_CHECK(d >= 0, "negative dimension in " + shape_to_string(shape));
  const size_t bytes = aligned(std::max<size_t>(1, static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype)));
  if (blocks_.empty() || blocks_.back().size - blocks_.back().used < bytes) {
    const size_t size = std::max({bytes, kMinBlock, capacity()});
    blocks_.push_back(Block{allocate_(size), size, 0});
  }
  Block& b = blocks_.back();
  void* p = static_cast<char*>(b.memory.get()) + b.used;
  b.used += bytes;
  return Tensor::wrap(dtype, shape, p, b.memory, device_);
}

void Arena::rewind() {
  if (blocks_.size() > 1) {
    const size_t total = capacity();
    blocks_.clear();
    blocks_.push_back(Block{allocate_(total), total, 0});
  }
  for (Block& b : blocks_) b.used = 0;
}

size_t Arena::capacity() const {
  size_t total = 0;
  for (const Block& b : blocks_) total += b.size;
  return total;
}

}  // namespace klinear
