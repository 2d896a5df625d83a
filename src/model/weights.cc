#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "core/counter_rng.h"

namespace klinear {

namespace {

// Where the weights come from: the checkpoint (fused and uploaded as they are read), or nowhere
// (dummy weights made on the device, or only counted).
enum class Source { kCheckpoint, kDummy, kCount };

// The shape of part `slice` of a tensor of `shape`.
Shape sliced_shape(Shape shape, const Slice& slice) {
  if (slice.along == Along::kRows) shape[0] /= slice.count;
  if (slice.along == Along::kColumns) shape.back() /= slice.count;
  return shape;
}

// Where part `slice` of a tensor of `shape` sits in it, for random_fill.
FillWindow window_of(const Shape& shape, const Slice& slice) {
  const int64_t numel = shape_numel(shape);
  switch (slice.along) {
    case Along::kWhole: return {};
    case Along::kRows: return {slice.index * (shape[0] / slice.count) * (numel / shape[0]), 0};
    case Along::kColumns: return {slice.index * (shape.back() / slice.count), shape.back()};
  }
  return {};
}

class Loader {
 public:
  // `backend`: null when only counting (Source::kCount), which counts as `storage` holds.
  Loader(Checkpoint* ckpt, Backend* backend, Source source, const WeightStorage& storage)
      : ckpt_(ckpt), backend_(backend), source_(source), storage_(storage) {}

  // Weight matrices and norm weights are stored in the activation dtype; `dtype` overrides it for
  // the vectors that enter fp32 math. `slice`: the part of the weight of `shape` this rank holds.
  Status take(const std::string& name, const Shape& shape, Tensor* out, const Slice& slice = {}) {
    return take(name, shape, storage_.activation, out, slice);
  }
  Status take(const std::string& name, const Shape& shape, DType dtype, Tensor* out, const Slice& slice = {}) {
    if (source_ != Source::kCheckpoint) return dummy(name, {shape}, dtype, out, slice);
    KL_ASSIGN_OR_RETURN(Tensor host, ckpt_->take(name, shape, StoredAs::kFloat, slice));
    *out = backend_->upload(host, dtype);
    return Status();
  }
  // Parts stacked along the first dimension (fused projections, convs), the rows `slice` of each.
  Status concat(const std::vector<std::string>& parts, const std::vector<Shape>& shapes, Tensor* out,
                const Slice& slice = {}) {
    KL_CHECK(slice.along != Along::kColumns, "fused parts are cut by rows");
    if (source_ != Source::kCheckpoint) return dummy(parts[0], shapes, storage_.activation, out, slice);
    KL_ASSIGN_OR_RETURN(Tensor host, ckpt_->take_concat(parts, shapes, StoredAs::kFloat, slice));
    *out = backend_->upload(host, storage_.activation);
    return Status();
  }
  // A per-head vector stored as [H], [1,1,H,1] or zero-padded (A_log); the heads `slice`.
  Status head_vector(const std::string& name, int64_t heads, Tensor* out, const Slice& slice = {}) {
    if (source_ != Source::kCheckpoint) return dummy(name, {{heads}}, DType::kF32, out, slice);
    KL_ASSIGN_OR_RETURN(Tensor host, ckpt_->take_head_vector(name, heads, slice));
    *out = backend_->upload(host, DType::kF32);
    return Status();
  }
  // Whether an optional tensor is there (dummy weights have none of the optional ones).
  bool has(const std::string& name) const { return source_ == Source::kCheckpoint && ckpt_->has(name); }
  std::optional<Shape> shape_of(const std::string& name) const {
    return has(name) ? ckpt_->shape_of(name) : std::nullopt;
  }

