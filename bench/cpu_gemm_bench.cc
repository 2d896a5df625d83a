// The CPU backend's GEMM orders side by side: OpenBLAS (GemmOrder::kBlas, the default) and the
// row-stable chains of --batch-invariant (GemmOrder::kRowStable), on the linear shapes of
// Kimi-Linear-48B (D = 2,304: a square projection; the expert shape 2,048 × 2,304) and of the tiny
// fixtures (D = 128), at 1 to 256 rows; the best of several runs of at least 0.2 s each.
// FLOP: 2·m·n·k.
//
// Usage: cpu_gemm_bench   (OMP_NUM_THREADS sets the threads, as for klinear)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/cpu/backend.h"

namespace {

using klinear::cpu::GemmOrder;

double seconds(GemmOrder order, int64_t m, int64_t n, int64_t k, const std::vector<float>& a, const std::vector<float>& b,
               std::vector<float>& c) {
  double best = 1e30;
  for (int run = 0; run < 3; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    int reps = 0;
    double s = 0;
    do {
      klinear::cpu::gemm(order, m, n, k, a.data(), k, b.data(), k, /*b_transposed=*/true, c.data(), n);
      ++reps;
      s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (s < 0.2);
    best = std::min(best, s / reps);
  }
  return best;
}

}  // namespace

int main() {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::printf("threads %d\n| m | n | k | BLAS ms | GFLOP/s | row-stable ms | GFLOP/s | row-stable / BLAS |\n"
              "|---|---|---|---|---|---|---|---|\n",
              omp_get_max_threads());
  struct Shape {
    int64_t n, k;
  };
  for (const Shape s : {Shape{2304, 2304}, Shape{2048, 2304}, Shape{128, 128}, Shape{512, 128}})
    for (const int64_t m : {1, 16, 64, 256}) {
      std::vector<float> a(static_cast<size_t>(m * s.k)), b(static_cast<size_t>(s.n * s.k)), c(static_cast<size_t>(m * s.n));
      for (float& x : a) x = u(rng);
      for (float& x : b) x = u(rng);
      const double blas = seconds(GemmOrder::kBlas, m, s.n, s.k, a, b, c);
      const double stable = seconds(GemmOrder::kRowStable, m, s.n, s.k, a, b, c);
      const double flop = 2.0 * static_cast<double>(m * s.n * s.k);
      std::printf("| %lld | %lld | %lld | %.3f | %.1f | %.3f | %.1f | %.2f |\n", static_cast<long long>(m),
                  static_cast<long long>(s.n), static_cast<long long>(s.k), blas * 1e3, flop / blas / 1e9, stable * 1e3,
                  flop / stable / 1e9, stable / blas);
    }
  return 0;
}
