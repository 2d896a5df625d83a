// linear (y = x·wᵀ) against a double-precision loop on every backend row, for shapes around tile
// edges, one row at inner sizes that are multiples of 8 (CUDA bf16 runs those on gemm.cu's
// small-row kernel: output counts off its 8-column blocks, inner sizes of less than one and of
// several 256-element passes), an F32 output from activation inputs (router logits, the lm_head) and
// an empty inner dimension (y = 0); linears (projections of one input or of their own) over the
// same loop; and, without a GPU, which problems the small-row kernel takes.
// CUDA rows: gemm_grouped (the MoE per-expert GEMMs) against the same loop with each of its kernels
// (CUTLASS's where the list fits it, and cuBLAS's), over lists of 1 to 300 rows per problem, more
// than one tile of n and of k, row strides wider than the rows, 80 problems in one list, and the
// lists CUTLASS must leave to cuBLAS (n or k not multiples of 8, one such problem among good ones,
// a row stride or an address off 16 bytes); and, without a GPU, which lists go to CUTLASS.
// The CPU's row-stable order (GemmOrder::kRowStable, --batch-invariant): bit for bit the plain
// chain per element, s ← s + a·b over k in order, for random shapes (panel and row-block edges,
// k = 0, strides wider than the rows, both layouts of B, alpha and beta).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/backend.h"
#include "backend_cases.h"
#include "test_util.h"
#if KLINEAR_WITH_CUDA
#include "backend/cuda/gemm/gemm.h"
#endif

namespace klinear {
namespace {

class Gemm : public testing::BackendTest {};

TEST_P(Gemm, LinearMatchesLoop) {
  std::mt19937_64 rng(testing::fresh_seed());
  struct Shape3 {
    int64_t n, m, k;
  };
  for (const Shape3 s : {Shape3{1, 17, 33}, Shape3{5, 64, 64}, Shape3{65, 31, 130}, Shape3{3, 8, 0},
                         Shape3{1, 300, 2304}, Shape3{1, 9, 8}, Shape3{1, 1001, 136}, Shape3{1, 37, 520}}) {
    for (DType out_dtype : {act(), DType::kF32}) {
      Tensor x = testing::random_tensor(rng, {s.n, s.k}), w = testing::random_tensor(rng, {s.m, s.k});
      Tensor expect = Tensor::empty(DType::kF32, {s.n, s.m});
      for (int64_t i = 0; i < s.n; ++i)
        for (int64_t j = 0; j < s.m; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < s.k; ++c) acc += double(x.f32()[i * s.k + c]) * w.f32()[j * s.k + c];
          expect.f32()[i * s.m + j] = float(acc);
        }
      Tensor y = poisoned({s.n, s.m}, out_dtype);
      be().linear(dev(x), persistent(w, act()), y);
      const Tensor got = host(y);
      const std::string what = "n " + std::to_string(s.n) + " m " + std::to_string(s.m) + " k " + std::to_string(s.k);
      if (s.k == 0) {
        for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got.f32()[i], 0.0f) << what;
      } else {
        EXPECT_TRUE(testing::all_close(got, expect, tol())) << what;
      }
    }
  }
}