  // [w1; w3] of each expert stacked into [E, 2F, in] and w2 into [E, out, F]; MXFP4 experts are
  // stored as weight_packed [rows, in/2] + weight_scale [rows, in/32] (MODEL.md 2.3), and dummy
  // ones made so (dummy_mxfp4). Only the experts `part` are read (the others are left to their
  // ranks).
  Status experts(const std::string& prefix, int64_t num_experts, int64_t f, int64_t din, int64_t dout,
                 ExpertFormat format, const Part& part, ExpertMatrix* w13, ExpertMatrix* w2) {
    const int64_t first = part.first(num_experts), count = part.size(num_experts);
    auto names = [&](std::vector<const char*> mats, const char* suffix, int64_t e0, int64_t e1) {
      std::vector<std::string> out;
      for (int64_t e = e0; e < e1; ++e)
        for (const char* m : mats) out.push_back(prefix + std::to_string(e) + "." + m + suffix);
      return out;
    };
    auto stack = [&](std::vector<const char*> mats, int64_t rows, int64_t in, ExpertMatrix* out) -> Status {
      const int64_t rows_all = rows * static_cast<int64_t>(mats.size());
      if (source_ != Source::kCheckpoint && format == ExpertFormat::kMxfp4)
        return dummy_mxfp4(prefix + mats[0], first, count, rows_all, in, out);
      if (source_ != Source::kCheckpoint)
        return dummy(prefix + mats[0], {{num_experts, rows_all, in}}, storage_.activation, &out->w, part.rows());
      std::vector<const char*> suffixes = {".weight"};
      if (format == ExpertFormat::kMxfp4) suffixes = {".weight_packed", ".weight_scale"};
      for (const char* suffix : suffixes)
        for (const auto& others : {names(mats, suffix, 0, first), names(mats, suffix, first + count, num_experts)})
          for (const std::string& name : others) KL_RETURN_IF_ERROR(ckpt_->leave(name));
      if (format == ExpertFormat::kDense) {
        KL_ASSIGN_OR_RETURN(Tensor t, ckpt_->take_stacked(names(mats, ".weight", first, first + count), {rows, in}));
        out->w = backend_->upload(t.view({count, rows_all, in}), storage_.activation);
      } else {
        KL_ASSIGN_OR_RETURN(Tensor packed, ckpt_->take_stacked(names(mats, ".weight_packed", first, first + count),
                                                               {rows, in / 2}, StoredAs::kU8));
        KL_ASSIGN_OR_RETURN(Tensor scale, ckpt_->take_stacked(names(mats, ".weight_scale", first, first + count),
                                                              {rows, in / 32}, StoredAs::kU8));
        *out = backend_->upload_mxfp4(packed.view({count, rows_all, in / 2}), scale.view({count, rows_all, in / 32}));
      }
      return Status();
    };
    KL_RETURN_IF_ERROR(stack({"w1", "w3"}, f, din, w13));
    return stack({"w2"}, dout, f, w2);
  }
  // Dummy MXFP4 experts [first, first + count) of `rows` × `in` each: nibbles uniform over the 16
  // codes and one scale per matrix, 2^round(log2(1 / (rms · sqrt(in)))) with rms ≈ 2.93 the codes'
  // root mean square, so the values' spread is that of the dense dummies (std 1/sqrt(in)); expert e's
  // bytes seeded by the name and e, so a rank's experts hold what the whole model's do.
  Status dummy_mxfp4(const std::string& name, int64_t first, int64_t count, int64_t rows, int64_t in,
                     ExpertMatrix* out) {
    const auto numel = static_cast<uint64_t>(count * rows * in);
    count_.parameters += numel;
    if (storage_.mxfp4 == Mxfp4Storage::kPacked) count_.bytes[DType::kU8] += numel / 2 + numel / 32;
    else count_.bytes[storage_.activation] += numel * dtype_size(storage_.activation);
    if (source_ == Source::kCount) {
      out->w = Tensor::wrap(storage_.activation, {count, rows, in}, nullptr, nullptr, Device::kCpu);
      return Status();
    }
    uint64_t seed = 0x6b6c696e656172ull;  // "klinear"
    for (char ch : name) seed = splitmix64(seed ^ static_cast<uint8_t>(ch));
    const int64_t per = rows * in / 2;  // packed bytes of one expert
    Tensor packed = Tensor::empty(DType::kU8, {count, rows, in / 2});
    Tensor scale = Tensor::empty(DType::kU8, {count, rows, in / 32});
    const auto e8m0 = static_cast<uint8_t>(127 + std::lround(-std::log2(2.93 * std::sqrt(static_cast<double>(in)))));
    std::memset(scale.data(), e8m0, scale.nbytes());
    auto* bytes = packed.data_as<uint8_t>();
#pragma omp parallel for
    for (int64_t e = 0; e < count; ++e) {
      const uint64_t stream = splitmix64(seed ^ static_cast<uint64_t>(first + e));
      for (int64_t i = 0; i < per; i += 8) {
        const uint64_t r = splitmix64(stream ^ static_cast<uint64_t>(i));
        std::memcpy(bytes + e * per + i, &r, static_cast<size_t>(std::min<int64_t>(8, per - i)));
      }
    }
    *out = backend_->upload_mxfp4(packed, scale);
    return Status();
  }
  // The AttnRes effective query e = w_norm ⊙ w_proj (MODEL.md 7.1 step 2), computed once in F32.
  Status attn_res_query(const std::string& prefix, int64_t d, Tensor* out) {
    if (source_ != Source::kCheckpoint) return dummy(prefix + "_proj.weight", {{d}}, DType::kF32, out, {});
    KL_ASSIGN_OR_RETURN(Tensor norm, ckpt_->take(prefix + "_norm.weight", {d}));
    KL_ASSIGN_OR_RETURN(Tensor proj, ckpt_->take(prefix + "_proj.weight", {1, d}));
    Tensor e = Tensor::empty(DType::kF32, {d});
    Tensor pf = Tensor::empty(DType::kF32, {d});
    convert_to_f32(norm.dtype(), norm.data(), e.f32(), static_cast<size_t>(d));
    convert_to_f32(proj.dtype(), proj.data(), pf.f32(), static_cast<size_t>(d));
    for (int64_t j = 0; j < d; ++j) e.f32()[j] *= pf.f32()[j];
    *out = backend_->upload(e, DType::kF32);
    return Status();
  }
  Status finish() { return source_ == Source::kCheckpoint ? ckpt_->finish() : Status(); }
  // A zero F32 vector of n: a bias the checkpoint (or a dummy model) does not hold, so not counted.
  Tensor zeros_f32(int64_t n) {
    if (source_ == Source::kCount) return Tensor::wrap(DType::kF32, {n}, nullptr, nullptr, Device::kCpu);
    return backend_->upload(Tensor::zeros(DType::kF32, {n}), DType::kF32);
  }
  const WeightCount& count() const { return count_; }

