// parse_model_config: the fixture configs, the published Kimi-Linear-48B and K3 configs, and errors naming the field.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "io/config.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::fixture_path;

ModelConfig load_fixture(const std::string& name) {
  auto c = load_model_config(fixture_path(name + "/model"));
  KL_CHECK(c.ok(), c.status().to_string());
  return std::move(c).value();
}

std::set<int64_t> mla_layers(const ModelConfig& c) {
  std::set<int64_t> out;
  for (int64_t l = 0; l < c.num_layers; ++l)
    if (c.mixer(l) == Mixer::kMla) out.insert(l);
  return out;
}

void expect_ffn_dense_then_moe(const ModelConfig& c) {
  EXPECT_EQ(c.ffn(0), Ffn::kDense);
  for (int64_t l = 1; l < c.num_layers; ++l) EXPECT_EQ(c.ffn(l), Ffn::kMoe) << "layer " << l;
}

TEST(ConfigTest, KimiLinearTinyFixture) {
  const ModelConfig c = load_fixture("kimi-linear-tiny");
  EXPECT_EQ(c.model_type, "kimi_linear");
  EXPECT_FALSE(c.nested_text_config);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.kda_layers, (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(mla_layers(c), (std::set<int64_t>{2, 4}));  // 1-based kda_layers 1,2,4 -> KDA at 0,1,3
  EXPECT_EQ(c.mixer(0), Mixer::kKda);
  EXPECT_EQ(c.mixer(3), Mixer::kKda);
  expect_ffn_dense_then_moe(c);
  EXPECT_EQ(c.kda_gate, KdaGate::kSoftplus);
  EXPECT_EQ(c.kda_output_gate, KdaOutputGate::kLowRank);
  EXPECT_EQ(c.activation, Activation::kSilu);
  EXPECT_EQ(c.situ_beta, 1.0f);
  EXPECT_FALSE(c.situ_linear_beta.has_value());
  EXPECT_FALSE(c.has_latent_moe());
  EXPECT_EQ(c.expert_io_dim(), 128);
  EXPECT_EQ(c.expert_format, ExpertFormat::kDense);
  EXPECT_FALSE(c.has_attn_res());
  EXPECT_TRUE(c.grouped_selection());
  EXPECT_EQ(c.num_expert_group, 4);
  EXPECT_EQ(c.topk_group, 2);
  EXPECT_EQ(c.q_lora_rank, 0);  // null -> full q_proj
  EXPECT_FALSE(c.mla_output_gate);
  EXPECT_FLOAT_EQ(c.routed_scaling_factor, 2.446f);
  EXPECT_EQ(c.kda_proj(), 128);
  EXPECT_EQ(c.mla_qk_head_dim(), 48);
  EXPECT_EQ(c.max_position_embeddings, 1048576);  // from model_max_length
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_TRUE(c.is_eos(2));
  EXPECT_FALSE(c.is_eos(1));
}

TEST(ConfigTest, KimiLinearTinyBf16Fixture) {
  const ModelConfig c = load_fixture("kimi-linear-tiny-bf16");
  EXPECT_EQ(c.num_layers, 4);
  EXPECT_EQ(mla_layers(c), (std::set<int64_t>{3}));
  expect_ffn_dense_then_moe(c);
  EXPECT_TRUE(c.grouped_selection());
  EXPECT_EQ(c.activation, Activation::kSilu);
}

// What every K3 config shares: layer 0 dense then MoE, the lower-bound gate at -5, the full-rank
// KDA output gate, SiTU with beta 4.
void expect_k3_layer_kinds(const ModelConfig& c) {
  expect_ffn_dense_then_moe(c);
  EXPECT_EQ(c.kda_gate, KdaGate::kLowerBound);
  EXPECT_EQ(c.gate_lower_bound, -5.0f);
  EXPECT_EQ(c.kda_output_gate, KdaOutputGate::kFullRank);
  EXPECT_EQ(c.activation, Activation::kSitu);
  EXPECT_EQ(c.situ_beta, 4.0f);
}

void expect_k3_tiny(const ModelConfig& c) {
  EXPECT_EQ(c.model_type, "kimi_k3");
  EXPECT_TRUE(c.nested_text_config);
  EXPECT_EQ(c.num_layers, 6);
  EXPECT_EQ(c.kda_layers, (std::vector<int64_t>{1, 2, 3, 5}));
  EXPECT_EQ(mla_layers(c), (std::set<int64_t>{3, 5}));
  expect_k3_layer_kinds(c);
  ASSERT_TRUE(c.situ_linear_beta.has_value());
  EXPECT_EQ(*c.situ_linear_beta, 25.0f);
  EXPECT_TRUE(c.has_latent_moe());
  EXPECT_EQ(c.routed_expert_hidden_size, 64);
  EXPECT_EQ(c.expert_io_dim(), 64);
  EXPECT_TRUE(c.latent_moe_use_norm);
  EXPECT_EQ(c.attn_res_block_size, 2);
  EXPECT_TRUE(c.has_attn_res());
  EXPECT_FALSE(c.grouped_selection());  // one group
  EXPECT_EQ(c.q_lora_rank, 48);
  EXPECT_TRUE(c.mla_output_gate);
  EXPECT_EQ(c.num_shared_experts, 2);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_TRUE(c.is_eos(2));
}

TEST(ConfigTest, K3TinyFixture) {
  const ModelConfig c = load_fixture("k3-tiny");
  expect_k3_tiny(c);
  EXPECT_EQ(c.expert_format, ExpertFormat::kDense);
}

TEST(ConfigTest, K3TinyMxfp4Fixture) {
  const ModelConfig c = load_fixture("k3-tiny-mxfp4");
  expect_k3_tiny(c);
  EXPECT_EQ(c.expert_format, ExpertFormat::kMxfp4);
}

// MODEL.md 1.1, the published Kimi-Linear-48B-A3B-Instruct config.json (fields that matter).
Json kimi_linear_48b() {
  return Json::parse(R"({
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "dtype": "bfloat16",
    "vocab_size": 163840, "hidden_size": 2304, "num_hidden_layers": 27, "head_dim": 72,
    "num_attention_heads": 32, "num_key_value_heads": 32, "q_lora_rank": null, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": true,
    "rope_theta": 10000.0, "rope_scaling": null,
    "linear_attn_config": {"num_heads": 32, "head_dim": 128, "short_conv_kernel_size": 4,
      "kda_layers": [1,2,3,5,6,7,9,10,11,13,14,15,17,18,19,21,22,23,25,26],
      "full_attn_layers": [4,8,12,16,20,24,27]},
    "intermediate_size": 9216, "hidden_act": "silu", "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "num_experts": 256, "num_experts_per_token": 8, "num_shared_experts": 1, "moe_intermediate_size": 1024,
    "moe_router_activation_func": "sigmoid", "moe_renormalize": true, "routed_scaling_factor": 2.446,
    "use_grouped_topk": true, "num_expert_group": 1, "topk_group": 1, "rms_norm_eps": 1e-5,
    "num_nextn_predict_layers": 0, "tie_word_embeddings": false, "model_max_length": 1048576,
    "bos_token_id": 163584, "eos_token_id": 163586, "pad_token_id": 163839,
    "initializer_range": 0.02, "use_cache": true})");
}

