// The seed runner's settings file (runtime/settings.h): parallel_config's layout, the other
// sections' fields checked as the seed checks them and listed as unused, every bad file a clear
// error naming the field.
#include "runtime/settings.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace klinear {
namespace {

Result<RunnerSettings> parse(const char* text) {
  return parse_runner_settings(parse_json(text, "settings").value(), "--settings s.json");
}

TEST(RunnerSettings, ParallelConfigAndTheFieldsNotUsed) {
  auto s = parse(R"({"model_config": {"exe_mode": "graph", "custom_params": {}},
                     "parallel_config": {"attn_tp_size": 4, "moe_ep_size": 4, "lmhead_tp_size": 1},
                     "data_config": {"pa_block_size": 128, "input_max_len": 4096, "max_new_tokens": 64,
                                     "next_n": 0, "draft_model_type": "none"}})");
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_TRUE(s->parallel.has_value());
  EXPECT_EQ(s->parallel->world, 4);  // tp × dp where world_size is not given
  EXPECT_EQ(s->parallel->tensor, 4);
  EXPECT_EQ(s->parallel->expert, 4);
  EXPECT_EQ(s->parallel->embed, 4);
  EXPECT_EQ(s->parallel->lm_head, 1);
  const std::vector<std::string> unused = {"data_config.draft_model_type", "data_config.input_max_len",
                                           "data_config.max_new_tokens",   "data_config.next_n",
                                           "data_config.pa_block_size",    "model_config.custom_params",
                                           "model_config.exe_mode"};
  EXPECT_EQ(s->unused(), unused);
  // A command takes the fields it has a setting for; they are no longer unused.
  const Json* block = s->take("pa_block_size");
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(*block, 128);
  EXPECT_EQ(s->take("batch_size_per_rank"), nullptr);
  const std::vector<std::string> left = s->unused();
  EXPECT_EQ(left.size(), unused.size() - 1);
  EXPECT_EQ(std::count(left.begin(), left.end(), "data_config.pa_block_size"), 0);

  auto none = parse(R"({"data_config": {"batch_size_per_rank": 2}})");
  ASSERT_TRUE(none.ok()) << none.status().to_string();
  EXPECT_FALSE(none->parallel.has_value());
  EXPECT_EQ(none->unused(), std::vector<std::string>{"data_config.batch_size_per_rank"});
}

TEST(RunnerSettings, BadSettingsNameWhatIsWrong) {
  const struct {
    const char* text;
    const char* says;
  } cases[] = {
      {R"([1])", "expected a JSON object with model_config, parallel_config and/or data_config"},
      {R"({"runner": {}})", "runner: not a section of the settings"},
      {R"({"data_config": 3})", "data_config: expected an object"},
      {R"({"parallel_config": {"world_size": 8, "attn_tp_size": 2}})",
       "parallel_config.world_size 8, but attn_tp_size 2 x attn_dp_size 1 make 2 ranks"},
      {R"({"parallel_config": {"moe_tp_size": 2}})", "MoE tensor parallelism is fixed at 1"},
      {R"({"parallel_config": {"attn_tp_size": 2, "shared_tp_size": 1}})", "shared_tp_size 1 must equal attn_tp_size 2"},
      {R"({"parallel_config": {"pp_size": 2}})", "parallel_config.pp_size: not a setting klinear knows"},
      {R"({"data_config": {"pa_block_size": 24}})", "pa_block_size 24: the paged cache needs a multiple of 16"},
      {R"({"data_config": {"pa_block_size": 0}})", "pa_block_size: expected a positive integer, got 0"},
      {R"({"data_config": {"batch_size_per_rank": "8"}})", "batch_size_per_rank: expected a positive integer"},
      {R"({"data_config": {"next_n": 2}})", "next_n 2 without a draft model (draft_model_type none): it must be 0"},
      {R"({"model_config": {"draft_model_type": "eagle"}})", "draft_model_type \"eagle\": unknown (expected none or dspark)"},
      {R"({"model_config": {"draft_model_type": "dspark"}, "data_config": {"next_n": 0}})",
       "draft_model_type dspark with next_n 0"},
      {R"({"model_config": {"draft_model_type": "dspark"}, "data_config": {"next_n": 2}})",
       "speculative decoding is not built yet"},
      {R"({"data_config": {"next_n": -1}})", "next_n: expected an integer of at least 0, got -1"},
  };
  for (const auto& c : cases) {
    auto s = parse(c.text);
    EXPECT_FALSE(s.ok()) << c.text;
    if (s.ok()) continue;
    EXPECT_NE(s.status().message().find(c.says), std::string::npos) << c.text << "\n" << s.status().to_string();
    EXPECT_NE(s.status().message().find("--settings s.json"), std::string::npos) << s.status().to_string();
  }
}

}  // namespace
}  // namespace klinear