// linears: independent projections of the same rows, each against the same loop. Cases: one row and
// four projections of one x (CUDA bf16: one launch of the small-row kernel, an F32 output among bf16
// ones, outputs that end mid-block), one row and two at the 48B width, one row and two of their own
// inputs of different widths (KDA's f_b and g_b: one launch), one row and five (more than that launch
// takes: a GEMM each), four rows (a GEMM each), one row with k = 33 (not a multiple of 8: a GEMM
// each). Outputs are poisoned first.
TEST_P(Gemm, LinearsMatchLoop) {
  std::mt19937_64 rng(testing::fresh_seed());
  struct Out {
    int64_t m, k;  // the projection's output and input widths
    DType dtype;   // its output's
    int input;     // which of the case's inputs it reads
  };
  struct Case {
    int64_t n;
    std::vector<Out> outs;
  };
  const Case cases[] = {
      {1, {{300, 264, act(), 0}, {17, 264, act(), 0}, {5, 264, DType::kF32, 0}, {64, 264, act(), 0}}},
      {1, {{33, 2304, DType::kF32, 0}, {264, 2304, act(), 0}}},
      {1, {{264, 128, DType::kF32, 0}, {40, 72, act(), 1}}},
      {1, {{8, 64, act(), 0}, {9, 64, act(), 0}, {10, 64, DType::kF32, 0}, {11, 64, act(), 0}, {12, 64, act(), 0}}},
      {4, {{300, 264, act(), 0}, {17, 264, DType::kF32, 0}}},
      {1, {{40, 33, act(), 0}, {7, 33, DType::kF32, 0}}},
  };
  for (const Case& c : cases) {
    const std::string what = "n " + std::to_string(c.n) + " k " + std::to_string(c.outs[0].k) + " projections " +
                             std::to_string(c.outs.size());
    std::vector<Tensor> xs, dxs, expects;
    std::vector<Projection> ps;
    for (const Out& o : c.outs) {
      if (o.input == static_cast<int>(xs.size())) {
        xs.push_back(testing::random_tensor(rng, {c.n, o.k}));
        dxs.push_back(dev(xs.back()));
      }
      const Tensor& x = xs.at(o.input);
      Tensor w = testing::random_tensor(rng, {o.m, o.k});
      Tensor expect = Tensor::empty(DType::kF32, {c.n, o.m});
      for (int64_t i = 0; i < c.n; ++i)
        for (int64_t j = 0; j < o.m; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < o.k; ++e) acc += double(x.f32()[i * o.k + e]) * w.f32()[j * o.k + e];
          expect.f32()[i * o.m + j] = float(acc);
        }
      expects.push_back(expect);
      ps.push_back(Projection{dxs.at(o.input), persistent(w, act()), poisoned({c.n, o.m}, o.dtype)});
    }
    be().linears(ps);
    for (size_t i = 0; i < ps.size(); ++i)
      EXPECT_TRUE(testing::all_close(host(ps[i].y), expects[i], tol())) << what << ": projection " << i;
  }
}

#if KLINEAR_WITH_CUDA
struct GroupedCase {
  const char* name;
  std::vector<std::array<int64_t, 3>> problems;  // (m, n, k) of each problem
  int64_t pad = 0;    // extra elements per row: lda = k + pad, ldc = n + pad
  int64_t shift = 0;  // A starts this many elements into its buffer (256-byte aligned)
  bool cutlass = true;  // whether the BF16 row's list fits CUTLASS's kernel
};

std::vector<GroupedCase> grouped_cases() {
  std::vector<GroupedCase> cases = {
      {"m 1 7 64 300, two n tiles, k tail", {{1, 264, 200}, {7, 264, 200}, {64, 264, 200}, {300, 264, 200}}},
      {"row strides wider than rows", {{5, 64, 64}, {130, 40, 1024}, {33, 128, 72}}, 8},
      {"n and k not multiples of 8", {{7, 36, 50}, {64, 17, 33}, {300, 20, 12}}, 0, 0, false},
      {"one odd problem among good ones", {{64, 264, 200}, {7, 36, 200}, {1, 264, 200}}, 0, 0, false},
      {"row stride not a multiple of 8", {{64, 64, 64}, {9, 64, 64}}, 4, 0, false},
      {"A 8 bytes off 16", {{64, 64, 64}, {9, 64, 64}}, 0, 4, false},
  };
  GroupedCase many{"80 problems of 1 to 300 rows", {}};
  for (int64_t i = 0; i < 80; ++i) many.problems.push_back({1 + (i * 37) % 300, 264, 72});
  cases.push_back(many);
  return cases;
}

// The host rules of which kernel takes a GEMM (they run without a GPU): a row changes a good BF16
// problem, and says whether the kernel still takes it.
struct FitsRow {
  const char* name;
  std::function<void(cuda::GemmArgs&)> change;
  bool fits;
};
void* at(uintptr_t address) { return reinterpret_cast<void*>(address); }
// A BF16 problem [m, k]·[n, k]ᵀ at 16-byte aligned addresses, rows packed.
cuda::GemmArgs bf16_problem(int64_t m, int64_t n, int64_t k) {
  cuda::GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.a = at(0x10000), g.lda = k;
  g.b = at(0x20000), g.ldb = k;
  g.c = at(0x30000), g.ldc = n;
  g.ab_dtype = g.c_dtype = DType::kBF16;
  return g;
}

