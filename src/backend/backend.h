// Backend: the one op interface. The model (src/model) calls these ops and never names a device;
// make_backend() is the only place a device is chosen.
//
// Contract for every op: tensors live on this backend's device, are contiguous and row-major, and
// have the backend's activation dtype (F32 on the CPU, BF16 or F32 on CUDA) unless a field says
// F32 or I32. Shapes use the letters N rows (the new tokens of every sequence of a step,
// concatenated), B sequences, C channels, H heads, d head dim, E experts, K top-k, F expert
// intermediate. Outputs are written in full and never alias an input unless the op says so.
//
// Memory: alloc() hands out step memory from one arena that begin_step() rewinds, so a step run
// twice with the same shapes sees the same addresses (what a captured CUDA graph needs); a tensor
// from alloc() is valid until the next begin_step(). Pools, caches and weights come from
// alloc_persistent() and upload(), which live as long as their tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/arena.h"
#include "core/kinds.h"
#include "core/status.h"
#include "core/tensor.h"
#include "dist/comm.h"

namespace klinear {

// ---- op parameters

// One projection of Backend::linears: y ← x · wᵀ.
struct Projection {
  Tensor x;  // [N, K]
  Tensor w;  // [M, K]
  Tensor y;  // [N, M]: the activation dtype, or F32 as `linear` allows
};

// MODEL.md 3.2. kSilu: silu(gate)·up. kSitu: β·tanh(g/β)·σ(g) · (β_l·tanh(u/β_l) or u).
struct GluParams {
  Activation kind = Activation::kSilu;
  float beta = 1.0f;
  std::optional<float> linear_beta;
};

// MODEL.md 4.3: g = −exp(A)·softplus(f + dt_bias) or lb·σ(exp(A)·(f + dt_bias)).
struct KdaGateParams {
  KdaGate kind = KdaGate::kSoftplus;
  float lower_bound = 0.0f;
};

// The shared experts of a MoE block (MODEL.md 3.4) as moe_experts takes them: their gate/up projection
// of the block's input (computed with the router's logits, one launch) and their down weight.
// gate_up undefined: none.
struct SharedExperts {
  Tensor gate_up;  // [N, 2·Fs], the activation dtype
  Tensor down;     // [Dout, Fs]
};

// One projection of the routed experts as a backend holds it: dense, `w` [E, rows, in] in the
// activation dtype; or MXFP4 (MODEL.md 2.3) on a backend that keeps it packed (the CUDA one):
// `w` U8 [E, rows, in/2] (two E2M1 values a byte, the low nibble the even column) and `scale` U8
// [E, rows, in/32] (E8M0 exponents), 4.25 bits a weight. A dense Tensor converts to one.
struct ExpertMatrix {
  Tensor w;
  Tensor scale;  // undefined: dense

  ExpertMatrix() = default;
  ExpertMatrix(Tensor dense) : w(std::move(dense)) {}  // NOLINT(google-explicit-constructor)
  ExpertMatrix(Tensor packed, Tensor scales) : w(std::move(packed)), scale(std::move(scales)) {}