// MODEL.md 1.2, the published K3 config.json (text_config nested; kda_layers = all but the MLA layers).
Json kimi_k3() {
  Json full = Json::array(), kda = Json::array();
  std::set<int> full_set;
  for (int l = 4; l <= 88; l += 4) full_set.insert(l);
  full_set.insert(92);
  full_set.insert(93);
  for (int l = 1; l <= 93; ++l) (full_set.count(l) ? full : kda).push_back(l);
  Json text = Json::parse(R"({
    "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"],
    "hidden_size": 7168, "num_hidden_layers": 93, "vocab_size": 163840,
    "num_attention_heads": 96, "num_key_value_heads": 96, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "mla_use_nope": true,
    "mla_use_output_gate": true,
    "linear_attn_config": {"num_heads": 96, "head_dim": 128, "short_conv_kernel_size": 4,
      "gate_lower_bound": -5.0, "use_full_rank_gate": true},
    "intermediate_size": 33792, "hidden_act": "situ", "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "num_experts": 896, "num_experts_per_token": 16, "num_shared_experts": 2, "moe_intermediate_size": 3072,
    "routed_expert_hidden_size": 3584, "latent_moe_use_norm": true, "moe_router_activation_func": "sigmoid",
    "moe_renormalize": true, "routed_scaling_factor": 1.0, "use_grouped_topk": true, "num_expert_group": 1,
    "topk_group": 1, "topk_method": "noaux_tc", "attn_res_block_size": 12, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 1048576, "num_nextn_predict_layers": 0, "tie_word_embeddings": false,
    "quantization_config": {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float",
        "group_size": 32, "strategy": "group", "symmetric": true, "scale_dtype": "torch.uint8"}}},
      "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*lm_head.*", "vision_tower", "mm_projector"]}
  })");
  text["linear_attn_config"]["full_attn_layers"] = full;
  text["linear_attn_config"]["kda_layers"] = kda;
  return Json{{"model_type", "kimi_k3"}, {"architectures", {"KimiK3ForConditionalGeneration"}},
              {"bos_token_id", 163584}, {"eos_token_id", 163586}, {"pad_token_id", 163839},
              {"media_placeholder_token_id", 163605}, {"dtype", "bfloat16"}, {"text_config", text},
              {"vision_config", {{"model_type", "moonvit"}}}};
}

