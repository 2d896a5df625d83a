// The MLA mixer (SPEC 5): query (full or q-LoRA), the latent c = RMSNorm(kv_a(x)[:c]) and the
// shared key part k_r appended to the sequence's cache, attention over all cached tokens (expanded
// for prefill, absorbed for decode), optional sigmoid output gate, o_proj. NoPE: nothing rotates.
#include <cmath>

#include "model/model.h"

namespace klinear {

namespace {
// q_a_layernorm and kv_a_layernorm use the module default eps, not rms_norm_eps (SPEC 3.1, D4).
constexpr float kMlaNormEps = 1e-6f;

// Grows a cache tensor [capacity, width] to hold at least `rows` rows, keeping [0, used).
void reserve_rows(Backend& be, Tensor& cache, int64_t width, int64_t used, int64_t rows) {
  if (cache.defined() && cache.dim(0) >= rows) return;
  int64_t capacity = cache.defined() ? cache.dim(0) : 0;
  capacity = std::max<int64_t>({rows, 2 * capacity, 64});
  Tensor grown = be.alloc({capacity, width});
  if (used > 0) be.copy(cache.rows(0, used), grown.rows(0, used));
  cache = grown;
}
}  // namespace

Tensor Model::mla(const MlaWeights& w, const Tensor& x, MlaLayerState& s, int64_t past, bool decode) {
  Backend& be = backend_;
  const ModelConfig& c = config_;
  const int64_t T = x.dim(0), H = c.mla_heads, n = c.qk_nope_dim, r = c.qk_rope_dim, v = c.v_head_dim;
  const int64_t qk = n + r, kvc = c.kv_lora_rank, Tc = past + T;

  Tensor q = be.alloc({T, H, qk});
  if (w.q_proj.defined()) {
    be.linear(x, w.q_proj, q);
  } else {
    Tensor qa = be.alloc({T, c.q_lora_rank});
    be.linear(x, w.q_a, qa);
    be.rms_norm(qa, w.q_a_norm, kMlaNormEps, qa);
    be.linear(qa, w.q_b, q);
  }

  Tensor ckv = be.alloc({T, kvc + r});
  be.linear(x, w.kv_a, ckv);
  reserve_rows(be, s.latent, kvc, past, Tc);
  reserve_rows(be, s.k_r, r, past, Tc);
  Tensor new_latent = s.latent.rows(past, Tc);
  be.copy_columns(ckv, 0, new_latent, 0, kvc);
  be.rms_norm(new_latent, w.kv_a_norm, kMlaNormEps, new_latent);
  be.copy_columns(ckv, kvc, s.k_r.rows(past, Tc), 0, r);

  const float scale = 1.0f / std::sqrt(static_cast<float>(qk));
  Tensor attn = be.alloc({T, H, v});
  if (decode) {
    be.mla_attention_absorbed(q, s.latent.rows(0, Tc), s.k_r.rows(0, Tc), w.kv_b, scale, attn);
  } else {
    Tensor kv = be.alloc({Tc, H, n + v});
    be.linear(s.latent.rows(0, Tc), w.kv_b, kv);
    be.mla_attention(q, kv, s.k_r.rows(0, Tc), scale, attn);
  }
  if (w.g_proj.defined()) {
    Tensor gate = be.alloc({T, H * v});
    be.linear(x, w.g_proj, gate);
    be.sigmoid_mul(attn, gate);
  }
  Tensor out = be.alloc({T, c.hidden_size});
  be.linear(attn.view({T, H * v}), w.o_proj, out);
  return out;
}

}  // namespace klinear
