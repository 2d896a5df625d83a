// One step, many sequences (docs/DESIGN.md): a schedule of steps that mixes prefill chunks of
// different lengths with decode rows gives every sequence the same logits, row by row, as running
// that sequence's pieces alone; then sequences are closed and new ones reuse their slots and
// (scattered) pages, from pools poisoned with NaN, with the same result. On the fixtures' models
// and random configs of both families, on every backend row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "backend_cases.h"
#include "bf16_reference.h"
#include "model/model.h"
#include "model_cases.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::BackendCase;
using testing::Source;

// A piece of sequence `seq`'s token list, [begin, end).
struct Piece {
  int seq;
  int64_t begin, end;
};
using Schedule = std::vector<std::vector<Piece>>;  // steps

// Four sequences of 37, 5, 70 and 3 tokens: prefill chunks beside decode rows, a sequence whose
// first step is a single token, steps where only some sequences take part.
const Schedule& schedule() {
  static const Schedule s = {
      {{0, 0, 20}, {1, 0, 5}, {2, 0, 30}},
      {{0, 20, 37}, {3, 0, 1}, {2, 30, 64}},
      {{1, 5, 6}, {0, 37, 38}, {3, 1, 2}, {2, 64, 65}},
      {{2, 65, 70}, {1, 6, 7}, {3, 2, 3}},
      {{0, 38, 39}, {1, 7, 8}, {2, 70, 71}},
  };
  return s;
}
const std::vector<int64_t> kLengths = {39, 8, 71, 3};

class BatchedEqualsAlone : public ::testing::TestWithParam<std::tuple<Source, BackendCase>> {};

