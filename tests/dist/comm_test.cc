// The host communicators (src/dist: MpiComm, SelfComm) with one process per rank: every collective
// on random non-zero data, checked on every rank against what it computes itself (rank r's data
// is a counter-based stream of a seed shared by rank 0, so any rank can make any rank's data).
//
// How the ranks run and report: tests/dist/ranks.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/counter_rng.h"
#include "dist/comm.h"
#include "dist/mpi_comm.h"
#include "dist/ranks.h"
#include "test_util.h"

namespace klinear {
namespace {

void expect_ok(const Status& status) { EXPECT_TRUE(status.ok()) << status.to_string(); }

// Which values rank_data draws.
enum class Values {
  kAny,        // uniform in [-1, 1)
  kExactSums,  // non-zero multiples of 1/8 in [-128, 128]: F32 sums over a few ranks are exact in any order
};

// `n` elements of stream `stream` in `dtype` (F32, BF16, I32 or I64; integers are kExactSums * 8).
Tensor rank_data(DType dtype, uint64_t stream, int64_t n, Values values) {
  Tensor t = Tensor::empty(dtype, {n});
  for (int64_t i = 0; i < n; ++i) {
    float v = counter_uniform(stream, static_cast<uint64_t>(i), -1.0f, 1.0f);
    if (values == Values::kExactSums || dtype == DType::kI32 || dtype == DType::kI64) {
      v = std::round(v * 1024.0f) / 8.0f;
      if (v == 0.0f) v = 0.125f;
    }
    switch (dtype) {
      case DType::kF32: t.f32()[i] = v; break;
      case DType::kBF16: t.data_as<uint16_t>()[i] = f32_to_bf16(v); break;
      case DType::kI32: t.data_as<int32_t>()[i] = static_cast<int32_t>(v * 8.0f); break;
      case DType::kI64: t.data_as<int64_t>()[i] = static_cast<int64_t>(v * 8.0f); break;
      default: KL_CHECK(false, "rank_data: no values for this dtype");
    }
  }
  return t;
}

double element(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32: return t.data_as<float>()[i];
    case DType::kBF16: return bf16_to_f32(t.data_as<uint16_t>()[i]);
    case DType::kI32: return t.data_as<int32_t>()[i];
    case DType::kI64: return static_cast<double>(t.data_as<int64_t>()[i]);
    default: KL_CHECK(false, "element: not a number dtype");
  }
}

// Bit-for-bit equality (moved data, exact sums), naming the first element that differs.
void expect_same_bytes(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.nbytes(), want.nbytes()) << what;
  const size_t width = dtype_size(got.dtype());
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (std::memcmp(static_cast<const char*>(got.data()) + i * width,
                    static_cast<const char*>(want.data()) + i * width, width) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << element(got, i) << ", expected " << element(want, i);
      return;
    }
  }
}

Tensor concat(const std::vector<Tensor>& parts, DType dtype) {
  int64_t n = 0;
  for (const Tensor& p : parts) n += p.numel();
  Tensor out = Tensor::empty(dtype, {n});
  size_t offset = 0;
  for (const Tensor& p : parts) {
    std::memcpy(static_cast<char*>(out.data()) + offset, p.data(), p.nbytes());
    offset += p.nbytes();
  }
  return out;
}

class CommTest : public testing::RanksTest {
 protected:
  // The stream of rank `r`'s data for part `part` of this test.
  uint64_t stream(int r, int part = 0) const {
    return splitmix64(seed() ^ (static_cast<uint64_t>(r) << 32 | static_cast<uint64_t>(part)));
  }
};

TEST_F(CommTest, WorldIsTheLaunchersOrOneRank) {
  if (const char* ranks = std::getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_TRUE(launched_by_mpi());
    EXPECT_EQ(size(), std::atoi(ranks));
    EXPECT_EQ(rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
  } else {
    EXPECT_FALSE(launched_by_mpi());
    EXPECT_EQ(size(), 1);
    EXPECT_EQ(rank(), 0);
  }
  EXPECT_EQ(world().device(), Device::kCpu);
}

TEST_F(CommTest, AllGatherPlacesEachRanksPartInRankOrder) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t n = 7;
    std::vector<Tensor> parts;
    for (int r = 0; r < size(); ++r) parts.push_back(rank_data(dtype, stream(r), n, Values::kAny));
    Tensor output = Tensor::empty(dtype, {size() * n});
    expect_ok(world().all_gather({.input = parts[rank()], .output = output}));
    expect_same_bytes(output, concat(parts, dtype), "all_gather");
  }
}

