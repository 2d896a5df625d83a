// CUDA GEMMs: cuBLASLt for one (batched) problem; many problems of different shapes in one launch
// (an MoE layer's experts at prefill) go to
// CUTLASS's grouped kernel for BF16 (gemm_grouped.cu) and to cublasGemmGroupedBatchedEx otherwise.
// Row-major problems are mapped to cuBLAS's column-major view (Cᵀ = op(B)ᵀ·Aᵀ); fp32 compute
// (CUBLAS_COMPUTE_32F: no TF32 for F32 operands, fp32 accumulation for BF16 ones). cuBLASLt
// descriptors and the heuristic's algorithm are cached per problem shape, so a step run again does
// no host-side planning.
//
// Small-row path (`gemv_kernel`): c[n] = a[k]·B[n, k]ᵀ for BF16 a and B, the projections of a
// batch-1 decode step. The bytes are B's (n·k·2); the FLOPs are nothing (2·n·k). cuBLASLt runs
// these as tiles of 8+ rows, far from that floor at one row (docs/perf-log.md, "Notes moved from the CUDA sources").
// Here a warp owns one output column: its lanes stream B's row in 16-byte loads (eight in flight a
// lane across the unrolled loop), multiply each by a (read through the read-only cache, where every
// warp of the block finds it) and sum in fp32 by shuffles; 8 warps a block. At 4 rows, where each
// lane loads A four times per B load, it lost to cuBLASLt on the large projections, so it takes one
// row only. `linears` runs independent projections of one row (a KDA layer's q/k/v, f_a, b and g_a,
// then its f_b and g_b, each of its own input; an MLA layer's q and kv_a; the router beside the
// shared expert's gate/up) as one launch of it: their blocks in a row of the grid, each problem with
// its own input row. The small ones alone are latency-bound, so one launch over a layer's few costs
// about what its largest costs alone (docs/perf-log.md, "Notes moved from the CUDA sources").
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <span>
#include <vector>

#include <sstream>

#include "backend/cuda/common/device.cuh"
#include "backend/cuda/gemm/gemm.h"

namespace klinear::cuda {

namespace {
cudaDataType_t lt_type(DType t) {
  KL_CHECK(t == DType::kF32 || t == DType::kBF16, std::string("gemm operand dtype ") + dtype_name(t));
  return t == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
}
constexpr int kGemvWarps = 8;

// Up to kGemvMaxProblems products c_i[n_i] = a_i[k_i]·B_i[n_i, k_i]ᵀ of one row each, in one launch:
// the blocks of problem i are [first_block[i], first_block[i + 1]).
constexpr int kGemvMaxProblems = 4;
struct GemvProblem {
  const __nv_bfloat16* a;  // [k]
  const __nv_bfloat16* b;  // [n, ldb]
  int k, ldb, n;
  Out c;                   // [n]
};
struct GemvProblems {
  GemvProblem p[kGemvMaxProblems];
  int first_block[kGemvMaxProblems + 1];
  int count;
};

// Warp w of block x owns one column of the problem the block falls in. Launched as a programmatic
// dependent (device.cuh). It loads nothing before the wait (loading weights there, or
// prefetching them to L2, measured slower: docs/perf-log.md, "Notes moved from the CUDA sources").
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_kernel(GemvProblems ps) {
  int i = 0;
  while (i + 1 < ps.count && static_cast<int>(blockIdx.x) >= ps.first_block[i + 1]) ++i;
  const GemvProblem& p = ps.p[i];
  const int lane = threadIdx.x % 32, col = (blockIdx.x - ps.first_block[i]) * kGemvWarps + threadIdx.x / 32;
  pdl_enter();
  if (col >= p.n) return;
  const __nv_bfloat16* __restrict__ a = p.a;
  const __nv_bfloat16* row = p.b + static_cast<int64_t>(col) * p.ldb;
  const int k = p.k;
  float acc = 0.0f;
#pragma unroll 8
  for (int j = 8 * lane; j < k; j += 8 * 32) {
    float bv[8], av[8];
    unpack_bf16x8(__ldcs(reinterpret_cast<const uint4*>(row + j)), bv);  // streamed: read once
    unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(a + j)), av);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc = fmaf(av[e], bv[e], acc);
  }
  acc = warp_sum(acc);
  if (lane == 0) p.c.set(col, acc);
}

