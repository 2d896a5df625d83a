// The KDA mixer (MODEL.md 4): fused q/k/v projection → short conv + SiLU → decay gate and β →
// chunked (prefill) or recurrent (decode) delta rule → gated RMSNorm → o_proj. Every sequence of
// the step continues from its slot of the layer's conv and recurrent state pools. Decode rows take
// one fused op after the projections (kda_decode); prefill rows, and decode rows that snapshot
// their state, the ops one by one.
#include "model/model.h"

namespace klinear {

Tensor Model::kda(const KdaWeights& w, const Tensor& x, int64_t layer, const Batch& batch, Cache& cache) {
  Backend& be = backend_;
  const ModelConfig& c = config_;
  const int64_t N = x.dim(0), H = c.kda_heads, d = c.kda_head_dim, P = c.kda_proj();
  const float eps = static_cast<float>(c.rms_norm_eps);
  const KdaGateParams gate{c.kda_gate, c.gate_lower_bound};

  // The projections of x (one call: a backend may run them as one launch), then the second halves
  // of the low-rank ones (another). Decay gate pre-activation f = f_b(f_a(x)), no activation
  // between (MODEL.md 4.1, 4.3), and β logits, in F32. Output gate: full-rank g_proj, or low-rank
  // g_b(g_a(x)) (MODEL.md 4.7).
  const Tensor qkv = act({N, 3 * P}), fa = act({N, d}), beta = be.alloc(DType::kF32, {N, H}), og = act({N, P});
  const bool low_rank_gate = !w.g_proj.defined();
  const Tensor ga = low_rank_gate ? act({N, d}) : Tensor();
  const Projection projections[] = {{x, w.qkv_proj, qkv}, {x, w.f_a, fa}, {x, w.b_proj, beta},
                                    low_rank_gate ? Projection{x, w.g_a, ga} : Projection{x, w.g_proj, og}};
  be.linears(projections);
  const Tensor f = be.alloc(DType::kF32, {N, P});
  const Projection second_halves[] = {{fa, w.f_b, f}, {ga, w.g_b, og}};
  be.linears(std::span<const Projection>(second_halves, low_rank_gate ? 2 : 1));

  Tensor y = act({N, P});
  const int64_t split = batch.decode.num_rows();
  const bool fused = batch.decode.num_seqs() > 0 && batch.decode.snap_seq.empty();
  if (fused)
    be.kda_decode(KdaDecodeArgs{qkv.rows(0, split), w.conv, cache.conv_states(layer), f.rows(0, split), w.dt_bias,
                                w.a_log, gate, beta.rows(0, split), og.rows(0, split), w.o_norm, eps,
                                cache.kda_states(layer), cache.scratch_slot(), y.rows(0, split)},
                  batch.decode);
  const int64_t r0 = fused ? split : 0, n = N - r0;
  if (n > 0) {
    const KdaDecodeArgs rows{qkv.rows(r0, N), w.conv, cache.conv_states(layer), f.rows(r0, N), w.dt_bias, w.a_log,
                             gate, beta.rows(r0, N), og.rows(r0, N), w.o_norm, eps, cache.kda_states(layer), -1,
                             y.rows(r0, N)};
    kda_rows_by_ops(be, rows, fused ? batch.prefill : batch.layout, [&](const KdaArgs& args) {
      if (!fused && batch.decode.num_seqs() > 0) be.kda_recurrent(args.rows(0, split), batch.decode);
      if (batch.prefill.num_seqs() > 0) be.kda_chunked(args.rows(split - r0, n), batch.prefill);
    });
  }
  Tensor out = act({N, c.hidden_size});
  be.linear(y, w.o_proj, out);
  if (!ranks_.shard.heads.whole()) sum_over_ranks(out);  // each rank's heads' part of o_proj
  return out;
}

}  // namespace klinear
