// CPU MLA attention (MODEL.md 5): the paged latent cache write, and the expanded prefill form and the
// absorbed decode form over it, one sequence at a time: the sequence's positions are gathered from
// its pages into one [Tc, c+r] block first. Queries are the last T of Tc positions (causal: query i
// sees keys 0 .. Tc−T+i). Softmax in fp32; per-head GEMMs through gemm() with strided operands.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/backend.h"

namespace klinear::cpu {

void causal_softmax(float* scores, int64_t t, int64_t tc) {
  const int64_t past = tc - t;
  for (int64_t i = 0; i < t; ++i) {
    float* row = scores + i * tc;
    const int64_t visible = past + i + 1;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, row[j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < visible; ++j) sum += (row[j] = std::exp(row[j] - mx));
    for (int64_t j = 0; j < visible; ++j) row[j] /= sum;
    for (int64_t j = visible; j < tc; ++j) row[j] = 0.0f;
  }
}

namespace {

// Expanded form: kv [Tc, H, n+v] = kv_b_proj(latent), k_r [Tc, r].
void attention_expanded(GemmOrder order, const Tensor& q, const Tensor& kv, const Tensor& k_r, float scale,
                        const Tensor& out) {
  const int64_t t = q.dim(0), heads = q.dim(1), qk = q.dim(2), tc = kv.dim(0), r = k_r.dim(1), n = qk - r;
  const int64_t vd = kv.dim(2) - n;
  KL_CHECK(kv.dim(1) == heads && k_r.dim(0) == tc && tc >= t && out.shape() == Shape({t, heads, vd}),
           "mla_attention shapes q " + shape_to_string(q.shape()) + " kv " + shape_to_string(kv.shape()) + " k_r " +
               shape_to_string(k_r.shape()));
#pragma omp parallel for
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<float> key(tc * qk), scores(t * tc);
    for (int64_t j = 0; j < tc; ++j) {
      std::copy_n(kv.f32() + (j * heads + h) * (n + vd), n, key.data() + j * qk);
      std::copy_n(k_r.f32() + j * r, r, key.data() + j * qk + n);
    }
    gemm(order, t, tc, qk, q.f32() + h * qk, heads * qk, key.data(), qk, /*b_transposed=*/true, scores.data(), tc);
    for (float& x : scores) x *= scale;
    causal_softmax(scores.data(), t, tc);
    gemm(order, t, vd, tc, scores.data(), tc, kv.f32() + h * (n + vd) + n, heads * (n + vd), /*b_transposed=*/false,
         out.f32() + h * vd, heads * vd);
  }
}

// Per head: q_lat = q_n·W_UK [T, c]; scores = (q_lat·latentᵀ + q_r·k_rᵀ)·scale; o_lat = P·latent;
// out = o_lat·W_UVᵀ, with W_UK = kv_b rows h(n+v)+[0,n) and W_UV = rows h(n+v)+n+[0,v).
void attention_absorbed(GemmOrder order, const Tensor& q, const Tensor& latent, const Tensor& k_r, const Tensor& kv_b,
                        float scale, const Tensor& out) {
  const int64_t t = q.dim(0), heads = q.dim(1), qk = q.dim(2), tc = latent.dim(0), c = latent.dim(1);
  const int64_t r = k_r.dim(1), n = qk - r, vd = out.dim(2);
  KL_CHECK(k_r.dim(0) == tc && kv_b.dim(0) == heads * (n + vd) && kv_b.dim(1) == c && tc >= t,
           "mla_attention_absorbed shapes");
#pragma omp parallel for
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<float> q_lat(t * c), scores(t * tc), o_lat(t * c);
    const float* w_uk = kv_b.f32() + h * (n + vd) * c;
    const float* w_uv = w_uk + n * c;
    gemm(order, t, c, n, q.f32() + h * qk, heads * qk, w_uk, c, /*b_transposed=*/false, q_lat.data(), c);
    gemm(order, t, tc, c, q_lat.data(), c, latent.f32(), c, /*b_transposed=*/true, scores.data(), tc);
    gemm(order, t, tc, r, q.f32() + h * qk + n, heads * qk, k_r.f32(), r, /*b_transposed=*/true, scores.data(), tc,
         /*beta=*/1.0f);
    for (float& x : scores) x *= scale;
    causal_softmax(scores.data(), t, tc);
    gemm(order, t, c, tc, scores.data(), tc, latent.f32(), c, /*b_transposed=*/false, o_lat.data(), c);
    gemm(order, t, vd, c, o_lat.data(), c, w_uv, c, /*b_transposed=*/true, out.f32() + h * vd, heads * vd);
  }
}

