// kda_decode (one fused decode step of a KDA layer) on every backend row against the composition
// of the existing ops on the CPU (kda_decode_by_ops; for the bf16 row through Bf16Storage, which
// stores the composition's intermediates in bf16 as the bf16 backend does): y, the KDA state pool
// and the conv state pool, over a case table of batches of 1, 3, 64 and 200 sequences, 1 to 4
// heads, head dims 12, 16, 20, 32, 80 and 128, conv kernels of 1 to 4 taps, both gate forms with
// strong decay, non-zero states, slots out of order and padded sequences (whose pools must stay
// untouched and whose y rows are zero). On the CPU row the op is the composition itself, so that
// row checks the padding; the composition's ops have their own tests, and the model fixtures run
// it for every decode row.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <memory>

#include "backend_cases.h"
#include "model/bf16_reference.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::all_close;

struct DecodeCase {
  int64_t seqs, heads, d;
  int64_t kc;  // conv taps (Kc)
  KdaGate gate;
  bool padded;  // every third sequence (and the last) is padding
};

// The host inputs of one call.
struct DecodeInputs {
  Tensor qkv, conv_w, conv_states, f, dt_bias, a_log, beta, og, o_norm, states;
};

class KdaDecode : public testing::BackendTest {
 public:
  static constexpr float kEps = 1e-5f;

  // Runs kda_decode on `be` over the inputs; returns y, the state pool and the conv pool on the host.
  static std::array<Tensor, 3> run(Backend& be, const DecodeInputs& in, const DecodeCase& c, int64_t pad_slot,
                                   SeqLayout layout) {
    const DType act = be.activation_dtype();
    auto pool = [&](const Tensor& h, DType dt) {
      Tensor t = be.alloc_persistent(dt, h.shape());
      be.copy(be.to_device(h, dt), t);
      return t;
    };
    be.begin_step();
    be.upload_layout(layout);
    const Tensor conv_states = pool(in.conv_states, act), states = pool(in.states, DType::kF32);
    Tensor y = be.alloc(act, {c.seqs, c.heads * c.d});
    be.fill(y, std::numeric_limits<float>::quiet_NaN());
    be.kda_decode(KdaDecodeArgs{be.to_device(in.qkv, act), be.to_device(in.conv_w, act), conv_states,
                                be.to_device(in.f, DType::kF32), be.to_device(in.dt_bias, DType::kF32),
                                be.to_device(in.a_log, DType::kF32), KdaGateParams{c.gate, -5.0f},
                                be.to_device(in.beta, DType::kF32), be.to_device(in.og, act),
                                be.to_device(in.o_norm, act), kEps, states, pad_slot, y},
                  layout);
    return {be.to_host(y), be.to_host(states), be.to_host(conv_states)};
  }
};