TEST_P(BatchedEqualsAlone, MixedStepsAndReuse) {
  const auto& [src, row] = GetParam();
  auto be = make_backend(BackendOptions{row.device, row.dtype});
  if (!be.ok()) GTEST_SKIP() << row.name << ": " << be.status().to_string();
  const uint64_t seed = testing::fresh_seed();
  const testing::ScratchDir scratch;
  std::string dir = scratch.str();
  std::vector<std::vector<int32_t>> tokens;
  if (!src.fixture.empty()) {
    dir = testing::fixture_path(src.fixture + "/model");
    auto cfg = read_json_file(dir + "/config.json");
    ASSERT_TRUE(cfg.ok());
    tokens = testing::untied_prompts(dir, seed, [&](uint64_t s) {
      std::vector<std::vector<int32_t>> t;
      for (size_t i = 0; i < kLengths.size(); ++i) t.push_back(testing::random_ids(*cfg, kLengths[i], s * 31 + i));
      return t;
    });
  } else {
    const Json cfg = testing::patched_preset(src.preset, src.patch);
    for (size_t i = 0; i < kLengths.size(); ++i) tokens.push_back(testing::random_ids(cfg, kLengths[i], seed + i));
    testing::write_untied_checkpoint(cfg, dir, tokens, seed);
  }
  // A bf16 row's batched steps take the routing its alone runs chose, row by row (a RouteTrace keyed
  // by sequence and position): bf16 roundings that differ with the row count move a router score
  // by far more than the 1e-4 margin the checkpoints keep, and an expert traded for another moves
  // the logits by 0.1-0.25 (a row failed so about once in 30 runs on the H200). The float32 rows
  // route for themselves. A decorated backend runs every step eagerly (its copies cannot be
  // captured), so a bf16 row's decode steps are not graphs here; GraphReplay checks those.
  const bool replay_routes = row.dtype != DType::kF32;
  const size_t moe_layers = testing::moe_layers(load_model_config(dir).value());
  testing::RouteTrace::Record routes;
  std::optional<testing::RouteTrace> recorder, replayer;
  if (replay_routes) recorder.emplace(**be, testing::RouteTrace::Mode::kRecord, routes, moe_layers);
  auto model = Model::load(dir, replay_routes ? *recorder : **be);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto route_key = [](int s, int64_t position) { return (int64_t{s} << 32) | position; };
  auto cache = Cache::create((*model)->config(), **be, CacheOptions{6, 8, 64 << 20});
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  Cache& c = **cache;
  for (int64_t l = 0; l < (*model)->config().num_layers; ++l)
    for (const Tensor* pool : {&c.kda_states(l), &c.conv_states(l), &c.mla_pages(l)})
      if (pool->defined()) (*be)->fill(*pool, std::numeric_limits<float>::quiet_NaN());
  auto piece_ids = [&](const Piece& p) { return std::span<const int32_t>(tokens[p.seq]).subspan(p.begin, p.end - p.begin); };

  // Alone: each sequence's pieces in order, one sequence in the cache at a time.
  std::map<std::pair<int, int64_t>, Tensor> alone;
  for (int s = 0; s < static_cast<int>(tokens.size()); ++s) {
    const SeqId id = c.open().value();
    for (const auto& step : schedule())
      for (const Piece& p : step) {
        if (p.seq != s) continue;
        if (recorder) {
          std::vector<int64_t> keys;
          for (int64_t i = p.begin; i < p.end; ++i) keys.push_back(route_key(s, i));
          recorder->key_rows(keys);
        }
        auto r = (*model)->forward_one(c, id, piece_ids(p), LogitsMode::kAll);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        alone[{s, p.begin}] = *r;
      }
    c.close(id);
  }

  // Batched (for a bf16 row, by a model on the replaying backend), twice: the second round reuses
  // the slots and pages the first one freed.
  std::unique_ptr<Model> replaying;
  if (replay_routes) {
    replayer.emplace(**be, testing::RouteTrace::Mode::kReplay, routes, moe_layers);
    auto loaded = Model::load(dir, *replayer);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    replaying = std::move(loaded).value();
  }
  Model& m = replaying ? *replaying : **model;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<SeqId> ids;
    for (size_t s = 0; s < tokens.size(); ++s) ids.push_back(c.open().value());
    for (size_t k = 0; k < schedule().size(); ++k) {
      const auto& step = schedule()[k];
      std::vector<SeqStep> steps;
      for (const Piece& p : step) steps.push_back(SeqStep{ids[p.seq], piece_ids(p), LogitsMode::kAll});
      ASSERT_TRUE(c.reserve(steps).ok());
      auto batch = c.plan(steps);
      ASSERT_TRUE(batch.ok()) << batch.status().to_string();
      if (replayer) {  // the rows in the batch's order: sequence by sequence of its layout
        std::vector<int64_t> keys;
        const SeqLayout& L = batch->layout;
        for (int64_t b = 0; b < L.num_seqs(); ++b) {
          const int s = static_cast<int>(std::find(ids.begin(), ids.end(), batch->seqs[b]) - ids.begin());
          for (int64_t i = 0; i < L.new_tokens(b); ++i) keys.push_back(route_key(s, L.cached[b] + i));
        }
        replayer->key_rows(keys);
      }
      auto logits = m.forward(*batch, c);
      ASSERT_TRUE(logits.ok()) << logits.status().to_string();
      const Tensor h = (*be)->to_host(*logits);
      int64_t r0 = 0;
      for (const Piece& p : step) {
        const int64_t n = p.end - p.begin;
        // A sequence's rows alone and in a batch are not bit-identical (BLAS rounds a row by the
        // batch's row count), so the bound is a model's rows in another batch shape (test_util.h).
        const Tensor got = h.rows(r0, r0 + n), want = alone.at({p.seq, p.begin});
        EXPECT_TRUE(
            testing::all_close(got, want, testing::kModelRows.rel(row.dtype), testing::ErrorShape::kAmplified))
            << "step " << k << " sequence " << p.seq << " tokens [" << p.begin << ", " << p.end << ")";
        r0 += n;
      }
      ASSERT_EQ(r0, h.dim(0));
    }
    for (size_t s = 0; s < ids.size(); ++s) EXPECT_EQ(c.tokens(ids[s]), kLengths[s]);
    // Close in another order than opened, so the next round's pages come back scattered.
    for (int s : {2, 0, 3, 1}) c.close(ids[s]);
  }
  EXPECT_EQ(c.free_slots(), c.sizes().slots);
  EXPECT_EQ(c.free_pages(), c.sizes().pages);
}

INSTANTIATE_TEST_SUITE_P(
    Models, BatchedEqualsAlone,
    ::testing::Combine(
        ::testing::Values(Source{"kimi_linear_tiny", "kimi-linear-tiny", "", {}},
                          Source{"kimi_linear_tiny_bf16", "kimi-linear-tiny-bf16", "", {}},
                          Source{"k3_tiny", "k3-tiny", "", {}}, Source{"k3_tiny_mxfp4", "k3-tiny-mxfp4", "", {}},
                          Source{"random_kimi_linear", "", "kimi-linear-tiny",
                                 Json{{"hidden_size", 96}, {"num_attention_heads", 3}, {"num_experts", 12},
                                      {"num_experts_per_token", 3}, {"num_expert_group", 3}, {"topk_group", 1},
                                      {"kv_lora_rank", 24}, {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 8},
                                      {"v_head_dim", 12},
                                      {"linear_attn_config", {{"num_heads", 3}, {"head_dim", 16}, {"short_conv_kernel_size", 3}}}}},
                          Source{"random_k3", "", "k3-tiny",
                                 Json{{"attn_res_block_size", 3}, {"num_hidden_layers", 7},
                                      {"linear_attn_config", {{"kda_layers", {1, 3, 4, 5, 7}}, {"full_attn_layers", {2, 6}}}}}}),
        ::testing::ValuesIn(testing::backend_cases())),
    [](const auto& info) { return std::get<0>(info.param).name + "_" + std::get<1>(info.param).name; });

}  // namespace
}  // namespace klinear