// Positions [0, tc) of sequence b, copied out of its pages: [tc, c+r].
Tensor gather_positions(const Tensor& pages, const SeqLayout& layout, int64_t b, int64_t tc) {
  const int64_t width = pages.dim(2), ps = layout.page_size;
  Tensor out = Tensor::empty(DType::kF32, {tc, width});
  for (int64_t p = 0; p < tc; ++p) {
    const int32_t page = layout.page_table[b * layout.max_pages + p / ps];
    KL_CHECK(page >= 0 && page < pages.dim(0), "page table of sequence " + std::to_string(b) + " lacks position " + std::to_string(p));
    std::memcpy(out.f32() + p * width, pages.f32() + (page * ps + p % ps) * width, static_cast<size_t>(width) * sizeof(float));
  }
  return out;
}

// Runs `one(q rows, latent [Tc, c], k_r [Tc, r], out rows)` for each sequence of the step.
template <typename OneSequence>
void per_sequence(const MlaArgs& a, const SeqLayout& layout, OneSequence one) {
  const int64_t c = a.kv_b.dim(1), width = a.pages.dim(2), r = width - c;
  KL_CHECK(a.q.dim(0) == layout.num_rows() && a.q.dim(2) >= r && a.pages.dim(1) == layout.page_size,
           "mla step: q " + shape_to_string(a.q.shape()) + " pages " + shape_to_string(a.pages.shape()));
  for (int64_t b = 0; b < layout.num_seqs(); ++b) {
    const int64_t r0 = layout.cu_seqlens[b], r1 = layout.cu_seqlens[b + 1], tc = layout.cached[b] + (r1 - r0);
    const Tensor block = gather_positions(a.pages, layout, b, tc);
    Tensor latent = Tensor::empty(DType::kF32, {tc, c}), k_r = Tensor::empty(DType::kF32, {tc, r});
    for (int64_t p = 0; p < tc; ++p) {
      std::memcpy(latent.f32() + p * c, block.f32() + p * width, static_cast<size_t>(c) * sizeof(float));
      std::memcpy(k_r.f32() + p * r, block.f32() + p * width + c, static_cast<size_t>(r) * sizeof(float));
    }
    one(a.q.rows(r0, r1), latent, k_r, a.out.rows(r0, r1));
  }
}

}  // namespace

void CpuBackend::mla_cache_write(const Tensor& rows, const Tensor& norm, float eps, const Tensor& pages,
                                 const SeqLayout& layout) {
  const int64_t width = pages.dim(2), ps = layout.page_size, c = norm.numel();
  KL_CHECK(rows.dim(-1) == width && rows.numel() / width == layout.num_rows() && pages.dim(1) == ps && c <= width,
           "mla_cache_write rows " + shape_to_string(rows.shape()) + " norm " + shape_to_string(norm.shape()) +
               " pages " + shape_to_string(pages.shape()));
  for (int64_t b = 0; b < layout.num_seqs(); ++b) {
    for (int64_t i = 0; i < layout.new_tokens(b); ++i) {
      const int64_t pos = layout.cached[b] + i;
      const int32_t page = layout.page_table[b * layout.max_pages + pos / ps];
      KL_CHECK(page >= 0 && page < pages.dim(0), "no page for position " + std::to_string(pos) + " of sequence " + std::to_string(b));
      float* dst = pages.f32() + (page * ps + pos % ps) * width;
      std::memcpy(dst, rows.f32() + (layout.cu_seqlens[b] + i) * width, static_cast<size_t>(width) * sizeof(float));
      const Tensor latent = Tensor::wrap(DType::kF32, {1, c}, dst, nullptr, Device::kCpu);
      rms_norm(latent, norm, eps, latent);
    }
  }
}

void CpuBackend::mla_prefill(const MlaArgs& a, const SeqLayout& layout) {
  const int64_t heads = a.q.dim(1), nv = a.kv_b.dim(0) / heads;
  per_sequence(a, layout, [&](const Tensor& q, const Tensor& latent, const Tensor& k_r, const Tensor& out) {
    const int64_t tc = latent.dim(0), c = latent.dim(1);
    Tensor kv = Tensor::empty(DType::kF32, {tc, heads, nv});
    gemm(gemm_order_, tc, heads * nv, c, latent.f32(), c, a.kv_b.f32(), c, /*b_transposed=*/true, kv.f32(),
         heads * nv);
    attention_expanded(gemm_order_, q, kv, k_r, a.scale, out);
  });
}

void CpuBackend::mla_decode(const MlaArgs& a, const SeqLayout& layout) {
  per_sequence(a, layout, [&](const Tensor& q, const Tensor& latent, const Tensor& k_r, const Tensor& out) {
    attention_absorbed(gemm_order_, q, latent, k_r, a.kv_b, a.scale, out);
  });
}

}  // namespace klinear::cpu
