// ModelConfig: the parsed config.json of a Kimi Linear (flat) or K3 (text model nested under
// `text_config`) checkpoint, validated so that the model code can trust every field.
//
// MODEL.md section 1. Layer lists in the file are 1-based; the accessors here take 0-based layers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/kinds.h"
#include "core/status.h"
#include "io/json.h"

namespace klinear {

enum class KdaOutputGate { kLowRank, kFullRank };
enum class Mixer { kKda, kMla };
enum class Ffn { kDense, kMoe };
enum class ExpertFormat { kDense, kMxfp4 };     // how routed expert weights are stored (MODEL.md 2.3)

struct ModelConfig {
  std::string model_type;  // top-level model_type ("kimi_linear", "kimi_k3")
  bool nested_text_config = false;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  int64_t max_position_embeddings = 0;  // 0 = unknown

  // MLA (MODEL.md 5)
  int64_t mla_heads = 0;
  int64_t q_lora_rank = 0;  // 0 = full q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_dim = 0;
  int64_t qk_rope_dim = 0;
  int64_t v_head_dim = 0;
  bool mla_output_gate = false;

  // KDA (MODEL.md 4)
  int64_t kda_heads = 0;
  int64_t kda_head_dim = 0;
  int64_t conv_kernel = 4;
  std::vector<int64_t> kda_layers;  // 1-based, as in the file
  KdaGate kda_gate = KdaGate::kSoftplus;
  float gate_lower_bound = 0.0f;  // used with kLowerBound
  KdaOutputGate kda_output_gate = KdaOutputGate::kLowRank;

  // FFN (MODEL.md 3.2-3.4)
  Activation activation = Activation::kSilu;
  float situ_beta = 1.0f;
  std::optional<float> situ_linear_beta;
  int64_t intermediate_size = 0;
  int64_t num_experts = 0;  // 0 = no MoE
  int64_t experts_per_token = 0;
  int64_t moe_intermediate_size = 0;
  int64_t num_shared_experts = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  bool use_grouped_topk = true;
  int64_t num_expert_group = 1;
  int64_t topk_group = 1;
  bool moe_renormalize = true;
  float routed_scaling_factor = 1.0f;
  int64_t routed_expert_hidden_size = 0;  // 0 = no latent MoE
  bool latent_moe_use_norm = false;
  ExpertFormat expert_format = ExpertFormat::kDense;

  // AttnRes (MODEL.md 7)
  int64_t attn_res_block_size = 0;  // 0 = plain residual stream

  Mixer mixer(int64_t layer) const;
  Ffn ffn(int64_t layer) const;
  bool has_attn_res() const { return attn_res_block_size > 0; }
  bool has_latent_moe() const { return routed_expert_hidden_size > 0; }
  int64_t kda_proj() const { return kda_heads * kda_head_dim; }  // P
  int64_t mla_qk_head_dim() const { return qk_nope_dim + qk_rope_dim; }
  // Width of each routed expert's input/output: the latent width for latent MoE, else hidden.
  int64_t expert_io_dim() const { return has_latent_moe() ? routed_expert_hidden_size : hidden_size; }
  // Whether grouped expert selection changes anything (MODEL.md 3.3 step 4).
  bool grouped_selection() const {
    return use_grouped_topk && num_expert_group > 1 && topk_group < num_expert_group;
  }
  bool is_eos(int64_t id) const;
};

// Parses and validates a config.json document. `where` names it in messages.
Result<ModelConfig> parse_model_config(const Json& doc, const std::string& where);
Result<ModelConfig> load_model_config(const std::string& model_dir);

}  // namespace klinear
