// CPU GEMM: the one OpenBLAS caller. linear() is y = x · wᵀ with PyTorch's [out, in] weights.
#include <cblas.h>

#include "backend/cpu/backend.h"

namespace klinear::cpu {

void gemm(GemmOrder order, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
          bool b_transposed, float* c, int64_t ldc, float beta, float alpha) {
  if (m == 0 || n == 0) return;
  if (order == GemmOrder::kRowStable) {
    // One sum per element over k in index order (no reassociation: the build has no -ffast-math).
    const int64_t b_row = b_transposed ? ldb : 1, b_col = b_transposed ? 1 : ldb;
#pragma omp parallel for if (m * n * k > (1 << 16))
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float sum = 0.0f;
        for (int64_t l = 0; l < k; ++l) sum += a[i * lda + l] * b[j * b_row + l * b_col];
        float& out = c[i * ldc + j];
        out = beta == 0.0f ? alpha * sum : alpha * sum + beta * out;
      }
    return;
  }
  if (k == 0) {  // an empty product (e.g. no rope part): C ← beta·C; BLAS would reject ld = 0
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

void CpuBackend::linear(const Tensor& x, const Tensor& w, const Tensor& y) {
  Shape lead = x.shape();
  lead.pop_back();
  const int64_t k = w.dim(1), m = w.dim(0), n = shape_numel(lead);
  KL_CHECK(x.dim(-1) == k && y.numel() == n * m,
           "linear x " + shape_to_string(x.shape()) + " w " + shape_to_string(w.shape()) + " y " + shape_to_string(y.shape()));
  gemm(gemm_order_, n, m, k, x.f32(), k, w.f32(), k, /*b_transposed=*/true, y.f32(), m);
}

}  // namespace klinear::cpu
