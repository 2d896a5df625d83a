// The engine over a fake runner whose "model" is a hash of everything a sequence has
// been fed (so any state mix-up, lost chunk or stale slot changes the tokens): batched and
// chunked runs under tight budgets equal one-by-one runs, steps mix decodes with prefill chunks
// and stay within the token budget and the pools, preemption recomputes exactly, cancellation and
// runner errors free everything, and bad requests are refused with a named reason.
#include <gtest/gtest.h>

#include <map>

#include "fake_runner.h"
#include "runtime/engine.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::FakeRunner;
using testing::StepRecord;
using testing::kOutOfMemory;
using testing::kPoison;
using testing::kVocab;
using testing::fake_logits;
using testing::mix;

struct Collected {
  std::map<int, std::vector<int32_t>> ids;  // by choice
  std::map<int, FinishReason> finish;
  RequestEnd end = RequestEnd::kRunning;
  Status error;
  RequestStats stats;
  std::vector<Sampled> prompt_logprobs;
  int prompt_logprob_events = 0;
};

// Submits every spec, runs until idle and returns what each sink saw.
std::vector<Collected> run_all(Engine& engine, const std::vector<RequestSpec>& specs) {
  std::vector<Collected> out(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    auto id = engine.submit(specs[i], [&out, i](const EngineEvent& e) {
      Collected& c = out[i];
      EXPECT_EQ(c.end, RequestEnd::kRunning) << "event after the request ended";
      for (const TokenOutput& t : e.tokens) c.ids[e.choice].push_back(t.id);
      if (!e.prompt_logprobs.empty()) {
        c.prompt_logprobs = e.prompt_logprobs;
        ++c.prompt_logprob_events;
      }
      if (e.finish) c.finish[e.choice] = *e.finish;
      if (e.end != RequestEnd::kRunning) {
        c.end = e.end;
        c.error = e.error;
        c.stats = e.stats;
      }
    });
    EXPECT_TRUE(id.ok()) << id.status().to_string();
  }
  engine.run_until_idle();
  return out;
}

std::vector<RequestSpec> random_specs(std::mt19937_64& rng, int count) {
  std::vector<RequestSpec> specs;
  for (int i = 0; i < count; ++i) {
    RequestSpec s;
    const int len = 1 + static_cast<int>(rng() % 40);
    for (int t = 0; t < len; ++t) s.prompt.push_back(static_cast<int32_t>(rng() % kOutOfMemory));
    s.stop.max_tokens = 1 + static_cast<int64_t>(rng() % 12);
    s.stop.ignore_eos = true;
    if (i % 3 == 1) {  // some sampled, seeded: must reproduce too
      s.sampling.temperature = 1.0f;
      s.sampling.seed = rng();
    }
    specs.push_back(s);
  }
  return specs;
}

// The reference: each request alone, with a roomy cache and budget.
std::vector<Collected> one_by_one(const std::vector<RequestSpec>& specs) {
  std::vector<Collected> out;
  for (const RequestSpec& s : specs) {
    FakeRunner runner(1, 1000, 16);
    Engine engine(runner, nullptr, EngineOptions{{4096, 1}, 16, {}});
    out.push_back(run_all(engine, {s})[0]);
  }
  return out;
}

TEST(Engine, GreedyTokensFollowTheModel) {
  FakeRunner runner(4, 100, 16);
  Engine engine(runner, nullptr, EngineOptions{});
  RequestSpec s;
  s.prompt = {5, 6, 7};
  s.stop.max_tokens = 6;
  s.stop.ignore_eos = true;
  const Collected c = run_all(engine, {s})[0];
  uint64_t h = 0;
  for (int32_t id : s.prompt) h = mix(h, id);
  std::vector<int32_t> expected;
  std::vector<float> row(kVocab);
  for (int i = 0; i < 6; ++i) {
    fake_logits(h, row.data());
    expected.push_back(argmax(row));
    h = mix(h, expected.back());
  }
  EXPECT_EQ(c.ids.at(0), expected);
  EXPECT_EQ(c.finish.at(0), FinishReason::kLength);
  EXPECT_EQ(c.end, RequestEnd::kFinished);
  EXPECT_EQ(c.stats.prompt_tokens, 3);
  EXPECT_EQ(c.stats.completion_tokens, 6);
}

