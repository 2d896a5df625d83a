// Backend: the one op interface. The model (src/model) calls these ops and never names a device;
// make_backend() is the only place a device is chosen.
//
// Contract for every op: tensors live on this backend's device, are contiguous and row-major, and
// have the activation dtype of the backend (F32 on the CPU) unless stated. Shapes use the letters
// N tokens, T tokens of one sequence, Tc cached + new tokens, C channels, H heads, d head dim,
// E experts, K top-k, F expert intermediate. Outputs are written in full and never alias an input
// unless the op says so. Ops do not allocate persistent state; callers own every tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace klinear {

// SPEC 3.2. kSilu: silu(gate)·up. kSitu: β·tanh(g/β)·σ(g) · (β_l·tanh(u/β_l) or u).
struct GluParams {
  enum class Kind { kSilu, kSitu } kind = Kind::kSilu;
  float beta = 1.0f;
  std::optional<float> linear_beta;
};

// SPEC 4.3: g = −exp(A)·softplus(f + dt_bias) or lb·σ(exp(A)·(f + dt_bias)).
struct KdaGateParams {
  enum class Kind { kSoftplus, kLowerBound } kind = Kind::kSoftplus;
  float lower_bound = 0.0f;
};

// SPEC 3.3: sigmoid scores, bias for selection only, grouped top-k, renormalise, scale.
struct RouteParams {
  int top_k = 1;
  int num_groups = 1;   // grouped selection runs when num_groups > topk_group
  int topk_group = 1;
  bool renormalize = true;
  float scale = 1.0f;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;