 private:
  // A dummy weight: the part `slice` of the rows of `parts` (one shape, or the fused parts stacked
  // along the first dimension) as one rank holds it, each part's values those of the whole, seeded
  // by the name, scaled so activations keep their size: norms are ones, A_log uniform in [0, ln 16)
  // (decay rates 1..16), dt_bias in [−5, −2) (small softplus steps), every other tensor uniform
  // with std 1/sqrt(fan_in) (its last dimension).
  Status dummy(const std::string& name, const std::vector<Shape>& parts, DType dtype, Tensor* out, const Slice& slice) {
    Shape whole = parts[0], local = sliced_shape(parts[0], slice);
    for (size_t i = 1; i < parts.size(); ++i) {
      whole[0] += parts[i][0];
      local[0] += sliced_shape(parts[i], slice)[0];
    }
    const auto numel = static_cast<uint64_t>(shape_numel(local));
    count_.parameters += numel;
    count_.bytes[dtype] += numel * dtype_size(dtype);
    if (source_ == Source::kCount) {  // a shape without storage, so views still work
      *out = Tensor::wrap(dtype, local, nullptr, nullptr, Device::kCpu);
      return Status();
    }
    *out = backend_->alloc_persistent(dtype, local);
    auto ends_with = [&](const char* t) {
      const std::string e(t);
      return name.size() >= e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0;
    };
    if (ends_with("norm.weight") || ends_with("layernorm.weight")) {
      backend_->fill(*out, 1.0f);
      return Status();
    }
    uint64_t seed = 0x6b6c696e656172ull;  // "klinear"
    for (char ch : name) seed = splitmix64(seed ^ static_cast<uint8_t>(ch));
    float lo = -std::sqrt(3.0f / static_cast<float>(whole.back())), hi = -lo;
    if (ends_with("A_log")) lo = 0.0f, hi = std::log(16.0f);
    if (ends_with("dt_bias")) lo = -5.0f, hi = -2.0f;
    // Each part's rows sit at its own offset in the whole (parts stacked) and in the local tensor.
    const int64_t row_elems = shape_numel(whole) / whole[0];
    int64_t whole_row = 0, local_row = 0;
    for (const Shape& part : parts) {
      const Shape mine = sliced_shape(part, slice);
      FillWindow w = window_of(part, slice);
      w.offset += whole_row * row_elems;
      const Tensor rows = out->view({local[0], shape_numel(local) / local[0]}).rows(local_row, local_row + mine[0]);
      backend_->random_fill(rows.view(mine), seed, lo, hi, w);
      whole_row += part[0];
      local_row += mine[0];
    }
    return Status();
  }

