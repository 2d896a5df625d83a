// KDA core on the CPU: both forms against the kda-op fixture (the HF recurrence, T=200 not a
// multiple of 64, non-zero initial state), and chunked vs recurrent on random inputs over a case
// table (lengths around the chunk size, both gate forms).
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cpu/backend.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::close_rel;

enum class Form { kChunked, kRecurrent };

// Runs one form over [B, T, H, D] fixture tensors sequence by sequence.
void run_form(cpu::CpuBackend& be, Form form, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
              const Tensor& beta, const Tensor& state, const Tensor& out) {
  const int64_t B = q.dim(0), T = q.dim(1), H = q.dim(2), D = q.dim(3);
  for (int64_t b = 0; b < B; ++b) {
    auto seq = [&](const Tensor& t, Shape s) { return t.rows(b, b + 1).view(std::move(s)); };
    const Shape thd{T, H, D};
    auto fn = form == Form::kChunked ? &cpu::CpuBackend::kda_chunked : &cpu::CpuBackend::kda_recurrent;
    (be.*fn)(seq(q, thd), seq(k, thd), seq(v, thd), seq(g, thd), seq(beta, {T, H}), seq(state, {H, D, D}),
             seq(out, thd));
  }
}

Tensor host_copy(const Tensor& t) {
  Tensor c = Tensor::empty(DType::kF32, t.shape());
  convert_to_f32(t.dtype(), t.data(), c.f32(), static_cast<size_t>(t.numel()));
  return c;
}

TEST(KdaOp, FixtureBothForms) {
  auto f = SafetensorsFile::open(testing::fixture_path("kda-op/kda.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto get = [&](const char* n) { return host_copy(f->tensor(*f->find(n))); };
  cpu::CpuBackend be;
  for (Form form : {Form::kChunked, Form::kRecurrent}) {
    SCOPED_TRACE(form == Form::kChunked ? "chunked" : "recurrent");
    Tensor state = get("initial_state");
    Tensor out = Tensor::zeros(DType::kF32, get("v").shape());
    run_form(be, form, get("q"), get("k"), get("v"), get("g"), get("beta"), state, out);
    EXPECT_TRUE(close_rel(out, get("out"), 1e-5));
    EXPECT_TRUE(close_rel(state, get("final_state"), 1e-5));
  }
}

struct KdaCase {
  int64_t t, heads, d;
  KdaGateParams::Kind gate;
  bool zero_state;
};

class KdaChunkVsRecurrent : public ::testing::TestWithParam<KdaCase> {};

TEST_P(KdaChunkVsRecurrent, Match) {
  const KdaCase c = GetParam();
  std::printf("[ case ] T=%lld H=%lld d=%lld gate=%s zero_state=%d\n", (long long)c.t, (long long)c.heads,
              (long long)c.d, c.gate == KdaGateParams::Kind::kSoftplus ? "softplus" : "lower-bound", c.zero_state);
  std::mt19937_64 rng(testing::fresh_seed());
  cpu::CpuBackend be;
  const Shape thd{c.t, c.heads, c.d};
  Tensor q = testing::random_tensor(rng, thd), k = testing::random_tensor(rng, thd), v = testing::random_tensor(rng, thd);
  // Realistic gates: f random, then the model's gate op.
  Tensor f = testing::random_tensor(rng, {c.t, c.heads * c.d}, -3.0f, 3.0f);
  Tensor dt = testing::random_tensor(rng, {c.heads * c.d});
  Tensor a_log = testing::random_tensor(rng, {c.heads}, 0.0f, 2.0f);
  Tensor g = Tensor::empty(DType::kF32, thd);
  be.kda_gate(f, dt, a_log, {c.gate, -5.0f}, g.view({c.t, c.heads * c.d}));
  Tensor beta = testing::random_tensor(rng, {c.t, c.heads}, 0.0f, 1.0f);
  Tensor s0 = c.zero_state ? Tensor::zeros(DType::kF32, {c.heads, c.d, c.d})
                           : testing::random_tensor(rng, {c.heads, c.d, c.d});
  Tensor s_chunk = Tensor::empty(DType::kF32, s0.shape()), s_rec = Tensor::empty(DType::kF32, s0.shape());
  std::memcpy(s_chunk.data(), s0.data(), s0.nbytes());
  std::memcpy(s_rec.data(), s0.data(), s0.nbytes());
  Tensor o_chunk = Tensor::empty(DType::kF32, thd), o_rec = Tensor::empty(DType::kF32, thd);
  be.kda_chunked(q, k, v, g, beta, s_chunk, o_chunk);
  be.kda_recurrent(q, k, v, g, beta, s_rec, o_rec);
  EXPECT_TRUE(close_rel(o_chunk, o_rec, 1e-5));
  EXPECT_TRUE(close_rel(s_chunk, s_rec, 1e-5));
}

INSTANTIATE_TEST_SUITE_P(
    KdaCases, KdaChunkVsRecurrent,
    ::testing::Values(KdaCase{1, 2, 16, KdaGateParams::Kind::kSoftplus, false},
                      KdaCase{63, 2, 16, KdaGateParams::Kind::kLowerBound, false},
                      KdaCase{64, 3, 32, KdaGateParams::Kind::kSoftplus, true},
                      KdaCase{65, 2, 32, KdaGateParams::Kind::kLowerBound, true},
                      KdaCase{150, 2, 32, KdaGateParams::Kind::kSoftplus, false},
                      KdaCase{200, 4, 32, KdaGateParams::Kind::kLowerBound, false},
                      KdaCase{131, 1, 64, KdaGateParams::Kind::kSoftplus, false}));

// The gate forms themselves (SPEC 4.3) on hand-checked values.
TEST(KdaGate, Forms) {
  cpu::CpuBackend be;
  Tensor f = Tensor::from_f32({1, 2}, {0.5f, 30.0f});
  Tensor dt = Tensor::from_f32({2}, {0.25f, -1.0f});
  Tensor a_log = Tensor::from_f32({1}, {std::log(2.0f)});
  Tensor g = Tensor::empty(DType::kF32, {1, 2});
  be.kda_gate(f, dt, a_log, {KdaGateParams::Kind::kSoftplus, 0.0f}, g);
  EXPECT_NEAR(g.f32()[0], -2.0f * std::log1p(std::exp(0.75f)), 1e-6);
  EXPECT_NEAR(g.f32()[1], -2.0f * 29.0f, 1e-4);  // softplus is the identity above 20
  be.kda_gate(f, dt, a_log, {KdaGateParams::Kind::kLowerBound, -5.0f}, g);
  EXPECT_NEAR(g.f32()[0], -5.0f / (1.0f + std::exp(-2.0f * 0.75f)), 1e-6);
  EXPECT_NEAR(g.f32()[1], -5.0f, 1e-5);
}

}  // namespace
}  // namespace klinear