  bool mxfp4() const { return scale.defined(); }
  int64_t experts() const { return w.dim(0); }
  int64_t rows() const { return w.dim(1); }
  int64_t in() const { return mxfp4() ? 2 * w.dim(2) : w.dim(2); }
  Shape shape() const { return {experts(), rows(), in()}; }
  size_t nbytes() const { return w.nbytes() + (mxfp4() ? scale.nbytes() : 0); }
};

// MODEL.md 3.3: sigmoid scores, bias for selection only, grouped top-k, renormalise, scale. Under
// expert parallelism a rank holds the experts [first_expert, first_expert + local_experts): the
// router picks over all of them as one rank would, and writes a pick of a held expert as its local
// index, any other as −1 (another rank's: moe_experts skips it), the weights unchanged.
struct RouteParams {
  int top_k = 1;
  int num_groups = 1;   // grouped selection runs when num_groups > topk_group
  int topk_group = 1;
  bool renormalize = true;
  float scale = 1.0f;
  int first_expert = 0;
  int local_experts = -1;  // −1: every expert is held here
};

// The sequences of one step (docs/DESIGN.md "One step, many sequences"). Sequence b owns rows
// [cu_seqlens[b], cu_seqlens[b+1]) of every [N, ...] tensor; its first new token sits at position
// cached[b]; its KDA and conv states are row slots[b] of the state pools; its MLA latent cache is
// the pages page_table[b, 0 ..] (position p lives in page page_table[b, p / page_size] at row
// p % page_size). Snapshot k asks for the KDA and conv state of sequence snap_seq[k] after its
// first snap_pos[k] new rows to be copied into slot snap_slot[k] of the pools as the step runs
// (prefix caching without splitting a prefill): snap_pos is a multiple of 64 (a chunk boundary)
// or the sequence's new_tokens. The host arrays are the truth; `dev` holds the same arrays on the
// backend's device (I32), made once per step by Backend::upload_layout.
struct SeqLayout {
  int64_t page_size = 0;
  int64_t max_pages = 0;              // columns of page_table
  std::vector<int32_t> cu_seqlens;    // [B+1], cu_seqlens[0] = 0, non-decreasing
  std::vector<int32_t> cached;        // [B]
  std::vector<int32_t> slots;         // [B]
  std::vector<int32_t> page_table;    // [B, max_pages], −1 past the pages a sequence holds
  std::vector<int32_t> snap_seq, snap_pos, snap_slot;  // [S] each
  struct Device {
    Tensor cu_seqlens, cached, slots, page_table, snap_seq, snap_pos, snap_slot;
  } dev;