TEST(ConfigTest, PublishedKimiLinear48B) {
  auto r = parse_model_config(kimi_linear_48b(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  EXPECT_EQ(mla_layers(c), (std::set<int64_t>{3, 7, 11, 15, 19, 23, 26}));
  expect_ffn_dense_then_moe(c);
  EXPECT_EQ(c.kda_proj(), 4096);
  EXPECT_EQ(c.mla_qk_head_dim(), 192);
  EXPECT_EQ(c.kda_gate, KdaGate::kSoftplus);
  EXPECT_EQ(c.kda_output_gate, KdaOutputGate::kLowRank);
  EXPECT_EQ(c.activation, Activation::kSilu);
  EXPECT_FALSE(c.grouped_selection());
  EXPECT_FALSE(c.has_latent_moe());
  EXPECT_FALSE(c.has_attn_res());
  EXPECT_EQ(c.expert_format, ExpertFormat::kDense);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.experts_per_token, 8);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{163586}));
  EXPECT_EQ(c.max_position_embeddings, 1048576);
}

TEST(ConfigTest, PublishedK3) {
  auto r = parse_model_config(kimi_k3(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  EXPECT_TRUE(c.nested_text_config);
  EXPECT_EQ(c.num_layers, 93);
  EXPECT_EQ(c.kda_layers.size(), 69u);
  std::set<int64_t> want;
  for (int64_t l = 3; l <= 87; l += 4) want.insert(l);
  want.insert(91);
  want.insert(92);
  EXPECT_EQ(want.size(), 24u);
  EXPECT_EQ(mla_layers(c), want);
  expect_k3_layer_kinds(c);
  EXPECT_EQ(c.situ_linear_beta.value_or(0.0f), 25.0f);
  EXPECT_EQ(c.expert_io_dim(), 3584);
  EXPECT_EQ(c.expert_format, ExpertFormat::kMxfp4);
  EXPECT_EQ(c.attn_res_block_size, 12);
  EXPECT_FALSE(c.grouped_selection());
  EXPECT_TRUE(c.mla_output_gate);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kda_proj(), 12288);
  EXPECT_EQ(c.bos_token_id, 163584);
  EXPECT_TRUE(c.is_eos(163586));
}

// ---- errors: each names the field (and the document)

Json fixture_json(const std::string& name) {
  auto j = read_json_file(fixture_path(name + "/model/config.json"));
  KL_CHECK(j.ok(), j.status().to_string());
  return *j;
}

void expect_error(const Json& doc, const std::string& needle, StatusCode code) {
  auto r = parse_model_config(doc, "cfg.json");
  ASSERT_FALSE(r.ok()) << "accepted: " << doc.dump();
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find(needle), std::string::npos)
      << "message: " << r.status().message() << "\nwanted: " << needle;
  EXPECT_EQ(r.status().message().rfind("cfg.json", 0), 0u) << r.status().message();
}

