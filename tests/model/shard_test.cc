// model/shard.h: the checks of a layout against a model, the seed runner's parallel_config, the
// parts a rank holds, and io/checkpoint.h's slices. The layouts themselves run over ranks in
// tests/dist/model_ranks_test.cc.
#include "model/shard.h"

#include <gtest/gtest.h>

#include <string>

#include "test_util.h"

namespace klinear {
namespace {

// Each setting that does not divide the model, or names a layout not built, is refused naming it.
TEST(Shard, SettingsThatDoNotFitAreRefused) {
  auto config = load_model_config(testing::fixture_path("kimi-linear-tiny/model"));
  ASSERT_TRUE(config.ok());
  struct Case {
    ParallelSizes sizes;
    std::string says;
  };
  const Case cases[] = {
      {{2, 3, 1, 1, 1, 1}, "tensor_parallel_size 3 x data_parallel_size 1 = 3 ranks, the launch has world_size 2"},
      {{3, 3, 1, 1, 1, 1}, "tensor_parallel_size 3 does not divide the 4 KDA heads"},
      {{8, 8, 1, 1, 1, 1}, "tensor_parallel_size 8 does not divide the 4 KDA heads"},
      {{2, 2, 1, 3, 1, 1}, "expert_parallel_size 3 with world_size 2"},
      {{2, 1, 2, 1, 1, 1}, "data_parallel_size 2: data-parallel attention"},
      {{2, 2, 1, 1, 3, 1}, "embed_tp_size 3: expected 1 or tensor_parallel_size 2"},
      {{4, 4, 1, 1, 1, 1}, ""},
  };
  for (const Case& c : cases) {
    const Status s = check_parallel(*config, c.sizes);
    if (c.says.empty()) {
      EXPECT_TRUE(s.ok()) << s.to_string();
      continue;
    }
    EXPECT_FALSE(s.ok()) << c.says;
    EXPECT_NE(s.to_string().find(c.says), std::string::npos) << s.to_string();
  }
  // A vocabulary of 512 over 3 ranks; 16 experts over 3.
  ModelConfig odd = *config;
  odd.kda_heads = odd.mla_heads = 6;
  odd.intermediate_size = odd.moe_intermediate_size = 96;
  EXPECT_NE(check_parallel(odd, {3, 3, 1, 1, 3, 3}).to_string().find("embed_tp_size 3 does not divide the 512"),
            std::string::npos);
  odd.vocab_size = 513;
  EXPECT_NE(check_parallel(odd, {3, 3, 1, 3, 1, 1}).to_string().find("expert_parallel_size 3 does not divide the 16 "
                                                                       "routed experts"),
            std::string::npos);
}

TEST(Shard, ParallelConfigUsesTheSeedRunnersNames) {
  auto parse = [](const char* text) { return parse_parallel_config(parse_json(text, "parallel_config").value()); };
  auto s = parse(R"({"world_size": 4, "attn_tp_size": 4, "moe_ep_size": 4, "dense_tp_size": 4})");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->world, 4);
  EXPECT_EQ(s->tensor, 4);
  EXPECT_EQ(s->data, 1);
  EXPECT_EQ(s->expert, 4);
  EXPECT_EQ(s->embed, 4);  // the vocabulary degrees default to attn_tp_size
  EXPECT_EQ(s->lm_head, 4);
  s = parse(R"({"world_size": 2, "attn_tp_size": 2, "embed_tp_size": 1, "lmhead_tp_size": 1})");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->embed, 1);
  EXPECT_EQ(s->lm_head, 1);
  struct Bad {
    const char* text;
    const char* says;
  };
  const Bad bad[] = {
      {R"({"attn_tp": 2})", "parallel_config.attn_tp: not a setting klinear knows"},
      {R"({"attn_tp_size": 0})", "parallel_config.attn_tp_size: expected a positive integer, got 0"},
      {R"({"attn_tp_size": "2"})", "expected a positive integer, got \"2\""},
      {R"({"moe_tp_size": 2})", "moe_tp_size 2: MoE tensor parallelism is fixed at 1"},
      {R"({"attn_tp_size": 2, "dense_tp_size": 1})", "dense_tp_size 1 must equal attn_tp_size 2"},
      {R"([2])", "parallel_config: expected an object"},
  };
  for (const Bad& b : bad) {
    auto r = parse(b.text);
    ASSERT_FALSE(r.ok()) << b.text;
    EXPECT_NE(r.status().to_string().find(b.says), std::string::npos) << r.status().to_string();
  }
}

TEST(Shard, EachRankHoldsItsBlockOfEachPart) {
  const ParallelSizes sizes{4, 4, 1, 4, 1, 4};
  for (int rank = 0; rank < 4; ++rank) {
    const ModelShard s = shard_of(sizes, rank);
    EXPECT_EQ(s.heads.index, rank);
    EXPECT_EQ(s.heads.count, 4);
    EXPECT_EQ(s.experts.first(16), 4 * rank);
    EXPECT_EQ(s.experts.size(16), 4);
    EXPECT_TRUE(s.embed.whole());
    EXPECT_EQ(s.lm_head.rows().along, Along::kRows);
    EXPECT_EQ(s.heads.columns().along, Along::kColumns);
    EXPECT_FALSE(s.whole());
  }
  EXPECT_TRUE(shard_of(ParallelSizes{}, 0).whole());
  EXPECT_EQ(shard_of(ParallelSizes{}, 0).heads.rows().along, Along::kWhole);
}

// Rows are a view of the same bytes; columns a copy of each row's block.
TEST(Shard, SlicesAreBlocksOfRowsOrColumns) {
  std::mt19937_64 rng(testing::fresh_seed());
  const Tensor t = testing::random_tensor(rng, {6, 8});
  const Tensor rows = slice_of(t, Slice{Along::kRows, 1, 3});
  ASSERT_EQ(rows.shape(), (Shape{2, 8}));
  EXPECT_EQ(rows.data(), static_cast<const void*>(t.f32() + 16));
  const Tensor cols = slice_of(t, Slice{Along::kColumns, 3, 4});
  ASSERT_EQ(cols.shape(), (Shape{6, 2}));
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t c = 0; c < 2; ++c) EXPECT_EQ(cols.f32()[r * 2 + c], t.f32()[r * 8 + 6 + c]) << r << "," << c;
  EXPECT_EQ(slice_of(t, Slice{}).data(), t.data());
}

}  // namespace
}  // namespace klinear