  int64_t num_seqs() const { return static_cast<int64_t>(cached.size()); }
  int64_t num_rows() const { return cu_seqlens.empty() ? 0 : cu_seqlens.back(); }
  int64_t new_tokens(int64_t b) const { return cu_seqlens[b + 1] - cu_seqlens[b]; }
  // Sequences [b0, b1) as a layout of their own, rows counted from the first of them (no `dev`).
  SeqLayout part(int64_t b0, int64_t b1) const;
};

// Short convolution over a step (MODEL.md 4.2).
struct ConvArgs {
  Tensor x;       // [N, C] pre-conv rows
  Tensor w;       // [C, Kc]
  Tensor states;  // [slots, Kc−1, C] pool: the previous Kc−1 pre-conv rows of each slot, oldest first
  Tensor out;     // [N, C] silu(conv(x))
};

// The KDA core over a step (MODEL.md 4.4-4.6).
struct KdaArgs {
  Tensor q, k;    // [N, H, dk] raw conv outputs: L2-normalised per head inside (qk_norm), q also scaled by dk^-1/2
  Tensor v;       // [N, H, dv]
  Tensor g;       // [N, H, dk] F32 log decay
  Tensor beta;    // [N, H] F32
  Tensor states;  // [slots, H, dk, dv] F32 pool (K-first), read and written in place
  Tensor out;     // [N, H, dv]
  KdaQkNorm qk_norm = KdaQkNorm::kInside;  // kGiven: q and k used as passed (q still scaled); CPU only
  // The same over rows [r0, r1) (the pool stays whole).
  KdaArgs rows(int64_t r0, int64_t r1) const {
    return {q.rows(r0, r1), k.rows(r0, r1), v.rows(r0, r1), g.rows(r0, r1), beta.rows(r0, r1), states,
            out.rows(r0, r1), qk_norm};
  }
};

// The gradients of the KDA core (MODEL.md 4.10) over the sequences of a layout (its cu_seqlens;
// slots and snapshots are not used): sequence b starts from h0[b] and ends in a state whose
// gradient is d_ht[b], and its rows' outputs have the gradient d_out.
struct KdaBackwardArgs {
  Tensor q, k;    // [N, H, dk] as KdaArgs takes them (qk_norm)
  Tensor v;       // [N, H, dv]
  Tensor g;       // [N, H, dk] F32 log decay
  Tensor beta;    // [N, H] F32
  Tensor h0;      // [B, H, dk, dv] F32 start states (K-first); undefined: zero
  Tensor d_out;   // [N, H, dv] gradient of the outputs
  Tensor d_ht;    // [B, H, dk, dv] F32 gradient of the end states; undefined: zero
  KdaQkNorm qk_norm = KdaQkNorm::kInside;
  Tensor dq, dk;  // [N, H, dk] out: gradients of the raw q, k (through the norm when kInside)
  Tensor dv;      // [N, H, dv] out
  Tensor dg;      // [N, H, dk] F32 out
  Tensor dbeta;   // [N, H] F32 out
  Tensor dh0;     // [B, H, dk, dv] F32 out: gradient of the start states
};

// The gradients of kda_gate (MODEL.md 4.10) with respect to its inputs, given dg of its output.
struct KdaGateBackwardArgs {
  Tensor f;          // [N, H·d] F32 gate pre-activation
  Tensor dt_bias;    // [H·d] F32
  Tensor a_log;      // [H] F32
  KdaGateParams gate;
  Tensor dg;         // [N, H·d] F32 gradient of g
  Tensor df;         // [N, H·d] F32 out
  Tensor d_dt_bias;  // [H·d] F32 out: summed over the rows
  Tensor d_a_log;    // [H] F32 out: summed over the rows and the head's channels
};

// The affine summary of each sequence's new rows (MODEL.md 4.9, 4.5): per head,
// with M_t = (I − β_t k_t k_tᵀ)·diag(e^{g_t}) (k L2-normalised as in KdaArgs), the rows map any
// start state to S_end = A·S_start + B, A = M_T···M_1 and B = S_end from S_start = 0. A sequence
// with no new rows has A = I, B = 0. Summaries of consecutive segments compose: (A2·A1, A2·B1 + B2).
struct KdaSummaryArgs {
  Tensor k;     // [N, H, dk] raw conv outputs: L2-normalised per head inside (qk_norm)
  Tensor v;     // [N, H, dv]
  Tensor g;     // [N, H, dk] F32 log decay
  Tensor beta;  // [N, H] F32
  Tensor a;     // [B, H, dk, dk] F32 out: the transition A
  Tensor b;     // [B, H, dk, dv] F32 out: the zero-start end state B
  KdaQkNorm qk_norm = KdaQkNorm::kInside;  // kGiven: k used as passed (CPU only, as KdaArgs)
};

// One decode step of a KDA layer after its projections (MODEL.md 4.8): every sequence of the layout has
// one row. Equal, up to rounding, to short_conv → split q, k, v → kda_gate → σ(β) → kda_recurrent
// → gated_rms_norm over the same rows (what the CPU runs). Sequences in `pad_slot` are the padding
// of a fixed-size step: their pools are neither read nor written and their rows of y are zero.
struct KdaDecodeArgs {
  Tensor qkv;          // [N, C] pre-conv q̂ ‖ k̂ ‖ v̂, C = 2·H·dk + H·dv
  Tensor conv_w;       // [C, Kc]
  Tensor conv_states;  // [slots, Kc−1, C] pool (as ConvArgs::states), read and written in place
  Tensor f;            // [N, H·dk] F32 gate pre-activation (after f_b)
  Tensor dt_bias;      // [H·dk] F32
  Tensor a_log;        // [H] F32
  KdaGateParams gate;
  Tensor beta_logits;  // [N, H] F32, σ taken inside
  Tensor og;           // [N, H·dv] output gate (σ taken inside)
  Tensor o_norm;       // [dv]
  float eps = 0.0f;    // of the gated RMSNorm
  Tensor states;       // [slots, H, dk, dv] F32 pool (K-first), read and written in place
  int64_t pad_slot = -1;  // −1: no padding
  Tensor y;            // [N, H·dv] gated-norm output (what o_proj reads)
};

// The pre-norm residual step of MODEL.md 6 (one sublayer's output added into the stream, then the
// next sublayer's RMSNorm, MODEL.md 3.1): h ← h + x, then y ← RMSNorm(h) ⊙ w reading h as stored (in the
// activation dtype, so rounded to it after the add). Equal to add(h, x) then rms_norm(h, w, eps, y).
struct AddNormArgs {
  Tensor h;          // [N, D] the residual stream, read and written in place
  Tensor x;          // [N, D] the sublayer output added into h
  Tensor w;          // [D] the norm weight
  float eps = 0.0f;  // of the RMSNorm
  Tensor y;          // [N, D] out: the normed stream (aliases neither h nor x)
};

// MLA attention over a step (MODEL.md 5). Queries are the new tokens; keys and values are every
// token of the sequence (cached and new), read from the paged latent cache.
struct MlaArgs {
  Tensor q;       // [N, H, n+r]
  Tensor pages;   // [pages, page_size, c+r] latent (after kv_a_layernorm) ‖ k_r of each position
  Tensor kv_b;    // [H·(n+v), c] kv_b_proj: rows h(n+v)+[0,n) are W_UK of head h, the next v rows W_UV
  float scale = 1.0f;
  Tensor out;     // [N, H, v]
  // The same over rows [r0, r1).
  MlaArgs rows(int64_t r0, int64_t r1) const { return {q.rows(r0, r1), pages, kv_b, scale, out.rows(r0, r1)}; }
};

// Sampling of one token per row (docs/DESIGN.md "Sampling on the device"). For a row with a
// non-finite logit the id is −1. temperature ≤ 0 is greedy: the lowest id among the largest
// logits. Otherwise, with m the row's largest logit:
//   weight w_i = floor(exp((l_i − m) · (1/t)) · 2^40), an integer (sample_weight in
//     backend/sampling.h), so every sum below is exact whatever the order it is added in;
//   ids ordered by logit, largest first, ties lowest id first; K = the first top_k of them (all
//     when top_k is 0 or ≥ V);
//   P = the shortest prefix of K whose weight reaches max(1, floor(top_p · Σ_K w)) (K when top_p ≥ 1);
//   x = floor(u · Σ_P w / 2^64) for the 64 random bits u = sample_bits(seed, counter);
//   the pick is the id i of P, walking P by ascending id, with Σ_{j∈P, j<i} w_j ≤ x < Σ_{j∈P, j≤i} w_j.
// So a row's pick depends on its logits, parameters, seed and counter only: the same on every
// backend and whatever else shares the step.
struct SampleArgs {
  Tensor logits;       // [R, V] F32
  Tensor temperature;  // [R] F32; ≤ 0: greedy
  Tensor top_k;        // [R] I32; 0: no limit
  Tensor top_p;        // [R] F32 in (0, 1]; 1: no limit
  Tensor seed;         // [R, 2] I32: low and high 32 bits of the row's 64-bit seed
  Tensor counter;      // [R] I32 ≥ 0: which draw of the seed's stream (the token's index in its output)
  Tensor ids;          // [R] I32 out
};

// One row of SampleArgs as the host holds it (what a request asks for).
struct SampleRow {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  int32_t counter = 0;
};

// Where a random_fill writes inside the whole tensor it is part of (a rank's rows or columns of a
// dummy weight): element (i, j) of the part is element offset + i · stride + j of the whole.
struct FillWindow {
  int64_t offset = 0;  // the whole's flat index of the part's first element
  int64_t stride = 0;  // the whole's row length; 0: the part's own last dim (a contiguous part)
};

// out [N, C] ← the embedding rows of ids [N] (I32 in [0, vocab), validated by the caller). The
// table holds the rows of ids [first_id, first_id + Vr): all of them, or a vocab-parallel rank's
// window; ids outside it give zero rows (another rank adds them).
struct EmbeddingArgs {
  Tensor ids;            // [N] I32
  Tensor table;          // [Vr, C]
  int64_t first_id = 0;  // the id of table row 0
  int64_t vocab = 0;     // every id is below it
  Tensor out;            // [N, C]
};

// Whether decode steps run as captured CUDA graphs (--cuda-graphs); the CPU always runs eagerly.
enum class CudaGraphs { kOff, kOn };
Result<CudaGraphs> parse_cuda_graphs(const std::string& name);

// Whether a row's results may depend on the other rows of its step (--batch-invariant): kOff lets
// each op pick its fastest reduction order for the step's shape (OpenBLAS's for a row of x·wᵀ changes
// with the row count); kOn reduces every row in an order fixed by its own sizes, so a sequence's logits
// are the same bits alone or beside any others (the CPU; CUDA refuses it until issue 40's kernels).
enum class BatchInvariance { kOff, kOn };

// Which kernels run MLA attention on CUDA (--attention-kernels); the CPU has one of each.
enum class AttentionKernels {
  kBest,  // FlashInfer's Hopper kernels where they fit the step and are the faster, else klinear's own
  kOwn,   // klinear's own kernels everywhere (mla.cu): the reference FlashInfer's are tested against
};
Result<AttentionKernels> parse_attention_kernels(const std::string& name);

// How a backend holds MXFP4 routed experts after upload_mxfp4.
enum class Mxfp4Storage {
  kWidened,  // dequantized to the activation dtype (the CPU: its exact reference)
  kPacked,   // packed and scales as loaded, dequantized in registers by the MoE kernels
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;

