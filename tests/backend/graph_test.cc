// Backend::run_graph (docs/DESIGN.md "The decode step as a CUDA graph"): a replay reads what
// write() put in the fixed buffers since, a body that reads the host fails its capture with a
// Status naming the op, and a body that lets go of the block its eager run grew the arena by
// still captures. The model's steps over graphs: tests/runtime/step_executor_test.cc.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "backend_cases.h"
#include "test_util.h"

namespace klinear {
namespace {

class RunGraph : public testing::BackendTest {};

TEST_P(RunGraph, ReplaysReadTheFixedBuffersAndHostReadsFailCapture) {
  const int64_t n = 1000;
  const Tensor in = be().alloc_persistent(DType::kF32, {n}), out = be().alloc_persistent(DType::kF32, {n});
  for (int call = 0; call < 4; ++call) {  // eager, capture, replay, replay
    be().begin_step();
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(call * n + i);
    be().write(Tensor::wrap(DType::kF32, {n}, v.data(), nullptr, Device::kCpu), in);
    be().fill(out, std::numeric_limits<float>::quiet_NaN());
    ASSERT_TRUE(be().run_graph(7, [&] {
                  const Tensor tmp = be().alloc(DType::kF32, {n});
                  be().copy(in, tmp);
                  be().add(tmp, tmp);
                  be().copy(tmp, out);
                }).ok());
    const Tensor h = host(out);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h.f32()[i], 2.0f * v[i]) << "call " << call << " element " << i;
  }
  // A body reading the host: the CPU runs it; CUDA runs it eagerly once, then its capture fails.
  bool failed = false;
  for (int call = 0; call < 2 && !failed; ++call) {
    be().begin_step();
    const Status s = be().run_graph(8, [&] { (void)host(in); });
    failed = !s.ok();
    if (failed) {
      EXPECT_EQ(call, 1) << "the first call runs eagerly";
      EXPECT_NE(s.message().find("to_host"), std::string::npos) << s.to_string();
    }
  }
  EXPECT_EQ(failed, GetParam().device == Device::kCuda);
  be().clear_graphs();
}

// StepExecutor keeps each bucket's outputs from one call to the next. When a body's eager run
// grows the step arena, the next begin_step() merges the arena's blocks, so during the capture that
// follows, replacing the kept outputs lets go of the last hold on the block they lie in; that block
// must outlive the capture (a cudaFree inside it invalidates the capture: the 48B model's batch-256
// decode step after a short prefill failed this way).
TEST_P(RunGraph, CapturesWhenTheBodyLetsGoOfABlockTheEagerRunGrew) {
  const int64_t n = int64_t{192} << 20 >> 2;  // 192 MiB of f32: more than the arena holds before
  const Tensor in = be().alloc_persistent(DType::kF32, {4});
  Tensor kept;
  for (int call = 0; call < 3; ++call) {  // eager (the arena grows), capture, replay
    be().begin_step();
    be().fill(in, static_cast<float>(call + 1));
    const Status s = be().run_graph(9, [&] {
      const Tensor big = be().alloc(DType::kF32, {n});
      kept = big.rows(n - 4, n);
      be().copy(in, kept);
    });
    ASSERT_TRUE(s.ok()) << "call " << call << ": " << s.to_string();
    const Tensor h = host(kept);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(h.f32()[i], static_cast<float>(call + 1)) << "call " << call;
  }
  be().clear_graphs();
}

KL_BACKEND_SUITE(RunGraph);

}  // namespace
}  // namespace klinear
