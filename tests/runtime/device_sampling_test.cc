// Sampling on the device through the engine and generate() (docs/DESIGN.md "Sampling on the
// device"), on the CPU backend: requests that use only temperature, top-k, top-p and a seed,
// several choices each, run together in one engine beside a request with penalties (host
// sampler) and a greedy one, give each choice the tokens generate() gives alone for its seed; the
// same run again gives the same tokens, other seeds other tokens; and the device path is really
// taken (the runner reports drawn ids, not logits, for those rows).
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "io/presets.h"
#include "model/model_cases.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/model_runner.h"
#include "test_util.h"

namespace klinear {
namespace {

TEST(DeviceSampling, EngineChoicesEqualGenerateAloneAndRepeat) {
  const testing::ScratchDir dir;
  std::mt19937_64 rng(testing::fresh_seed());

  struct Case {
    const char* name;
    SamplingParams p;
    int n;
  };
  auto params = [](float t, int k, float top_p, uint64_t seed, float presence = 0.0f) {
    SamplingParams p;
    p.temperature = t, p.top_k = k, p.top_p = top_p, p.seed = seed, p.presence_penalty = presence;
    return p;
  };
  const std::vector<Case> cases = {
      {"temperature", params(1.0f, 0, 1.0f, rng()), 2},
      {"top-k", params(0.8f, 8, 1.0f, rng()), 1},
      {"top-p", params(1.3f, 0, 0.7f, rng()), 3},
      {"top-k and top-p", params(0.9f, 20, 0.9f, rng()), 1},
      {"greedy", params(0.0f, 0, 1.0f, 0), 1},
      {"presence penalty (host sampler)", params(1.0f, 0, 1.0f, rng(), 0.5f), 1},
  };
  const int kTokens = 9;
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < cases.size(); ++i) {
    prompts.emplace_back(1 + rng() % 30);
    for (int32_t& id : prompts.back()) id = static_cast<int32_t>(rng() % 256);
  }
  // Routed clear of ties on the prompts, so batching cannot legitimately change a token.
  testing::write_untied_checkpoint(preset_config("kimi-linear-tiny").value(), dir.str(), prompts, rng());
  auto backend = make_backend(BackendOptions{}).value();
  auto model = Model::load(dir.str(), *backend).value();
  for (const Case& c : cases)
    EXPECT_EQ(device_samplable(c.p, -1), c.p.presence_penalty == 0.0f) << c.name;

  auto run_engine = [&](uint64_t seed_offset) {
    auto runner = ModelRunner::create(*model, CacheOptions{16, 16, 32 << 20}).value();
    Engine engine(*runner, nullptr, EngineOptions{{64, 16}, 100, {}});
    std::vector<std::vector<std::vector<int32_t>>> got(cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      RequestSpec s;
      s.prompt = prompts[i];
      s.sampling = cases[i].p;
      s.sampling.seed += seed_offset;
      s.n = cases[i].n;
      s.stop.max_tokens = kTokens;
      s.stop.ignore_eos = true;
      got[i].resize(static_cast<size_t>(cases[i].n));
      EXPECT_TRUE(engine.submit(s, [&got, i](const EngineEvent& e) {
        for (const TokenOutput& t : e.tokens) got[i][static_cast<size_t>(e.choice)].push_back(t.id);
      }).ok());
    }
    engine.run_until_idle();
    return got;
  };
  const auto first = run_engine(0);
  EXPECT_EQ(run_engine(0), first) << "the same seeds gave other tokens";
  // Other seeds give other tokens: the sampled choices (every case but greedy) together draw 8 x 9
  // tokens from the tiny model's spread distributions; equal by chance is out of reach.
  const auto other = run_engine(1);
  std::vector<std::vector<int32_t>> sampled_first, sampled_other;
  for (size_t i = 0; i < cases.size(); ++i)
    if (cases[i].p.temperature > 0.0f) {
      sampled_first.insert(sampled_first.end(), first[i].begin(), first[i].end());
      sampled_other.insert(sampled_other.end(), other[i].begin(), other[i].end());
    } else {
      EXPECT_EQ(other[i], first[i]) << cases[i].name << ": greedy depends on no seed";
    }
  EXPECT_NE(sampled_other, sampled_first) << "seeds + 1 gave the same tokens: the seed is not used";
  for (size_t i = 0; i < cases.size(); ++i)
    for (int j = 0; j < cases[i].n; ++j) {
      GenerateOptions o;
      o.max_tokens = kTokens;
      o.ignore_eos = true;
      o.sampling = cases[i].p;
      o.sampling.seed += static_cast<uint64_t>(j);
      const auto alone = generate(*model, prompts[i], o, nullptr);
      ASSERT_TRUE(alone.ok()) << alone.status().to_string();
      EXPECT_EQ(first[i][static_cast<size_t>(j)], alone->ids) << cases[i].name << " choice " << j;
    }

  // The runner draws on the device for the rows asking it, and returns logits for the others.
  auto runner = ModelRunner::create(*model, CacheOptions{4, 16, 32 << 20}).value();
  const RunnerSeq a = runner->open().value(), b = runner->open().value();
  std::vector<RunnerStep> steps = {{a, prompts[0], StepLogits::kLast, 0, sample_row(cases[0].p, 0)},
                                   {b, prompts[1], StepLogits::kLast, 0, {}}};
  for (const RunnerStep& s : steps) ASSERT_TRUE(runner->reserve(s.seq, static_cast<int64_t>(s.ids.size())));
  auto out = runner->run(steps);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->ids.size(), 1u);
  EXPECT_EQ(out->logits.dim(0), 1);
  EXPECT_TRUE(out->ids[0] >= 0 && out->ids[0] < model->config().vocab_size);
}

}  // namespace
}  // namespace klinear