  // ---- memory
  // Dtype of activations (F32 on the CPU).
  virtual DType activation_dtype() const = 0;
  // Bytes one weight element occupies after upload (4 on the CPU, which widens to F32).
  virtual size_t weight_element_bytes() const = 0;
  // Memory available now for weights and caches.
  virtual uint64_t available_bytes() const = 0;
  // Rewinds the step arena: every tensor from alloc() before this call is dead after it.
  virtual void begin_step() = 0;
  // Uninitialised step tensor from the arena.
  virtual Tensor alloc(DType dtype, const Shape& shape) = 0;
  // Within a step: step_release(m) makes the memory alloc() handed out since step_mark() m free
  // again for the step's later allocations (the model releases each sublayer's temporaries, so a
  // step needs the memory of one layer, not of all of them). Backends without an arena of their
  // own (test decorators) keep everything until begin_step().
  virtual Arena::Mark step_mark() { return {}; }
  virtual void step_release(const Arena::Mark& mark) { (void)mark; }
  // Uninitialised tensor that lives as long as its handles (pools, caches).
  virtual Tensor alloc_persistent(DType dtype, const Shape& shape) = 0;
  // t ← value in every element (an I32 tensor takes the integral value). Zeroes fresh state slots;
  // tests poison outputs with NaN.
  virtual void fill(const Tensor& t, float value) = 0;
  // t[i, j] ← counter_uniform(seed, w.offset + i · stride + j, lo, hi) (core/counter_rng.h) over
  // t as [rows, last dim]: the same values on every backend. Dummy weights are made on the device
  // this way, with no host copy; a rank holding part of a weight makes exactly its part of them.
  virtual void random_fill(const Tensor& t, uint64_t seed, float lo, float hi, const FillWindow& w) = 0;
  // Persistent device copy of a host tensor of any float dtype, converted to `dtype` (the
  // activation dtype for weight matrices; F32 for the vectors used in fp32 math: router bias,
  // dt_bias, A_log, AttnRes queries).
  virtual Tensor upload(const Tensor& host, DType dtype) = 0;
  // Routed expert weights in MXFP4 (MODEL.md 2.3): packed U8 [E, out, in/2] (low nibble = even
  // column) and scale U8 E8M0 [E, out, in/32], held as mxfp4_storage() says.
  virtual ExpertMatrix upload_mxfp4(const Tensor& packed, const Tensor& scale) = 0;
  virtual Mxfp4Storage mxfp4_storage() const = 0;
  // Step copy of a host tensor: float data converted to `dtype` (a float dtype), I32 kept as I32.
  virtual Tensor to_device(const Tensor& host, DType dtype) = 0;
  // Makes layout.dev for this step.
  virtual void upload_layout(SeqLayout& layout) = 0;
  // Host copy of a device tensor: F32 for float dtypes, I32 for I32. Waits for pending work.
  virtual Tensor to_host(const Tensor& t) = 0;
  // dst ← src, same numel and dtype.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  // Strided column copy between two 2-D views with the same row count (rows = numel / last dim):
  // dst[:, dst_col + j] ← src[:, src_col + j] for j < width. Splits fused projections.
  virtual void copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width) = 0;
  // out [R, C] ← src [N, C] rows `rows` [R] (I32, each in [0, N)).
  virtual void gather_rows(const Tensor& src, const Tensor& rows, const Tensor& out) = 0;
  // dst ← host, an existing tensor of this backend with the same numel and dtype (F32 or I32):
  // fills the fixed input buffers of a captured step before it is replayed.
  virtual void write(const Tensor& host, const Tensor& dst) = 0;

