// The engine over the real model (ModelRunner: batched forward, pooled cache, CPU backend): prompts of lengths around
// a page boundary, run together under prefill chunk budgets of 1, 7, 64 and 100 tokens (so steps
// mix decodes with prefill chunks carrying KDA and conv state between them) and under a cache too
// small for all of them (so sequences wait and are preempted and recomputed), give the greedy
// tokens and the top-8 log-probabilities of each sequence run alone through Model::forward; so does
// the engine with prefix caching on (below).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

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

// Greedy ids and top-8 log-probabilities equal to the sequence run alone. The runs sum in different
// orders (chunk boundaries, batch rows), so two ids whose log-probabilities differ by less than the
// tolerance may trade places: each position's log-probability must match, and each id of the
// reference's list must be in ours with its log-probability, or be missing only as a tie with our
// last entry (seed 3160875662 gave two ids 424 and 108 in swapped places). A greedy pick may differ
// only as such a tie (k3-tiny, seed 4102074501: ids 390 and 378 9e-7 apart); the tokens after it
// continue another text, so they are not compared.
void expect_matches(const std::vector<TokenOutput>& got, const Reference& ref, const std::string& what) {
  constexpr float kTol = 1e-4f;
  ASSERT_EQ(got.size(), static_cast<size_t>(kNew)) << what;
  for (int t = 0; t < kNew; ++t) {
    const Sampled& want = ref.steps[static_cast<size_t>(t)];
    const Sampled& have = got[static_cast<size_t>(t)].logprobs;
    EXPECT_NEAR(have.logprob, want.logprob, kTol) << what << " token " << t;
    const int32_t pick = got[static_cast<size_t>(t)].id;
    if (pick != ref.ids[static_cast<size_t>(t)]) {
      const auto it = std::find_if(want.top.begin(), want.top.end(), [&](const TokenLogprob& w) { return w.id == pick; });
      ASSERT_TRUE(it != want.top.end() && std::abs(it->logprob - want.logprob) <= kTol)
          << what << " token " << t << ": id " << pick << " instead of " << ref.ids[static_cast<size_t>(t)] << ", not a tie";
      std::printf("[ note ] %s token %d: greedy tie (ids %d and %d, log-probabilities %.7g and %.7g); the rest differs\n",
                  what.c_str(), t, pick, ref.ids[static_cast<size_t>(t)], it->logprob, want.logprob);
      return;
    }
    ASSERT_EQ(have.top.size(), want.top.size()) << what << " token " << t;
    for (size_t k = 0; k < want.top.size(); ++k) {
      EXPECT_NEAR(have.top[k].logprob, want.top[k].logprob, kTol) << what << " token " << t << " rank " << k;
      const TokenLogprob& w = want.top[k];
      const auto it = std::find_if(have.top.begin(), have.top.end(), [&](const TokenLogprob& h) { return h.id == w.id; });
      if (it != have.top.end())
        EXPECT_NEAR(it->logprob, w.logprob, kTol) << what << " token " << t << " id " << w.id;
      else
        EXPECT_NEAR(w.logprob, have.top.back().logprob, kTol)
            << what << " token " << t << ": id " << w.id << " of the reference's top list is missing, not as a tie";
    }
  }
}

// Submits a greedy request for `prompt` (kNew tokens, top-8 log-probabilities) whose tokens go to `got`.
void submit_greedy(Engine& engine, const std::vector<int32_t>& prompt, std::vector<TokenOutput>& got) {
  RequestSpec s;
  s.prompt = prompt;
  s.stop.max_tokens = kNew;
  s.stop.ignore_eos = true;
  s.top_logprobs = kTop;
  EXPECT_TRUE(engine.submit(s, [&got](const EngineEvent& e) { got.insert(got.end(), e.tokens.begin(), e.tokens.end()); }).ok());
}

// Runs greedy requests for `prompts` together and returns each one's tokens.
std::vector<std::vector<TokenOutput>> run_greedy(Engine& engine, const std::vector<std::vector<int32_t>>& prompts) {
  std::vector<std::vector<TokenOutput>> got(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) submit_greedy(engine, prompts[i], got[i]);
  engine.run_until_idle();
  return got;
}

void poison(ModelRunner& runner, const ModelConfig& config, Backend& backend) {
  Cache& c = runner.cache();
  for (int64_t l = 0; l < config.num_layers; ++l)
    for (const Tensor* pool : {&c.kda_states(l), &c.conv_states(l), &c.mla_pages(l)})
      if (pool->defined()) backend.fill(*pool, std::numeric_limits<float>::quiet_NaN());
}

