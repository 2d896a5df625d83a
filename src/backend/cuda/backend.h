// CudaBackend: every op of the interface on one NVIDIA GPU (sm_90a), on one stream.
//
// Dtypes: activations and weights are BF16 (the default on CUDA) or F32 (the exact mode: fp32
// throughout, TF32 off, which reproduces the CPU reference). Whatever the activation dtype, every
// reduction, softmax, norm statistic, router score, gate and the KDA state are fp32.
//
// Memory: step tensors come from one Arena (backend/arena.h) over device blocks; begin_step()
// rewinds it, so after the first steps no cudaMalloc runs on the hot path. Weights, pools and
// caches come from alloc_persistent()/upload() (cudaMalloc at load time, freed with their last
// handle). Every CUDA and cuBLAS call is checked (KL_CUDA / KL_CUBLAS) with the op and shape.
//
// Graphs (graph.cu): run_graph captures a step per key on the one stream and replays it. While a
// capture runs, the ops that cannot be captured (host reads and syncs, host→device copies, new
// device memory) do not run: the first of them is recorded, and the capture fails with its name.
//
// Interface-internal helpers shared by the op files live below (kernels are in the .cu files that
// own them; this header compiles as plain C++ too).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <map>
#include <string>
#include <unordered_map>

#include "backend/arena.h"
#include "backend/backend.h"

struct cublasLtContext;
using cublasLtHandle_t = cublasLtContext*;
struct cublasContext;
using cublasHandle_t = cublasContext*;

namespace klinear::cuda {

// Aborts with the call, the CUDA error and `what` (the op and its shape) when `err` is not success.
void check_cuda(cudaError_t err, const char* call, const std::string& what, const char* file, int line);
void check_cublas(int status, const char* call, const std::string& what, const char* file, int line);
#define KL_CUDA(call, what) ::klinear::cuda::check_cuda((call), #call, (what), __FILE__, __LINE__)
#define KL_CUBLAS(call, what) ::klinear::cuda::check_cublas(static_cast<int>(call), #call, (what), __FILE__, __LINE__)
// After a kernel launch: the launch error (bad configuration) with the op and shape.
#define KL_LAUNCHED(what) KL_CUDA(cudaGetLastError(), (what))

// C[m, n] (row-major, ldc) ← A[m, k] (lda) · op(B), op(B) = Bᵀ for B stored [n, k] (b_transposed)
// or B for B stored [k, n]; `batch` problems `stride_*` elements apart. A and B share a dtype (F32 or
// BF16); C is that dtype or F32. fp32 accumulation; TF32 never. `accumulate`: C ← C + A·op(B).
struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  bool b_transposed = true;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  int64_t batch = 1;
  DType ab_dtype = DType::kF32;
  DType c_dtype = DType::kF32;
  bool accumulate = false;
};

// The kernels that can run a GEMM, a list of them and an MLA decode step's attention (declared
// here for the friends below; gemm/gemm.h and mla/mla.h define them).
enum class GemmPath;
enum class GemmGroupedPath;
enum class MlaDecodePath;

class MlaDecodeSm90;

class CudaBackend final : public Backend {
 public:
  // On device `gpu` (−1: the current one). Fails (NotSupported) when no CUDA device is visible or
  // `dtype` is not F32/BF16, InvalidArgument when `gpu` is not a visible device.
  static Result<std::unique_ptr<CudaBackend>> create(DType dtype, CudaGraphs graphs = CudaGraphs::kOn,
                                                     AttentionKernels attention = AttentionKernels::kBest, int gpu = -1);
  ~CudaBackend() override;

  Device device() const override { return Device::kCuda; }
  const char* name() const override { return "cuda"; }

