// The KDA mixer (SPEC 4): fused q/k/v projection → short conv + SiLU → decay gate and β →
// chunked (prefill) or recurrent (decode) delta rule → gated RMSNorm → o_proj.
#include "model/model.h"

namespace klinear {

Tensor Model::kda(const KdaWeights& w, const Tensor& x, KdaLayerState& s, bool decode) {
  Backend& be = backend_;
  const ModelConfig& c = config_;
  const int64_t T = x.dim(0), H = c.kda_heads, d = c.kda_head_dim, P = c.kda_proj();

  Tensor qkv = be.alloc({T, 3 * P});
  be.linear(x, w.qkv_proj, qkv);
  Tensor conv = be.alloc({T, 3 * P});
  be.short_conv(qkv, w.conv, s.conv, conv);
  Tensor q = be.alloc({T, H, d}), k = be.alloc({T, H, d}), v = be.alloc({T, H, d});
  be.copy_columns(conv, 0, q.view({T, P}), 0, P);
  be.copy_columns(conv, P, k.view({T, P}), 0, P);
  be.copy_columns(conv, 2 * P, v.view({T, P}), 0, P);

  // Decay gate: f = f_b(f_a(x)), no activation between (SPEC 4.1, 4.3).
  Tensor fa = be.alloc({T, d});
  be.linear(x, w.f_a, fa);
  Tensor f = be.alloc({T, P});
  be.linear(fa, w.f_b, f);
  Tensor g = be.alloc({T, H, d});
  const KdaGateParams gate{c.kda_gate == KdaGate::kLowerBound ? KdaGateParams::Kind::kLowerBound
                                                               : KdaGateParams::Kind::kSoftplus,
                           c.gate_lower_bound};
  be.kda_gate(f, w.dt_bias, w.a_log, gate, g);
  Tensor beta = be.alloc({T, H});
  be.linear(x, w.b_proj, beta);
  be.sigmoid(beta, beta);

  Tensor o = be.alloc({T, H, d});
  if (decode) be.kda_recurrent(q, k, v, g, beta, s.recurrent, o);
  else be.kda_chunked(q, k, v, g, beta, s.recurrent, o);

  // Output gate (full-rank g_proj, or low-rank g_b(g_a(x))), then RMSNorm ⊙ σ(gate) (SPEC 4.7).
  Tensor og = be.alloc({T, P});
  if (w.g_proj.defined()) {
    be.linear(x, w.g_proj, og);
  } else {
    Tensor ga = be.alloc({T, d});
    be.linear(x, w.g_a, ga);
    be.linear(ga, w.g_b, og);
  }
  Tensor y = be.alloc({T * H, d});
  be.gated_rms_norm(o.view({T * H, d}), w.o_norm, og.view({T * H, d}), static_cast<float>(c.rms_norm_eps), y);
  Tensor out = be.alloc({T, c.hidden_size});
  be.linear(y.view({T, P}), w.o_proj, out);
  return out;
}

}  // namespace klinear