// One launch over `problems` (each fits GemmPath::kSmallRow).
void launch_gemv(std::span<const GemmArgs> problems, cudaStream_t stream, const std::string& what) {
  KL_CHECK(!problems.empty() && problems.size() <= kGemvMaxProblems, what + ": gemv problem count");
  GemvProblems ps{};
  ps.count = static_cast<int>(problems.size());
  for (int i = 0; i < ps.count; ++i) {
    const GemmArgs& g = problems[i];
    ps.p[i] = GemvProblem{static_cast<const __nv_bfloat16*>(g.a), static_cast<const __nv_bfloat16*>(g.b),
                          static_cast<int>(g.k), static_cast<int>(g.ldb), static_cast<int>(g.n),
                          Out{g.c, g.c_dtype == DType::kBF16}};
    ps.first_block[i + 1] = ps.first_block[i] + static_cast<int>((g.n + kGemvWarps - 1) / kGemvWarps);
  }
  launch_dependent(stream, gemv_kernel, dim3(ps.first_block[ps.count]), dim3(kGemvWarps * 32), 0, what, ps);
}

// Largest power of two ≤ 256 dividing the address (cuBLASLt picks kernels by operand alignment).
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}
}  // namespace

struct CudaBackend::GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~GemmPlan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

const char* gemm_path_name(GemmPath path) { return path_name(path, {"small-row", "cuBLASLt"}); }

bool gemm_path_fits(GemmPath path, const GemmArgs& g) {
  switch (path) {
    case GemmPath::kSmallRow:
      return g.batch == 1 && g.m == 1 && g.b_transposed && !g.accumulate && g.ab_dtype == DType::kBF16 &&
             (g.c_dtype == DType::kBF16 || g.c_dtype == DType::kF32) && g.n >= 1 && g.k >= 1 && g.n <= INT_MAX &&
             g.k <= INT_MAX && g.ldb <= INT_MAX && g.k % 8 == 0 && g.ldb % 8 == 0 && g.ldb >= g.k && aligned16(g.a) &&
             aligned16(g.b);
    case GemmPath::kCublasLt:
      return true;
  }
  return false;
}

GemmPath gemm_path_for(const GemmArgs& g) {
  return gemm_path_fits(GemmPath::kSmallRow, g) ? GemmPath::kSmallRow : GemmPath::kCublasLt;
}

void gemm_on(CudaBackend& be, GemmPath path, const GemmArgs& g, const char* what) {
  KL_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 1, std::string(what) + ": bad gemm sizes");
  std::ostringstream shape;
  shape << what << " gemm m=" << g.m << " n=" << g.n << " k=" << g.k << " batch=" << g.batch;
  KL_CHECK(gemm_path_fits(path, g), shape.str() + ": the " + gemm_path_name(path) +
                                        " path cannot run this problem (dtypes, rows, widths or alignment)");
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {  // an empty product: C ← 0 (or unchanged when accumulating)
    if (!g.accumulate) {
      KL_CHECK(g.batch == 1 && g.ldc == g.n, shape.str() + ": empty product into a strided C");
      KL_CUDA(cudaMemsetAsync(g.c, 0, g.m * g.n * dtype_size(g.c_dtype), be.stream()), shape.str());
    }
    return;
  }
  switch (path) {
    case GemmPath::kSmallRow:
      launch_gemv({&g, 1}, be.stream(), shape.str());
      break;
    case GemmPath::kCublasLt:
      be.gemm_cublaslt(g, shape.str());
      break;
  }
}

void CudaBackend::gemm(const GemmArgs& g, const char* what) { gemm_on(*this, gemm_path_for(g), g, what); }

