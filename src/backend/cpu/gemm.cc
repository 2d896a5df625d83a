// CPU GEMM: the one OpenBLAS caller. linear() is y = x · wᵀ with PyTorch's [out, in] weights.
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/backend.h"

namespace klinear::cpu {

namespace {

constexpr int64_t kPanel = 16;  // columns whose chains run side by side (four SSE vectors)
constexpr int64_t kRowBlock = 2;  // rows of A a panel's pass takes at once

// GemmOrder::kRowStable: c[i][j] ← alpha · s + beta · c[i][j] (alpha · s when beta = 0) with s the one
// chain s ← s + a[i][l] · op(b)[l][j] over l = 0 .. k−1 from 0 (a product, then an add: no
// reassociation, and the build has no -ffast-math or FMA contraction), so an element depends on its
// row of A, its column of op(B), k, alpha and beta alone. For speed without touching any chain,
// each thread takes panels of kPanel columns: op(B)'s panel copied to [k][kPanel] (zeros past n),
// then each kRowBlock rows of A run their kRowBlock · kPanel chains side by side, which the
// compiler vectorises across the panel's columns; with one row block only (decode) the chains
// read op(B) in place, independent chains the core overlaps.
void row_stable_gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                     bool b_transposed, float* c, int64_t ldc, float beta, float alpha) {
  const int64_t panels = (n + kPanel - 1) / kPanel;
  // c's rows [i0, i0 + rows) and columns [j0, j0 + width) from their chains.
  auto store = [&](const float (&acc)[kRowBlock][kPanel], int64_t i0, int64_t rows, int64_t j0, int64_t width) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t jj = 0; jj < width; ++jj) {
        float& out = c[(i0 + r) * ldc + j0 + jj];
        out = beta == 0.0f ? alpha * acc[r][jj] : alpha * acc[r][jj] + beta * out;
      }
  };
#pragma omp parallel if (m * n * k > (1 << 16))
  {
    // One row block (decode): no copy, the chains read op(B) where it lies.
    const bool pack = m > kRowBlock;
    std::vector<float> panel(pack ? static_cast<size_t>(k * kPanel) : 0);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t j0 = p * kPanel, width = std::min(kPanel, n - j0);
      auto op_b = [&](int64_t l, int64_t j) { return b_transposed ? b[j * ldb + l] : b[l * ldb + j]; };
      if (!pack) {
        float acc[kRowBlock][kPanel] = {};
        for (int64_t l = 0; l < k; ++l)
          for (int64_t r = 0; r < m; ++r) {
            const float ai = a[r * lda + l];
            for (int64_t jj = 0; jj < width; ++jj) acc[r][jj] = acc[r][jj] + ai * op_b(l, j0 + jj);
          }
        store(acc, 0, m, j0, width);
        continue;
      }
      for (int64_t l = 0; l < k; ++l)
        for (int64_t jj = 0; jj < kPanel; ++jj) panel[l * kPanel + jj] = jj < width ? op_b(l, j0 + jj) : 0.0f;
      for (int64_t i0 = 0; i0 < m; i0 += kRowBlock) {
        const int64_t rows = std::min(kRowBlock, m - i0);
        float acc[kRowBlock][kPanel] = {};
        for (int64_t l = 0; l < k; ++l) {
          const float* pl = panel.data() + l * kPanel;
          for (int64_t r = 0; r < kRowBlock; ++r) {
            const float ai = r < rows ? a[(i0 + r) * lda + l] : 0.0f;
            for (int64_t jj = 0; jj < kPanel; ++jj) acc[r][jj] = acc[r][jj] + ai * pl[jj];
          }
        }
        store(acc, i0, rows, j0, width);
      }
    }
  }
}

}  // namespace

void gemm(GemmOrder order, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
          bool b_transposed, float* c, int64_t ldc, float beta, float alpha) {
  if (m == 0 || n == 0) return;
  if (order == GemmOrder::kRowStable) {
    row_stable_gemm(m, n, k, a, lda, b, ldb, b_transposed, c, ldc, beta, alpha);
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
