// Feed-forward blocks (MODEL.md 3.2-3.4): the gated MLP (dense layer 0) and the MoE block: router on the
// full x, routed experts (in the latent width for K3, followed by the latent RMSNorm and up
// projection), plus the shared experts on the original x (in moe_experts' call, or after the latent
// up projection through add_shared_experts). Over ranks (model/shard.h) each rank computes its part
// of the intermediate (dense, shared) and its experts' picks; the partial sums meet in one
// all-reduce where both are split alike, else in one each.
#include "model/model.h"

namespace klinear {

namespace {
GluParams glu_params(const ModelConfig& c) {
  return {c.activation, c.situ_beta, c.situ_linear_beta};
}
}  // namespace

Tensor Model::mlp(const MlpWeights& w, const Tensor& x) {
  Backend& be = backend_;
  const int64_t T = x.dim(0), F = w.down.dim(1);
  Tensor gu = act({T, w.gate_up.dim(0)});
  be.linear(x, w.gate_up, gu);
  Tensor a = act({T, F});
  be.glu(gu, glu_params(config_), a);
  Tensor out = act({T, w.down.dim(0)});
  be.linear(a, w.down, out);
  if (!ranks_.shard.heads.whole()) sum_over_ranks(out);
  return out;
}

void Model::add_shared(const SharedExperts& shared, const Tensor& out) {
  if (!shared.gate_up.defined()) return;
  if (ranks_.shard.heads.whole()) return add_shared_experts(backend_, shared, glu_params(config_), out);
  const Tensor part = act(out.shape());
  backend_.fill(part, 0.0f);
  add_shared_experts(backend_, shared, glu_params(config_), part);
  sum_over_ranks(part);
  backend_.add(out, part);
}

Tensor Model::moe(const MoeWeights& w, const Tensor& x) {
  Backend& be = backend_;
  const ModelConfig& c = config_;
  const int64_t T = x.dim(0), K = c.experts_per_token;

  // The projections of x (one call: a backend may run them as one launch): the router's logits,
  // the shared experts' gate/up and K3's latent down projection.
  const Tensor logits = be.alloc(DType::kF32, {T, c.num_experts});
  const Tensor shared_gu = w.has_shared ? act({T, w.shared.gate_up.dim(0)}) : Tensor();
  const Tensor z = c.has_latent_moe() ? act({T, c.routed_expert_hidden_size}) : Tensor();
  Projection projections[3] = {{x, w.router, logits}};
  size_t count = 1;
  if (w.has_shared) projections[count++] = {x, w.shared.gate_up, shared_gu};
  if (c.has_latent_moe()) projections[count++] = {x, w.latent_down, z};
  be.linears(std::span<const Projection>(projections, count));
  Tensor idx = be.alloc(DType::kI32, {T, K});
  Tensor weights = be.alloc(DType::kF32, {T, K});
  const Part& experts = ranks_.shard.experts;
  const RouteParams route{static_cast<int>(K),
                          c.grouped_selection() ? static_cast<int>(c.num_expert_group) : 1,
                          c.grouped_selection() ? static_cast<int>(c.topk_group) : 1,
                          c.moe_renormalize,
                          c.routed_scaling_factor,
                          static_cast<int>(experts.first(c.num_experts)),
                          experts.whole() ? -1 : static_cast<int>(experts.size(c.num_experts))};
  be.moe_route(logits, w.router_bias, route, idx, weights);

  Tensor out = act({T, c.hidden_size});
  const SharedExperts shared = w.has_shared ? SharedExperts{shared_gu, w.shared.down} : SharedExperts{};
  const bool split_routed = !experts.whole(), split_shared = w.has_shared && !ranks_.shard.heads.whole();
  if (c.has_latent_moe()) {
    Tensor r = act({T, c.routed_expert_hidden_size});
    be.moe_experts(z, idx, weights, w.w13, w.w2, glu_params(c), r, SharedExperts{});
    if (split_routed) sum_over_ranks(r);
    if (w.latent_norm.defined()) be.rms_norm(r, w.latent_norm, static_cast<float>(c.rms_norm_eps), r);
    be.linear(r, w.latent_up, out);
    add_shared(shared, out);
  } else if (split_routed == split_shared || !w.has_shared) {
    // The shared experts in the same call (a backend may fuse them with the routed ones), one sum.
    be.moe_experts(x, idx, weights, w.w13, w.w2, glu_params(c), out, shared);
    if (split_routed || split_shared) sum_over_ranks(out);
  } else {
    be.moe_experts(x, idx, weights, w.w13, w.w2, glu_params(c), out, SharedExperts{});
    if (split_routed) sum_over_ranks(out);
    add_shared(shared, out);
  }
  return out;
}

}  // namespace klinear