TEST_F(CommTest, ReduceScatterSumsEachBlockOnItsRank) {
  const int64_t n = 5;  // per rank; the input holds size() blocks
  for (DType dtype : {DType::kF32, DType::kI32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Values values = dtype == DType::kBF16 ? Values::kAny : Values::kExactSums;
    std::vector<Tensor> inputs;
    for (int r = 0; r < size(); ++r) inputs.push_back(rank_data(dtype, stream(r), size() * n, values));
    Tensor output = Tensor::empty(dtype, {n});
    expect_ok(world().reduce_scatter({.input = inputs[rank()], .output = output}));
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int r = 0; r < size(); ++r) want += element(inputs[r], rank() * n + j);
      if (dtype == DType::kBF16) {
        // Reduced in F32 and rounded once: within half a BF16 step of the sum.
        EXPECT_NEAR(element(output, j), want, std::ldexp(std::abs(want), -8) + 1e-6) << "element " << j;
      } else {
        EXPECT_EQ(element(output, j), want) << "element " << j;
      }
    }
  }
}

TEST_F(CommTest, AllReduceSumsAndMaxesInAndOutOfPlace) {
  struct Case {
    DType dtype;
    ReduceOp op;
    bool in_place;
  };
  const Case cases[] = {{DType::kF32, ReduceOp::kSum, true},  {DType::kF32, ReduceOp::kSum, false},
                        {DType::kF32, ReduceOp::kMax, false}, {DType::kI32, ReduceOp::kSum, true},
                        {DType::kI64, ReduceOp::kMax, true},  {DType::kBF16, ReduceOp::kSum, true}};
  const int64_t n = 13;  // divides by no rank count
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.dtype)) + (c.op == ReduceOp::kSum ? " sum" : " max") +
                 (c.in_place ? " in place" : ""));
    const Values values = c.dtype == DType::kBF16 ? Values::kAny : Values::kExactSums;
    std::vector<Tensor> inputs;
    for (int r = 0; r < size(); ++r) inputs.push_back(rank_data(c.dtype, stream(r), n, values));
    const Tensor input = rank_data(c.dtype, stream(rank()), n, values);  // a copy: in place overwrites it
    const Tensor output = c.in_place ? input : Tensor::empty(c.dtype, {n});
    expect_ok(world().all_reduce({.input = input, .output = output, .op = c.op}));
    for (int64_t j = 0; j < n; ++j) {
      double want = c.op == ReduceOp::kSum ? 0.0 : element(inputs[0], j);
      for (int r = 0; r < size(); ++r) {
        want = c.op == ReduceOp::kSum ? want + element(inputs[r], j) : std::max(want, element(inputs[r], j));
      }
      if (c.dtype == DType::kBF16) {
        EXPECT_NEAR(element(output, j), want, std::ldexp(std::abs(want), -8) + 1e-6) << "element " << j;
      } else {
        EXPECT_EQ(element(output, j), want) << "element " << j;
      }
    }
  }
}

TEST_F(CommTest, AllToAllMovesUnevenPartsIncludingEmptyOnes) {
  // Rank r sends count(r, q) elements to rank q: nothing to rank 0 (which then receives nothing
  // at all), and 0 to 4 elements elsewhere, varying with the seed.
  auto count = [&](int from, int to) -> int64_t {
    return to == 0 ? 0 : static_cast<int64_t>((static_cast<uint64_t>(from + 2 * to) + seed()) % 5);
  };
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::vector<Tensor> sent, expected;
    std::vector<int64_t> send_counts, recv_counts;
    for (int q = 0; q < size(); ++q) {
      sent.push_back(rank_data(dtype, stream(rank(), q), count(rank(), q), Values::kAny));
      send_counts.push_back(count(rank(), q));
      expected.push_back(rank_data(dtype, stream(q, rank()), count(q, rank()), Values::kAny));
      recv_counts.push_back(count(q, rank()));
    }
    const Tensor want = concat(expected, dtype);
    Tensor output = Tensor::empty(dtype, {want.numel()});
    expect_ok(world().all_to_all(
        {.input = concat(sent, dtype), .send_counts = send_counts, .output = output, .recv_counts = recv_counts}));
    expect_same_bytes(output, want, "all_to_all");
  }
}