TEST_P(KdaDecode, MatchesTheCompositionOfOps) {
  const std::vector<DecodeCase> cases = {
      {1, 2, 16, 4, KdaGate::kSoftplus, false},    {1, 4, 128, 1, KdaGate::kLowerBound, false},
      {3, 2, 32, 3, KdaGate::kLowerBound, false},  {3, 3, 128, 4, KdaGate::kSoftplus, true},
      {64, 2, 128, 4, KdaGate::kSoftplus, false},  {64, 2, 16, 3, KdaGate::kLowerBound, true},
      {64, 1, 32, 1, KdaGate::kSoftplus, true},    {64, 2, 128, 4, KdaGate::kLowerBound, true},
      {3, 2, 80, 4, KdaGate::kSoftplus, true},  // CUDA: a last column tile half used, rows past dk
      // CUDA: head dims not a multiple of 8 (element-wise accesses, a last chunk of 4), an odd
      // number of heads (a prelude block's second head absent), Kc = 2, a last norm block part used.
      {200, 3, 20, 2, KdaGate::kLowerBound, true}, {1, 1, 12, 4, KdaGate::kSoftplus, false},
      {5, 2, 16, 6, KdaGate::kSoftplus, true},  // CUDA: more conv taps than the kernels hold: the ops
  };
  std::mt19937_64 rng(testing::fresh_seed());
  auto cpu = make_backend(BackendOptions{});
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  std::unique_ptr<Backend> bf16;
  Backend* ref = (*cpu).get();
  if (act() == DType::kBF16) ref = (bf16 = std::make_unique<testing::Bf16Storage>(**cpu)).get();

  for (const DecodeCase& c : cases) {
    const int64_t H = c.heads, d = c.d, C = 3 * H * d, slots = c.seqs + 3, pad_slot = slots - 1;
    SCOPED_TRACE("seqs " + std::to_string(c.seqs) + " H " + std::to_string(H) + " d " + std::to_string(d) +
                 " Kc " + std::to_string(c.kc) +
                 (c.gate == KdaGate::kSoftplus ? " softplus" : " lower-bound") + (c.padded ? " padded" : ""));
    // Real sequences in shuffled slots other than the padding's.
    std::vector<int32_t> slot_of(static_cast<size_t>(pad_slot));
    std::iota(slot_of.begin(), slot_of.end(), 0);
    std::shuffle(slot_of.begin(), slot_of.end(), rng);
    slot_of.resize(static_cast<size_t>(c.seqs));
    if (c.padded)
      for (int64_t b = 0; b < c.seqs; ++b)
        if (b % 3 == 1 || b == c.seqs - 1) slot_of[b] = static_cast<int32_t>(pad_slot);
    const SeqLayout layout = testing::make_layout(std::vector<int32_t>(c.seqs, 1), std::vector<int32_t>(c.seqs, 7),
                                                  slot_of, 64, c.seqs, rng);
    // Strong decay: A up to e^2.5 with |f| up to 3 (softplus form: g down to ~ −37 per step).
    const DecodeInputs in{testing::random_tensor(rng, {c.seqs, C}),
                          testing::random_tensor(rng, {C, c.kc}),
                          testing::random_tensor(rng, {slots, c.kc - 1, C}),
                          testing::random_tensor(rng, {c.seqs, H * d}, -3.0f, 3.0f),
                          testing::random_tensor(rng, {H * d}),
                          testing::random_tensor(rng, {H}, 0.0f, 2.5f),
                          testing::random_tensor(rng, {c.seqs, H}, -3.0f, 3.0f),
                          testing::random_tensor(rng, {c.seqs, H * d}, -3.0f, 3.0f),
                          testing::random_tensor(rng, {d}, 0.5f, 1.5f),
                          testing::random_tensor(rng, {slots, H, d, d}, -0.5f, 0.5f)};
    const auto [y_ref, s_ref, conv_ref] = run(*ref, in, c, pad_slot, layout);
    const auto [y, s, conv] = run(be(), in, c, pad_slot, layout);
    EXPECT_TRUE(all_close(y, y_ref, tol())) << "y";
    EXPECT_TRUE(all_close(s, s_ref, tol())) << "KDA state pool";
    if (c.kc > 1) {  // Kc = 1: no pool
      EXPECT_TRUE(all_close(conv, conv_ref, tol())) << "conv state pool";
    }
    if (c.padded) {  // the padding's slot exactly as it was, its rows of y zero
      EXPECT_EQ(std::memcmp(s.rows(pad_slot, slots).data(), in.states.rows(pad_slot, slots).data(),
                            static_cast<size_t>(H * d * d) * sizeof(float)),
                0);
      const Tensor conv_in = host(dev(in.conv_states));
      EXPECT_EQ(std::memcmp(conv.rows(pad_slot, slots).data(), conv_in.rows(pad_slot, slots).data(),
                            static_cast<size_t>((c.kc - 1) * C) * sizeof(float)),
                0);
      for (int64_t b = 0; b < c.seqs; ++b) {
        if (slot_of[b] != pad_slot) continue;
        for (int64_t i = 0; i < H * d; ++i) ASSERT_EQ(y.f32()[b * H * d + i], 0.0f) << "padded row " << b;
      }
    }
  }
}

KL_BACKEND_SUITE(KdaDecode);

}  // namespace
}  // namespace klinear
