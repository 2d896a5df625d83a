// CpuBackend: the reference implementation of every op. Plain loops in fp32, OpenBLAS for GEMMs
// and OpenMP on outer loops; no intrinsics. It must stay obviously right: every CUDA kernel is
// tested against it, and it is tested against the golden fixtures.
//
// Activations, weights and states are all F32 here: bf16 and F16 weights are widened on upload
// and MXFP4 experts are dequantized (MODEL.md 2.3), which matches the float32 golden oracles.
#pragma once

#include <cmath>
#include <limits>

#include "backend/arena.h"
#include "backend/backend.h"

namespace klinear::cpu {

// How gemm orders its sums. kBlas: OpenBLAS's blocked kernels, whose order for one element depends
// on m, n and k. kRowStable: each element one loop over k in index order, so it depends on its row
// of A, its column of op(B), k, alpha and beta alone (BatchInvariance::kOn; a sum over more k whose
// extra terms are zero, such as attention over masked keys, is the same too).
enum class GemmOrder { kBlas, kRowStable };

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(BatchInvariance invariance = BatchInvariance::kOff);
  Device device() const override { return Device::kCpu; }
  const char* name() const override { return "cpu"; }

  DType activation_dtype() const override { return DType::kF32; }
  size_t weight_element_bytes() const override { return 4; }
  uint64_t available_bytes() const override;
  void begin_step() override { arena_.rewind(); }
  Tensor alloc(DType dtype, const Shape& shape) override { return arena_.alloc(dtype, shape); }
  Arena::Mark step_mark() override { return arena_.mark(); }
  void step_release(const Arena::Mark& mark) override { arena_.release(mark); }
  Tensor alloc_persistent(DType dtype, const Shape& shape) override { return Tensor::empty(dtype, shape); }
  void fill(const Tensor& t, float value) override;
  void random_fill(const Tensor& t, uint64_t seed, float lo, float hi, const FillWindow& w) override;
  Tensor upload(const Tensor& host, DType dtype) override;
  ExpertMatrix upload_mxfp4(const Tensor& packed, const Tensor& scale) override;
  Mxfp4Storage mxfp4_storage() const override { return Mxfp4Storage::kWidened; }
  Tensor to_device(const Tensor& host, DType dtype) override;
  void upload_layout(SeqLayout& layout) override;
  Tensor to_host(const Tensor& t) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width) override;
  void gather_rows(const Tensor& src, const Tensor& rows, const Tensor& out) override;
  void write(const Tensor& host, const Tensor& dst) override;

  void embedding(const EmbeddingArgs& a) override;
  void add(const Tensor& acc, const Tensor& x) override;
  void sigmoid_mul(const Tensor& x, const Tensor& gate) override;
  void sigmoid(const Tensor& x, const Tensor& y) override;
  void glu(const Tensor& gate_up, const GluParams& p, const Tensor& out) override;

  void linear(const Tensor& x, const Tensor& w, const Tensor& y) override;

  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) override;
  void gated_rms_norm(const Tensor& o, const Tensor& w, const Tensor& gate, float eps, const Tensor& y) override;
  void add_rms_norm(const AddNormArgs& a) override;

  void short_conv(const ConvArgs& a, const SeqLayout& layout) override;
  void kda_gate(const Tensor& f, const Tensor& dt_bias, const Tensor& a_log, const KdaGateParams& p,
                const Tensor& g) override;
  void kda_chunked(const KdaArgs& a, const SeqLayout& layout) override;
  void kda_recurrent(const KdaArgs& a, const SeqLayout& layout) override;
  void kda_chunked_backward(const KdaBackwardArgs& a, const SeqLayout& layout) override;
  void kda_recurrent_backward(const KdaBackwardArgs& a, const SeqLayout& layout) override;
  void kda_gate_backward(const KdaGateBackwardArgs& a) override;
  void kda_summary(const KdaSummaryArgs& a, const SeqLayout& layout) override;
  void kda_decode(const KdaDecodeArgs& a, const SeqLayout& decode) override;

  void mla_cache_write(const Tensor& rows, const Tensor& norm, float eps, const Tensor& pages,
                       const SeqLayout& layout) override;
  void mla_prefill(const MlaArgs& a, const SeqLayout& layout) override;
  void mla_decode(const MlaArgs& a, const SeqLayout& layout) override;

  void moe_route(const Tensor& logits, const Tensor& bias, const RouteParams& p, const Tensor& idx,
                 const Tensor& weights) override;
  void moe_experts(const Tensor& x, const Tensor& idx, const Tensor& weights, const ExpertMatrix& w13,
                   const ExpertMatrix& w2, const GluParams& p, const Tensor& out, const SharedExperts& shared) override;

  void attn_res_read(std::span<const Tensor> candidates, const Tensor& e, float eps, const Tensor& out) override;

  void sample(const SampleArgs& a) override;

  // The smallest gap seen by moe_route between the last expert (or group) chosen and the first
  // one left out, since the last reset. Two evaluation orders of the same model may legitimately
  // route differently only when this is at the level of rounding; tests that compare them check it.
  float min_route_margin() const { return route_margin_; }
  void reset_route_margin() { route_margin_ = std::numeric_limits<float>::infinity(); }

 private:
  Arena arena_;
  float route_margin_ = std::numeric_limits<float>::infinity();
  GemmOrder gemm_order_;  // of the products whose sizes follow the step's rows (linear, experts, attention)
};

// ---- helpers shared by the CPU op files (the one place each piece of math is written)

// C [m, n] ← alpha · A [m, k] · op(B) + beta · C, row-major with leading dimensions; op(B) = Bᵀ
// when b_transposed (B stored [n, k]) else B (stored [k, n]). The only BLAS caller.
void gemm(GemmOrder order, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
          bool b_transposed, float* c, int64_t ldc, float beta = 0.0f, float alpha = 1.0f);
// By OpenBLAS, for products whose sizes do not depend on the step's other rows (KDA's chunks).
inline void gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                 bool b_transposed, float* c, int64_t ldc, float beta = 0.0f, float alpha = 1.0f) {
  gemm(GemmOrder::kBlas, m, n, k, a, lda, b, ldb, b_transposed, c, ldc, beta, alpha);
}
// out [n, f] ← glu(gate_up [n, 2f]) (MODEL.md 3.2).
void glu_rows(const float* gate_up, int64_t n, int64_t f, const GluParams& p, float* out);
// In-place causal softmax of scores [t, tc] where query row i sees keys [0, past + i].
void causal_softmax(float* scores, int64_t t, int64_t tc);
inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace klinear::cpu
