// BatchInvariance::kOn on the CPU (issue 40): a probe sequence gives the same bits alone as beside
// other sequences' prefill chunks and decode rows, as one of several copies in one step, and
// prefilled whole as in pieces that end on 64-token boundaries: every logit of its prompt and of 6
// greedy decode steps, and so its tokens. On the fixtures of both families (K3's MXFP4 experts too).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/model.h"
#include "model_cases.h"
#include "test_util.h"

namespace klinear {
namespace {

constexpr int64_t kPrompt = 71, kDecode = 6;

// Bit for bit (NaN fails: a reference must be finite).
::testing::AssertionResult same_bits(const Tensor& got, const Tensor& want) {
  if (got.numel() != want.numel())
    return ::testing::AssertionFailure() << "size " << got.numel() << " vs " << want.numel();
  for (int64_t i = 0; i < want.numel(); ++i) {
    if (!std::isfinite(want.f32()[i])) return ::testing::AssertionFailure() << "non-finite reference at " << i;
    if (std::memcmp(got.f32() + i, want.f32() + i, sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << got.f32()[i] << " vs " << want.f32()[i];
  }
  return ::testing::AssertionSuccess();
}

int32_t argmax_last(const Tensor& logits) {
  const int64_t v = logits.dim(-1);
  const float* row = logits.f32() + logits.numel() - v;
  return static_cast<int32_t>(std::max_element(row, row + v) - row);
}

// One step over pieces of open sequences: each piece's logits (host, every row).
struct Piece {
  SeqId seq;
  std::vector<int32_t> ids;
};
std::vector<Tensor> step(Model& m, Cache& c, Backend& be, const std::vector<Piece>& pieces) {
  std::vector<SeqStep> steps;
  for (const Piece& p : pieces) steps.push_back(SeqStep{p.seq, p.ids, LogitsMode::kAll});
  EXPECT_TRUE(c.reserve(steps).ok());
  auto batch = c.plan(steps);
  EXPECT_TRUE(batch.ok()) << batch.status().to_string();
  auto logits = m.forward(*batch, c);
  EXPECT_TRUE(logits.ok()) << logits.status().to_string();
  const Tensor h = be.to_host(*logits);
  std::vector<Tensor> out;
  int64_t r0 = 0;
  for (const Piece& p : pieces) {
    const int64_t n = static_cast<int64_t>(p.ids.size());
    Tensor rows = Tensor::empty(DType::kF32, {n, h.dim(1)});
    std::memcpy(rows.f32(), h.f32() + r0 * h.dim(1), static_cast<size_t>(rows.numel()) * sizeof(float));
    out.push_back(rows);
    r0 += n;
  }
  return out;
}

class BatchInvariantMode : public ::testing::TestWithParam<const char*> {};

TEST_P(BatchInvariantMode, ProbeGivesTheSameBitsInAnyCompany) {
  BackendOptions options;
  options.batch_invariance = klinear::BatchInvariance::kOn;
  auto be = make_backend(options);
  ASSERT_TRUE(be.ok()) << be.status().to_string();
  const std::string dir = testing::fixture_path(std::string(GetParam()) + "/model");
  const Json cfg = read_json_file(dir + "/config.json").value();
  const uint64_t seed = testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const std::vector<int32_t> probe = testing::random_ids(cfg, kPrompt, seed);
  auto model = Model::load(dir, **be);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  Model& m = **model;
  auto cache = Cache::create(m.config(), **be, CacheOptions{12, 16, 256 << 20});
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  Cache& c = **cache;
  auto slice = [](const std::vector<int32_t>& v, int64_t a, int64_t b) {
    return std::vector<int32_t>(v.begin() + a, v.begin() + b);
  };

  // Alone, the prompt whole: the reference prompt logits, tokens and decode logits.
  std::vector<Tensor> want;
  std::vector<int32_t> tokens;
  {
    const SeqId id = c.open().value();
    want.push_back(step(m, c, **be, {{id, probe}})[0]);
    for (int64_t i = 0; i < kDecode; ++i) {
      tokens.push_back(argmax_last(want.back()));
      want.push_back(step(m, c, **be, {{id, {tokens.back()}}})[0]);
    }
    c.close(id);
  }

  // Beside others, the prompt in two pieces ([0, 64), [64, 71)): others' prefill chunks (lengths
  // 5, 40 and 100, the last in pieces of 33 and 67) and decode rows in every step.
  {
    SCOPED_TRACE("beside others, in pieces");
    const SeqId id = c.open().value();
    std::vector<SeqId> others;
    std::vector<std::vector<int32_t>> other_ids;
    for (int64_t len : {5, 40, 100}) {
      others.push_back(c.open().value());
      other_ids.push_back(testing::random_ids(cfg, len, rng()));
    }
    auto got = step(m, c, **be,
                    {{others[0], other_ids[0]}, {others[2], slice(other_ids[2], 0, 33)}, {id, slice(probe, 0, 64)},
                     {others[1], other_ids[1]}});
    EXPECT_TRUE(same_bits(got[2], want[0].rows(0, 64)));
    got = step(m, c, **be,
               {{others[0], {7}}, {id, slice(probe, 64, kPrompt)}, {others[2], slice(other_ids[2], 33, 100)}, {others[1], {9}}});
    EXPECT_TRUE(same_bits(got[1], want[0].rows(64, kPrompt)));
    for (int64_t i = 0; i < kDecode; ++i) {
      got = step(m, c, **be, {{others[1], {static_cast<int32_t>(rng() % 64)}}, {id, {tokens[i]}},
                              {others[2], {static_cast<int32_t>(rng() % 64)}}});
      EXPECT_TRUE(same_bits(got[1], want[1 + i])) << "decode step " << i;
      EXPECT_EQ(argmax_last(got[1]), i + 1 < kDecode ? tokens[i + 1] : argmax_last(want.back()));
    }
    c.close(id);
    for (SeqId o : others) c.close(o);
  }

  // Eight copies in each step.
  {
    SCOPED_TRACE("eight copies");
    std::vector<SeqId> ids;
    std::vector<Piece> prefill;
    for (int i = 0; i < 8; ++i) {
      ids.push_back(c.open().value());
      prefill.push_back({ids.back(), probe});
    }
    const auto got = step(m, c, **be, prefill);
    for (const Tensor& t : got) EXPECT_TRUE(same_bits(t, want[0]));
    for (int64_t i = 0; i < kDecode; ++i) {
      std::vector<Piece> decode;
      for (SeqId s : ids) decode.push_back({s, {tokens[i]}});
      for (const Tensor& t : step(m, c, **be, decode)) EXPECT_TRUE(same_bits(t, want[1 + i])) << "decode step " << i;
    }
    for (SeqId s : ids) c.close(s);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchInvariantMode,
                         ::testing::Values("kimi-linear-tiny", "k3-tiny", "k3-tiny-mxfp4"),
                         [](const auto& info) { return testing::identifier(info.param); });

}  // namespace
}  // namespace klinear