void CudaBackend::gemm_cublaslt(const GemmArgs& g, const std::string& s) {
  std::ostringstream key;
  key << g.m << ',' << g.n << ',' << g.k << ',' << g.lda << ',' << g.stride_a << ',' << g.ldb << ',' << g.stride_b << ','
      << g.b_transposed << ',' << g.ldc << ',' << g.stride_c << ',' << g.batch << ',' << int(g.ab_dtype) << ','
      << int(g.c_dtype) << ',' << alignment(g.a) << ',' << alignment(g.b) << ',' << alignment(g.c);
  std::shared_ptr<GemmPlan>& plan = gemm_plans_[key.str()];
  if (!plan) {
    auto p = std::make_shared<GemmPlan>();
    KL_CUBLAS(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), s);
    const cublasOperation_t ta = g.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
    KL_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), s);
    KL_CUBLAS(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), s);
    // Column-major: A_lt = B (k×n stored, or n×k), B_lt = A (k×m), C_lt = C (n×m).
    const cudaDataType_t ab = lt_type(g.ab_dtype), ct = lt_type(g.c_dtype);
    KL_CUBLAS(cublasLtMatrixLayoutCreate(&p->a, ab, g.b_transposed ? g.k : g.n, g.b_transposed ? g.n : g.k, g.ldb), s);
    KL_CUBLAS(cublasLtMatrixLayoutCreate(&p->b, ab, g.k, g.m, g.lda), s);
    KL_CUBLAS(cublasLtMatrixLayoutCreate(&p->c, ct, g.n, g.m, g.ldc), s);
    if (g.batch > 1) {
      const int32_t count = static_cast<int32_t>(g.batch);
      const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {{p->a, g.stride_b}, {p->b, g.stride_a}, {p->c, g.stride_c}};
      for (const auto& [layout, stride] : layouts) {
        KL_CUBLAS(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), s);
        KL_CUBLAS(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                   sizeof(stride)),
                  s);
      }
    }
    cublasLtMatmulPreference_t pref = nullptr;
    KL_CUBLAS(cublasLtMatmulPreferenceCreate(&pref), s);
    KL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt_workspace_bytes_,
                                                   sizeof(lt_workspace_bytes_)),
              s);
    const uint32_t al_a = alignment(g.b), al_b = alignment(g.a), al_c = alignment(g.c);
    KL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)), s);
    KL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)), s);
    KL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)), s);
    KL_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)), s);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    KL_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt_, p->op, p->a, p->b, p->c, p->c, pref, 1, &result, &found), s);
    cublasLtMatmulPreferenceDestroy(pref);
    KL_CHECK(found > 0, s + ": cuBLASLt has no algorithm for this problem");
    p->algo = result.algo;
    plan = p;
  }
  const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
  KL_CUBLAS(cublasLtMatmul(lt_, plan->op, &alpha, g.b, plan->a, g.a, plan->b, &beta, g.c, plan->c, g.c, plan->c,
                           &plan->algo, lt_workspace_, lt_workspace_bytes_, stream_),
            s);
}

namespace {

// linear's GEMM: y [n, m] ← x [n, k] · wᵀ, w [m, k].
GemmArgs linear_args(const Tensor& x, const Tensor& w, const Tensor& y) {
  const int64_t k = w.dim(1), m = w.dim(0), n = k == 0 ? y.numel() / std::max<int64_t>(m, 1) : x.numel() / k;
  KL_CHECK(x.dim(-1) == k && y.numel() == n * m && x.dtype() == w.dtype() &&
               (y.dtype() == x.dtype() || y.dtype() == DType::kF32),
           "linear x " + shapes(x) + " w " + shapes(w) + " y " + shapes(y) + " " + dtype_name(x.dtype()) + "/" +
               dtype_name(w.dtype()) + "->" + dtype_name(y.dtype()));
  GemmArgs g;
  g.m = n;
  g.n = m;
  g.k = k;
  g.a = x.data();
  g.lda = k;
  g.b = w.data();
  g.ldb = k;
  g.b_transposed = true;
  g.c = y.data();
  g.ldc = m;
  g.ab_dtype = x.dtype();
  g.c_dtype = y.dtype();
  return g;
}

}  // namespace

void CudaBackend::linear(const Tensor& x, const Tensor& w, const Tensor& y) { gemm(linear_args(x, w, y), "linear"); }

void CudaBackend::linears(std::span<const Projection> projections) {
  std::vector<GemmArgs> problems;
  for (const Projection& p : projections) problems.push_back(linear_args(p.x, p.w, p.y));
  const bool one_launch = problems.size() <= kGemvMaxProblems &&
                          std::all_of(problems.begin(), problems.end(),
                                      [](const GemmArgs& g) { return gemm_path_fits(GemmPath::kSmallRow, g); });
  if (!one_launch) {
    for (const GemmArgs& g : problems) gemm(g, "linear");
    return;
  }
  launch_gemv(problems, stream_, "linears x " + shapes(projections[0].x) + " (" + std::to_string(problems.size()) +
                                     " projections)");
}

const char* gemm_grouped_path_name(GemmGroupedPath path) { return path_name(path, {"CUTLASS", "cuBLAS"}); }

GemmGroupedPath gemm_grouped_path_for(std::span<const GemmArgs> problems) {
  return gemm_grouped_path_fits(GemmGroupedPath::kCutlass, problems) ? GemmGroupedPath::kCutlass
                                                                      : GemmGroupedPath::kCublas;
}