TEST_F(CommTest, BroadcastCopiesTheRootsData) {
  const int root = size() - 1;
  for (DType dtype : {DType::kF32, DType::kI64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor data = rank_data(dtype, stream(rank()), 9, Values::kAny);
    expect_ok(world().broadcast({.data = data, .root = root}));
    expect_same_bytes(data, rank_data(dtype, stream(root), 9, Values::kAny), "broadcast");
  }
}

TEST_F(CommTest, SendRecvPassesAChainOfUnevenMessages) {
  if (size() == 1) GTEST_SKIP() << "a world of one has no peer";
  auto length = [](int r) -> int64_t { return 3 + 2 * r; };  // what rank r sends to r + 1
  if (rank() > 0) {
    Tensor got = Tensor::empty(DType::kF32, {length(rank() - 1)});
    expect_ok(world().recv({.data = got, .peer = rank() - 1}));
    expect_same_bytes(got, rank_data(DType::kF32, stream(rank() - 1), length(rank() - 1), Values::kAny), "recv");
  }
  if (rank() + 1 < size()) {
    expect_ok(world().send({.data = rank_data(DType::kF32, stream(rank()), length(rank()), Values::kAny),
                            .peer = rank() + 1}));
  }
}

TEST_F(CommTest, SplitFormsGroupsByColorOrderedByKey) {
  // Two groups (even and odd ranks), each ordered by descending world rank.
  std::vector<int> members;
  for (int r = size() - 1; r >= 0; --r) {
    if (r % 2 == rank() % 2) members.push_back(r);
  }
  Result<std::unique_ptr<Comm>> group = world().split({.color = rank() % 2, .key = size() - rank()});
  // MPI_Comm_split is collective: a failure is every rank's, so no rank is left waiting below.
  ASSERT_TRUE(group.ok()) << group.status().to_string();
  Comm& g = **group;
  EXPECT_EQ(g.size(), static_cast<int>(members.size()));
  EXPECT_EQ(g.rank(), std::find(members.begin(), members.end(), rank()) - members.begin());

  Tensor mine = Tensor::empty(DType::kI32, {1});
  mine.data_as<int32_t>()[0] = rank();
  Tensor order = Tensor::empty(DType::kI32, {g.size()});
  expect_ok(g.all_gather({.input = mine, .output = order}));
  EXPECT_EQ(std::vector<int>(order.data_as<int32_t>(), order.data_as<int32_t>() + g.size()), members);

  const Tensor sum = rank_data(DType::kF32, stream(rank()), 6, Values::kExactSums);
  expect_ok(g.all_reduce({.input = sum, .output = sum}));
  for (int64_t j = 0; j < 6; ++j) {
    double want = 0;
    for (int r : members) want += element(rank_data(DType::kF32, stream(r), 6, Values::kExactSums), j);
    EXPECT_EQ(sum.f32()[j], want) << "element " << j;
  }
  // The world still works beside its groups.
  expect_ok(world().barrier());
}

TEST_F(CommTest, LibraryErrorNamesTheCallAndTheRank) {
  if (size() == 1) GTEST_SKIP() << "a world of one uses no library";
  // Rank 0 sends 8 elements where rank 1 has room for 4: MPI reports the truncation on rank 1.
  if (rank() == 0) expect_ok(world().send({.data = rank_data(DType::kF32, stream(0), 8, Values::kAny), .peer = 1}));
  if (rank() == 1) {
    const Status status = world().recv({.data = Tensor::empty(DType::kF32, {4}), .peer = 0});
    ASSERT_FALSE(status.ok());
    EXPECT_NE(status.message().find("MPI_Recv on rank 1 of " + std::to_string(size()) + ": MPI_ERR_TRUNCATE"),
              std::string::npos)
        << status.to_string();
  }
}

TEST_F(CommTest, BrokenArgumentsAbortWithFileAndLine) {
  if (size() > 1) GTEST_SKIP() << "death tests fork; the shared checks run in the world of one (Dist.Self)";
  const Tensor three = Tensor::empty(DType::kF32, {3});
  EXPECT_DEATH((void)world().all_gather({.input = three, .output = Tensor::empty(DType::kF32, {5})}),
               "comm\\.cc:[0-9]+: .*all_gather: output F32\\[5\\] is not 1 x input F32\\[3\\]");
  EXPECT_DEATH((void)world().all_reduce({.input = three, .output = Tensor::empty(DType::kBF16, {3})}),
               "comm\\.cc:[0-9]+: .*differ in dtype");
  EXPECT_DEATH((void)world().all_to_all({.input = three, .send_counts = {2}, .output = three, .recv_counts = {3}}),
               "comm\\.cc:[0-9]+: .*send_counts add up to 2 elements");
  EXPECT_DEATH((void)world().send({.data = three, .peer = 0}), "comm\\.cc:[0-9]+: .*peer 0 is not another rank of 1");
  EXPECT_DEATH((void)world().all_reduce({.input = Tensor::empty(DType::kU8, {3}), .output = Tensor::empty(DType::kU8, {3})}),
               "comm\\.cc:[0-9]+: .*no reduction over U8");
}

}  // namespace
}  // namespace klinear
