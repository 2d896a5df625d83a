// Context-parallel KDA (dist/kda_context.h) over the launch's ranks against one rank, on the CPU in
// float32: every strategy's forward (each rank's output rows, the end state) and backward (each
// rank's dq, dk, dv, dg, dβ rows, the start-state gradient) equal kda_chunked and
// kda_chunked_backward run on the whole sequence, for lengths 1 to 1000 (shorter than the ranks,
// not divisible by them or by the chunk), with and without a start state and an end-state gradient.
// And the meshes' checks: every error the flags can make.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "dist/kda_context.h"
#include "dist/ranks.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::all_close;

constexpr int64_t kHeads = 4, kDk = 16, kDv = 8;

// One sequence's inputs (host F32): q and k L2-normalised per head (the op takes them as given).
struct Inputs {
  int64_t len = 0;
  Tensor q, k, v, g, beta, d_out;
  Tensor h0, d_ht;  // [1, H, dk, dv]; zero when the case has none
};

void normalise_heads(Tensor& t) {
  for (int64_t i = 0; i < t.numel() / kDk; ++i) {
    float* x = t.f32() + i * kDk;
    double n2 = 0;
    for (int64_t j = 0; j < kDk; ++j) n2 += double(x[j]) * x[j];
    for (int64_t j = 0; j < kDk; ++j) x[j] = static_cast<float>(x[j] / std::sqrt(n2));
  }
}

Inputs random_inputs(std::mt19937_64& rng, int64_t len, bool states) {
  Inputs in;
  in.len = len;
  in.q = testing::random_tensor(rng, {len, kHeads, kDk});
  in.k = testing::random_tensor(rng, {len, kHeads, kDk});
  normalise_heads(in.q);
  normalise_heads(in.k);
  in.v = testing::random_tensor(rng, {len, kHeads, kDv});
  in.g = testing::random_tensor(rng, {len, kHeads, kDk}, -0.4f, -0.01f);
  in.beta = testing::random_tensor(rng, {len, kHeads}, 0.05f, 0.95f);
  in.d_out = testing::random_tensor(rng, {len, kHeads, kDv});
  in.h0 = states ? testing::random_tensor(rng, {1, kHeads, kDk, kDv}) : Tensor::zeros(DType::kF32, {1, kHeads, kDk, kDv});
  in.d_ht = states ? testing::random_tensor(rng, {1, kHeads, kDk, kDv}) : Tensor::zeros(DType::kF32, {1, kHeads, kDk, kDv});
  return in;
}

// What one rank computes for the whole sequence (host F32).
struct Results {
  Tensor o, ht, dq, dk, dv, dg, dbeta, dh0;
};

SeqLayout one_sequence(Backend& be, int64_t rows) {
  SeqLayout l;
  l.cu_seqlens = {0, static_cast<int32_t>(rows)};
  l.cached = {0};
  l.slots = {0};
  be.upload_layout(l);
  return l;
}

Results whole(Backend& be, const Inputs& in) {
  const SeqLayout l = one_sequence(be, in.len);
  auto dev = [&](const Tensor& t) { return be.to_device(t, DType::kF32); };
  const Tensor q = dev(in.q), k = dev(in.k), v = dev(in.v), g = dev(in.g), beta = dev(in.beta);
  const Tensor states = dev(in.h0), o = be.alloc(DType::kF32, {in.len, kHeads, kDv});
  be.kda_chunked({q, k, v, g, beta, states, o, KdaQkNorm::kGiven}, l);
  const Shape qk{in.len, kHeads, kDk};
  KdaBackwardArgs b{q, k, v, g, beta, dev(in.h0), dev(in.d_out), dev(in.d_ht), KdaQkNorm::kGiven,
                    be.alloc(DType::kF32, qk), be.alloc(DType::kF32, qk), be.alloc(DType::kF32, {in.len, kHeads, kDv}),
                    be.alloc(DType::kF32, qk), be.alloc(DType::kF32, {in.len, kHeads}),
                    be.alloc(DType::kF32, {1, kHeads, kDk, kDv})};
  be.kda_chunked_backward(b, l);
  return {be.to_host(o), be.to_host(states), be.to_host(b.dq), be.to_host(b.dk), be.to_host(b.dv),
          be.to_host(b.dg), be.to_host(b.dbeta), be.to_host(b.dh0)};
}