// prompt_logprobs: every prompt token after the first scored under the model's distribution at its
// position (the fake's logits of the prompt so far), once, over prefill pieces of 8 tokens, beside
// another request and with n = 2; the generated tokens are those of a request without them; with
// max_tokens 0 the prompt is scored and nothing generated.
TEST(Engine, PromptLogprobsScoreEveryPromptToken) {
  std::mt19937_64 rng(testing::fresh_seed());
  RequestSpec s;
  for (int t = 0; t < 30; ++t) s.prompt.push_back(static_cast<int32_t>(rng() % kOutOfMemory));
  s.stop.max_tokens = 4;
  s.stop.ignore_eos = true;
  const Collected plain = one_by_one({s})[0];
  s.prompt_logprobs = 3;
  s.n = 2;
  RequestSpec other = s;
  other.prompt_logprobs = -1;
  other.n = 1;
  std::vector<Sampled> want;
  uint64_t h = 0;
  std::vector<float> row(kVocab);
  for (size_t pos = 0; pos + 1 < s.prompt.size(); ++pos) {
    h = mix(h, s.prompt[pos]);
    fake_logits(h, row.data());
    want.push_back(logprobs_of(row, s.prompt[pos + 1], 3));
  }
  for (const int64_t max_tokens : {int64_t{4}, int64_t{0}}) {
    SCOPED_TRACE(max_tokens);
    s.stop.max_tokens = max_tokens;
    FakeRunner runner(4, 100, 16);
    Engine engine(runner, nullptr, EngineOptions{{8, 4}, 16, {}});
    const std::vector<Collected> got = run_all(engine, {other, s});
    const Collected& c = got[1];
    EXPECT_EQ(c.end, RequestEnd::kFinished);
    EXPECT_EQ(c.prompt_logprob_events, 1);
    ASSERT_EQ(c.prompt_logprobs.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(c.prompt_logprobs[i].id, want[i].id) << i;
      EXPECT_EQ(c.prompt_logprobs[i].logprob, want[i].logprob) << i;
      ASSERT_EQ(c.prompt_logprobs[i].top.size(), 3u) << i;
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(c.prompt_logprobs[i].top[k].id, want[i].top[k].id) << i;
        EXPECT_EQ(c.prompt_logprobs[i].top[k].logprob, want[i].top[k].logprob) << i;
      }
    }
    EXPECT_EQ(got[0].ids.at(0), plain.ids.at(0));
    if (max_tokens > 0) {
      EXPECT_EQ(c.ids.at(0), plain.ids.at(0));
      EXPECT_EQ(c.ids.at(1), plain.ids.at(0));
    } else {
      EXPECT_TRUE(c.ids.empty());
      EXPECT_EQ(c.finish.at(0), FinishReason::kLength);
      EXPECT_EQ(c.stats.completion_tokens, 0);
    }
  }
  {
    // A long prompt under a large step budget: its scored pieces stay within 512 rows.
    RequestSpec lng = s;
    lng.prompt.clear();
    for (int t = 0; t < 1300; ++t) lng.prompt.push_back(static_cast<int32_t>(rng() % kOutOfMemory));
    lng.stop.max_tokens = 1;
    lng.n = 1;
    FakeRunner runner(4, 200, 16);
    Engine engine(runner, nullptr, EngineOptions{{4096, 4}, 16, {}});
    const Collected c = run_all(engine, {lng})[0];
    EXPECT_EQ(c.prompt_logprobs.size(), 1299u);
    int64_t widest = 0;
    for (const StepRecord& rec : runner.record) widest = std::max(widest, rec.widest_all);
    EXPECT_EQ(widest, 512);
  }
  FakeRunner runner(4, 100, 16);
  Engine engine(runner, nullptr, EngineOptions{});
  RequestSpec bad = s;
  bad.prompt_logprobs = 21;
  EXPECT_FALSE(engine.submit(bad, [](const EngineEvent&) {}).ok());
  bad.prompt_logprobs = -1;
  bad.stop.max_tokens = 0;  // max_tokens 0 scores a prompt: without prompt_logprobs it is refused
  EXPECT_FALSE(engine.submit(bad, [](const EngineEvent&) {}).ok());
}

