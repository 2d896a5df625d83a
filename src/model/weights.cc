#include "model/weights.h"

#include <string>

namespace klinear {

namespace {

class Loader {
 public:
  Loader(Checkpoint& ckpt, Backend& backend) : ckpt_(ckpt), backend_(backend) {}

  // Weight matrices and norm weights are stored in the activation dtype; `dtype` overrides it for
  // the vectors that enter fp32 math.
  Status take(const std::string& name, const Shape& shape, Tensor* out) {
    return take(name, shape, backend_.activation_dtype(), out);
  }
  Status take(const std::string& name, const Shape& shape, DType dtype, Tensor* out) {
    KL_ASSIGN_OR_RETURN(Tensor host, ckpt_.take(name, shape));
    *out = backend_.upload(host, dtype);
    return Status();
  }
  Status concat(const std::vector<std::string>& parts, const std::vector<Shape>& shapes, Tensor* out) {
    KL_ASSIGN_OR_RETURN(Tensor host, ckpt_.take_concat(parts, shapes));
    *out = backend_.upload(host, backend_.activation_dtype());
    return Status();
  }
  // [w1; w3] of each expert stacked into [E, 2F, in] and w2 into [E, out, F]; MXFP4 experts are
  // stored as weight_packed [rows, in/2] + weight_scale [rows, in/32] (SPEC 2.3).
  Status experts(const std::string& prefix, int64_t num_experts, int64_t f, int64_t din, int64_t dout,
                 ExpertFormat format, Tensor* w13, Tensor* w2) {
    auto names = [&](std::vector<const char*> mats, const char* suffix) {
      std::vector<std::string> out;
      for (int64_t e = 0; e < num_experts; ++e)
        for (const char* m : mats) out.push_back(prefix + std::to_string(e) + "." + m + suffix);
      return out;
    };
    auto stack = [&](std::vector<const char*> mats, int64_t rows, int64_t in, Tensor* out) -> Status {
      const int64_t rows_all = rows * static_cast<int64_t>(mats.size());
      if (format == ExpertFormat::kDense) {
        KL_ASSIGN_OR_RETURN(Tensor t, ckpt_.take_stacked(names(mats, ".weight"), {rows, in}));
        *out = backend_.upload(t.view({num_experts, rows_all, in}), backend_.activation_dtype());
      } else {
        KL_ASSIGN_OR_RETURN(Tensor packed,
                            ckpt_.take_stacked(names(mats, ".weight_packed"), {rows, in / 2}, StoredAs::kU8));
        KL_ASSIGN_OR_RETURN(Tensor scale,
                            ckpt_.take_stacked(names(mats, ".weight_scale"), {rows, in / 32}, StoredAs::kU8));
        *out = backend_.upload_mxfp4(packed.view({num_experts, rows_all, in / 2}),
                                     scale.view({num_experts, rows_all, in / 32}));
      }
      return Status();
    };
    KL_RETURN_IF_ERROR(stack({"w1", "w3"}, f, din, w13));
    return stack({"w2"}, dout, f, w2);
  }
  // The AttnRes effective query e = w_norm ⊙ w_proj (SPEC 7.1 step 2), computed once in F32.
  Status attn_res_query(const std::string& prefix, int64_t d, Tensor* out) {
    KL_ASSIGN_OR_RETURN(Tensor norm, ckpt_.take(prefix + "_norm.weight", {d}));
    KL_ASSIGN_OR_RETURN(Tensor proj, ckpt_.take(prefix + "_proj.weight", {1, d}));
    Tensor e = Tensor::empty(DType::kF32, {d});
    Tensor pf = Tensor::empty(DType::kF32, {d});
    convert_to_f32(norm.dtype(), norm.data(), e.f32(), static_cast<size_t>(d));
    convert_to_f32(proj.dtype(), proj.data(), pf.f32(), static_cast<size_t>(d));
    for (int64_t j = 0; j < d; ++j) e.f32()[j] *= pf.f32()[j];
    *out = backend_.upload(e, DType::kF32);
    return Status();
  }
  Checkpoint& ckpt() { return ckpt_; }
  Backend& backend() { return backend_; }

