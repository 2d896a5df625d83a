// StepExecutor, the decode step as a CUDA graph (docs/DESIGN.md): the same model on a backend with graphs on
// and on one with graphs off, fed the same tokens, give bit for bit the same logits and drawn ids
// over many decode steps whose batch sizes move between buckets (exact ones and padded ones), so
// each bucket's graph is captured once and replayed while every context grows across page
// boundaries (8-position pages), and the first sequence's grows past the 16 page-table columns a
// decode step starts with (so the table widens and every bucket is captured again). On the
// fixtures' models and a random config; the CPU rows run the same padded steps eagerly (both
// sides), the CUDA rows compare replay with eager.
#include <gtest/gtest.h>

#include <cstring>

#include "backend_cases.h"
#include "io/presets.h"
#include "model/model.h"
#include "model/model_cases.h"
#include "runtime/step_executor.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::BackendCase;
using testing::Source;

// Sequences decoding in each step: the first n of them (1, 2, 4, 8, 16 exact; the rest padded).
const std::vector<int> kActive = {1, 3, 5, 2, 8, 17, 4, 3, 16, 1, 6, 17, 2, 5, 9, 17, 3, 1, 8, 12, 17, 5, 2, 17};
constexpr int kSeqs = 17;

struct Side {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Model> model;
  std::unique_ptr<Cache> cache;
  std::unique_ptr<StepExecutor> executor;
  std::vector<SeqId> seqs;
};

class GraphReplay : public ::testing::TestWithParam<std::tuple<Source, BackendCase>> {};