  // ---- memory
  // Bytes one weight element occupies after upload (4 on the CPU, which widens to F32).
  virtual size_t weight_element_bytes() const = 0;
  // Memory available now for weights and caches.
  virtual uint64_t available_bytes() const = 0;
  // Uninitialised activation tensor of `shape` (F32 on the CPU).
  virtual Tensor alloc(const Shape& shape) = 0;
  virtual Tensor zeros(const Shape& shape) = 0;
  // Uninitialised I32 tensor (router indices).
  virtual Tensor alloc_i32(const Shape& shape) = 0;
  // Device copy of a host weight of any float dtype, in the backend's weight dtype.
  virtual Tensor upload(const Tensor& host) = 0;
  // Routed expert weights in MXFP4 (SPEC 2.3): packed U8 [..., out, in/2] (low nibble = even
  // column) and scale U8 E8M0 [..., out, in/32]. The result is the backend's expert format.
  virtual Tensor upload_mxfp4(const Tensor& packed, const Tensor& scale) = 0;
  // Host F32 copy of a device tensor.
  virtual Tensor to_host(const Tensor& t) = 0;
  // dst ← src, same numel.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  // Strided column copy between two 2-D views with the same row count (rows = numel / last dim):
  // dst[:, dst_col + j] ← src[:, src_col + j] for j < width. Splits fused projections and writes
  // cache rows.
  virtual void copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width) = 0;

  // ---- elementwise and small ops
  // out[n] ← table[ids[n]] for table [V, C], out [N, C]. Ids are validated by the caller.
  virtual void embedding(std::span<const int32_t> ids, const Tensor& table, const Tensor& out) = 0;
  // acc ← acc + x (same shape). In place.
  virtual void add(const Tensor& acc, const Tensor& x) = 0;
  // x ← x ⊙ σ(gate) (same shape). In place.
  virtual void sigmoid_mul(const Tensor& x, const Tensor& gate) = 0;
  // y ← σ(x) elementwise.
  virtual void sigmoid(const Tensor& x, const Tensor& y) = 0;
  // gate_up [N, 2F] (gate first, up second) → out [N, F] (SPEC 3.2).
  virtual void glu(const Tensor& gate_up, const GluParams& p, const Tensor& out) = 0;

  // ---- gemm
  // y [N, M] ← x [N, K] · wᵀ for w [M, K].
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor& y) = 0;

  // ---- norms (SPEC 3.1, 4.7)
  // y [N, C] ← RMSNorm(x [N, C]) ⊙ w [C]. y may alias x.
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) = 0;
  // y [N, d] ← RMSNorm(o [N, d]) ⊙ w [d] ⊙ σ(gate [N, d]), one rounding (FLA FusedRMSNormGated).
  virtual void gated_rms_norm(const Tensor& o, const Tensor& w, const Tensor& gate, float eps, const Tensor& y) = 0;

  // ---- KDA (SPEC 4)
  // Causal depthwise conv + SiLU over one sequence: x [T, C], w [C, Kc], state [Kc-1, C] holding
  // the previous Kc-1 pre-conv inputs (zeros for a fresh sequence), updated in place; out [T, C].
  virtual void short_conv(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& out) = 0;
  // g [T, H·d] ← gate(f [T, H·d] + dt_bias [H·d], A_log [H]) in fp32.
  virtual void kda_gate(const Tensor& f, const Tensor& dt_bias, const Tensor& a_log, const KdaGateParams& p,
                        const Tensor& g) = 0;
  // The KDA core over one sequence, continuing from `state` [H, dk, dv] (fp32, updated in place).
  // q, k [T, H, dk] are raw: both are L2-normalised per head inside (eps 1e-6 inside the sum) and
  // q is scaled by dk^-1/2. v [T, H, dv], g [T, H, dk] log decay, beta [T, H]. out [T, H, dv].
  // kda_chunked uses the chunk-64 algorithm (SPEC 4.6), kda_recurrent the token loop (SPEC 4.5).
  virtual void kda_chunked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                           const Tensor& state, const Tensor& out) = 0;
  virtual void kda_recurrent(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                             const Tensor& state, const Tensor& out) = 0;

  // ---- MLA (SPEC 5), one sequence whose first Tc − T tokens are cached
  // Expanded form: q [T, H, n+r], kv [Tc, H, n+v] = kv_b_proj(latent), k_r [Tc, r];
  // causal softmax(q·[k_n ‖ k_r]ᵀ · scale) · v → out [T, H, v].
  virtual void mla_attention(const Tensor& q, const Tensor& kv, const Tensor& k_r, float scale, const Tensor& out) = 0;
  // Absorbed form over the latent cache: q [T, H, n+r], latent [Tc, c] (after kv_a_layernorm),
  // k_r [Tc, r], kv_b [H·(n+v), c]; same result as mla_attention up to rounding.
  virtual void mla_attention_absorbed(const Tensor& q, const Tensor& latent, const Tensor& k_r, const Tensor& kv_b,
                                      float scale, const Tensor& out) = 0;

  // ---- MoE (SPEC 3.3, 3.4)
  // Router: logits [N, E] (fp32), bias [E] → idx [N, K] (I32), weights [N, K] (F32).
  virtual void moe_route(const Tensor& logits, const Tensor& bias, const RouteParams& p, const Tensor& idx,
                         const Tensor& weights) = 0;
  // out [N, Dout] ← Σ_k weights[n,k] · down_e(glu(gate_up_e(x[n]))) with e = idx[n, k];
  // x [N, Din], w13 [E, 2F, Din], w2 [E, Dout, F] (as returned by upload / upload_mxfp4).
  virtual void moe_experts(const Tensor& x, const Tensor& idx, const Tensor& weights, const Tensor& w13,
                           const Tensor& w2, const GluParams& p, const Tensor& out) = 0;

  // ---- AttnRes (SPEC 7.1)
  // out [T, D] ← Σ_i softmax_i(ρ_i · (v_i · e)) · v_i over candidates v_i [T, D], with
  // ρ_i = rsqrt(mean(v_i²) + eps) and the effective query e [D] (F32).
  virtual void attn_res_read(std::span<const Tensor> candidates, const Tensor& e, float eps, const Tensor& out) = 0;
};

// The only place a device is chosen. "cpu" always works; "cuda" needs a CUDA build and a GPU.
enum class DeviceKind { kCpu, kCuda };
Result<DeviceKind> parse_device(const std::string& name);
Result<std::unique_ptr<Backend>> make_backend(DeviceKind device);

}  // namespace klinear