// Tight budgets of every kind give the same tokens as one-by-one runs, and leave the pools full.
TEST(Engine, BatchedChunkedAndPreemptedEqualOneByOne) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<RequestSpec> specs = random_specs(rng, 24);
  // Four of them as long as the draw allows (40 prompt tokens, 12 generated), and the three after
  // the first one page long (8 tokens) with 2 generated. Under "pages for ~2 sequences" the first
  // step then admits the first four into all 8 pages; in the second the first and the second need
  // a page each and preempt the fourth and the third; the second finishes, and in the third step the
  // first decodes while the third is admitted again. So that case preempts and mixes whatever the
  // rest drew (with the long four alone, 3 seeds in 1,000 did neither).
  for (int i = 0; i < 24; i += 6) {
    specs[i].prompt.resize(40, 7);
    specs[i].stop.max_tokens = 12;
  }
  for (int i = 1; i <= 3; ++i) {
    specs[i].prompt.resize(8, 7);
    specs[i].stop.max_tokens = 2;
  }
  const std::vector<Collected> ref = one_by_one(specs);
  struct Case {
    const char* name;
    int64_t slots, pages, page_size, max_num_tokens, max_num_seqs;
    bool expect_preemption;
    bool expect_mixed;  // some step runs decodes and prefill chunks together
  };
  const std::vector<Case> cases{
      {"roomy: everything in the first step", 32, 1000, 16, 4096, 64, false, false},
      {"chunk 1", 8, 1000, 16, 1, 64, false, false},
      {"chunk 7", 8, 1000, 16, 7, 64, false, true},
      {"few slots", 3, 1000, 16, 64, 64, false, true},
      {"max_num_seqs 2", 32, 1000, 16, 100, 2, false, true},
      {"pages for ~2 sequences", 16, 8, 8, 100, 64, true, true},
      {"page size 1, tight", 16, 60, 1, 7, 64, true, true},
      {"no pages (a model without MLA layers), 3 slots", 3, 0, 16, 64, 64, false, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    FakeRunner runner(c.slots, c.pages, c.page_size);
    Engine engine(runner, nullptr, EngineOptions{{c.max_num_tokens, c.max_num_seqs}, 1024, {}});
    const std::vector<Collected> got = run_all(engine, specs);
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(got[i].end, RequestEnd::kFinished) << "request " << i;
      EXPECT_EQ(got[i].ids, ref[i].ids) << "request " << i;
    }
    bool mixed = false;
    for (const StepRecord& r : runner.record) {
      EXPECT_LE(r.tokens, c.max_num_tokens);
      EXPECT_LE(r.decodes + r.prefills, c.max_num_seqs);
      mixed = mixed || (r.decodes > 0 && r.prefills > 0);
    }
    EXPECT_EQ(mixed, c.expect_mixed);
    const EngineMetrics m = engine.metrics();
    // Every step is counted once, under one kind, with its tokens; the roomy case prefills every
    // prompt in its first step and only decodes after.
    uint64_t steps = 0, tokens = 0, record_tokens = 0;
    for (const StepMetrics& k : m.steps) {
      EXPECT_EQ(k.seconds.count(), k.forward_seconds.count());
      EXPECT_GE(k.seconds.sum(), k.forward_seconds.sum());
      steps += k.seconds.count(), tokens += k.tokens;
    }
    for (const StepRecord& r : runner.record) record_tokens += static_cast<uint64_t>(r.tokens);
    EXPECT_EQ(steps, runner.record.size());
    EXPECT_EQ(tokens, record_tokens);
    if (c.max_num_tokens == 4096) {  // a tight budget may run no decode-only step ("chunk 7": 3 seeds in 200)
      EXPECT_GT(m.steps[static_cast<int>(StepKind::kDecode)].seconds.count(), 0u);
      EXPECT_EQ(m.steps[static_cast<int>(StepKind::kPrefill)].seconds.count(), 1u);
      EXPECT_EQ(m.steps[static_cast<int>(StepKind::kMixed)].seconds.count(), 0u);
    }
    EXPECT_EQ(m.preemptions > 0, c.expect_preemption) << m.preemptions << " preemptions";
    const CacheUsage u = runner.usage();
    EXPECT_EQ(u.slots_free, u.slots_total);
    EXPECT_EQ(u.pages_free, u.pages_total);
    EXPECT_EQ(m.requests.at("length"), specs.size());
  }
}