TEST_P(GraphReplay, EqualsEagerAcrossBucketsAndPages) {
  const auto& [src, row] = GetParam();
  const uint64_t seed = testing::fresh_seed();
  const testing::ScratchDir scratch;
  std::string dir = scratch.str();
  if (!src.fixture.empty()) {
    dir = testing::fixture_path(src.fixture + "/model");
  } else {
    ASSERT_TRUE(write_random_checkpoint(testing::patched_preset(src.preset, src.patch), dir, seed).ok());
  }
  Side on, off;
  for (auto [side, graphs] : {std::pair{&on, CudaGraphs::kOn}, std::pair{&off, CudaGraphs::kOff}}) {
    auto be = make_backend(BackendOptions{row.device, row.dtype, graphs});
    if (!be.ok()) GTEST_SKIP() << row.name << ": " << be.status().to_string();
    side->be = std::move(be).value();
    auto model = Model::load(dir, *side->be);
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    side->model = std::move(model).value();
    auto cache = Cache::create(side->model->config(), *side->be, CacheOptions{kSeqs, 8, 32 << 20});
    ASSERT_TRUE(cache.ok()) << cache.status().to_string();
    side->cache = std::move(cache).value();
    side->executor = std::make_unique<StepExecutor>(*side->model, *side->cache);
  }
  const ModelConfig& cfg = on.model->config();
  std::mt19937_64 rng(seed);
  std::vector<int32_t> next(kSeqs);
  // Prompts of 1 .. 20 tokens, the first one 125 (16 pages less 3 positions), one prefill step for
  // all (eager on both sides).
  {
    std::vector<std::vector<int32_t>> prompts(kSeqs);
    std::vector<SeqStep> steps;
    for (Side* s : {&on, &off}) s->seqs.clear();
    for (int i = 0; i < kSeqs; ++i) {
      prompts[i].resize(i == 0 ? 125 : 1 + rng() % 20);
      for (int32_t& t : prompts[i]) t = static_cast<int32_t>(rng() % cfg.vocab_size);
    }
    for (Side* s : {&on, &off}) {
      steps.clear();
      for (int i = 0; i < kSeqs; ++i) {
        s->seqs.push_back(s->cache->open().value());
        steps.push_back(SeqStep{s->seqs[i], prompts[i]});
      }
      ASSERT_TRUE(s->cache->reserve(steps).ok());
      auto batch = s->cache->plan(steps);
      ASSERT_TRUE(batch.ok()) << batch.status().to_string();
      ASSERT_TRUE(s->executor->run(*batch).ok());
    }
    for (int i = 0; i < kSeqs; ++i) next[i] = static_cast<int32_t>(rng() % cfg.vocab_size);
  }
  for (size_t k = 0; k < kActive.size(); ++k) {
    SCOPED_TRACE("step " + std::to_string(k) + ", " + std::to_string(kActive[k]) + " sequences, seed " + std::to_string(seed));
    std::vector<SampleRow> draws;
    for (int i = 0; i < kActive[k]; ++i)
      draws.push_back(SampleRow{i % 3 == 0 ? 0.0f : 0.9f, i % 2 == 0 ? 0 : 20, i % 4 == 1 ? 0.8f : 1.0f,
                                seed + static_cast<uint64_t>(i), static_cast<int32_t>(k)});
    Tensor logits[2], ids[2];
    int side_index = 0;
    for (Side* s : {&on, &off}) {
      std::vector<SeqStep> steps;
      for (int i = 0; i < kActive[k]; ++i) steps.push_back(SeqStep{s->seqs[i], std::span<const int32_t>(&next[i], 1)});
      ASSERT_TRUE(s->cache->reserve(steps).ok());
      auto batch = s->cache->plan(steps);
      ASSERT_TRUE(batch.ok()) << batch.status().to_string();
      auto out = s->executor->run(*batch, draws);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      logits[side_index] = s->be->to_host(out->logits);
      ids[side_index] = s->be->to_host(out->ids);
      ++side_index;
    }
    ASSERT_EQ(logits[0].numel(), kActive[k] * cfg.vocab_size);
    EXPECT_EQ(std::memcmp(logits[0].data(), logits[1].data(), logits[0].nbytes()), 0) << "logits differ";
    ASSERT_EQ(std::memcmp(ids[0].data(), ids[1].data(), ids[0].nbytes()), 0) << "drawn ids differ";
    for (int i = 0; i < kActive[k]; ++i) {
      const int32_t id = ids[0].data_as<const int32_t>()[i];
      ASSERT_TRUE(id >= 0 && id < cfg.vocab_size) << "row " << i << " drew " << id;
      next[i] = id;
    }
  }
  // The padding took nothing: every slot and page is back once the sequences close.
  for (Side* s : {&on, &off}) {
    s->executor.reset();
    for (SeqId id : s->seqs) s->cache->close(id);
    EXPECT_EQ(s->cache->free_slots(), s->cache->sizes().slots);
    EXPECT_EQ(s->cache->free_pages(), s->cache->sizes().pages);
  }
}


INSTANTIATE_TEST_SUITE_P(
    Models, GraphReplay,
    ::testing::Combine(
        ::testing::Values(Source{"kimi_linear_tiny", "kimi-linear-tiny", "", {}},
                          Source{"k3_tiny", "k3-tiny", "", {}},
                          Source{"random_kimi_linear", "", "kimi-linear-tiny",
                                 Json{{"hidden_size", 80}, {"num_attention_heads", 5}, {"num_experts", 10},
                                      {"num_experts_per_token", 2}, {"num_expert_group", 2}, {"topk_group", 1}, {"kv_lora_rank", 40}, {"qk_nope_head_dim", 16},
                                      {"qk_rope_head_dim", 8}, {"v_head_dim", 16},
                                      {"linear_attn_config", {{"num_heads", 5}, {"head_dim", 16}}}}},
                          // The latent shape of the 48B model (512 + 64), where the CUDA bf16 decode
                          // runs its tensor-core kernels.
                          Source{"random_latent_512", "", "kimi-linear-tiny",
                                 Json{{"kv_lora_rank", 512}, {"qk_rope_head_dim", 64}}}),
        ::testing::ValuesIn(testing::backend_cases())),
    [](const auto& info) { return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name; });

}  // namespace
}  // namespace klinear