  Checkpoint* ckpt_;
  Backend* backend_;
  Source source_;
  WeightStorage storage_;
  WeightCount count_;
};

// The intermediate `part` of a gated MLP: its gate and up rows, its down columns.
Status load_mlp(Loader& ld, const std::string& prefix, int64_t f, int64_t d, const Part& part, MlpWeights* w) {
  KL_RETURN_IF_ERROR(ld.concat({prefix + "gate_proj.weight", prefix + "up_proj.weight"}, {{f, d}, {f, d}}, &w->gate_up,
                               part.rows()));
  return ld.take(prefix + "down_proj.weight", {d, f}, &w->down, part.columns());
}

// The heads `part` of a KDA layer: the rows of every per-head projection, conv channel and
// vector, o_proj's columns.
Status load_kda(Loader& ld, const ModelConfig& c, const std::string& p, const Part& part, KdaWeights* w) {
  const int64_t D = c.hidden_size, H = c.kda_heads, d = c.kda_head_dim, P = c.kda_proj(), Kc = c.conv_kernel;
  const Slice rows = part.rows();
  KL_RETURN_IF_ERROR(ld.concat({p + "q_proj.weight", p + "k_proj.weight", p + "v_proj.weight"},
                               {{P, D}, {P, D}, {P, D}}, &w->qkv_proj, rows));
  {
    KL_RETURN_IF_ERROR(ld.concat({p + "q_conv1d.weight", p + "k_conv1d.weight", p + "v_conv1d.weight"},
                                 {{P, 1, Kc}, {P, 1, Kc}, {P, 1, Kc}}, &w->conv, rows));
    w->conv = w->conv.view({3 * part.size(P), Kc});
  }
  KL_RETURN_IF_ERROR(ld.take(p + "f_a_proj.weight", {d, D}, &w->f_a));
  KL_RETURN_IF_ERROR(ld.take(p + "f_b_proj.weight", {P, d}, &w->f_b, rows));
  // dt_bias is [P] in the published checkpoints; per-head [H, d] layouts are the same numbers.
  const Shape dt_shape = ld.shape_of(p + "dt_bias") == Shape{H, d} ? Shape{H, d} : Shape{P};
  KL_RETURN_IF_ERROR(ld.take(p + "dt_bias", dt_shape, DType::kF32, &w->dt_bias, rows));
  w->dt_bias = w->dt_bias.view({part.size(P)});
  KL_RETURN_IF_ERROR(ld.head_vector(p + "A_log", H, &w->a_log, rows));
  KL_RETURN_IF_ERROR(ld.take(p + "b_proj.weight", {H, D}, &w->b_proj, rows));
  if (c.kda_output_gate == KdaOutputGate::kFullRank) {
    KL_RETURN_IF_ERROR(ld.take(p + "g_proj.weight", {P, D}, &w->g_proj, rows));
  } else {
    KL_RETURN_IF_ERROR(ld.take(p + "g_a_proj.weight", {d, D}, &w->g_a));
    KL_RETURN_IF_ERROR(ld.take(p + "g_b_proj.weight", {P, d}, &w->g_b, rows));
  }
  KL_RETURN_IF_ERROR(ld.take(p + "o_norm.weight", {d}, &w->o_norm));
  return ld.take(p + "o_proj.weight", {D, P}, &w->o_proj, part.columns());
}

// The heads `part` of an MLA layer: the per-head rows of q and kv_b (and the gate), o_proj's
// columns; the latent projection whole (every rank keeps the whole latent cache).
Status load_mla(Loader& ld, const ModelConfig& c, const std::string& p, const Part& part, MlaWeights* w) {
  const int64_t D = c.hidden_size, H = c.mla_heads, qk = c.mla_qk_head_dim(), v = c.v_head_dim;
  const int64_t kvc = c.kv_lora_rank, r = c.qk_rope_dim;
  const Slice rows = part.rows();
  if (c.q_lora_rank > 0) {
    KL_RETURN_IF_ERROR(ld.take(p + "q_a_proj.weight", {c.q_lora_rank, D}, &w->q_a));
    KL_RETURN_IF_ERROR(ld.take(p + "q_a_layernorm.weight", {c.q_lora_rank}, &w->q_a_norm));
    KL_RETURN_IF_ERROR(ld.take(p + "q_b_proj.weight", {H * qk, c.q_lora_rank}, &w->q_b, rows));
  } else {
    KL_RETURN_IF_ERROR(ld.take(p + "q_proj.weight", {H * qk, D}, &w->q_proj, rows));
  }
  KL_RETURN_IF_ERROR(ld.take(p + "kv_a_proj_with_mqa.weight", {kvc + r, D}, &w->kv_a));
  KL_RETURN_IF_ERROR(ld.take(p + "kv_a_layernorm.weight", {kvc}, &w->kv_a_norm));
  KL_RETURN_IF_ERROR(ld.take(p + "kv_b_proj.weight", {H * (c.qk_nope_dim + v), kvc}, &w->kv_b, rows));
  if (c.mla_output_gate) KL_RETURN_IF_ERROR(ld.take(p + "g_proj.weight", {H * v, D}, &w->g_proj, rows));
  return ld.take(p + "o_proj.weight", {D, H * v}, &w->o_proj, part.columns());
}

// The experts `shard.experts` of a MoE block, the shared experts' intermediate `shard.heads`; the
// router and the latent projections whole.
Status load_moe(Loader& ld, const ModelConfig& c, const std::string& p, const ModelShard& shard, MoeWeights* w) {
  const int64_t D = c.hidden_size, E = c.num_experts, F = c.moe_intermediate_size, L = c.expert_io_dim();
  KL_RETURN_IF_ERROR(ld.take(p + "gate.weight", {E, D}, &w->router));
  if (ld.has(p + "gate.e_score_correction_bias")) {
    KL_RETURN_IF_ERROR(ld.take(p + "gate.e_score_correction_bias", {E}, DType::kF32, &w->router_bias));
  } else {
    w->router_bias = ld.zeros_f32(E);
  }
  KL_RETURN_IF_ERROR(ld.experts(p + "experts.", E, F, L, L, c.expert_format, shard.experts, &w->w13, &w->w2));
  if (c.has_latent_moe()) {
    KL_RETURN_IF_ERROR(ld.take(p + "routed_expert_down_proj.weight", {L, D}, &w->latent_down));
    if (c.latent_moe_use_norm) KL_RETURN_IF_ERROR(ld.take(p + "routed_expert_norm.weight", {L}, &w->latent_norm));
    KL_RETURN_IF_ERROR(ld.take(p + "routed_expert_up_proj.weight", {D, L}, &w->latent_up));
  }
  w->has_shared = c.num_shared_experts > 0;
  if (w->has_shared)
    KL_RETURN_IF_ERROR(load_mlp(ld, p + "shared_experts.", F * c.num_shared_experts, D, shard.heads, &w->shared));
  return Status();
}

// Every weight of `c` from `ld`'s source, the part `shard` of each.
Result<ModelWeights> load_all(const ModelConfig& c, const ModelShard& shard, Loader& ld) {
  ModelWeights w;
  const int64_t D = c.hidden_size, V = c.vocab_size;
  KL_RETURN_IF_ERROR(ld.take("model.embed_tokens.weight", {V, D}, &w.embed, shard.embed.rows()));
  KL_RETURN_IF_ERROR(ld.take("model.norm.weight", {D}, &w.final_norm));
  if (c.tie_word_embeddings && !ld.has("lm_head.weight")) w.lm_head = w.embed;  // check_parallel: the same rows
  else KL_RETURN_IF_ERROR(ld.take("lm_head.weight", {V, D}, &w.lm_head, shard.lm_head.rows()));
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
    if (lw.mixer == Mixer::kKda) KL_RETURN_IF_ERROR(load_kda(ld, c, p + "self_attn.", shard.heads, &lw.kda));
    else KL_RETURN_IF_ERROR(load_mla(ld, c, p + "self_attn.", shard.heads, &lw.mla));
    if (lw.ffn == Ffn::kDense) KL_RETURN_IF_ERROR(load_mlp(ld, p + "mlp.", c.intermediate_size, D, shard.heads, &lw.mlp));
    else KL_RETURN_IF_ERROR(load_moe(ld, c, p + "block_sparse_moe.", shard, &lw.moe));
    w.layers.push_back(std::move(lw));
  }
  KL_RETURN_IF_ERROR(ld.finish());
  return w;
}

}  // namespace

WeightStorage storage_of(const Backend& backend) { return {backend.activation_dtype(), backend.mxfp4_storage()}; }

uint64_t WeightCount::total_bytes() const {
  uint64_t t = 0;
  for (const auto& [dtype, b] : bytes) t += b;
  return t;
}

Result<ModelWeights> load_weights(const ModelConfig& config, Checkpoint& ckpt, Backend& backend,
                                  const ModelShard& shard) {
  Loader ld(&ckpt, &backend, Source::kCheckpoint, storage_of(backend));
  return load_all(config, shard, ld);
}

Result<ModelWeights> dummy_weights(const ModelConfig& config, Backend& backend, const ModelShard& shard) {
  Loader ld(nullptr, &backend, Source::kDummy, storage_of(backend));
  return load_all(config, shard, ld);
}

WeightCount count_weights(const ModelConfig& config, const WeightStorage& storage, const ModelShard& shard) {
  Loader ld(nullptr, nullptr, Source::kCount, storage);
  KL_CHECK(load_all(config, shard, ld).ok(), "counting weights cannot fail");
  return ld.count();
}

uint64_t count_parameters(const ModelConfig& config, const ModelShard& shard) {
  return count_weights(config, WeightStorage{}, shard).parameters;
}

}  // namespace klinear
