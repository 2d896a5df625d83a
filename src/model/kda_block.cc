// The KDA mixer (SPEC 4): fused q/k/v projection → short conv + SiLU → decay gate and β →
// chunked (prefill) or recurrent (decode) delta rule → gated RMSNorm → o_proj. Every sequence of
// the step continues from its slot of the layer's conv and recurrent state pools.
#include "model/model.h"

namespace klinear {

Tensor Model::kda(const KdaWeights& w, const Tensor& x, int64_t layer, const Batch& batch, Cache& cache) {
  Backend& be = backend_;
  const ModelConfig& c = config_;
  const int64_t N = x.dim(0), H = c.kda_heads, d = c.kda_head_dim, P = c.kda_proj();

  Tensor qkv = act({N, 3 * P});
  be.linear(x, w.qkv_proj, qkv);
  Tensor conv = act({N, 3 * P});
  be.short_conv(ConvArgs{qkv, w.conv, cache.conv_states(layer), conv}, batch.layout);
  Tensor q = act({N, H, d}), k = act({N, H, d}), v = act({N, H, d});
  be.copy_columns(conv, 0, q.view({N, P}), 0, P);
  be.copy_columns(conv, P, k.view({N, P}), 0, P);
  be.copy_columns(conv, 2 * P, v.view({N, P}), 0, P);

  // Decay gate: f = f_b(f_a(x)), no activation between (SPEC 4.1, 4.3); g and β in F32.
  Tensor fa = act({N, d});
  be.linear(x, w.f_a, fa);
  Tensor f = be.alloc(DType::kF32, {N, P});
  be.linear(fa, w.f_b, f);
  Tensor g = be.alloc(DType::kF32, {N, H, d});
  be.kda_gate(f, w.dt_bias, w.a_log, KdaGateParams{c.kda_gate, c.gate_lower_bound}, g);
  Tensor beta = be.alloc(DType::kF32, {N, H});
  be.linear(x, w.b_proj, beta);
  be.sigmoid(beta, beta);

  Tensor o = act({N, H, d});
  const KdaArgs args{q, k, v, g, beta, cache.kda_states(layer), o};
  const int64_t split = batch.decode.num_rows();
  if (batch.decode.num_seqs() > 0) be.kda_recurrent(args.rows(0, split), batch.decode);
  if (batch.prefill.num_seqs() > 0) be.kda_chunked(args.rows(split, N), batch.prefill);

  // Output gate (full-rank g_proj, or low-rank g_b(g_a(x))), then RMSNorm ⊙ σ(gate) (SPEC 4.7).
  Tensor og = act({N, P});
  if (w.g_proj.defined()) {
    be.linear(x, w.g_proj, og);
  } else {
    Tensor ga = act({N, d});
    be.linear(x, w.g_a, ga);
    be.linear(ga, w.g_b, og);
  }
  Tensor y = act({N * H, d});
  be.gated_rms_norm(o.view({N * H, d}), w.o_norm, og.view({N * H, d}), static_cast<float>(c.rms_norm_eps), y);
  Tensor out = act({N, c.hidden_size});
  be.linear(y.view({N, P}), w.o_proj, out);
  return out;
}

}  // namespace klinear
