// The MLA mixer (MODEL.md 5): query (full or q-LoRA), the latent c = RMSNorm(kv_a(x)[:c]) and the
// shared key part k_r written to the sequence's pages of the latent cache, attention over every
// position of each sequence (expanded for prefill, absorbed for decode), optional sigmoid output
// gate, o_proj. NoPE: nothing rotates.
#include <cmath>

#include "model/model.h"

namespace klinear {

namespace {
// q_a_layernorm and kv_a_layernorm use the module default eps, not rms_norm_eps (MODEL.md 3.1, D4).
constexpr float kMlaNormEps = 1e-6f;
}  // namespace

Tensor Model::mla(const MlaWeights& w, const Tensor& x, int64_t layer, const Batch& batch, Cache& cache) {
  Backend& be = backend_;
  const ModelConfig& c = config_;
  const int64_t N = x.dim(0), H = c.mla_heads, n = c.qk_nope_dim, r = c.qk_rope_dim, v = c.v_head_dim;
  const int64_t qk = n + r, kvc = c.kv_lora_rank;

  // The projections of x (one call: a backend may run them as one launch): q (full-rank, or the
  // low-rank q_a), ckv = [latent ‖ k_r], and K3's output gate.
  const Tensor q = act({N, H, qk}), ckv = act({N, kvc + r});
  const bool low_rank_q = !w.q_proj.defined(), gated = w.g_proj.defined();
  const Tensor qa = low_rank_q ? act({N, c.q_lora_rank}) : Tensor();
  const Tensor gate = gated ? act({N, H * v}) : Tensor();
  Projection projections[3] = {low_rank_q ? Projection{x, w.q_a, qa} : Projection{x, w.q_proj, q}, {x, w.kv_a, ckv}};
  if (gated) projections[2] = {x, w.g_proj, gate};
  be.linears(std::span<const Projection>(projections, gated ? 3 : 2));
  if (low_rank_q) {
    be.rms_norm(qa, w.q_a_norm, kMlaNormEps, qa);
    be.linear(qa, w.q_b, q);
  }

  // The cache write normalises the latent columns of ckv on their way into the pages.
  const Tensor& pages = cache.mla_pages(layer);
  be.mla_cache_write(ckv, w.kv_a_norm, kMlaNormEps, pages, batch.layout);

  Tensor attn = act({N, H, v});
  const MlaArgs args{q, pages, w.kv_b, 1.0f / std::sqrt(static_cast<float>(qk)), attn};
  const int64_t split = batch.decode.num_rows();
  if (batch.decode.num_seqs() > 0) be.mla_decode(args.rows(0, split), batch.decode);
  if (batch.prefill.num_seqs() > 0) be.mla_prefill(args.rows(split, N), batch.prefill);
  if (gated) be.sigmoid_mul(attn, gate);
  Tensor out = act({N, c.hidden_size});
  be.linear(attn.view({N, H * v}), w.o_proj, out);
  if (!ranks_.shard.heads.whole()) sum_over_ranks(out);  // each rank's heads' part of o_proj
  return out;
}

}  // namespace klinear
