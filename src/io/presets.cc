#include "io/presets.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "io/config.h"
#include "io/safetensors.h"

namespace klinear {

namespace {

// Special ids sit in the last 256 ids of the vocabulary, as in the Kimi tokenizer (bos 163584,
// eos <|im_end|> 163586, pad 163839 of 163840), so a tiny vocabulary gets ids inside it.
int64_t special(int64_t vocab, int64_t offset) { return vocab - 256 + offset; }

Json kimi_linear_text(int64_t vocab) {
  return Json{{"model_type", "kimi_linear"}, {"architectures", {"KimiLinearForCausalLM"}}, {"vocab_size", vocab}, {"hidden_size", 128}, {"intermediate_size", 256},
              {"moe_intermediate_size", 64}, {"num_hidden_layers", 5}, {"num_attention_heads", 4},
              {"num_key_value_heads", 4}, {"q_lora_rank", nullptr}, {"kv_lora_rank", 64},
              {"qk_nope_head_dim", 32}, {"qk_rope_head_dim", 16}, {"v_head_dim", 32}, {"mla_use_nope", true},
              {"num_experts", 16}, {"num_experts_per_token", 4}, {"num_shared_experts", 1}, {"moe_layer_freq", 1},
              {"first_k_dense_replace", 1}, {"num_expert_group", 4}, {"topk_group", 2}, {"moe_renormalize", true},
              {"moe_router_activation_func", "sigmoid"}, {"routed_scaling_factor", 2.446}, {"rms_norm_eps", 1e-5},
              {"hidden_act", "silu"}, {"tie_word_embeddings", false}, {"bos_token_id", special(vocab, 0)},
              {"eos_token_id", special(vocab, 2)}, {"pad_token_id", special(vocab, 255)}, {"model_max_length", 1048576},
              {"linear_attn_config",
               {{"head_dim", 32}, {"num_heads", 4}, {"short_conv_kernel_size", 4}, {"kda_layers", {1, 2, 4}},
                {"full_attn_layers", {3, 5}}}}};
}

// MODEL.md 1.1: the published Kimi-Linear-48B-A3B-Instruct config.json (for --load-format dummy).
Json kimi_linear_48b() {
  std::vector<int> kda, mla{4, 8, 12, 16, 20, 24, 27};
  for (int l = 1; l <= 27; ++l)
    if (std::find(mla.begin(), mla.end(), l) == mla.end()) kda.push_back(l);
  return Json{{"model_type", "kimi_linear"}, {"architectures", {"KimiLinearForCausalLM"}}, {"vocab_size", 163840},
              {"hidden_size", 2304}, {"intermediate_size", 9216}, {"moe_intermediate_size", 1024},
              {"num_hidden_layers", 27}, {"num_attention_heads", 32}, {"num_key_value_heads", 32},
              {"head_dim", 72}, {"q_lora_rank", nullptr}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128},
              {"qk_rope_head_dim", 64}, {"v_head_dim", 128}, {"mla_use_nope", true}, {"num_experts", 256},
              {"num_experts_per_token", 8}, {"num_shared_experts", 1}, {"moe_layer_freq", 1},
              {"first_k_dense_replace", 1}, {"use_grouped_topk", true}, {"num_expert_group", 1}, {"topk_group", 1},
              {"moe_renormalize", true}, {"moe_router_activation_func", "sigmoid"}, {"routed_scaling_factor", 2.446},
              {"rms_norm_eps", 1e-5}, {"hidden_act", "silu"}, {"tie_word_embeddings", false},
              {"bos_token_id", 163584}, {"eos_token_id", 163586}, {"pad_token_id", 163839},
              {"model_max_length", 1048576}, {"dtype", "bfloat16"},
              {"linear_attn_config",
               {{"head_dim", 128}, {"num_heads", 32}, {"short_conv_kernel_size", 4}, {"kda_layers", kda},
                {"full_attn_layers", mla}}}};
}

Json k3_text(int64_t vocab, bool mxfp4) {
  Json t{{"vocab_size", vocab}, {"hidden_size", 128}, {"intermediate_size", 256}, {"moe_intermediate_size", 64},
         {"routed_expert_hidden_size", 64}, {"latent_moe_use_norm", true}, {"num_hidden_layers", 6},
         {"num_attention_heads", 4}, {"num_key_value_heads", 4}, {"q_lora_rank", 48}, {"kv_lora_rank", 64},
         {"qk_nope_head_dim", 32}, {"qk_rope_head_dim", 16}, {"v_head_dim", 32}, {"mla_use_nope", true},
         {"mla_use_output_gate", true}, {"num_experts", 16}, {"num_experts_per_token", 4},
         {"num_shared_experts", 2}, {"moe_layer_freq", 1}, {"first_k_dense_replace", 1},
         {"use_grouped_topk", true}, {"num_expert_group", 1}, {"topk_group", 1}, {"moe_renormalize", true},
         {"moe_router_activation_func", "sigmoid"}, {"routed_scaling_factor", 1.0}, {"rms_norm_eps", 1e-5},
         {"hidden_act", "situ"}, {"activation_situ_beta", 4.0}, {"activation_situ_linear_beta", 25.0},
         {"attn_res_block_size", 2}, {"tie_word_embeddings", false}, {"bos_token_id", special(vocab, 0)},
         {"eos_token_id", special(vocab, 2)}, {"pad_token_id", special(vocab, 255)}, {"max_position_embeddings", 1048576},
         {"linear_attn_config",
          {{"head_dim", 32}, {"num_heads", 4}, {"short_conv_kernel_size", 4}, {"kda_layers", {1, 2, 3, 5}},
           {"full_attn_layers", {4, 6}}, {"gate_lower_bound", -5.0}, {"use_full_rank_gate", true}}}};
  if (mxfp4)
    t["quantization_config"] = {{"quant_method", "compressed-tensors"}, {"format", "mxfp4-pack-quantized"}};
  return Json{{"model_type", "kimi_k3"}, {"architectures", {"KimiK3ForConditionalGeneration"}},
              {"bos_token_id", special(vocab, 0)}, {"eos_token_id", special(vocab, 2)}, {"pad_token_id", special(vocab, 255)}, {"text_config", t}};
}

class Writer {
 public:
  Writer(uint64_t seed, std::string prefix) : rng_(seed), prefix_(std::move(prefix)) {}