// Every slot and page free, no page referenced.
void expect_pools_empty(ModelRunner& runner) {
  runner.clear_prefix_cache();
  Cache& c = runner.cache();
  EXPECT_EQ(c.free_slots(), c.sizes().slots);
  EXPECT_EQ(c.free_pages(), c.sizes().pages);
  for (int32_t p = 0; p < c.sizes().pages; ++p) ASSERT_EQ(c.page_refs(p), 0) << "page " << p;
}

// A random checkpoint of `preset` in `dir` routed clear of ties on `prompts` and their greedy
// tokens, loaded on the CPU.
struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
};
Loaded load_untied(const char* preset, const std::string& dir, const std::vector<std::vector<int32_t>>& prompts,
                   uint64_t seed, BatchInvariance invariance = BatchInvariance::kOff) {
  testing::write_untied_checkpoint(preset_config(preset).value(), dir, prompts, seed, kNew);
  Loaded l;
  BackendOptions options;
  options.batch_invariance = invariance;
  l.backend = make_backend(options).value();
  auto model = Model::load(dir, *l.backend);
  KL_CHECK(model.ok(), model.status().to_string());
  l.model = std::move(model).value();
  return l;
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
  Loaded loaded = load_untied(GetParam(), dir.str(), prompts, rng());
  Model& m = *loaded.model;
  std::vector<Reference> ref;
  for (const auto& p : prompts) ref.push_back(run_alone(m, p));

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
  const CacheSizes sizes = ModelRunner::create(m, CacheOptions{1, 64, 64 << 20}).value()->sizes();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const uint64_t budget = c.slots * sizes.bytes_per_slot + c.pages * sizes.bytes_per_page;
    auto runner = ModelRunner::create(m, CacheOptions{c.slots, 64, budget}, {PrefixCaching::kOff}).value();
    ASSERT_EQ(runner->usage().pages_total, c.pages);
    Engine engine(*runner, nullptr, EngineOptions{{c.chunk, 8}, 100, {}});
    const auto got = run_greedy(engine, prompts);
    for (size_t i = 0; i < prompts.size(); ++i) expect_matches(got[i], ref[i], "prompt " + std::to_string(i));
    EXPECT_EQ(engine.metrics().preemptions > 0, c.expect_preemption) << engine.metrics().preemptions;
    const CacheUsage u = runner->usage();
    EXPECT_EQ(u.slots_free, u.slots_total);
    EXPECT_EQ(u.pages_free, u.pages_total);
  }
}

// prompt_logprobs over the model: each prompt token's log-probability and top 5 at its position equal
// the rows of Model::forward over the whole prompt (LogitsMode::kAll), with the prompt cut into
// pieces of 16 beside another request, prefix caching on (the scored sequence takes no hit, though
// the same prompt ran before), and with max_tokens 0 (scored, nothing generated).
TEST_P(EngineOnModel, PromptLogprobsEqualTheModelsRows) {
  const testing::ScratchDir dir;
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<int32_t> prompt(70);
  for (int32_t& id : prompt) id = static_cast<int32_t>(rng() % 256);
  Loaded loaded = load_untied(GetParam(), dir.str(), {prompt}, rng());
  Model& m = *loaded.model;
  auto cache = Cache::create(m.config(), m.backend(), CacheOptions{1, 64, 64 << 20}).value();
  const Tensor rows = m.forward_one(*cache, cache->open().value(), prompt, LogitsMode::kAll).value();
  const size_t vocab = static_cast<size_t>(m.config().vocab_size);
  auto runner = ModelRunner::create(m, CacheOptions{4, 64, 64 << 20}, {PrefixCaching::kOn}).value();
  Engine engine(*runner, nullptr, EngineOptions{{16, 4}, 100, {}});
  run_greedy(engine, {prompt});  // publishes the prompt's prefix
  for (const int64_t max_tokens : {int64_t{2}, int64_t{0}}) {
    SCOPED_TRACE(max_tokens);
    RequestSpec s;
    s.prompt = prompt;
    s.stop.max_tokens = max_tokens;
    s.stop.ignore_eos = true;
    s.prompt_logprobs = 5;
    std::vector<Sampled> got;
    int64_t tokens = 0;
    ASSERT_TRUE(engine
                    .submit(s,
                            [&](const EngineEvent& e) {
                              if (!e.prompt_logprobs.empty()) got = e.prompt_logprobs;
                              tokens += static_cast<int64_t>(e.tokens.size());
                            })
                    .ok());
    std::vector<TokenOutput> beside;
    submit_greedy(engine, std::vector<int32_t>(prompt.begin(), prompt.begin() + 40), beside);
    engine.run_until_idle();
    EXPECT_EQ(tokens, max_tokens);
    EXPECT_EQ(beside.size(), static_cast<size_t>(kNew));
    ASSERT_EQ(got.size(), prompt.size() - 1);
    for (size_t i = 0; i + 1 < prompt.size(); ++i) {
      const Sampled want = logprobs_of(std::span<const float>(rows.f32() + i * vocab, vocab), prompt[i + 1], 5);
      EXPECT_EQ(got[i].id, prompt[i + 1]);
      EXPECT_NEAR(got[i].logprob, want.logprob, 1e-4f) << "position " << i + 1;
      ASSERT_EQ(got[i].top.size(), 5u);
      for (size_t k = 0; k < 5; ++k) EXPECT_NEAR(got[i].top[k].logprob, want.top[k].logprob, 1e-4f) << i << " " << k;
    }
  }
}