TEST(Engine, NChoicesUseSeedPlusIndex) {
  RequestSpec s;
  s.prompt = {1, 2, 3};
  s.stop.max_tokens = 20;
  s.stop.ignore_eos = true;
  s.sampling.temperature = 2.0f;
  s.sampling.seed = 77;
  s.n = 3;
  FakeRunner runner(8, 100, 16);
  Engine engine(runner, nullptr, EngineOptions{});
  const Collected c = run_all(engine, {s})[0];
  ASSERT_EQ(c.ids.size(), 3u);
  EXPECT_EQ(c.stats.completion_tokens, 60);
  RequestSpec single = s;
  single.n = 1;
  single.sampling.seed = 79;
  EXPECT_EQ(one_by_one({single})[0].ids.at(0), c.ids.at(2));
  EXPECT_NE(c.ids.at(0), c.ids.at(1));
}

TEST(Engine, EosAndStopIdsEndAChoice) {
  FakeRunner runner(4, 100, 16);
  RequestSpec s;
  s.prompt = {9};
  s.stop.max_tokens = 30;
  s.stop.ignore_eos = true;
  const std::vector<int32_t> ids = one_by_one({s})[0].ids.at(0);
  const int32_t eos = ids[4];  // the fifth generated id becomes eos
  Engine engine(runner, nullptr, EngineOptions{{2048, 256}, 1024, {eos}});
  s.stop.ignore_eos = false;
  const Collected c = run_all(engine, {s})[0];
  const auto first = std::find(ids.begin(), ids.end(), eos);
  EXPECT_EQ(c.finish.at(0), FinishReason::kStop);
  // Text-less stop ids are not released as tokens with text, so the ids end before the eos.
  EXPECT_EQ(c.ids.at(0), std::vector<int32_t>(ids.begin(), first));
  EXPECT_EQ(c.stats.completion_tokens, first - ids.begin() + 1);
}

TEST(Engine, CancelFreesEverythingAndOthersFinish) {
  FakeRunner runner(4, 100, 4);
  Engine engine(runner, nullptr, EngineOptions{{8, 64}, 1024, {}});
  RequestSpec s;
  s.prompt = {1, 2, 3, 4, 5};
  s.stop.max_tokens = 50;
  s.stop.ignore_eos = true;
  std::vector<RequestEnd> ends(3, RequestEnd::kRunning);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i)
    ids.push_back(engine.submit(s, [&ends, i](const EngineEvent& e) {
      if (e.end != RequestEnd::kRunning) ends[i] = e.end;
    }).value());
  for (int i = 0; i < 5; ++i) engine.step();
  engine.cancel(ids[1]);
  engine.cancel(12345);  // unknown: ignored
  engine.run_until_idle();
  EXPECT_EQ(ends, (std::vector<RequestEnd>{RequestEnd::kFinished, RequestEnd::kCancelled, RequestEnd::kFinished}));
  const CacheUsage u = runner.usage();
  EXPECT_EQ(u.slots_free, u.slots_total);
  EXPECT_EQ(u.pages_free, u.pages_total);
  EXPECT_EQ(engine.metrics().requests.at("cancelled"), 1u);
}

