#include "model/weights.h"

#include <cmath>
#include <optional>
#include <string>

#include "core/counter_rng.h"

namespace klinear {

namespace {

// Where the weights come from: the checkpoint (fused and uploaded as they are read), or nowhere
// (dummy weights made on the device, or only counted).
enum class Source { kCheckpoint, kDummy, kCount };

class Loader {
 public:
  Loader(Checkpoint* ckpt, Backend& backend, Source source) : ckpt_(ckpt), backend_(backend), source_(source) {}

  // Weight matrices and norm weights are stored in the activation dtype; `dtype` overrides it for
  // the vectors that enter fp32 math.
  Status take(const std::string& name, const Shape& shape, Tensor* out) {
    return take(name, shape, backend_.activation_dtype(), out);
  }
  Status take(const std::string& name, const Shape& shape, DType dtype, Tensor* out) {
    if (source_ != Source::kCheckpoint) return dummy(name, shape, dtype, out);
    KL_ASSIGN_OR_RETURN(Tensor host, ckpt_->take(name, shape));
    *out = backend_.upload(host, dtype);
    return Status();
  }
  // Parts stacked along the first dimension (fused projections, convs).
  Status concat(const std::vector<std::string>& parts, const std::vector<Shape>& shapes, Tensor* out) {
    if (source_ != Source::kCheckpoint) {
      Shape all = shapes[0];
      for (size_t i = 1; i < shapes.size(); ++i) all[0] += shapes[i][0];
      return dummy(parts[0], all, backend_.activation_dtype(), out);
    }
    KL_ASSIGN_OR_RETURN(Tensor host, ckpt_->take_concat(parts, shapes));
    *out = backend_.upload(host, backend_.activation_dtype());
    return Status();
  }
  // A per-head vector stored as [H], [1,1,H,1] or zero-padded (A_log).
  Status head_vector(const std::string& name, int64_t heads, Tensor* out) {
    if (source_ != Source::kCheckpoint) return dummy(name, {heads}, DType::kF32, out);
    KL_ASSIGN_OR_RETURN(Tensor host, ckpt_->take_head_vector(name, heads));
    *out = backend_.upload(host, DType::kF32);
    return Status();
  }
  // Whether an optional tensor is there (dummy weights have none of the optional ones).
  bool has(const std::string& name) const { return source_ == Source::kCheckpoint && ckpt_->has(name); }
  std::optional<Shape> shape_of(const std::string& name) const {
    return has(name) ? ckpt_->shape_of(name) : std::nullopt;
  }

  // [w1; w3] of each expert stacked into [E, 2F, in] and w2 into [E, out, F]; MXFP4 experts are
  // stored as weight_packed [rows, in/2] + weight_scale [rows, in/32] (MODEL.md 2.3). Dummy experts
  // are dense in the activation dtype whatever the format.
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
      if (source_ != Source::kCheckpoint) return dummy(prefix + mats[0], {num_experts, rows_all, in}, backend_.activation_dtype(), out);
      if (format == ExpertFormat::kDense) {
        KL_ASSIGN_OR_RETURN(Tensor t, ckpt_->take_stacked(names(mats, ".weight"), {rows, in}));
        *out = backend_.upload(t.view({num_experts, rows_all, in}), backend_.activation_dtype());
      } else {
        KL_ASSIGN_OR_RETURN(Tensor packed,
                            ckpt_->take_stacked(names(mats, ".weight_packed"), {rows, in / 2}, StoredAs::kU8));
        KL_ASSIGN_OR_RETURN(Tensor scale,
                            ckpt_->take_stacked(names(mats, ".weight_scale"), {rows, in / 32}, StoredAs::kU8));
        *out = backend_.upload_mxfp4(packed.view({num_experts, rows_all, in / 2}),
                                     scale.view({num_experts, rows_all, in / 32}));
      }
      return Status();
    };
    KL_RETURN_IF_ERROR(stack({"w1", "w3"}, f, din, w13));
    return stack({"w2"}, dout, f, w2);
  }
  // The AttnRes effective query e = w_norm ⊙ w_proj (MODEL.md 7.1 step 2), computed once in F32.
  Status attn_res_query(const std::string& prefix, int64_t d, Tensor* out) {
    if (source_ != Source::kCheckpoint) return dummy(prefix + "_proj.weight", {d}, DType::kF32, out);
    KL_ASSIGN_OR_RETURN(Tensor norm, ckpt_->take(prefix + "_norm.weight", {d}));
    KL_ASSIGN_OR_RETURN(Tensor proj, ckpt_->take(prefix + "_proj.weight", {1, d}));
    Tensor e = Tensor::empty(DType::kF32, {d});
    Tensor pf = Tensor::empty(DType::kF32, {d});
    convert_to_f32(norm.dtype(), norm.data(), e.f32(), static_cast<size_t>(d));
    convert_to_f32(proj.dtype(), proj.data(), pf.f32(), static_cast<size_t>(d));
    for (int64_t j = 0; j < d; ++j) e.f32()[j] *= pf.f32()[j];
    *out = backend_.upload(e, DType::kF32);
    return Status();
  }
  Status finish() { return source_ == Source::kCheckpoint ? ckpt_->finish() : Status(); }
  Backend& backend() { return backend_; }
  uint64_t dummy_elements() const { return dummy_elements_; }