  // ---- step graphs (docs/DESIGN.md "The decode step as a CUDA graph")
  // Runs `body` (calls of this backend's ops) as graph `key`. On the CPU, and on CUDA with
  // CudaGraphs::kOff, that is body() every time. On CUDA with kOn: the first call of a key runs
  // body() eagerly (the arena grows, GEMM plans are made), the second captures what body() issues
  // and replays it, later calls replay without calling body(). A body must therefore be
  // capturable: the same arena allocations and launches whatever the data (device inputs in fixed
  // buffers, written with write() before the call), no host reads or syncs, no host→device
  // copies, no arena growth. A capture that breaks one of these fails with a Status naming the
  // op, and nothing is kept for the key. Tensors a body allocated stay valid (their memory is not
  // handed out again) until clear_graphs(); after a replay the step allocates nothing more.
  virtual Status run_graph(int64_t key, const std::function<void()>& body) {
    (void)key;
    body();
    return Status();
  }
  // Forgets every graph (a new cache: the captured pools and buffers are gone).
  virtual void clear_graphs() {}
  // Host-side planning for kernels that read a plan from fixed device buffers: called with the
  // step's layout before each run_graph of a step (eager, capture and replay alike), since a replay
  // runs no host code. Not inside a body. Nothing to do on the CPU.
  virtual void plan_step(const SeqLayout& layout) { (void)layout; }