// Prefix caching is exact: prompts sharing a prefix, of lengths just under, at and over snapshot
// points (every 64 tokens) and page boundaries (pages of 16), run in waves (the longest alone, so
// the others restore snapshots taken inside its steps; then all, mixing decodes with prefill
// chunks; then all again, hitting what the first waves published), under prefill chunks of 1, 7,
// 64 and 100 tokens and from NaN-poisoned pools, give the tokens and log-probabilities of each
// prompt run alone; a cache too small for everything evicts instead of refusing; afterwards every
// slot and page is free.
TEST_P(EngineOnModel, PrefixCacheEqualsUncached) {
  const testing::ScratchDir dir;
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<int32_t> base(200), other(200);
  for (int32_t& id : base) id = static_cast<int32_t>(rng() % 256);
  for (int32_t& id : other) id = static_cast<int32_t>(rng() % 256);
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {15, 16, 17, 63, 64, 65, 66, 127, 128, 129, 150, 193})
    prompts.emplace_back(base.begin(), base.begin() + len);
  prompts.push_back(std::vector<int32_t>(base.begin(), base.begin() + 70));
  prompts.back().insert(prompts.back().end(), other.begin(), other.begin() + 60);  // diverges inside a page
  Loaded loaded = load_untied(GetParam(), dir.str(), prompts, rng());
  Model& m = *loaded.model;
  Backend& be = *loaded.backend;
  std::vector<Reference> ref;
  for (const auto& p : prompts) ref.push_back(run_alone(m, p));
  std::vector<size_t> all(prompts.size());
  std::iota(all.begin(), all.end(), size_t{0});

  struct Case {
    const char* name;
    int64_t chunk, slots, pages;
  };
  const std::vector<Case> cases{
      {"chunk 1", 1, 40, 200}, {"chunk 7", 7, 40, 200}, {"chunk 64", 64, 40, 200}, {"chunk 100", 100, 40, 200},
      {"chunk 64, 20 pages: evictions", 64, 10, 20},
  };
  const CacheSizes sizes = ModelRunner::create(m, CacheOptions{1, 16, 64 << 20}).value()->sizes();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const uint64_t budget = c.slots * sizes.bytes_per_slot + c.pages * sizes.bytes_per_page;
    auto runner = ModelRunner::create(m, CacheOptions{c.slots, 16, budget}, {PrefixCaching::kOn, 64}).value();
    poison(*runner, m.config(), be);
    Engine engine(*runner, nullptr, EngineOptions{{c.chunk, 8, 64}, 100, {}});
    // The longest prompt first (so the others restore snapshots it took inside its steps), then all, twice.
    const std::vector<std::vector<size_t>> waves{{prompts.size() - 2}, all, all};
    for (size_t w = 0; w < waves.size(); ++w) {
      std::vector<std::vector<int32_t>> batch;
      for (size_t i : waves[w]) batch.push_back(prompts[i]);
      const auto got = run_greedy(engine, batch);
      for (size_t k = 0; k < batch.size(); ++k)
        expect_matches(got[k], ref[waves[w][k]], "wave " + std::to_string(w) + " prompt " + std::to_string(waves[w][k]));
    }
    EXPECT_GT(engine.metrics().prefix_hit_tokens, 0u);
    expect_pools_empty(*runner);
  }
}