  void normal(const std::string& name, Shape shape, DType dtype = DType::kBF16, float stddev = 0.02f) {
    std::normal_distribution<float> dist(0.0f, stddev);
    add(name, shape, dtype, [&] { return dist(rng_); });
  }
  void constant(const std::string& name, Shape shape, float value, DType dtype = DType::kBF16) {
    add(name, shape, dtype, [&] { return value; });
  }
  void uniform(const std::string& name, Shape shape, float lo, float hi, DType dtype) {
    std::uniform_real_distribution<float> dist(lo, hi);
    add(name, shape, dtype, [&] { return dist(rng_); });
  }
  // MXFP4 expert weight [out, in]: random nibbles with scales near 2^-8 (MODEL.md 2.3).
  void mxfp4(const std::string& name, int64_t out, int64_t in) {
    Tensor packed = Tensor::empty(DType::kU8, {out, in / 2}), scale = Tensor::empty(DType::kU8, {out, in / 32});
    std::uniform_int_distribution<int> byte(0, 255), exp(119, 121);
    for (int64_t i = 0; i < packed.numel(); ++i) packed.data_as<uint8_t>()[i] = static_cast<uint8_t>(byte(rng_));
    for (int64_t i = 0; i < scale.numel(); ++i) scale.data_as<uint8_t>()[i] = static_cast<uint8_t>(exp(rng_));
    tensors_.emplace_back(prefix_ + name + ".weight_packed", packed);
    tensors_.emplace_back(prefix_ + name + ".weight_scale", scale);
  }
  const std::vector<std::pair<std::string, Tensor>>& tensors() const { return tensors_; }