TEST(ConfigTest, FixturesParseAsDocuments) {
  // Control for the error tests: the unedited documents are accepted.
  ASSERT_TRUE(parse_model_config(fixture_json("kimi-linear-tiny"), "cfg.json").ok());
  ASSERT_TRUE(parse_model_config(fixture_json("k3-tiny"), "cfg.json").ok());
}

TEST(ConfigTest, MissingOrMistypedField) {
  Json j = fixture_json("kimi-linear-tiny");
  j.erase("hidden_size");
  expect_error(j, "'hidden_size' is missing", StatusCode::kNotFound);
  j = fixture_json("kimi-linear-tiny");
  j["hidden_size"] = "128";
  expect_error(j, "'hidden_size' must be an integer", StatusCode::kInvalidArgument);
  j["hidden_size"] = 128.5;
  expect_error(j, "'hidden_size' must be an integer", StatusCode::kInvalidArgument);
  j = fixture_json("kimi-linear-tiny");
  j["moe_renormalize"] = "yes";
  expect_error(j, "'moe_renormalize' must be a boolean", StatusCode::kInvalidArgument);
  j = fixture_json("kimi-linear-tiny");
  j["vocab_size"] = 0;
  expect_error(j, "vocab_size is 0, expected an integer in [1, ", StatusCode::kInvalidArgument);
  expect_error(Json::array(), "must be a JSON object", StatusCode::kInvalidArgument);
}

TEST(ConfigTest, HugeFloatForIntegerField) {
  Json j = fixture_json("kimi-linear-tiny");
  j["hidden_size"] = 1e300;
  expect_error(j, "'hidden_size' must be an integer", StatusCode::kInvalidArgument);
}

TEST(ConfigTest, NestedK3ErrorsNameTextConfig) {
  Json j = fixture_json("k3-tiny");
  j["text_config"].erase("num_hidden_layers");
  expect_error(j, "cfg.json.text_config: required field 'num_hidden_layers'", StatusCode::kNotFound);
  j = fixture_json("k3-tiny");
  j["text_config"] = 5;
  expect_error(j, "text_config must be an object", StatusCode::kInvalidArgument);
}

TEST(ConfigTest, KdaLayersOutOfRange) {
  Json j = fixture_json("kimi-linear-tiny");
  j["linear_attn_config"]["kda_layers"] = {0, 1, 2};
  expect_error(j, "kda_layers entry 0 is outside 1..5", StatusCode::kInvalidArgument);
  j["linear_attn_config"]["kda_layers"] = {1, 2, 6};
  expect_error(j, "kda_layers entry 6 is outside 1..5", StatusCode::kInvalidArgument);
  j["linear_attn_config"]["kda_layers"] = {1, 2, 2};
  expect_error(j, "kda_layers has duplicates", StatusCode::kInvalidArgument);
  j["linear_attn_config"]["kda_layers"] = {1, "2"};
  expect_error(j, "'kda_layers' must be a list of integers", StatusCode::kInvalidArgument);
}

TEST(ConfigTest, ExpertCounts) {
  Json j = fixture_json("kimi-linear-tiny");
  j["num_expert_group"] = 3;
  expect_error(j, "num_experts 16 is not divisible by num_expert_group 3", StatusCode::kInvalidArgument);
  j = fixture_json("kimi-linear-tiny");
  j["num_experts_per_token"] = 17;
  expect_error(j, "num_experts_per_token 17 exceeds num_experts 16", StatusCode::kInvalidArgument);
  j = fixture_json("kimi-linear-tiny");
  j["topk_group"] = 5;
  expect_error(j, "topk_group 5 must be in 1..4", StatusCode::kInvalidArgument);
  j = fixture_json("kimi-linear-tiny");
  j["moe_layer_freq"] = -1;
  expect_error(j, "moe_layer_freq is -1, expected an integer in [1, ", StatusCode::kInvalidArgument);
}