 private:
  Checkpoint& ckpt_;
  Backend& backend_;
};

Status load_mlp(Loader& ld, const std::string& prefix, int64_t f, int64_t d, MlpWeights* w) {
  KL_RETURN_IF_ERROR(ld.concat({prefix + "gate_proj.weight", prefix + "up_proj.weight"}, {{f, d}, {f, d}}, &w->gate_up));
  return ld.take(prefix + "down_proj.weight", {d, f}, &w->down);
}

Status load_kda(Loader& ld, const ModelConfig& c, const std::string& p, KdaWeights* w) {
  const int64_t D = c.hidden_size, H = c.kda_heads, d = c.kda_head_dim, P = c.kda_proj(), Kc = c.conv_kernel;
  KL_RETURN_IF_ERROR(ld.concat({p + "q_proj.weight", p + "k_proj.weight", p + "v_proj.weight"},
                               {{P, D}, {P, D}, {P, D}}, &w->qkv_proj));
  {
    KL_ASSIGN_OR_RETURN(Tensor conv, ld.ckpt().take_concat({p + "q_conv1d.weight", p + "k_conv1d.weight",
                                                            p + "v_conv1d.weight"},
                                                           {{P, 1, Kc}, {P, 1, Kc}, {P, 1, Kc}}));
    w->conv = ld.backend().upload(conv.view({3 * P, Kc}), ld.backend().activation_dtype());
  }
  KL_RETURN_IF_ERROR(ld.take(p + "f_a_proj.weight", {d, D}, &w->f_a));
  KL_RETURN_IF_ERROR(ld.take(p + "f_b_proj.weight", {P, d}, &w->f_b));
  // dt_bias is [P] in the published checkpoints; per-head [H, d] layouts are the same numbers.
  const Shape dt_shape = ld.ckpt().shape_of(p + "dt_bias") == Shape{H, d} ? Shape{H, d} : Shape{P};
  KL_RETURN_IF_ERROR(ld.take(p + "dt_bias", dt_shape, DType::kF32, &w->dt_bias));
  w->dt_bias = w->dt_bias.view({P});
  {
    KL_ASSIGN_OR_RETURN(Tensor a_log, ld.ckpt().take_head_vector(p + "A_log", H));
    w->a_log = ld.backend().upload(a_log, DType::kF32);
  }
  KL_RETURN_IF_ERROR(ld.take(p + "b_proj.weight", {H, D}, &w->b_proj));
  if (c.kda_output_gate == KdaOutputGate::kFullRank) {
    KL_RETURN_IF_ERROR(ld.take(p + "g_proj.weight", {P, D}, &w->g_proj));
  } else {
    KL_RETURN_IF_ERROR(ld.take(p + "g_a_proj.weight", {d, D}, &w->g_a));
    KL_RETURN_IF_ERROR(ld.take(p + "g_b_proj.weight", {P, d}, &w->g_b));
  }
  KL_RETURN_IF_ERROR(ld.take(p + "o_norm.weight", {d}, &w->o_norm));
  return ld.take(p + "o_proj.weight", {D, P}, &w->o_proj);
}

Status load_mla(Loader& ld, const ModelConfig& c, const std::string& p, MlaWeights* w) {
  const int64_t D = c.hidden_size, H = c.mla_heads, qk = c.mla_qk_head_dim(), v = c.v_head_dim;
  const int64_t kvc = c.kv_lora_rank, r = c.qk_rope_dim;
  if (c.q_lora_rank > 0) {
    KL_RETURN_IF_ERROR(ld.take(p + "q_a_proj.weight", {c.q_lora_rank, D}, &w->q_a));
    KL_RETURN_IF_ERROR(ld.take(p + "q_a_layernorm.weight", {c.q_lora_rank}, &w->q_a_norm));
    KL_RETURN_IF_ERROR(ld.take(p + "q_b_proj.weight", {H * qk, c.q_lora_rank}, &w->q_b));
  } else {
    KL_RETURN_IF_ERROR(ld.take(p + "q_proj.weight", {H * qk, D}, &w->q_proj));
  }
  KL_RETURN_IF_ERROR(ld.take(p + "kv_a_proj_with_mqa.weight", {kvc + r, D}, &w->kv_a));
  KL_RETURN_IF_ERROR(ld.take(p + "kv_a_layernorm.weight", {kvc}, &w->kv_a_norm));
  KL_RETURN_IF_ERROR(ld.take(p + "kv_b_proj.weight", {H * (c.qk_nope_dim + v), kvc}, &w->kv_b));
  if (c.mla_output_gate) KL_RETURN_IF_ERROR(ld.take(p + "g_proj.weight", {H * v, D}, &w->g_proj));
  return ld.take(p + "o_proj.weight", {D, H * v}, &w->o_proj);
}

Status load_moe(Loader& ld, const ModelConfig& c, const std::string& p, MoeWeights* w) {
  const int64_t D = c.hidden_size, E = c.num_experts, F = c.moe_intermediate_size, L = c.expert_io_dim();
  KL_RETURN_IF_ERROR(ld.take(p + "gate.weight", {E, D}, &w->router));
  if (ld.ckpt().has(p + "gate.e_score_correction_bias")) {
    KL_RETURN_IF_ERROR(ld.take(p + "gate.e_score_correction_bias", {E}, DType::kF32, &w->router_bias));
  } else {
    w->router_bias = ld.backend().upload(Tensor::zeros(DType::kF32, {E}), DType::kF32);
  }
  KL_RETURN_IF_ERROR(ld.experts(p + "experts.", E, F, L, L, c.expert_format, &w->w13, &w->w2));
  if (c.has_latent_moe()) {
    KL_RETURN_IF_ERROR(ld.take(p + "routed_expert_down_proj.weight", {L, D}, &w->latent_down));
    if (c.latent_moe_use_norm) KL_RETURN_IF_ERROR(ld.take(p + "routed_expert_norm.weight", {L}, &w->latent_norm));
    KL_RETURN_IF_ERROR(ld.take(p + "routed_expert_up_proj.weight", {D, L}, &w->latent_up));
  }
  w->has_shared = c.num_shared_experts > 0;
  if (w->has_shared) KL_RETURN_IF_ERROR(load_mlp(ld, p + "shared_experts.", F * c.num_shared_experts, D, &w->shared));
  return Status();
}

}  // namespace

Result<ModelWeights> load_weights(const ModelConfig& c, Checkpoint& ckpt, Backend& backend) {
  Loader ld(ckpt, backend);
  ModelWeights w;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  KL_RETURN_IF_ERROR(ld.take("model.embed_tokens.weight", {V, D}, &w.embed));
  KL_RETURN_IF_ERROR(ld.take("model.norm.weight", {D}, &w.final_norm));
  if (c.tie_word_embeddings && !ckpt.has("lm_head.weight")) w.lm_head = w.embed;
  else KL_RETURN_IF_ERROR(ld.take("lm_head.weight", {V, D}, &w.lm_head));
  if (c.has_attn_res()) KL_RETURN_IF_ERROR(ld.attn_res_query("model.output_attn_res", D, &w.output_res_query));

  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights lw;
    lw.mixer = c.mixer(l);
    lw.ffn = c.ffn(l);
    KL_RETURN_IF_ERROR(ld.take(p + "input_layernorm.weight", {D}, &lw.input_norm));
    KL_RETURN_IF_ERROR(ld.take(p + "post_attention_layernorm.weight", {D}, &lw.post_norm));
    if (c.has_attn_res()) {
      KL_RETURN_IF_ERROR(ld.attn_res_query(p + "self_attention_res", D, &lw.attn_res_query));
      KL_RETURN_IF_ERROR(ld.attn_res_query(p + "mlp_res", D, &lw.mlp_res_query));
    }
    if (lw.mixer == Mixer::kKda) KL_RETURN_IF_ERROR(load_kda(ld, c, p + "self_attn.", &lw.kda));
    else KL_RETURN_IF_ERROR(load_mla(ld, c, p + "self_attn.", &lw.mla));
    if (lw.ffn == Ffn::kDense) KL_RETURN_IF_ERROR(load_mlp(ld, p + "mlp.", c.intermediate_size, D, &lw.mlp));
    else KL_RETURN_IF_ERROR(load_moe(ld, c, p + "block_sparse_moe.", &lw.moe));
    w.layers.push_back(std::move(lw));
  }
  KL_RETURN_IF_ERROR(ckpt.finish());
  return w;
}

}  // namespace klinear