 private:
  template <typename Gen>
  void add(const std::string& name, const Shape& shape, DType dtype, Gen gen) {
    Tensor t = Tensor::empty(dtype, shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float v = gen();
      if (dtype == DType::kF32) t.f32()[i] = v;
      else t.data_as<uint16_t>()[i] = f32_to_bf16(v);
    }
    tensors_.emplace_back(prefix_ + name, t);
  }
  std::mt19937_64 rng_;
  std::string prefix_;
  std::vector<std::pair<std::string, Tensor>> tensors_;
};

}  // namespace

std::vector<std::string> preset_names() {
  return {"kimi-linear-tiny", "k3-tiny",           "k3-tiny-mxfp4", "kimi-linear-demo", "k3-demo",
          "kimi-linear-48b-a3b", "kimi-linear-48b-a3b-mxfp4"};
}

Result<Json> preset_config(const std::string& preset) {
  constexpr int64_t kTinyVocab = 512, kRealVocab = 163840;
  if (preset == "kimi-linear-tiny") return kimi_linear_text(kTinyVocab);
  if (preset == "k3-tiny") return k3_text(kTinyVocab, false);
  if (preset == "k3-tiny-mxfp4") return k3_text(kTinyVocab, true);
  if (preset == "kimi-linear-demo") return kimi_linear_text(kRealVocab);
  if (preset == "k3-demo") return k3_text(kRealVocab, false);
  if (preset == "kimi-linear-48b-a3b") return kimi_linear_48b();
  if (preset == "kimi-linear-48b-a3b-mxfp4") {
    // The 48B shapes with MXFP4 routed experts (a config for --load-format dummy: the effect of
    // 4-bit experts measurable on one GPU).
    Json c = kimi_linear_48b();
    c["quantization_config"] = {{"quant_method", "compressed-tensors"}, {"format", "mxfp4-pack-quantized"}};
    return c;
  }
  std::string names;
  for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  return Status::InvalidArgument("unknown preset '" + preset + "' (expected one of: " + names + ")");
}

std::optional<std::string> preset_tokenizer(const std::string& preset) {
  if (preset == "kimi-linear-demo" || preset.rfind("kimi-linear-48b-a3b", 0) == 0) return "kimi-k2";
  if (preset == "k3-demo") return "kimi-k3";
  return std::nullopt;
}

