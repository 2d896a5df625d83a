// main() of klinear_dist_tests and the harness of tests/dist/ranks.h.
#include <cstdio>
#include <memory>

#include "dist/mpi_comm.h"
#include "dist/ranks.h"
#include "test_util.h"

namespace klinear::testing {
namespace {

Comm* g_world = nullptr;

// Ranks other than 0 print only their failures, each line naming the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.summary());
  }

 private:
  int rank_;
};

}  // namespace

Comm& host_world() { return *g_world; }

void RanksTest::SetUp() {
  Tensor seed = Tensor::empty(DType::kI64, {1});
  seed.data_as<int64_t>()[0] = rank() == 0 ? static_cast<int64_t>(fresh_seed()) : 0;
  const Status shared = world().broadcast({.data = seed, .root = 0});
  EXPECT_TRUE(shared.ok()) << shared.to_string();
  seed_ = static_cast<uint64_t>(seed.data_as<int64_t>()[0]);
}

void RanksTest::TearDown() {
  Tensor mine = Tensor::empty(DType::kI32, {1});
  mine.data_as<int32_t>()[0] = HasFailure() ? 1 : 0;
  Tensor all = Tensor::empty(DType::kI32, {size()});
  const Status gathered = world().all_gather({.input = mine, .output = all});
  EXPECT_TRUE(gathered.ok()) << gathered.to_string();
  if (rank() != 0) return;
  for (int r = 1; r < size(); ++r)
    if (all.data_as<int32_t>()[r] != 0) ADD_FAILURE() << "rank " << r << " failed this test (its lines start [rank " << r << "])";
}

}  // namespace klinear::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  klinear::Result<std::unique_ptr<klinear::Comm>> world = klinear::open_host_world();
  if (!world.ok()) {
    std::fprintf(stderr, "klinear_dist_tests: %s\n", world.status().to_string().c_str());
    return 1;
  }
  klinear::testing::g_world = world->get();
  const int rank = world->get()->rank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new klinear::testing::RankFailurePrinter(rank));
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  // Every rank exits non-zero when any rank failed.
  klinear::Tensor any = klinear::Tensor::empty(klinear::DType::kI32, {1});
  any.data_as<int32_t>()[0] = failed;
  const klinear::Status status =
      world->get()->all_reduce({.input = any, .output = any, .op = klinear::ReduceOp::kMax});
  if (!status.ok()) {
    std::fprintf(stderr, "klinear_dist_tests: %s\n", status.to_string().c_str());
    return 1;
  }
  return any.data_as<int32_t>()[0];
}