  // ---- elementwise and small ops
  // See EmbeddingArgs.
  virtual void embedding(const EmbeddingArgs& a) = 0;
  // acc ← acc + x (same shape). In place.
  virtual void add(const Tensor& acc, const Tensor& x) = 0;
  // x ← x ⊙ σ(gate) (same shape). In place.
  virtual void sigmoid_mul(const Tensor& x, const Tensor& gate) = 0;
  // y ← σ(x) elementwise; y may alias x.
  virtual void sigmoid(const Tensor& x, const Tensor& y) = 0;
  // gate_up [N, 2F] (gate first, up second) → out [N, F] (MODEL.md 3.2).
  virtual void glu(const Tensor& gate_up, const GluParams& p, const Tensor& out) = 0;

  // ---- gemm
  // y [N, M] ← x [N, K] · wᵀ for w [M, K]; y may be F32 whatever the activation dtype (router
  // logits, gates, β, the lm_head).
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor& y) = 0;
  // Independent projections of the same rows (a layer's input projections of x; KDA's f_b and g_b,
  // each of its own input), in one call so that a backend may run them as one launch: the CUDA
  // backend does for one row (a batch-1 decode step, where each small projection's launch costs
  // more than its bytes). Default: `linear` each.
  virtual void linears(std::span<const Projection> projections) {
    for (const Projection& p : projections) linear(p.x, p.w, p.y);
  }

  // ---- norms (MODEL.md 3.1, 4.7)
  // y [N, C] ← RMSNorm(x [N, C]) ⊙ w [C]. y may alias x.
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) = 0;
  // y [N, d] ← RMSNorm(o [N, d]) ⊙ w [d] ⊙ σ(gate [N, d]), one rounding (FLA FusedRMSNormGated).
  virtual void gated_rms_norm(const Tensor& o, const Tensor& w, const Tensor& gate, float eps, const Tensor& y) = 0;
  // h += x, then y ← RMSNorm(h) ⊙ w in one pass over the rows (see AddNormArgs).
  virtual void add_rms_norm(const AddNormArgs& a) = 0;

  // ---- KDA (MODEL.md 4)
  // Causal depthwise conv + SiLU of every sequence, continuing from and updating its state slot
  // (and writing the layout's snapshots).
  virtual void short_conv(const ConvArgs& a, const SeqLayout& layout) = 0;
  // g [N, H·d] (F32) ← gate(f [N, H·d] + dt_bias [H·d], A_log [H]).
  virtual void kda_gate(const Tensor& f, const Tensor& dt_bias, const Tensor& a_log, const KdaGateParams& p,
                        const Tensor& g) = 0;
  // The delta rule of every sequence from its state slot, written back, with the layout's
  // snapshots: kda_chunked by the chunk-64 algorithm (MODEL.md 4.6, chunks counted from each
  // sequence's first new row), kda_recurrent by the token loop (MODEL.md 4.5). Equal up to rounding.
  virtual void kda_chunked(const KdaArgs& a, const SeqLayout& layout) = 0;
  virtual void kda_recurrent(const KdaArgs& a, const SeqLayout& layout) = 0;
  // The gradients of the delta rule (see KdaBackwardArgs): kda_chunked_backward by the chunk-64
  // algorithm (MODEL.md 4.10, chunk states recomputed from the forward), kda_recurrent_backward by
  // the token loop in reverse. Equal up to rounding. CPU only for now (issue 37).
  virtual void kda_chunked_backward(const KdaBackwardArgs& a, const SeqLayout& layout) = 0;
  virtual void kda_recurrent_backward(const KdaBackwardArgs& a, const SeqLayout& layout) = 0;
  // df, d_dt_bias, d_a_log of kda_gate (see KdaGateBackwardArgs). CPU only for now (issue 37).
  virtual void kda_gate_backward(const KdaGateBackwardArgs& a) = 0;
  // (A, B) of every sequence of the layout (its cu_seqlens; slots and snapshots are not used), by
  // the chunks of MODEL.md 4.6 counted from each sequence's first new row, in fp32. No model path
  // calls it yet: it stays (tested against the CPU) as the building block of context parallelism,
  // where each device's share of a sequence becomes such a map and the maps compose in order.
  virtual void kda_summary(const KdaSummaryArgs& a, const SeqLayout& layout) = 0;
  // One decode step of a KDA layer over `decode` (one row per sequence, no snapshots): see KdaDecodeArgs.
  virtual void kda_decode(const KdaDecodeArgs& a, const SeqLayout& decode) = 0;

  // ---- MLA (MODEL.md 5)
  // Writes rows [N, c+r] (kv_a's latent ‖ k_r of each new token) into `pages` at the positions the
  // layout gives (row i of sequence b at position cached[b] + i), the latent RMS-normalised with
  // norm [c] on the way (MODEL.md 5: c = RMSNorm(kv_a(x)[:c]); rms_norm's arithmetic, rounded once).
  virtual void mla_cache_write(const Tensor& rows, const Tensor& norm, float eps, const Tensor& pages,
                               const SeqLayout& layout) = 0;
  // Causal attention of each sequence's new queries over its cached + new positions (query i of
  // sequence b sees positions 0 .. cached[b] + i). mla_prefill expands keys and values through
  // kv_b (MODEL.md 5, prefill form); mla_decode attends in the latent space with W_UK absorbed into
  // the query and W_UV applied after (MODEL.md 5, decode form). Equal up to rounding.
  virtual void mla_prefill(const MlaArgs& a, const SeqLayout& layout) = 0;
  virtual void mla_decode(const MlaArgs& a, const SeqLayout& layout) = 0;

  // ---- MoE (MODEL.md 3.3, 3.4)
  // Router: logits [N, E] (F32), bias [E] (F32) → idx [N, K] (I32), weights [N, K] (F32).
  virtual void moe_route(const Tensor& logits, const Tensor& bias, const RouteParams& p, const Tensor& idx,
                         const Tensor& weights) = 0;
  // out [N, Dout] ← Σ_k weights[n,k] · down_e(glu(gate_up_e(x[n]))) with e = idx[n, k], picks
  // of e = −1 (another rank's expert, RouteParams) adding nothing (the CPU only: the CUDA paths
  // trap on them, so expert parallelism is refused on CUDA at load);
  // x [N, Din], w13 [E, 2F, Din], w2 [E, Dout, F] (as returned by upload / upload_mxfp4). With
  // `shared` defined, then out ← out + shared.down · glu(shared.gate_up) (add_shared_experts).
  virtual void moe_experts(const Tensor& x, const Tensor& idx, const Tensor& weights, const ExpertMatrix& w13,
                           const ExpertMatrix& w2, const GluParams& p, const Tensor& out,
                           const SharedExperts& shared) = 0;

  // ---- AttnRes (MODEL.md 7.1)
  // out [N, D] ← Σ_i softmax_i(ρ_i · (v_i · e)) · v_i over candidates v_i [N, D], with
  // ρ_i = rsqrt(mean(v_i²) + eps) and the effective query e [D] (F32).
  virtual void attn_res_read(std::span<const Tensor> candidates, const Tensor& e, float eps, const Tensor& out) = 0;

  // ---- sampling (see SampleArgs)
  virtual void sample(const SampleArgs& a) = 0;
};