// A prompt-end snapshot off a page boundary is usable as soon as the step that wrote it finished:
// a prompt continuing a running sequence's prompt (70 tokens: 4 pages of 16 and 6 positions)
// hits all 70 tokens while that sequence still decodes (the partial page is read from the
// producer's live page, which it keeps writing past position 70), and both stay exact.
TEST_P(EngineOnModel, PrefixHitOnARunningSequencesPromptEnd) {
  const testing::ScratchDir dir;
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<int32_t> base(100);
  for (int32_t& id : base) id = static_cast<int32_t>(rng() % 256);
  const std::vector<int32_t> producer(base.begin(), base.begin() + 70), consumer = base;
  Loaded loaded = load_untied(GetParam(), dir.str(), {producer, consumer}, rng());
  const Reference ref_producer = run_alone(*loaded.model, producer), ref_consumer = run_alone(*loaded.model, consumer);
  for (int64_t chunk : {7, 64}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    auto runner = ModelRunner::create(*loaded.model, CacheOptions{8, 16, 64 << 20}, {PrefixCaching::kOn, 64}).value();
    poison(*runner, loaded.model->config(), *loaded.backend);
    Engine engine(*runner, nullptr, EngineOptions{{chunk, 8, 64}, 100, {}});
    std::vector<TokenOutput> got_producer, got_consumer;
    submit_greedy(engine, producer, got_producer);
    while (got_producer.empty()) ASSERT_TRUE(engine.step());
    submit_greedy(engine, consumer, got_consumer);
    engine.step();  // admits the consumer from the cache while the producer decodes
    EXPECT_EQ(engine.metrics().prefix_hit_tokens, 70u);
    EXPECT_LT(got_producer.size(), static_cast<size_t>(kNew));
    engine.run_until_idle();
    expect_matches(got_producer, ref_producer, "producer");
    expect_matches(got_consumer, ref_consumer, "consumer");
    expect_pools_empty(*runner);
  }
}

// Random admissions, extensions (prompts continuing earlier ones), finishes, cancellations and
// evictions (a small cache) leave the pools exactly as they started.
TEST_P(EngineOnModel, PrefixCacheRandomOpsLeavePoolsEmpty) {
  const testing::ScratchDir dir;
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<int32_t> base(300);
  for (int32_t& id : base) id = static_cast<int32_t>(rng() % 256);
  testing::write_untied_checkpoint(preset_config(GetParam()).value(), dir.str(), {base}, rng());
  auto backend = make_backend(BackendOptions{});
  ASSERT_TRUE(backend.ok());
  auto model = Model::load(dir.str(), **backend);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  const CacheSizes sizes = ModelRunner::create(**model, CacheOptions{1, 16, 64 << 20}).value()->sizes();
  auto runner = ModelRunner::create(**model, CacheOptions{8, 16, 8 * sizes.bytes_per_slot + 48 * sizes.bytes_per_page},
                                    {PrefixCaching::kOn, 64}).value();
  poison(*runner, (*model)->config(), **backend);
  Engine engine(*runner, nullptr, EngineOptions{{48, 4, 64}, 100, {}});
  std::vector<uint64_t> live;
  int ended = 0, submitted = 0;
  for (int round = 0; round < 60; ++round) {
    const int op = static_cast<int>(rng() % 4);
    if (op <= 1) {  // admit: a prefix of the base, sometimes continued with fresh tokens
      RequestSpec s;
      s.prompt.assign(base.begin(), base.begin() + 1 + static_cast<int64_t>(rng() % 200));
      if (rng() % 2) s.prompt.push_back(static_cast<int32_t>(rng() % 256));
      s.stop.max_tokens = 1 + static_cast<int64_t>(rng() % 8);
      s.stop.ignore_eos = true;
      auto id = engine.submit(s, [&ended](const EngineEvent& e) { ended += e.end != RequestEnd::kRunning; });
      ASSERT_TRUE(id.ok()) << id.status().to_string();
      live.push_back(*id);
      ++submitted;
    } else if (op == 2 && !live.empty()) {
      engine.cancel(live[rng() % live.size()]);
    }
    for (int k = static_cast<int>(rng() % 4); k > 0; --k) engine.step();
    if (round == 19 || round == 39) {
      // What usage() counts free (free pages and slots plus those only the prefix cache holds,
      // kept as running counts) is exactly what evicting everything frees, mid-run too.
      const CacheUsage u = runner->usage();
      runner->clear_prefix_cache();
      EXPECT_EQ(runner->cache().free_pages(), u.pages_free) << "round " << round;
      EXPECT_EQ(runner->cache().free_slots(), u.slots_free) << "round " << round;
    }
  }
  engine.run_until_idle();
  EXPECT_EQ(ended, submitted);
  EXPECT_GT(engine.metrics().prefix_hit_tokens, 0u);
  expect_pools_empty(*runner);
}