 private:
  // A dummy weight, seeded by its name, scaled so activations keep their size: norms are ones,
  // A_log uniform in [0, ln 16) (decay rates 1..16), dt_bias in [−5, −2) (small softplus steps),
  // every other tensor uniform with std 1/sqrt(fan_in) (its last dimension).
  Status dummy(const std::string& name, const Shape& shape, DType dtype, Tensor* out) {
    dummy_elements_ += static_cast<uint64_t>(shape_numel(shape));
    if (source_ == Source::kCount) {  // a shape without storage, so views still work
      *out = Tensor::wrap(dtype, shape, nullptr, nullptr, backend_.device());
      return Status();
    }
    *out = backend_.alloc_persistent(dtype, shape);
    auto ends_with = [&](const char* t) {
      const std::string e(t);
      return name.size() >= e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0;
    };
    uint64_t seed = 0x6b6c696e656172ull;  // "klinear"
    for (char ch : name) seed = splitmix64(seed ^ static_cast<uint8_t>(ch));
    if (ends_with("norm.weight") || ends_with("layernorm.weight")) {
      backend_.fill(*out, 1.0f);
    } else if (ends_with("A_log")) {
      backend_.random_fill(*out, seed, 0.0f, std::log(16.0f));
    } else if (ends_with("dt_bias")) {
      backend_.random_fill(*out, seed, -5.0f, -2.0f);
    } else {
      const float a = std::sqrt(3.0f / static_cast<float>(shape.back()));
      backend_.random_fill(*out, seed, -a, a);
    }
    return Status();
  }

  Checkpoint* ckpt_;
  Backend& backend_;
  Source source_;
  uint64_t dummy_elements_ = 0;
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
    KL_RETURN_IF_ERROR(ld.concat({p + "q_conv1d.weight", p + "k_conv1d.weight", p + "v_conv1d.weight"},
                                 {{P, 1, Kc}, {P, 1, Kc}, {P, 1, Kc}}, &w->conv));
    w->conv = w->conv.view({3 * P, Kc});
  }
  KL_RETURN_IF_ERROR(ld.take(p + "f_a_proj.weight", {d, D}, &w->f_a));
  KL_RETURN_IF_ERROR(ld.take(p + "f_b_proj.weight", {P, d}, &w->f_b));
  // dt_bias is [P] in the published checkpoints; per-head [H, d] layouts are the same numbers.
  const Shape dt_shape = ld.shape_of(p + "dt_bias") == Shape{H, d} ? Shape{H, d} : Shape{P};
  KL_RETURN_IF_ERROR(ld.take(p + "dt_bias", dt_shape, DType::kF32, &w->dt_bias));
  w->dt_bias = w->dt_bias.view({P});
  KL_RETURN_IF_ERROR(ld.head_vector(p + "A_log", H, &w->a_log));
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
  if (ld.has(p + "gate.e_score_correction_bias")) {
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

// Every weight of `c` from `ld`'s source.
Result<ModelWeights> load_all(const ModelConfig& c, Loader& ld) {
  ModelWeights w;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  KL_RETURN_IF_ERROR(ld.take("model.embed_tokens.weight", {V, D}, &w.embed));
  KL_RETURN_IF_ERROR(ld.take("model.norm.weight", {D}, &w.final_norm));
  if (c.tie_word_embeddings && !ld.has("lm_head.weight")) w.lm_head = w.embed;
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
  KL_RETURN_IF_ERROR(ld.finish());
  return w;
}

}  // namespace

Result<ModelWeights> load_weights(const ModelConfig& config, Checkpoint& ckpt, Backend& backend) {
  Loader ld(&ckpt, backend, Source::kCheckpoint);
  return load_all(config, ld);
}

Result<ModelWeights> dummy_weights(const ModelConfig& config, Backend& backend) {
  Loader ld(nullptr, backend, Source::kDummy);
  return load_all(config, ld);
}

uint64_t count_parameters(const ModelConfig& config, Backend& backend) {
  Loader ld(nullptr, backend, Source::kCount);
  KL_CHECK(load_all(config, ld).ok(), "counting parameters cannot fail");
  return ld.dummy_elements();
}

}  // namespace klinear