void gemm_grouped_on(CudaBackend& be, GemmGroupedPath path, std::span<const GemmArgs> problems, const char* what) {
  KL_CHECK(gemm_grouped_path_fits(path, problems), std::string(what) + ": the " + gemm_grouped_path_name(path) +
                                                       " path cannot run this list of " +
                                                       std::to_string(problems.size()) +
                                                       " problems (dtypes, widths or alignment)");
  if (problems.empty()) return;
  const DType ab = problems[0].ab_dtype, c = problems[0].c_dtype;
  for (size_t i = 0; i < problems.size(); ++i) {
    const GemmArgs& g = problems[i];
    KL_CHECK(g.batch == 1 && g.b_transposed && !g.accumulate && g.ab_dtype == ab && g.c_dtype == c && g.m > 0 &&
                 g.n > 0 && g.k > 0 && g.m <= INT_MAX && g.n <= INT_MAX && g.k <= INT_MAX && g.lda <= INT_MAX &&
                 g.ldb <= INT_MAX && g.ldc <= INT_MAX,
             std::string(what) + ": grouped gemm problem " + std::to_string(i) + " m=" + std::to_string(g.m) +
                 " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
                 " (single, Bᵀ, not accumulating, one dtype pair, sizes in int)");
  }
  const std::string shape = std::string(what) + " grouped gemm of " + std::to_string(problems.size()) +
                            " problems, n=" + std::to_string(problems[0].n) + " k=" + std::to_string(problems[0].k);
  switch (path) {
    case GemmGroupedPath::kCutlass:
      be.gemm_grouped_cutlass(problems, shape);
      break;
    case GemmGroupedPath::kCublas:
      be.gemm_grouped_cublas(problems, shape);
      break;
  }
}

void CudaBackend::gemm_grouped(std::span<const GemmArgs> problems, const char* what) {
  gemm_grouped_on(*this, gemm_grouped_path_for(problems), problems, what);
}

void CudaBackend::gemm_grouped_cublas(std::span<const GemmArgs> problems, const std::string& shape) {
  // cublasGemmGroupedBatchedEx reads the matrices' addresses from device memory, so it cannot pick a
  // kernel for their alignment: it assumes 16 bytes. A list with any other address runs problem by
  // problem through cuBLASLt, which is told each address.
  const bool addresses_aligned = std::all_of(problems.begin(), problems.end(), [](const GemmArgs& g) {
    return aligned16(g.a) && aligned16(g.b) && aligned16(g.c);
  });
  if (!addresses_aligned) {
    for (const GemmArgs& g : problems) gemm_on(*this, GemmPath::kCublasLt, g, shape.c_str());
    return;
  }
  const int groups = static_cast<int>(problems.size());
  const DType ab = problems[0].ab_dtype, c = problems[0].c_dtype;
  std::vector<int> m(groups), n(groups), k(groups), lda(groups), ldb(groups), ldc(groups);
  std::vector<int64_t> ptrs(3 * static_cast<size_t>(groups));  // A, B, C of cuBLAS's view, group by group
  for (int i = 0; i < groups; ++i) {
    const GemmArgs& g = problems[i];
    // Column-major: Cᵀ[n, m] = B[n, k] · Aᵀ[k, m], B stored [n, k] row-major = [k, n] column-major, op T.
    m[i] = static_cast<int>(g.n), n[i] = static_cast<int>(g.m), k[i] = static_cast<int>(g.k);
    lda[i] = static_cast<int>(g.ldb), ldb[i] = static_cast<int>(g.lda), ldc[i] = static_cast<int>(g.ldc);
    ptrs[i] = reinterpret_cast<int64_t>(g.b);
    ptrs[groups + i] = reinterpret_cast<int64_t>(g.a);
    ptrs[2 * groups + i] = reinterpret_cast<int64_t>(g.c);
  }
  const Tensor dev = to_device(Tensor::wrap(DType::kI64, {3 * static_cast<int64_t>(groups)}, ptrs.data(), nullptr,
                                            Device::kCpu),
                               DType::kI64);
  const auto* p = dev.data_as<const void* const>();
  const std::vector<cublasOperation_t> ta(groups, CUBLAS_OP_T), tb(groups, CUBLAS_OP_N);
  const std::vector<float> alpha(groups, 1.0f), beta(groups, 0.0f);
  const std::vector<int> one(groups, 1);
  KL_CUBLAS(cublasGemmGroupedBatchedEx(blas_, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(), p,
                                       lt_type(ab), lda.data(), p + groups, lt_type(ab), ldb.data(), beta.data(),
                                       const_cast<void* const*>(p + 2 * groups), lt_type(c), ldc.data(), groups,
                                       one.data(), CUBLAS_COMPUTE_32F),
            shape);
}

}  // namespace klinear::cuda
