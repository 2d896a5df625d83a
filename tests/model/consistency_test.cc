// The model on configs the fixtures do not cover (other sizes, layer tables, gate variants, group
// counts, AttnRes block sizes, MXFP4): random-weight checkpoints written with real tensor names,
// then one prompt run three ways that must agree: a single prefill (chunked KDA, expanded MLA),
// a prefill in two pieces, and a short prefill followed by token-by-token decode (recurrent KDA,
// absorbed MLA over the latent cache, conv state carried).
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "model/model.h"
#include "model/presets.h"
#include "test_util.h"

namespace klinear {
namespace {

// Both sides are fp32 evaluations of the same math in different orders (chunked vs recurrent KDA,
// expanded vs absorbed MLA) through up to 7 layers of a random network; seen up to ~1.0e-4.
constexpr double kTol = 5e-4;

struct Variant {
  const char* name;
  const char* preset;
  Json text_patch;  // merged into the text config
};

Json patched(const Variant& v) {
  Json cfg = preset_config(v.preset).value();
  Json& text = cfg.contains("text_config") ? cfg["text_config"] : cfg;
  text.merge_patch(v.text_patch);
  return cfg;
}

class ModelConsistency : public ::testing::TestWithParam<Variant> {};

TEST_P(ModelConsistency, PrefillPiecesAndDecodeAgree) {
  const Variant& v = GetParam();
  const uint64_t seed = testing::fresh_seed();
  const testing::ScratchDir scratch;
  const std::string dir = scratch.str();
  ASSERT_TRUE(write_random_checkpoint(patched(v), dir, seed).ok());
  testing::separate_router_choices(dir, seed);
  auto be = make_backend(DeviceKind::kCpu);
  ASSERT_TRUE(be.ok());
  auto model = Model::load(dir, **be);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  Model& m = **model;
  const int64_t vocab = m.config().vocab_size;

  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(75);
  for (int32_t& id : ids) id = tok(rng);

  SequenceState whole = m.new_sequence();
  auto all = m.forward(ids, whole, LogitsMode::kAll);
  ASSERT_TRUE(all.ok());

  // Two pieces: 70 then 5 (the second continues every cache).
  SequenceState pieces = m.new_sequence();
  ASSERT_TRUE(m.forward(std::span(ids).first(70), pieces, LogitsMode::kAll).ok());
  auto tail = m.forward(std::span(ids).subspan(70), pieces, LogitsMode::kAll);
  ASSERT_TRUE(tail.ok());
  EXPECT_TRUE(testing::close_rel(*tail, all->rows(70, 75), kTol)) << "piecewise prefill";

  // Decode: prefill 3 tokens, then one token at a time.
  SequenceState dec = m.new_sequence();
  ASSERT_TRUE(m.forward(std::span(ids).first(3), dec, LogitsMode::kAll).ok());
  for (int64_t i = 3; i < static_cast<int64_t>(ids.size()); ++i) {
    auto step = m.forward(std::span(ids).subspan(i, 1), dec, LogitsMode::kLast);
    ASSERT_TRUE(step.ok());
    ASSERT_TRUE(testing::close_rel(*step, all->rows(i, i + 1), kTol)) << "decode position " << i;
  }
  EXPECT_EQ(dec.tokens, 75);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ModelConsistency,
    ::testing::Values(
        Variant{"kimi_linear", "kimi-linear-tiny", Json::object()},
        Variant{"kimi_linear_wide", "kimi-linear-tiny",
                Json{{"hidden_size", 96}, {"num_hidden_layers", 4}, {"num_attention_heads", 3},
                     {"num_experts", 12}, {"num_experts_per_token", 3}, {"num_expert_group", 3}, {"topk_group", 1},
                     {"num_shared_experts", 0}, {"first_k_dense_replace", 2}, {"kv_lora_rank", 24},
                     {"qk_nope_head_dim", 8}, {"qk_rope_head_dim", 8}, {"v_head_dim", 12},
                     {"linear_attn_config", {{"num_heads", 3}, {"head_dim", 16}, {"short_conv_kernel_size", 3},
                                             {"kda_layers", {2, 3}}, {"full_attn_layers", {1, 4}}}}}},
        Variant{"kimi_linear_lb_gate", "kimi-linear-tiny",
                Json{{"hidden_act", "situ"}, {"activation_situ_beta", 2.0},
                     {"linear_attn_config", {{"gate_lower_bound", -3.0}}}}},
        Variant{"k3", "k3-tiny", Json::object()},
        Variant{"k3_block3_lowrank", "k3-tiny",
                Json{{"attn_res_block_size", 3}, {"num_hidden_layers", 7}, {"q_lora_rank", nullptr},
                     {"latent_moe_use_norm", false}, {"moe_layer_freq", 2},
                     {"num_experts", 8}, {"num_experts_per_token", 2}, {"num_shared_experts", 1},
                     {"routed_expert_hidden_size", 32}, {"activation_situ_linear_beta", nullptr},
                     {"linear_attn_config", {{"use_full_rank_gate", false}, {"kda_layers", {1, 3, 4, 5, 7}},
                                             {"full_attn_layers", {2, 6}}}}}},
        Variant{"k3_mxfp4", "k3-tiny-mxfp4", Json{{"num_expert_group", 4}, {"topk_group", 2}}}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace klinear
