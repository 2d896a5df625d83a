// MLA attention over the paged latent cache on every backend row: the new positions written by
// mla_cache_write (their latent RMS-normalised on the way), then the expanded (prefill) and
// absorbed (decode) forms against a plain per-head, per-position reference, over a case table of steps (decode rows, multi-token rows with
// cached positions, several sequences with scattered pages, q-head widths with and without a rope
// part, page sizes that do and do not divide the lengths, and the model's latent shape 512 + 64,
// which the CUDA bf16 decode runs on tensor cores). Outputs are poisoned before each op.
// CUDA rows also run the prefill on mla.cu's own kernels (AttentionKernels::kOwn) and the decode on each
// MlaDecodePath that fits (FlashInfer's Hopper kernel and mla.cu's absorbed one for the bf16 rows of
// latent 512 + 64, `attend` for every row), and check which rows FlashInfer's prefill
// takes: every bf16 row of the Kimi-Linear-48B head shape (H = 32, q/k 128 + 64, v 128, latent
// 512 + 64), 1 to 1,000 new tokens with and without cached ones, several sequences of different
// lengths in one step.
#include <gtest/gtest.h>

#include <cstring>

#include "backend_cases.h"
#include "test_util.h"
#if KLINEAR_WITH_CUDA
#include "backend/cuda/mla/mla.h"
#endif