TEST(CpuGemm, RowStableIsOneChainPerElement) {
  std::mt19937_64 rng(testing::fresh_seed());
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int t = 0; t < 200; ++t) {
    const int64_t m = t == 0 ? 130 : 1 + static_cast<int64_t>(rng() % 9);
    const int64_t n = t == 0 ? 200 : 1 + static_cast<int64_t>(rng() % 70);
    const int64_t k = t == 0 ? 257 : static_cast<int64_t>(rng() % 90);
    const bool bt = rng() % 2 == 0;
    const float beta = rng() % 2 ? 0.0f : 0.5f, alpha = rng() % 2 ? 1.0f : -1.5f;
    const int64_t lda = k + static_cast<int64_t>(rng() % 3), ldb = (bt ? k : n) + static_cast<int64_t>(rng() % 3);
    const int64_t ldc = n + static_cast<int64_t>(rng() % 3);
    std::vector<float> a(static_cast<size_t>(m * lda)), b(static_cast<size_t>((bt ? n : k) * ldb)),
        c(static_cast<size_t>(m * ldc));
    for (auto* v : {&a, &b, &c})
      for (float& x : *v) x = u(rng);
    std::vector<float> want = c;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        float s = 0.0f;
        for (int64_t l = 0; l < k; ++l) s = s + a[i * lda + l] * (bt ? b[j * ldb + l] : b[l * ldb + j]);
        float& o = want[i * ldc + j];
        o = beta == 0.0f ? alpha * s : alpha * s + beta * o;
      }
    cpu::gemm(cpu::GemmOrder::kRowStable, m, n, k, a.data(), lda, b.data(), ldb, bt, c.data(), ldc, beta, alpha);
    ASSERT_EQ(std::memcmp(c.data(), want.data(), c.size() * sizeof(float)), 0)
        << "m " << m << " n " << n << " k " << k << (bt ? " Bt" : " B") << " beta " << beta << " alpha " << alpha;
  }
}

// gemm's small-row kernel; the rows change the batch-1 decode's q/k/v projection of the 48B model.
TEST(GemmPath, SmallRowKernelTakesOneRowBf16Problems) {
  const FitsRow rows[] = {
      {"the same shape", [](cuda::GemmArgs&) {}, true},
      {"an F32 C, odd n", [](cuda::GemmArgs& g) { g.c_dtype = DType::kF32, g.n = g.ldc = 37; }, true},
      {"wider row strides", [](cuda::GemmArgs& g) { g.lda += 8, g.ldb += 16, g.ldc += 3; }, true},
      {"C 8 bytes off 16 (written a value at a time)", [](cuda::GemmArgs& g) { g.c = at(0x30008); }, true},
      {"2 rows", [](cuda::GemmArgs& g) { g.m = 2; }, false},
      {"F32 operands", [](cuda::GemmArgs& g) { g.ab_dtype = g.c_dtype = DType::kF32; }, false},
      {"k 2300", [](cuda::GemmArgs& g) { g.k = 2300; }, false},
      {"ldb + 4", [](cuda::GemmArgs& g) { g.ldb += 4; }, false},
      {"A 8 bytes off 16", [](cuda::GemmArgs& g) { g.a = at(0x10008); }, false},
      {"B 2 bytes off 16", [](cuda::GemmArgs& g) { g.b = at(0x20002); }, false},
      {"accumulating", [](cuda::GemmArgs& g) { g.accumulate = true; }, false},
      {"batched", [](cuda::GemmArgs& g) { g.batch = 2; }, false},
      {"B not transposed", [](cuda::GemmArgs& g) { g.b_transposed = false; }, false},
  };
  for (const FitsRow& r : rows) {
    cuda::GemmArgs g = bf16_problem(1, 12288, 2304);
    r.change(g);
    EXPECT_EQ(cuda::gemm_path_fits(cuda::GemmPath::kSmallRow, g), r.fits) << r.name;
  }
}