// --batch-invariant: a probe prompt's greedy tokens and log-probabilities (the pick's and the top
// 8, as floats) are the same bits alone with the whole prompt in one step as beside prompts of other
// lengths under budgets of 512 and 64 tokens a step (its prefill in pieces, beside decode rows), as
// one of 16 copies, and resumed from a prefix-cache snapshot (interval 64) that another prompt left.
TEST_P(EngineOnModel, BatchInvariantGivesTheSameBits) {
  const testing::ScratchDir dir;
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<std::vector<int32_t>> prompts;
  for (int len : {150, 1, 7, 63, 64, 65, 100, 200}) {
    prompts.emplace_back(len);
    for (int32_t& id : prompts.back()) id = static_cast<int32_t>(rng() % 256);
  }
  const std::vector<int32_t> probe = prompts[0];
  std::vector<int32_t> sharer(probe.begin(), probe.begin() + 100);  // shares the probe's first 100 tokens
  sharer.push_back(7);
  prompts.push_back(sharer);
  Loaded loaded = load_untied(GetParam(), dir.str(), prompts, rng(), BatchInvariance::kOn);
  Model& m = *loaded.model;
  const BatchInvariance on = BatchInvariance::kOn;
  auto engine_run = [&](int64_t budget, PrefixCaching prefix, const std::vector<std::vector<int32_t>>& batch) {
    auto runner =
        ModelRunner::create(m, CacheOptions{24, 16, 256 << 20}, {prefix, 64, on}).value();
    SchedulerOptions so{budget, 20, prefix == PrefixCaching::kOn ? 64 : 0, 0, on};
    Engine engine(*runner, nullptr, EngineOptions{so, 100, {}});
    auto got = run_greedy(engine, batch);
    return std::make_pair(got, engine.metrics().prefix_hit_tokens);
  };
  auto same = [](const std::vector<TokenOutput>& got, const std::vector<TokenOutput>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t t = 0; t < want.size(); ++t) {
      EXPECT_EQ(got[t].id, want[t].id) << what << " token " << t;
      EXPECT_EQ(got[t].logprobs.logprob, want[t].logprobs.logprob) << what << " token " << t;
      ASSERT_EQ(got[t].logprobs.top.size(), want[t].logprobs.top.size()) << what << " token " << t;
      for (size_t k = 0; k < want[t].logprobs.top.size(); ++k) {
        EXPECT_EQ(got[t].logprobs.top[k].id, want[t].logprobs.top[k].id) << what << " token " << t << " rank " << k;
        EXPECT_EQ(got[t].logprobs.top[k].logprob, want[t].logprobs.top[k].logprob) << what << " token " << t;
      }
    }
  };
  const auto alone = engine_run(8192, PrefixCaching::kOff, {probe}).first[0];
  ASSERT_EQ(alone.size(), static_cast<size_t>(kNew));
  for (int64_t budget : {512, 64}) {
    const auto got = engine_run(budget, PrefixCaching::kOff, prompts).first;
    same(got[0], alone, "beside others, " + std::to_string(budget) + " tokens a step");
  }
  const auto copies = engine_run(8192, PrefixCaching::kOff, std::vector<std::vector<int32_t>>(16, probe)).first;
  for (size_t i = 0; i < copies.size(); ++i) same(copies[i], alone, "copy " + std::to_string(i));
  {
    auto runner = ModelRunner::create(m, CacheOptions{24, 16, 256 << 20}, {PrefixCaching::kOn, 64, on}).value();
    Engine engine(*runner, nullptr, EngineOptions{SchedulerOptions{8192, 20, 64, 0, on}, 100, {}});
    run_greedy(engine, {sharer});
    const auto got = run_greedy(engine, {probe});
    EXPECT_EQ(engine.metrics().prefix_hit_tokens, 64u) << "the probe resumes from the sharer's snapshot at 64";
    same(got[0], alone, "from a prefix-cache snapshot");
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, EngineOnModel, ::testing::Values("kimi-linear-tiny", "k3-tiny"),
                         [](const auto& info) { return testing::identifier(info.param); });

}  // namespace
}  // namespace klinear
