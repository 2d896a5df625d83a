// The memory ops every other op test leans on, on every backend row: host → device → host round
// trips in both dtypes, fill, copy, copy_columns, gather_rows (a table of widths, offsets and row
// counts), and the step arena (the same addresses when a step of the same shapes runs again, memory
// reused after begin_step).
#include <gtest/gtest.h>

#include "backend_cases.h"
#include "test_util.h"

namespace klinear {
namespace {

class MemoryOps : public testing::BackendTest {};

TEST_P(MemoryOps, RoundTripsFillAndCopies) {
  std::mt19937_64 rng(testing::fresh_seed());
  Tensor x = testing::random_tensor(rng, {7, 12});
  EXPECT_TRUE(testing::all_close(host(dev(x, DType::kF32)), x, testing::kExact.rel(DType::kF32)))
      << "F32 round trip is exact";
  EXPECT_TRUE(testing::all_close(host(dev(x)), x, tol())) << "activation dtype round trip";
  Tensor ids = Tensor::empty(DType::kI32, {5});
  for (int i = 0; i < 5; ++i) ids.data_as<int32_t>()[i] = 1000003 * i - 7;
  Tensor back = host(dev(ids, DType::kI32));
  ASSERT_EQ(back.dtype(), DType::kI32);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(back.data_as<int32_t>()[i], ids.data_as<int32_t>()[i]);

  Tensor f = poisoned({3, 4}, DType::kF32);
  be().fill(f, 2.5f);
  Tensor fh = host(f);
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(fh.f32()[i], 2.5f);

  Tensor dst = poisoned({7, 12});
  be().copy(dev(x), dst);
  EXPECT_TRUE(testing::all_close(host(dst), x, tol())) << "copy";

  // copy_columns: columns [3, 8) of x into columns [1, 6) of a [7, 9] tensor; the rest keeps 0.
  Tensor cols = dev(Tensor::zeros(DType::kF32, {7, 9}));
  be().copy_columns(dev(x), 3, cols, 1, 5);
  Tensor expect = Tensor::zeros(DType::kF32, {7, 9});
  for (int64_t r = 0; r < 7; ++r)
    for (int64_t j = 0; j < 5; ++j) expect.f32()[r * 9 + 1 + j] = x.f32()[r * 12 + 3 + j];
  EXPECT_TRUE(testing::close_rel(host(cols), expect, tol())) << "copy_columns";
}

struct GatherCase {
  const char* name;
  int64_t src_rows, cols, out_rows;
  int64_t offset;  // src and out are views starting this many rows into their tensors
};

// CUDA copies a row in the widest units (16, 8, 4 or 2 bytes) its width and both addresses allow,
// and strides over rows past a grid's 65,535 in y.
const GatherCase kGatherCases[] = {
    {"chunked_width", 7, 16, 4, 0},
    {"odd_width", 7, 13, 5, 0},
    {"width_6_rows_offset", 9, 6, 6, 1},
    {"width_24_rows_offset", 5, 24, 3, 3},
    {"70000_rows", 300, 8, 70000, 0},
};

TEST_P(MemoryOps, GatherRows) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (const GatherCase& c : kGatherCases) {
    SCOPED_TRACE(c.name);
    Tensor x = testing::random_tensor(rng, {c.offset + c.src_rows, c.cols});
    Tensor rows = Tensor::empty(DType::kI32, {c.out_rows});
    for (int64_t i = 0; i < c.out_rows; ++i) rows.data_as<int32_t>()[i] = static_cast<int32_t>(rng() % c.src_rows);
    rows.data_as<int32_t>()[c.out_rows - 1] = rows.data_as<int32_t>()[0];  // a repeated row
    Tensor out = poisoned({c.offset + c.out_rows, c.cols});
    be().gather_rows(dev(x).rows(c.offset, c.offset + c.src_rows), dev(rows, DType::kI32),
                     out.rows(c.offset, c.offset + c.out_rows));
    Tensor expect = Tensor::empty(DType::kF32, {c.out_rows, c.cols});
    for (int64_t i = 0; i < c.out_rows; ++i)
      for (int64_t j = 0; j < c.cols; ++j)
        expect.f32()[i * c.cols + j] = x.f32()[(c.offset + rows.data_as<int32_t>()[i]) * c.cols + j];
    EXPECT_TRUE(testing::all_close(host(out).rows(c.offset, c.offset + c.out_rows), expect, tol()));
  }
}

TEST_P(MemoryOps, StepArenaGivesTheSameAddressesEachStep) {
  auto step = [&] {
    be().begin_step();
    std::vector<void*> p;
    for (int64_t n : {1, 1000, 70000, 3})  // the third outgrows a fresh arena's first block
      p.push_back(be().alloc(DType::kF32, {n, 16}).data());
    return p;
  };
  step();                  // may grow the arena
  const auto first = step();  // one merged block from here on
  for (int i = 0; i < 3; ++i) EXPECT_EQ(step(), first);
}

TEST_P(MemoryOps, StepReleaseGivesBackWhatFollowedTheMark) {
  // One step: a kept tensor, then three "layers" each taking temporaries after a mark and
  // releasing them; the middle layer outgrows the arena's block. Every layer gets the first
  // layer's addresses (once the arena holds the largest), the kept tensor keeps its data, and the
  // same step run again sees the same addresses.
  auto step = [&](bool check) {
    be().begin_step();
    Tensor kept = be().alloc(DType::kF32, {8});
    be().fill(kept, 3.0f);
    std::vector<std::vector<void*>> layers;
    for (int64_t n : {1000, 300000, 1000}) {
      const Arena::Mark mark = be().step_mark();
      std::vector<void*> p;
      for (int i = 0; i < 3; ++i) {
        Tensor t = be().alloc(DType::kF32, {n, 4});
        be().fill(t, -1.0f);
        p.push_back(t.data());
      }
      layers.push_back(p);
      be().step_release(mark);
    }
    if (check) {
      EXPECT_EQ(layers[0], layers[2]) << "a released layer's memory is handed out again";
      const Tensor h = host(kept);
      for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(h.f32()[i], 3.0f) << "the tensor before the marks was overwritten";
    }
    layers.push_back({kept.data()});
    return layers;
  };
  step(false);  // grows and merges the arena
  const auto first = step(true);
  EXPECT_EQ(first[0][0], first[1][0]) << "with one block, every layer starts at the mark";
  EXPECT_EQ(step(true), first);
}

KL_BACKEND_SUITE(MemoryOps);

}  // namespace
}  // namespace klinear