TEST(ConfigTest, UnsupportedFeatures) {
  Json j = fixture_json("kimi-linear-tiny");
  j["hidden_act"] = "gelu";
  expect_error(j, "hidden_act 'gelu' is not supported", StatusCode::kNotSupported);
  j = fixture_json("kimi-linear-tiny");
  j["moe_router_activation_func"] = "softmax";
  expect_error(j, "moe_router_activation_func 'softmax' is not supported", StatusCode::kNotSupported);
  j = fixture_json("kimi-linear-tiny");
  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}};
  expect_error(j, "quantization_config", StatusCode::kNotSupported);
  // MXFP4 is found by its scheme whatever the vendor spelling; other schemes are refused naming them.
  struct Quant {
    Json q;
    bool mxfp4;
  };
  auto groups = [](const Json& weights) { return Json{{"group_0", Json{{"weights", weights}}}}; };
  const Json fp4 = Json{{"num_bits", 4}, {"type", "float"}, {"group_size", 32}};
  const Json int4 = Json{{"num_bits", 4}, {"type", "int"}, {"group_size", 128}};
  const Quant quants[] = {
      {Json{{"quant_method", "compressed-tensors"}, {"format", "mxfp4-pack-quantized"}}, true},
      {Json{{"quant_method", "compressed-tensors"}, {"format", "MXFP4_pack_quantized"}}, true},
      {Json{{"quant_method", "mxfp4"}}, true},
      {Json{{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"}, {"config_groups", groups(fp4)}}, true},
      {Json{{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"}, {"config_groups", groups(int4)}}, false},
      {Json{{"quant_method", "fp8"}, {"fmt", "e4m3"}}, false},
  };
  for (const Quant& c : quants) {
    j = fixture_json("k3-tiny");
    j["text_config"]["quantization_config"] = c.q;
    auto parsed = parse_model_config(j, "cfg.json");
    ASSERT_EQ(parsed.ok(), c.mxfp4) << c.q << ": " << parsed.status().to_string();
    if (c.mxfp4) {
      EXPECT_EQ(parsed->expert_format, ExpertFormat::kMxfp4) << c.q;
    } else {
      EXPECT_EQ(parsed.status().code(), StatusCode::kNotSupported) << c.q;
      EXPECT_NE(parsed.status().message().find("4-bit floats in groups of 32"), std::string::npos) << parsed.status().to_string();
    }
  }
  j = fixture_json("k3-tiny");
  j["text_config"]["attn_res_mode"] = "fused";  // the runner's schedule of the same sums
  EXPECT_TRUE(parse_model_config(j, "cfg.json").ok());
  j["text_config"]["attn_res_mode"] = 3;
  expect_error(j, "attn_res_mode", StatusCode::kInvalidArgument);
  j = fixture_json("kimi-linear-tiny");
  j["attn_res_mode"] = "fused";
  expect_error(j, "no AttnRes blocks", StatusCode::kInvalidArgument);
  j = fixture_json("kimi-linear-tiny");
  j["mla_use_nope"] = false;
  expect_error(j, "mla_use_nope", StatusCode::kNotSupported);
  j = fixture_json("kimi-linear-tiny");
  j["mla_use_rope"] = true;
  expect_error(j, "mla_use_rope", StatusCode::kNotSupported);
  j = fixture_json("k3-tiny");
  j["text_config"]["latent_moe_use_norm"] = false;  // supported: the latent output goes straight up
  EXPECT_FALSE(parse_model_config(j, "cfg.json")->latent_moe_use_norm);
  j = fixture_json("k3-tiny");
  j["text_config"]["linear_attn_config"]["gate_lower_bound"] = 1.0;
  expect_error(j, "gate_lower_bound is 1, expected a finite number in [-10000, 0]", StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace klinear