// moe_experts' shared experts (moe_shared.cc): the checks (Fs; 0 when `s` is undefined), and their
// part composed from the other ops, out ← out + down · glu(gate_up), each op's output rounded to its
// dtype: the CPU's form and the reference of the CUDA rows path, which fuses it.
int64_t check_shared_experts(const SharedExperts& s, int64_t n, const Tensor& out);
void add_shared_experts(Backend& be, const SharedExperts& s, const GluParams& p, const Tensor& out);

// A KDA layer's rows after its projections, op by op over `layout` (the rows of a's tensors, any
// number per sequence; pad_slot unused): short_conv, the q/k/v split (copy_columns), kda_gate,
// sigmoid(β), `delta_rule` (kda_recurrent and/or kda_chunked over the rows' KdaArgs) and
// gated_rms_norm into a.y.
void kda_rows_by_ops(Backend& be, const KdaDecodeArgs& a, const SeqLayout& layout,
                     const std::function<void(const KdaArgs&)>& delta_rule);
// kda_decode as the composition of the other ops on `be` (the CPU's kda_decode, and the reference
// the fused kernels are tested against): the runs of sequences between padded ones go through
// kda_rows_by_ops with kda_recurrent.
void kda_decode_by_ops(Backend& be, const KdaDecodeArgs& a, const SeqLayout& decode);
// The sizes of a kda_decode call; aborts naming the op, the shapes and the layout unless they agree
// (one row per sequence, no snapshots, dtypes as KdaDecodeArgs says).
struct KdaDecodeDims {
  int64_t rows, heads, dk, dv, channels, kc;
};
KdaDecodeDims check_kda_decode(const KdaDecodeArgs& a, const SeqLayout& decode);