Status write_random_checkpoint(const Json& config, const std::string& dir, uint64_t seed) {
  KL_ASSIGN_OR_RETURN(ModelConfig c, parse_model_config(config, "preset config"));
  const bool k3 = c.nested_text_config;
  // Real K3 checkpoints keep convs, dt_bias, A_log, o_norm and the router bias in F32 (MODEL.md 2.2).
  const DType small = k3 ? DType::kF32 : DType::kBF16;
  Writer w(seed, k3 ? "language_model." : "");
  const int64_t D = c.hidden_size, V = c.vocab_size;
  w.normal("model.embed_tokens.weight", {V, D}, DType::kBF16, 1.0f);
  w.constant("model.norm.weight", {D}, 1.0f);
  if (!c.tie_word_embeddings) w.normal("lm_head.weight", {V, D});
  auto attn_res = [&](const std::string& p) {
    w.constant(p + "_norm.weight", {D}, 1.0f);
    w.normal(p + "_proj.weight", {1, D}, DType::kBF16, 0.5f);
  };
  if (c.has_attn_res()) attn_res("model.output_attn_res");
  auto mlp = [&](const std::string& p, int64_t f) {
    w.normal(p + "gate_proj.weight", {f, D});
    w.normal(p + "up_proj.weight", {f, D});
    w.normal(p + "down_proj.weight", {D, f});
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    w.constant(p + "input_layernorm.weight", {D}, 1.0f);
    w.constant(p + "post_attention_layernorm.weight", {D}, 1.0f);
    if (c.has_attn_res()) {
      attn_res(p + "self_attention_res");
      attn_res(p + "mlp_res");
    }
    const std::string a = p + "self_attn.";
    if (c.mixer(l) == Mixer::kKda) {
      const int64_t H = c.kda_heads, d = c.kda_head_dim, P = c.kda_proj();
      for (const char* m : {"q", "k", "v"}) {
        w.normal(a + m + "_proj.weight", {P, D});
        w.normal(a + m + "_conv1d.weight", {P, 1, c.conv_kernel}, small, 0.5f);
      }
      w.normal(a + "f_a_proj.weight", {d, D});
      w.normal(a + "f_b_proj.weight", {P, d});
      w.uniform(a + "dt_bias", {P}, -1.0f, 1.0f, DType::kF32);
      w.uniform(a + "A_log", k3 ? Shape{H} : Shape{1, 1, H, 1}, 0.0f, std::log(16.0f), DType::kF32);
      w.normal(a + "b_proj.weight", {H, D});
      if (c.kda_output_gate == KdaOutputGate::kFullRank) {
        w.normal(a + "g_proj.weight", {P, D});
      } else {
        w.normal(a + "g_a_proj.weight", {d, D});
        w.normal(a + "g_b_proj.weight", {P, d});
      }
      w.constant(a + "o_norm.weight", {d}, 1.0f, small);
      w.normal(a + "o_proj.weight", {D, P});
    } else {
      const int64_t H = c.mla_heads, qk = c.mla_qk_head_dim(), v = c.v_head_dim;
      if (c.q_lora_rank > 0) {
        w.normal(a + "q_a_proj.weight", {c.q_lora_rank, D});
        w.constant(a + "q_a_layernorm.weight", {c.q_lora_rank}, 1.0f);
        w.normal(a + "q_b_proj.weight", {H * qk, c.q_lora_rank});
      } else {
        w.normal(a + "q_proj.weight", {H * qk, D});
      }
      w.normal(a + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_dim, D});
      w.constant(a + "kv_a_layernorm.weight", {c.kv_lora_rank}, 1.0f);
      w.normal(a + "kv_b_proj.weight", {H * (c.qk_nope_dim + v), c.kv_lora_rank});
      if (c.mla_output_gate) w.normal(a + "g_proj.weight", {H * v, D});
      w.normal(a + "o_proj.weight", {D, H * v});
    }
    if (c.ffn(l) == Ffn::kDense) {
      mlp(p + "mlp.", c.intermediate_size);
      continue;
    }
    const std::string m = p + "block_sparse_moe.";
    const int64_t E = c.num_experts, F = c.moe_intermediate_size, L = c.expert_io_dim();
    w.normal(m + "gate.weight", {E, D});
    w.normal(m + "gate.e_score_correction_bias", {E}, small, 0.1f);
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      if (c.expert_format == ExpertFormat::kMxfp4) {
        w.mxfp4(x + "w1", F, L);
        w.mxfp4(x + "w3", F, L);
        w.mxfp4(x + "w2", L, F);
      } else {
        w.normal(x + "w1.weight", {F, L});
        w.normal(x + "w3.weight", {F, L});
        w.normal(x + "w2.weight", {L, F});
      }
    }
    if (c.has_latent_moe()) {
      w.normal(m + "routed_expert_down_proj.weight", {L, D});
      if (c.latent_moe_use_norm) w.constant(m + "routed_expert_norm.weight", {L}, 1.0f);
      w.normal(m + "routed_expert_up_proj.weight", {D, L});
    }
    if (c.num_shared_experts > 0) mlp(m + "shared_experts.", F * c.num_shared_experts);
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError(dir + ": cannot create directory: " + ec.message());
  std::ofstream cfg(dir + "/config.json");
  cfg << config.dump(2) << "\n";
  cfg.close();  // flushes: a full disk shows up here
  if (!cfg) return Status::IOError(dir + "/config.json: write failed");
  return write_safetensors(dir + "/model.safetensors", w.tensors());
}

}  // namespace klinear