// A step that fails (an error the runner returns, or a failed allocation it throws: issue 34)
// fails the requests of that step; the engine frees their slots and serves the next request.
TEST(Engine, RunnerErrorFailsOnlyItsStep) {
  struct Case {
    int32_t id;
    StatusCode code;
    const char* message;
  };
  for (const Case& c : {Case{kPoison, StatusCode::kInvalidArgument, "poisoned"},
                        Case{kOutOfMemory, StatusCode::kResourceExhausted, "out of memory in a step of 1 sequences"}}) {
    FakeRunner runner(4, 100, 16);
    Engine engine(runner, nullptr, EngineOptions{{2048, 256}, 1024, {}});
    RequestSpec good, bad;
    good.prompt = {1, 2};
    good.stop.max_tokens = 4;
    bad.prompt = {1, c.id};
    bad.stop.max_tokens = 4;
    std::vector<Collected> first = run_all(engine, {bad});
    EXPECT_EQ(first[0].end, RequestEnd::kFailed) << c.message;
    EXPECT_EQ(first[0].error.code(), c.code) << first[0].error.to_string();
    EXPECT_NE(first[0].error.message().find(c.message), std::string::npos) << first[0].error.to_string();
    std::vector<Collected> second = run_all(engine, {good});
    EXPECT_EQ(second[0].end, RequestEnd::kFinished) << c.message;
    EXPECT_EQ(runner.usage().slots_free, 4) << c.message;
  }
}

TEST(Engine, RefusesRequestsThatCannotRun) {
  FakeRunner runner(2, 4, 16);  // 64 tokens of cache
  Engine engine(runner, nullptr, EngineOptions{{2048, 256}, 2, {}});
  auto spec = [](std::vector<int32_t> prompt, int64_t max_tokens) {
    RequestSpec s;
    s.prompt = std::move(prompt);
    s.stop.max_tokens = max_tokens;
    return s;
  };
  struct Case {
    const char* name;
    RequestSpec s;
    std::string message;
  };
  RequestSpec n0 = spec({1}, 4), logprobs = spec({1}, 4), stop = spec({1}, 4), temp = spec({1}, 4);
  n0.n = 0;
  logprobs.top_logprobs = 21;
  stop.stop.stop = {"x"};
  temp.sampling.temperature = -1;
  const std::vector<Case> cases{
      {"empty prompt", spec({}, 4), "prompt is empty"},
      {"id out of range", spec({1, 64}, 4), "prompt token 1 is 64"},
      {"over the context", spec({1}, 5000), "exceeds the context of 4096"},
      {"over the cache", spec({1}, 64), "the cache holds 64"},
      {"max_tokens 0", spec({1}, 0), "max_tokens"},
      {"n 0", n0, "n must be"},
      {"top_logprobs 21", logprobs, "top_logprobs"},
      {"stop strings without tokenizer", stop, "tokenizer"},
      {"temperature", temp, "temperature"},
  };
  for (const Case& c : cases) {
    auto r = engine.submit(c.s, [](const EngineEvent&) {});
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << c.name << ": " << r.status().to_string();
  }
  // The queue holds 2: a third request waiting is refused with ResourceExhausted.
  ASSERT_TRUE(engine.submit(spec({1}, 4), [](const EngineEvent&) {}).ok());
  ASSERT_TRUE(engine.submit(spec({1}, 4), [](const EngineEvent&) {}).ok());
  auto full = engine.submit(spec({1}, 4), [](const EngineEvent&) {});
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  engine.run_until_idle();
  EXPECT_TRUE(engine.submit(spec({1}, 4), [](const EngineEvent&) {}).ok());
  engine.run_until_idle();
}

}  // namespace
}  // namespace klinear