  DType activation_dtype() const override { return dtype_; }
  size_t weight_element_bytes() const override { return dtype_size(dtype_); }
  uint64_t available_bytes() const override;
  void begin_step() override;
  Tensor alloc(DType dtype, const Shape& shape) override;
  Arena::Mark step_mark() override { return arena_->mark(); }
  void step_release(const Arena::Mark& mark) override { arena_->release(mark); }
  Tensor alloc_persistent(DType dtype, const Shape& shape) override;
  void fill(const Tensor& t, float value) override;
  void random_fill(const Tensor& t, uint64_t seed, float lo, float hi, const FillWindow& w) override;
  Tensor upload(const Tensor& host, DType dtype) override;
  ExpertMatrix upload_mxfp4(const Tensor& packed, const Tensor& scale) override;
  Mxfp4Storage mxfp4_storage() const override { return Mxfp4Storage::kPacked; }
  Tensor to_device(const Tensor& host, DType dtype) override;
  void upload_layout(SeqLayout& layout) override;
  Tensor to_host(const Tensor& t) override;
  void copy(const Tensor& src, const Tensor& dst) override;
  void copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width) override;
  void gather_rows(const Tensor& src, const Tensor& rows, const Tensor& out) override;
  void write(const Tensor& host, const Tensor& dst) override;
  Status run_graph(int64_t key, const std::function<void()>& body) override;
  void clear_graphs() override;
  // Plans the FlashInfer MLA decode (mla_decode_sm90.cu) for `layout` once one has run.
  void plan_step(const SeqLayout& layout) override;

  void embedding(const EmbeddingArgs& a) override;
  void add(const Tensor& acc, const Tensor& x) override;
  void sigmoid_mul(const Tensor& x, const Tensor& gate) override;
  void sigmoid(const Tensor& x, const Tensor& y) override;
  void glu(const Tensor& gate_up, const GluParams& p, const Tensor& out) override;

  void linear(const Tensor& x, const Tensor& w, const Tensor& y) override;
  // One row and up to four projections that each fit GemmPath::kSmallRow: one launch of the
  // small-row kernel (gemm.cu); otherwise a GEMM each.
  void linears(std::span<const Projection> projections) override;

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

  // ---- for the op files
  cudaStream_t stream() const { return stream_; }
  int num_sms() const { return num_sms_; }
  // Runs one (batched) GEMM on the stream on the path gemm_path_for picks (gemm/gemm.h); `what`
  // names the op for errors.
  void gemm(const GemmArgs& g, const char* what);
  // Runs many GEMMs of different shapes in one launch, each C[m, n] ← A[m, k] · Bᵀ with B stored
  // [n, k]: single problems (batch 1), no accumulation, one A/B dtype and one C dtype for all, on the
  // path gemm_grouped_path_for picks (gemm/gemm.h). Not capturable (it uploads the problem list).
  void gemm_grouped(std::span<const GemmArgs> problems, const char* what);
  // Waits for the stream; `what` names the op for errors.
  void sync(const char* what);
  // True (and `what` recorded as the op that broke it) while a graph capture runs: the caller
  // skips its uncapturable work.
  bool breaks_capture(const std::string& what);

 private:
  CudaBackend(DType dtype, CudaGraphs graphs, AttentionKernels attention);
  struct GemmPlan;
  // The paths that run on the backend's own state (the cuBLASLt plans and handles, the FlashInfer
  // decode plan).
  friend void gemm_on(CudaBackend& be, GemmPath path, const GemmArgs& g, const char* what);
  friend void gemm_grouped_on(CudaBackend& be, GemmGroupedPath path, std::span<const GemmArgs> problems,
                              const char* what);
  friend void mla_decode_on(CudaBackend& be, MlaDecodePath path, const MlaArgs& a, const SeqLayout& layout);
  // gemm's cuBLASLt kernel (GemmPath::kCublasLt) for a checked, non-empty problem; `shape` names it.
  void gemm_cublaslt(const GemmArgs& g, const std::string& shape);
  // gemm_grouped's two kernels for a checked list that fits them (CUTLASS's in gemm_grouped.cu).
  void gemm_grouped_cutlass(std::span<const GemmArgs> problems, const std::string& what);
  void gemm_grouped_cublas(std::span<const GemmArgs> problems, const std::string& what);

  // The state ops' kernels over a layout, snapshots aside.
  void short_conv_rows(const ConvArgs& a, const SeqLayout& layout);
  void kda_recurrent_rows(const KdaArgs& a, const SeqLayout& layout);
  // Runs op(r0, r1, part) over the layout. Without snapshots that is one call over every row. With
  // them, a sequence that has snapshots runs alone, in pieces cut at its snapshot positions (multiples
  // of 64, so the chunks stay where they were), and after each piece its slot of `states` is copied
  // into the snapshot's slot; the sequences between run together. Correct, not fast: prefix-caching
  // steps pay a layout upload per piece until the kernels write snapshots themselves (kda_chunked's
  // do, kda.cu).
  void for_snapshot_pieces(const SeqLayout& layout, const Tensor& states,
                           const std::function<void(int64_t r0, int64_t r1, const SeqLayout& part)>& op);

  struct Graph;

  DType dtype_;
  CudaGraphs graphs_ = CudaGraphs::kOn;
  AttentionKernels attention_ = AttentionKernels::kBest;  // what mla_prefill and mla_decode run
  bool capturing_ = false;
  std::string capture_breaker_;              // the first uncapturable op of the running capture
  std::map<int64_t, std::shared_ptr<Graph>> graph_by_key_;
  int device_ = 0;
  int num_sms_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;  // for gemm_grouped_cublas only (the grouped API is not in cuBLASLt)
  void* lt_workspace_ = nullptr;   // shared by both handles: they run on the one stream
  size_t lt_workspace_bytes_ = 0;
  std::unordered_map<std::string, std::shared_ptr<GemmPlan>> gemm_plans_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<MlaDecodeSm90> mla_decode_sm90_;  // made by the first bf16 decode at latent 512 + 64
};

// Shapes as "[2, 3]" for messages.
inline std::string shapes(const Tensor& t) { return shape_to_string(t.shape()); }

}  // namespace klinear::cuda
