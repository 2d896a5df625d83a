// The engine over the real model (ModelRunner: batched forward, pooled cache, CPU backend): prompts of lengths around
// a page boundary, run together under prefill chunk budgets of 1, 7, 64 and 100 tokens (so steps
// mix decodes with prefill chunks carrying KDA and conv state between them) and under a cache too
// small for all of them (so sequences wait and are preempted and recomputed), give the greedy
// tokens and the top-8 log-probabilities of each sequence run alone through Model::forward.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "io/presets.h"
#include "model/model_cases.h"
#include "runtime/engine.h"
#include "runtime/model_runner.h"
#include "test_util.h"

namespace klinear {
namespace {

struct Reference {
  std::vector<int32_t> ids;
  std::vector<Sampled> steps;  // the pick and the top 8 of each generated token
};

constexpr int kTop = 8, kNew = 5;

Reference run_alone(Model& model, const std::vector<int32_t>& prompt) {
  Reference r;
  auto cache = Cache::create(model.config(), model.backend(), CacheOptions{1, 64, 64 << 20}).value();
  const SeqId seq = cache->open().value();
  Tensor logits = model.forward_one(*cache, seq, prompt, LogitsMode::kLast).value();
  const size_t vocab = static_cast<size_t>(model.config().vocab_size);
  for (int i = 0; i < kNew; ++i) {
    const std::span<const float> row(logits.f32(), vocab);
    const int32_t next = argmax(row);
    r.ids.push_back(next);
    r.steps.push_back(logprobs_of(row, next, kTop));
    const int32_t one[1] = {next};
    if (i + 1 < kNew) logits = model.forward_one(*cache, seq, one, LogitsMode::kLast).value();
  }
  return r;
}

class EngineOnModel : public ::testing::TestWithParam<const char*> {};

TEST_P(EngineOnModel, ChunkedMixedAndPreemptedEqualAlone) {
  const testing::ScratchDir dir;
  // Token ids below 256 exist in every preset's vocabulary.
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {1, 7, 63, 64, 65, 100}) {
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (int32_t& id : p) id = static_cast<int32_t>(rng() % 256);
    prompts.push_back(p);
  }
  testing::write_untied_checkpoint(preset_config(GetParam()).value(), dir.str(), prompts, rng());
  auto backend = make_backend(BackendOptions{});
  ASSERT_TRUE(backend.ok());
  auto model = Model::load(dir.str(), **backend);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  std::vector<Reference> ref;
  for (const auto& p : prompts) ref.push_back(run_alone(**model, p));

  struct Case {
    const char* name;
    int64_t chunk, slots, pages;
    bool expect_preemption;
  };
  const std::vector<Case> cases{
      {"chunk 1", 1, 8, 64, false},
      {"chunk 7", 7, 8, 64, false},
      {"chunk 64", 64, 8, 64, false},
      {"chunk 100", 100, 8, 64, false},
      {"3 pages of 64 for 6 sequences", 64, 6, 3, true},
  };
  const CacheSizes sizes = ModelRunner::create(**model, CacheOptions{1, 64, 64 << 20}).value()->sizes();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const uint64_t budget = c.slots * sizes.bytes_per_slot + c.pages * sizes.bytes_per_page;
    auto runner = ModelRunner::create(**model, CacheOptions{c.slots, 64, budget}).value();
    ASSERT_EQ(runner->usage().pages_total, c.pages);
    Engine engine(*runner, nullptr, EngineOptions{{c.chunk, 8}, 100, {}});
    std::vector<std::vector<TokenOutput>> got(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestSpec s;
      s.prompt = prompts[i];
      s.stop.max_tokens = kNew;
      s.stop.ignore_eos = true;
      s.top_logprobs = kTop;
      ASSERT_TRUE(engine.submit(s, [&got, i](const EngineEvent& e) {
        got[i].insert(got[i].end(), e.tokens.begin(), e.tokens.end());
      }).ok());
    }
    engine.run_until_idle();
    for (size_t i = 0; i < prompts.size(); ++i) {
      ASSERT_EQ(got[i].size(), static_cast<size_t>(kNew)) << "prompt " << i;
      for (int t = 0; t < kNew; ++t) {
        const Sampled& want = ref[i].steps[static_cast<size_t>(t)];
        const Sampled& have = got[i][static_cast<size_t>(t)].logprobs;
        ASSERT_EQ(got[i][static_cast<size_t>(t)].id, ref[i].ids[static_cast<size_t>(t)]) << "prompt " << i << " token " << t;
        EXPECT_NEAR(have.logprob, want.logprob, 1e-4) << "prompt " << i << " token " << t;
        for (int k = 0; k < kTop; ++k) {
          EXPECT_EQ(have.top[static_cast<size_t>(k)].id, want.top[static_cast<size_t>(k)].id);
          EXPECT_NEAR(have.top[static_cast<size_t>(k)].logprob, want.top[static_cast<size_t>(k)].logprob, 1e-4);
        }
      }
    }
    EXPECT_EQ(engine.metrics().preemptions > 0, c.expect_preemption) << engine.metrics().preemptions;
    const CacheUsage u = runner->usage();
    EXPECT_EQ(u.slots_free, u.slots_total);
    EXPECT_EQ(u.pages_free, u.pages_total);
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, EngineOnModel, ::testing::Values("kimi-linear-tiny", "k3-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace klinear