// This rank's part by context parallelism over `comm`: rows [r0, r1) of the outputs, and the states.
Results context_parallel(Backend& be, Comm& comm, const KdaCpMesh& mesh, const Inputs& in, int64_t r0, int64_t r1) {
  const int64_t n = r1 - r0;
  auto rows = [&](const Tensor& t) { return n > 0 ? be.to_device(t.rows(r0, r1), DType::kF32) : Tensor(); };
  auto alloc = [&](Shape shape) {
    shape[0] = n;
    return n > 0 ? be.alloc(DType::kF32, shape) : Tensor();
  };
  auto poisoned = [&](Shape shape) {  // unwritten elements fail the comparison
    const Tensor t = alloc(std::move(shape));
    if (t.defined()) be.fill(t, NAN);
    return t;
  };
  auto host_copy = [](const Tensor& t) {
    Tensor c = Tensor::empty(DType::kF32, t.shape());
    std::copy(t.f32(), t.f32() + t.numel(), c.f32());
    return c;
  };
  const Shape qk{in.len, kHeads, kDk}, vs{in.len, kHeads, kDv};
  const Tensor q = rows(in.q), k = rows(in.k), v = rows(in.v), g = rows(in.g), beta = rows(in.beta);
  Results r;
  r.ht = host_copy(in.h0);
  const Tensor o = poisoned(vs);
  const Status fwd = kda_cp_forward(be, comm, mesh, {q, k, v, g, beta, KdaQkNorm::kGiven, r.ht, o});
  EXPECT_TRUE(fwd.ok()) << fwd.to_string();
  r.dh0 = host_copy(in.d_ht);
  KdaCpBackwardArgs b{q, k, v, g, beta, rows(in.d_out), KdaQkNorm::kGiven, in.h0, r.dh0,
                      poisoned(qk), poisoned(qk), poisoned(vs), poisoned(qk), poisoned({in.len, kHeads})};
  const Status bwd = kda_cp_backward(be, comm, mesh, b);
  EXPECT_TRUE(bwd.ok()) << bwd.to_string();
  if (n > 0) {
    r.o = be.to_host(o);
    r.dq = be.to_host(b.dq);
    r.dk = be.to_host(b.dk);
    r.dv = be.to_host(b.dv);
    r.dg = be.to_host(b.dg);
    r.dbeta = be.to_host(b.dbeta);
  }
  return r;
}

// The meshes of every strategy on P ranks for kHeads heads: grouped in groups of P/2 (and of 1 on
// odd P), hybrid with Ulysses over 2 ranks where P is even.
std::vector<std::pair<std::string, KdaCpMesh>> meshes(int ranks) {
  const bool even = ranks % 2 == 0;
  const struct {
    const char* name;
    KdaCpMode mode;
    int group, ulysses;
  } modes[] = {{"p2p", KdaCpMode::kP2p, 0, 0},
               {"allgather", KdaCpMode::kAllGather, 0, 0},
               {"grouped", KdaCpMode::kGrouped, even ? ranks / 2 : 1, 0},
               {"ulysses", KdaCpMode::kUlysses, 0, 0},
               {"hybrid", KdaCpMode::kHybrid, 0, even ? 2 : 1}};
  std::vector<std::pair<std::string, KdaCpMesh>> out;
  for (const auto& m : modes) {
    auto mesh = kda_cp_mesh(m.mode, ranks, kHeads, m.group, m.ulysses);
    EXPECT_TRUE(mesh.ok()) << m.name << ": " << mesh.status().to_string();
    if (mesh.ok()) out.emplace_back(m.name, *mesh);
  }
  return out;
}

class KdaContextTest : public testing::RanksTest {};

// all_close, except that a reference of exact zeros (dg of a first row decaying a zero state, with
// no end-state gradient) wants exact zeros.
::testing::AssertionResult matches(const Tensor& got, const Tensor& want, double tol) {
  if (std::all_of(want.f32(), want.f32() + want.numel(), [](float x) { return x == 0.0f; })) {
    if (got.numel() == want.numel() && std::all_of(got.f32(), got.f32() + got.numel(), [](float x) { return x == 0.0f; }))
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "the reference is exactly zero, the result is not";
  }
  return all_close(got, want, tol);
}