// gemm_grouped's CUTLASS kernel; the rows change the second problem of a list whose first is an
// expert's gate/up GEMM of the 48B model.
TEST(GemmGroupedPath, CutlassTakesOnlyBf16ListsTmaCanAddress) {
  const cuda::GemmArgs good = bf16_problem(64, 2048, 2304);
  const FitsRow rows[] = {
      {"the same shape", [](cuda::GemmArgs&) {}, true},
      {"one row, another shape", [](cuda::GemmArgs& g) { g.m = 1, g.n = 2304, g.k = 1024, g.lda = g.ldb = 1024, g.ldc = 2304; }, true},
      {"odd m (rows are free)", [](cuda::GemmArgs& g) { g.m = 301; }, true},
      {"wider row strides", [](cuda::GemmArgs& g) { g.lda += 8, g.ldb += 16, g.ldc += 8; }, true},
      {"F32 operands and C", [](cuda::GemmArgs& g) { g.ab_dtype = g.c_dtype = DType::kF32; }, false},
      {"F32 C", [](cuda::GemmArgs& g) { g.c_dtype = DType::kF32; }, false},
      {"n 36", [](cuda::GemmArgs& g) { g.n = g.ldc = 36; }, false},
      {"k 50", [](cuda::GemmArgs& g) { g.k = g.lda = g.ldb = 50; }, false},
      {"lda + 4", [](cuda::GemmArgs& g) { g.lda += 4; }, false},
      {"ldb + 2", [](cuda::GemmArgs& g) { g.ldb += 2; }, false},
      {"ldc + 1", [](cuda::GemmArgs& g) { g.ldc += 1; }, false},
      {"A 8 bytes off 16", [](cuda::GemmArgs& g) { g.a = at(0x10008); }, false},
      {"B 2 bytes off 16", [](cuda::GemmArgs& g) { g.b = at(0x20002); }, false},
      {"C 8 bytes off 16", [](cuda::GemmArgs& g) { g.c = at(0x30008); }, false},
  };
  for (const FitsRow& r : rows) {
    std::vector<cuda::GemmArgs> list = {good, good};
    r.change(list[1]);
    EXPECT_EQ(cuda::gemm_grouped_path_fits(cuda::GemmGroupedPath::kCutlass, list), r.fits) << r.name;
  }
  EXPECT_FALSE(cuda::gemm_grouped_path_fits(cuda::GemmGroupedPath::kCutlass, {})) << "an empty list";
}

TEST_P(Gemm, GroupedMatchesLoop) {
  auto* cuda = dynamic_cast<cuda::CudaBackend*>(&be());
  if (cuda == nullptr) GTEST_SKIP() << "gemm_grouped is the CUDA backend's";
  std::mt19937_64 rng(testing::fresh_seed());
  const size_t es = dtype_size(act());
  for (const GroupedCase& c : grouped_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<cuda::GemmArgs> args;
    std::vector<Tensor> keep, outs, expects;
    for (const auto& [m, n, k] : c.problems) {
      const int64_t lda = k + c.pad, ldc = n + c.pad;
      const Tensor a = testing::random_tensor(rng, {c.shift + m * lda}), b = testing::random_tensor(rng, {n, k});
      Tensor expect = Tensor::empty(DType::kF32, {m, n});
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t t = 0; t < k; ++t) acc += double(a.f32()[c.shift + i * lda + t]) * b.f32()[j * k + t];
          expect.f32()[i * n + j] = float(acc);
        }
      const Tensor da = dev(a), db = persistent(b, act());
      cuda::GemmArgs& g = args.emplace_back();
      g.m = m, g.n = n, g.k = k;
      g.a = static_cast<const char*>(da.data()) + c.shift * es, g.lda = lda;
      g.b = db.data(), g.ldb = k;
      outs.push_back(be().alloc(act(), {m, ldc}));
      g.c = outs.back().data(), g.ldc = ldc;
      g.ab_dtype = act(), g.c_dtype = act();
      keep.push_back(da), keep.push_back(db), expects.push_back(expect);
    }
    EXPECT_EQ(cuda::gemm_grouped_path_fits(cuda::GemmGroupedPath::kCutlass, args), c.cutlass && act() == DType::kBF16);
    for (const auto path : {cuda::GemmGroupedPath::kCutlass, cuda::GemmGroupedPath::kCublas}) {
      if (!cuda::gemm_grouped_path_fits(path, args)) continue;
      SCOPED_TRACE(cuda::gemm_grouped_path_name(path));
      for (const Tensor& o : outs) be().fill(o, std::numeric_limits<float>::quiet_NaN());
      cuda::gemm_grouped_on(*cuda, path, args, "grouped test");
      for (size_t p = 0; p < args.size(); ++p) {
        const int64_t m = args[p].m, n = args[p].n, ldc = args[p].ldc;
        const Tensor got = host(outs[p]);
        Tensor rows = Tensor::empty(DType::kF32, {m, n});
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            const float v = got.f32()[i * ldc + j];
            if (j < n)
              rows.f32()[i * n + j] = v;
            else
              ASSERT_TRUE(std::isnan(v)) << "problem " << p << " wrote row " << i << " column " << j << " past n";
          }
        EXPECT_TRUE(testing::all_close(rows, expects[p], tol()))
            << "problem " << p << " m " << m << " n " << n << " k " << args[p].k;
      }
    }
  }
}
#endif

KL_BACKEND_SUITE(Gemm);

}  // namespace
}  // namespace klinear
