// Arena: the step memory of a backend. A bump allocator over blocks of one device's memory:
// alloc() hands out 256-byte aligned pieces, rewind() makes all of it free again. A step that
// needs more than the arena holds gets an extra block; the next rewind() merges the blocks into
// one, so from then on a step of the same shapes sees the same addresses every time (what a
// captured CUDA graph relies on). Tensors keep their block alive, so a stale tensor is never a
// dangling pointer, only stale data. mark() / release() give back, within a step, everything
// handed out since the mark (a layer's temporaries), so a step needs the memory of its largest
// layer rather than of all of them; the same sequence of calls still sees the same addresses.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace klinear {

class Arena {
 public:
  // `allocate(bytes)` returns a block of device memory whose deleter frees it.
  using BlockAllocator = std::function<std::shared_ptr<void>(size_t bytes)>;
  Arena(Device device, BlockAllocator allocate) : device_(device), allocate_(std::move(allocate)) {}

  struct Mark {
    size_t block = 0, used = 0;
  };

  Tensor alloc(DType dtype, const Shape& shape);
  void rewind();
  // Where the next alloc() would start; release(m) makes everything handed out since mark() m
  // free again (blocks grown since stay, for the next allocations).
  Mark mark() const;
  void release(const Mark& m);
  size_t capacity() const;

 private:
  struct Block {
    std::shared_ptr<void> memory;
    size_t size = 0, used = 0;
  };
  Device device_;
  BlockAllocator allocate_;
  std::vector<Block> blocks_;
  size_t current_ = 0;  // the block alloc() takes from; blocks after it are empty
};

}  // namespace klinear
