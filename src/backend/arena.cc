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
  // The first block from the current one on with room (the blocks after the current one are empty).
  while (current_ < blocks_.size() && blocks_[current_].size - blocks_[current_].used < bytes) ++current_;
  if (current_ == blocks_.size()) {
    const size_t size = std::max({bytes, kMinBlock, capacity()});
    blocks_.push_back(Block{allocate_(size), size, 0});
  }
  Block& b = blocks_[current_];
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
  current_ = 0;
}

Arena::Mark Arena::mark() const {
  if (blocks_.empty()) return Mark{};
  const size_t block = std::min(current_, blocks_.size() - 1);
  return Mark{block, blocks_[block].used};
}

void Arena::release(const Mark& m) {
  if (blocks_.empty()) return;
  KL_CHECK(m.block <= current_ && m.block < blocks_.size() && m.used <= blocks_[m.block].used,
           "arena release past the current allocation (a mark from another step?)");
  for (size_t i = m.block + 1; i < blocks_.size(); ++i) blocks_[i].used = 0;
  blocks_[m.block].used = m.used;
  current_ = m.block;
}

size_t Arena::capacity() const {
  size_t total = 0;
  for (const Block& b : blocks_) total += b.size;
  return total;
}

}  // namespace klinear