TEST_F(KdaContextTest, EveryStrategyEqualsOneRank) {
  std::mt19937_64 rng(seed());
  auto be = std::move(make_backend(BackendOptions{})).value();
  // The scan reorders a recurrence's sums at the segment boundaries: one op's fp32 depth; dg's rows
  // as the chunk form's gradients (segments move the chunk boundaries).
  const double tol = testing::kOp.rel(DType::kF32), tol_dg = testing::kGradients.rel(DType::kF32);
  for (const int64_t len : {1, 63, 64, 65, 200, 1000})
    for (const bool states : {false, true}) {
      const Inputs in = random_inputs(rng, len, states);
      be->begin_step();
      const Results want = whole(*be, in);
      const int64_t r0 = len * rank() / size(), r1 = len * (rank() + 1) / size();
      for (const auto& [name, mesh] : meshes(size())) {
        SCOPED_TRACE(name + " over " + std::to_string(size()) + " ranks, T " + std::to_string(len) +
                     (states ? ", with h0 and dht" : ", no h0 or dht") + ", rows [" + std::to_string(r0) + ", " +
                     std::to_string(r1) + ")");
        be->begin_step();
        const Results got = context_parallel(*be, world(), mesh, in, r0, r1);
        EXPECT_TRUE(matches(got.ht, want.ht, tol)) << "end state";
        EXPECT_TRUE(matches(got.dh0, want.dh0, tol)) << "start-state gradient";
        if (r1 == r0) continue;
        EXPECT_TRUE(matches(got.o, want.o.rows(r0, r1), tol)) << "o";
        EXPECT_TRUE(matches(got.dq, want.dq.rows(r0, r1), tol)) << "dq";
        EXPECT_TRUE(matches(got.dk, want.dk.rows(r0, r1), tol)) << "dk";
        EXPECT_TRUE(matches(got.dv, want.dv.rows(r0, r1), tol)) << "dv";
        EXPECT_TRUE(matches(got.dg, want.dg.rows(r0, r1), tol_dg)) << "dg";
        EXPECT_TRUE(matches(got.dbeta, want.dbeta.rows(r0, r1), tol)) << "dbeta";
      }
    }
}

// The reference's checks, as the flags reach them (8 ranks, 4 heads).
TEST_F(KdaContextTest, MeshesRefuseWhatTheyCannotRun) {
  const struct {
    KdaCpMode mode;
    int group, ulysses;
    const char* error;  // empty: accepted
  } cases[] = {
      {KdaCpMode::kGrouped, 0, 0, "--cp-mode grouped needs --allgather-group-size"},
      {KdaCpMode::kGrouped, 3, 0, "--allgather-group-size 3: must divide the 8 ranks"},
      {KdaCpMode::kGrouped, 4, 0, ""},
      {KdaCpMode::kP2p, 2, 0, "--allgather-group-size applies to --cp-mode grouped and hybrid only"},
      {KdaCpMode::kAllGather, 0, 2, "--ulysses-degree applies to --cp-mode ulysses and hybrid only"},
      {KdaCpMode::kUlysses, 0, 0, "ulysses degree 8 does not divide the 4 heads"},
      {KdaCpMode::kUlysses, 0, 4, "--ulysses-degree 4: must equal the 8 ranks"},
      {KdaCpMode::kHybrid, 0, 0, "--cp-mode hybrid needs --ulysses-degree"},
      {KdaCpMode::kHybrid, 0, 3, "--ulysses-degree 3: must divide the 8 ranks"},
      {KdaCpMode::kHybrid, 0, 8, "ulysses degree 8 does not divide the 4 heads"},
      {KdaCpMode::kHybrid, 4, 4, "--allgather-group-size 4: must divide the 2 state-parallel segments"},
      {KdaCpMode::kHybrid, 0, 4, ""},
  };
  for (const auto& c : cases) {
    const auto mesh = kda_cp_mesh(c.mode, 8, kHeads, c.group, c.ulysses);
    if (*c.error == '\0') {
      EXPECT_TRUE(mesh.ok()) << mesh.status().to_string();
      continue;
    }
    EXPECT_FALSE(mesh.ok()) << c.error;
    if (mesh.ok()) continue;
    EXPECT_NE(mesh.status().to_string().find(c.error), std::string::npos) << mesh.status().to_string();
  }
  EXPECT_FALSE(parse_kda_cp_mode("ring").ok());
  auto hybrid = parse_kda_cp_mode("hybrid");
  EXPECT_TRUE(hybrid.ok() && *hybrid == KdaCpMode::kHybrid);
}

}  // namespace
}  // namespace klinear