// The sizes of a kda_summary call; aborts naming the shapes and the layout unless they agree.
struct KdaSummaryDims {
  int64_t rows, seqs, heads, dk, dv;
};
KdaSummaryDims check_kda_summary(const KdaSummaryArgs& a, const SeqLayout& layout);

// What make_backend builds: the device and the dtype of weights and activations (F32 or BF16;
// the CPU computes in F32 only).
struct BackendOptions {
  Device device = Device::kCpu;
  DType dtype = DType::kF32;
  CudaGraphs graphs = CudaGraphs::kOn;              // CUDA only
  AttentionKernels attention = AttentionKernels::kBest;  // CUDA only
  int gpu = -1;  // CUDA only: the device ordinal (a rank's local rank); −1: the current device
  BatchInvariance batch_invariance = BatchInvariance::kOff;
};

// The only place a device is chosen. kCpu always works; kCuda needs a CUDA build and a GPU.
Result<Device> parse_device(const std::string& name);
// "float32" / "bfloat16" (as --dtype spells them); "" (--dtype not given) is the device's default:
// bfloat16 on CUDA, float32 (the exact reference) on the CPU.
Result<DType> parse_compute_dtype(const std::string& name, Device device);
Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options);
// The communicator a model split over the ranks of `host_world` (dist/mpi_comm.h) sums and
// gathers its tensors over, on the backend's device: a communicator of its own over the same ranks
// for the CPU (MPI), NCCL over them on the backend's stream for CUDA. A collective call of every
// rank of `host_world`.
Result<std::unique_ptr<Comm>> make_backend_comm(Backend& backend, Comm& host_world);

}  // namespace klinear