namespace klinear {
namespace {

struct MlaCase {
  std::vector<int32_t> lens, cached;
  int64_t heads, nope, rope, v, latent, page_size;
};

class MlaOps : public testing::BackendTest {};

// out[t, h] = Σ_τ≤past+t softmax(scale · q[t,h]·[k_n[τ,h] ‖ k_r[τ]]) · val[τ, h], with
// [k_n ‖ val] = kv_b · latent[τ], for one sequence: q [T, H, n+r], latent [Tc, c], k_r [Tc, r].
Tensor reference(const Tensor& q, const Tensor& latent, const Tensor& k_r, const Tensor& kv_b, int64_t nope, int64_t vd,
                 float scale) {
  const int64_t t = q.dim(0), heads = q.dim(1), tc = latent.dim(0), c = latent.dim(1), r = k_r.dim(1);
  std::vector<double> kv(static_cast<size_t>(tc * heads * (nope + vd)));
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t j = 0; j < tc; ++j)
    for (int64_t o = 0; o < heads * (nope + vd); ++o) {
      double acc = 0;
      for (int64_t x = 0; x < c; ++x) acc += double(kv_b.f32()[o * c + x]) * latent.f32()[j * c + x];
      kv[j * heads * (nope + vd) + o] = acc;
    }
  Tensor out = Tensor::zeros(DType::kF32, {t, heads, vd});
#pragma omp parallel for schedule(dynamic, 8)
  for (int64_t i = 0; i < t; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      const float* qi = q.f32() + (i * heads + h) * (nope + r);
      const int64_t visible = tc - t + i + 1;
      std::vector<double> s(visible);
      double mx = -1e300;
      for (int64_t j = 0; j < visible; ++j) {
        const double* kj = kv.data() + (j * heads + h) * (nope + vd);
        double dot = 0;
        for (int64_t x = 0; x < nope; ++x) dot += qi[x] * kj[x];
        for (int64_t x = 0; x < r; ++x) dot += double(qi[nope + x]) * k_r.f32()[j * r + x];
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      double z = 0;
      for (int64_t j = 0; j < visible; ++j) z += (s[j] = std::exp(s[j] - mx));
      for (int64_t x = 0; x < vd; ++x) {
        double acc = 0;
        for (int64_t j = 0; j < visible; ++j) acc += s[j] / z * kv[(j * heads + h) * (nope + vd) + nope + x];
        out.f32()[(i * heads + h) * vd + x] = float(acc);
      }
    }
  return out;
}

TEST_P(MlaOps, CacheWriteThenBothFormsMatchReference) {
  const std::vector<MlaCase> cases = {
      {{1}, {0}, 2, 16, 8, 16, 32, 64},
      {{1}, {37}, 4, 32, 16, 32, 64, 16},
      {{9}, {0}, 3, 8, 8, 12, 24, 4},
      {{25}, {40}, 2, 16, 0, 16, 32, 64},
      {{70}, {5}, 4, 32, 16, 32, 64, 64},
      {{1, 13, 1, 64}, {100, 0, 3, 64}, 2, 16, 8, 16, 32, 7},
      // Long cached contexts (a GPU decode splits them over blocks) beside a short one.
      {{1, 1, 2}, {1000, 70, 0}, 2, 16, 8, 16, 32, 16},
      // The latent shape 512 + 64: one key; a head count past one 32-head tile and not a multiple
      // of it beside keys in one page and in exactly 65; several query rows of one sequence, 127 and
      // 1004 keys (not multiples of the 64-key tile) over scattered pages of 16; a long context split
      // over many blocks.
      {{1}, {0}, 3, 16, 64, 16, 512, 64},
      {{1, 1, 1}, {1200, 0, 64}, 36, 8, 64, 8, 512, 64},
      {{1, 4, 2}, {126, 1000, 0}, 4, 16, 64, 16, 512, 16},
      {{1}, {4999}, 2, 8, 64, 8, 512, 64},
      // The head shape q/k 128 + 64, v 128, which the CUDA bf16 prefill runs on tensor cores: query
      // tiles of 64 rows with a partial last one, prefill rows after cached positions, one row
      // alone; with the latent 512 + 64 both forms take their tensor-core kernels.
      {{130, 1, 64}, {0, 1000, 7}, 3, 128, 64, 128, 64, 16},
      {{1}, {0}, 1, 128, 64, 128, 32, 64},
      {{1, 70}, {63, 1000}, 2, 128, 64, 128, 512, 64},
      // The 48B shape (H = 32), which the CUDA bf16 prefill runs on FlashInfer's kernel (128-row
      // query tiles, 128-key tiles): one row, one short of a 64-row tile, one tile, one past it,
      // 1,000 rows (eight 128-row tiles, the last partial) after 24 cached positions; then several
      // sequences of different lengths behind cached positions (none, a page, one, 127 and 500).
      {{1}, {0}, 32, 128, 64, 128, 512, 64},
      {{63}, {0}, 32, 128, 64, 128, 512, 64},
      {{64}, {0}, 32, 128, 64, 128, 512, 64},
      {{65}, {0}, 32, 128, 64, 128, 512, 64},
      {{1000}, {24}, 32, 128, 64, 128, 512, 64},
      {{1, 63, 64, 65, 200}, {500, 0, 64, 1, 127}, 32, 128, 64, 128, 512, 64},
  };
  std::mt19937_64 rng(testing::fresh_seed());
  for (const MlaCase& c : cases) {
    const int64_t width = c.latent + c.rope;
    int64_t pages = 3;  // a few more than the sequences use
    for (size_t b = 0; b < c.lens.size(); ++b) pages += (c.cached[b] + c.lens[b] + c.page_size - 1) / c.page_size;
    SeqLayout layout = testing::make_layout(c.lens, c.cached, std::vector<int32_t>(c.lens.size(), 0), c.page_size, pages, rng);
    be().upload_layout(layout);
    const int64_t n = layout.num_rows(), B = layout.num_seqs();
    SCOPED_TRACE("case with " + std::to_string(B) + " sequences, " + std::to_string(n) + " rows, page " +
                 std::to_string(c.page_size));
    Tensor q = testing::random_tensor(rng, {n, c.heads, c.nope + c.rope});
    Tensor kv_b = testing::random_tensor(rng, {c.heads * (c.nope + c.v), c.latent}, -0.3f, 0.3f);
    // Every position of every sequence: [latent ‖ k_r]. Cached ones go into the pages on the host,
    // new ones through mla_cache_write, which normalises their latent (RMSNorm with `norm`, eps
    // 1e-6: the reference's rows hold it normalised in double, then rounded as the pages store it);
    // unused page rows stay NaN.
    const float eps = 1e-6f;
    Tensor norm = testing::random_tensor(rng, {c.latent}, 0.5f, 1.5f);
    Tensor pool = Tensor::empty(DType::kF32, {pages, c.page_size, width});
    std::fill(pool.f32(), pool.f32() + pool.numel(), std::numeric_limits<float>::quiet_NaN());
    std::vector<Tensor> seq_rows;
    Tensor new_rows = Tensor::empty(DType::kF32, {n, width});
    // The rows as the backend holds them (bf16 rows: rounded): the reference normalises those values.
    const Tensor held_norm = host(dev(norm));
    for (int64_t b = 0; b < B; ++b) {
      const int64_t tc = c.cached[b] + c.lens[b];
      Tensor all = host(dev(testing::random_tensor(rng, {tc, width})));
      for (int64_t p = 0; p < tc; ++p) {
        float* src = all.f32() + p * width;
        if (p < c.cached[b]) {
          const int32_t page = layout.page_table[b * layout.max_pages + p / c.page_size];
          std::memcpy(pool.f32() + (page * c.page_size + p % c.page_size) * width, src, width * sizeof(float));
        } else {
          std::memcpy(new_rows.f32() + (layout.cu_seqlens[b] + p - c.cached[b]) * width, src, width * sizeof(float));
          double ss = 0;
          for (int64_t j = 0; j < c.latent; ++j) ss += double(src[j]) * src[j];
          const double s = 1.0 / std::sqrt(ss / double(c.latent) + eps);
          for (int64_t j = 0; j < c.latent; ++j) {  // as the pages hold it: rounded once to their dtype
            const float v = float(src[j] * s * held_norm.f32()[j]);
            src[j] = act() == DType::kBF16 ? bf16_to_f32(f32_to_bf16(v)) : v;
          }
        }
      }
      seq_rows.push_back(all);
    }
    Tensor dpages = persistent(pool, act());
    be().mla_cache_write(dev(new_rows), dev(norm), eps, dpages, layout);
    const float scale = 1.0f / std::sqrt(float(c.nope + c.rope));
    Tensor expect = Tensor::empty(DType::kF32, {n, c.heads, c.v});
    for (int64_t b = 0; b < B; ++b) {
      const int64_t tc = c.cached[b] + c.lens[b], r0 = layout.cu_seqlens[b];
      Tensor latent = Tensor::empty(DType::kF32, {tc, c.latent}), k_r = Tensor::empty(DType::kF32, {tc, c.rope});
      for (int64_t p = 0; p < tc; ++p) {
        std::memcpy(latent.f32() + p * c.latent, seq_rows[b].f32() + p * width, c.latent * sizeof(float));
        std::memcpy(k_r.f32() + p * c.rope, seq_rows[b].f32() + p * width + c.latent, c.rope * sizeof(float));
      }
      const Tensor o = reference(q.rows(r0, r0 + c.lens[b]), latent, k_r, kv_b, c.nope, c.v, scale);
      std::memcpy(expect.f32() + r0 * c.heads * c.v, o.f32(), o.nbytes());
    }
    const Tensor dq = dev(q), dkv_b = persistent(kv_b, act());
    Tensor expanded = poisoned({n, c.heads, c.v}), absorbed = poisoned({n, c.heads, c.v});
    be().mla_prefill(MlaArgs{dq, dpages, dkv_b, scale, expanded}, layout);
    be().mla_decode(MlaArgs{dq, dpages, dkv_b, scale, absorbed}, layout);
    // The absorbed form stores two more intermediates in the activation dtype than the expanded
    // one (q_n·W_UK and the latent output before W_UV; the 48B shape's 1,000-key rows measured a
    // worst row of 0.0203 in bf16 against the op bound of 0.02 once in ~10 runs).
    const double absorbed_tol = tol(testing::kOp.plus_storage(2));
    EXPECT_TRUE(testing::all_close(host(expanded), expect, tol())) << "prefill (expanded)";
    EXPECT_TRUE(testing::all_close(host(absorbed), expect, absorbed_tol)) << "decode (absorbed)";
#if KLINEAR_WITH_CUDA
    if (auto* cuda = dynamic_cast<cuda::CudaBackend*>(&be())) {
      // bf16 rows of the head shape q/k 128 + 64, v 128 (the 48B rows among them) run FlashInfer's.
      EXPECT_EQ(cuda::mla_prefill_path_fits(cuda::MlaPrefillPath::kFlashInfer, act(), c.nope, c.rope, c.v, layout),
                act() == DType::kBF16 && c.nope == 128 && c.rope == 64 && c.v == 128)
          << "which rows FlashInfer's kernel takes";
      Tensor own = poisoned({n, c.heads, c.v});
      const auto own_path = cuda::mla_prefill_path_for(AttentionKernels::kOwn, act(), c.nope, c.rope, c.v, layout);
      cuda::mla_prefill_on(*cuda, own_path, MlaArgs{dq, dpages, dkv_b, scale, own}, layout);
      EXPECT_TRUE(testing::all_close(host(own), expect, tol())) << "prefill (expanded), mla.cu's kernels forced";
      for (const auto path :
           {cuda::MlaDecodePath::kFlashInfer, cuda::MlaDecodePath::kAbsorbed, cuda::MlaDecodePath::kAttend}) {
        if (!cuda::mla_decode_path_fits(path, act(), c.latent, c.rope)) continue;
        Tensor named = poisoned({n, c.heads, c.v});
        cuda::mla_decode_on(*cuda, path, MlaArgs{dq, dpages, dkv_b, scale, named}, layout);
        EXPECT_TRUE(testing::all_close(host(named), expect, absorbed_tol))
            << "decode (absorbed) on the " << cuda::mla_decode_path_name(path) << " path";
      }
    }
#endif
  }
}

#if KLINEAR_WITH_CUDA
// Which steps FlashInfer's kernel takes (a host decision: runs without a GPU too).
TEST(MlaPrefillSm90, FitsOnlyTheCompiledShape) {
  std::mt19937_64 rng(1);
  const SeqLayout step = testing::make_layout({8192}, {0}, {0}, 64, 130, rng);
  const auto flashinfer_fits = [](const auto&... step_shape) {
    return cuda::mla_prefill_path_fits(cuda::MlaPrefillPath::kFlashInfer, step_shape...);
  };
  EXPECT_TRUE(flashinfer_fits(DType::kBF16, 128, 64, 128, step)) << "the 48B shape in bf16";
  EXPECT_FALSE(flashinfer_fits(DType::kF32, 128, 64, 128, step)) << "the F32 exact mode";
  EXPECT_FALSE(flashinfer_fits(DType::kBF16, 64, 64, 128, step)) << "q/k 64 + 64";
  EXPECT_FALSE(flashinfer_fits(DType::kBF16, 128, 0, 128, step)) << "no rope part";
  EXPECT_FALSE(flashinfer_fits(DType::kBF16, 128, 64, 64, step)) << "v 64";
  // FlashInfer plans ceil(rows / 128) + B − 1 tiles per head; past 4,096 it picks a scheduler not
  // compiled here.
  // B one-row sequences: ceil(B / 128) + B − 1 tiles, 4,096 at B = 4,065.
  const auto one_row_each = [&](int seqs) {
    return testing::make_layout(std::vector<int32_t>(seqs, 1), std::vector<int32_t>(seqs, 0),
                                std::vector<int32_t>(seqs, 0), 64, seqs, rng);
  };
  EXPECT_TRUE(flashinfer_fits(DType::kBF16, 128, 64, 128, one_row_each(4065))) << "4,065 sequences";
  EXPECT_FALSE(flashinfer_fits(DType::kBF16, 128, 64, 128, one_row_each(4066))) << "4,066 sequences";
}
#endif

KL_BACKEND_SUITE(MlaOps);

}  // namespace
}  // namespace klinear
