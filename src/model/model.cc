#include "model/model.h"

#include <vector>

#include "io/checkpoint.h"

namespace klinear {

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, Backend& backend) {
  KL_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  KL_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::open(dir));
  // Refuse up front rather than die of OOM half-way: every weight element (an MXFP4 byte holds
  // two) takes weight_element_bytes() on the backend.
  uint64_t elements = 0;
  for (const auto& [dtype, s] : ckpt.stats()) elements += static_cast<uint64_t>(dtype == "U8" ? 2 * s.bytes : s.params);
  const uint64_t need = elements * backend.weight_element_bytes(), have = backend.available_bytes();
  if (need > have) {
    auto gib = [](uint64_t b) { return std::to_string(b >> 30) + "." + std::to_string(((b >> 20) & 1023) * 10 / 1024); };
    return Status::ResourceExhausted(dir + ": the weights need about " + gib(need) + " GiB on the " + backend.name() +
                                     " backend, " + gib(have) + " GiB is available");
  }
  KL_ASSIGN_OR_RETURN(ModelWeights weights, load_weights(config, ckpt, backend));
  return std::make_unique<Model>(std::move(config), std::move(weights), backend);
}

SequenceState Model::new_sequence() const {
  SequenceState s;
  const ModelConfig& c = config_;
  s.kda.resize(static_cast<size_t>(c.num_layers));
  s.mla.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (c.mixer(l) != Mixer::kKda) continue;
    s.kda[l].conv = backend_.zeros({c.conv_kernel - 1, 3 * c.kda_proj()});
    s.kda[l].recurrent = backend_.zeros({c.kda_heads, c.kda_head_dim, c.kda_head_dim});
  }
  return s;
}

Tensor Model::attn_res_read(std::vector<Tensor> candidates, const Tensor& query) {
  if (candidates.size() == 1) return candidates[0];  // SPEC 7.1: one candidate is returned unchanged
  Tensor out = backend_.alloc(candidates[0].shape());
  backend_.attn_res_read(candidates, query, static_cast<float>(config_.rms_norm_eps), out);
  return out;
}

Result<Tensor> Model::forward(std::span<const int32_t> ids, SequenceState& state, LogitsMode mode) {
  const ModelConfig& c = config_;
  Backend& be = backend_;
  const int64_t T = static_cast<int64_t>(ids.size()), D = c.hidden_size;
  if (T == 0) return Status::InvalidArgument("forward: no tokens to run");
  for (int64_t i = 0; i < T; ++i)
    if (ids[i] < 0 || ids[i] >= c.vocab_size)
      return Status::InvalidArgument("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                     " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  if (c.max_position_embeddings > 0 && state.tokens + T > c.max_position_embeddings)
    return Status::InvalidArgument("sequence of " + std::to_string(state.tokens + T) +
                                   " tokens exceeds the model's context of " +
                                   std::to_string(c.max_position_embeddings) + " tokens");
  const int64_t past = state.tokens;
  const bool decode = T == 1 && past > 0;
  const float eps = static_cast<float>(c.rms_norm_eps);

  Tensor h = be.alloc({T, D});
  be.embedding(ids, weights_.embed, h);

  auto mixer = [&](int64_t l, const Tensor& xn) {
    const LayerWeights& lw = weights_.layers[l];
    return lw.mixer == Mixer::kKda ? kda(lw.kda, xn, state.kda[l], decode)
                                   : mla(lw.mla, xn, state.mla[l], past, decode);
  };
  auto ffn = [&](int64_t l, const Tensor& xn) {
    const LayerWeights& lw = weights_.layers[l];
    return lw.ffn == Ffn::kDense ? mlp(lw.mlp, xn) : moe(lw.moe, xn);
  };
  auto normed = [&](const Tensor& x, const Tensor& w) {
    Tensor y = be.alloc(x.shape());
    be.rms_norm(x, w, eps, y);
    return y;
  };

  Tensor x;  // the input to the final norm
  if (!c.has_attn_res()) {
    // SPEC 6: pre-norm residual stream.
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const LayerWeights& lw = weights_.layers[l];
      be.add(h, mixer(l, normed(h, lw.input_norm)));
      be.add(h, ffn(l, normed(h, lw.post_norm)));
    }
    x = h;
  } else {
    // SPEC 7.2: sealed blocks + the live partial sum p; each sublayer reads a softmax mix of them.
    const int64_t B = c.attn_res_block_size;
    std::vector<Tensor> blocks;
    Tensor p = h;
    auto with_partial = [&](const Tensor& partial) {
      std::vector<Tensor> v = blocks;
      v.push_back(partial);
      return v;
    };
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const LayerWeights& lw = weights_.layers[l];
      Tensor xa = blocks.empty() ? p : attn_res_read(with_partial(p), lw.attn_res_query);
      const bool sealed = l % B == 0;
      if (sealed) blocks.push_back(p);
      Tensor a = mixer(l, normed(xa, lw.input_norm));
      // p never aliases a sealed block here: sealing replaces p by the fresh mixer output.
      if (sealed) p = a;
      else be.add(p, a);
      Tensor xm = attn_res_read(with_partial(p), lw.mlp_res_query);
      be.add(p, ffn(l, normed(xm, lw.post_norm)));
    }
    x = attn_res_read(with_partial(p), weights_.output_res_query);
  }
  state.tokens += T;

  Tensor last = mode == LogitsMode::kLast ? x.rows(T - 1, T) : x;
  Tensor logits = be.alloc({last.dim(0), c.vocab_size});
  be.linear(normed(last, weights_.final_norm), weights_.lm_head, logits);
  return be.to_host(logits);
}

}  // namespace klinear
