// CPU KDA (MODEL.md 4.3-4.6): the decay gate, the token-by-token recurrence (the oracle), the
// chunk-64 algorithm used for prefill and the affine summary of a segment built from its chunks.
// State layout [H, dk, dv] (FLA's default, K-first): row j of a head's state is scaled by exp(g[j]).
//
// Both core forms normalise q and k per head inside (q, k / sqrt(Σx² + 1e-6), MODEL.md 4.4, D8)
// unless the caller says they come normalised (KdaQkNorm::kGiven), and scale q by dk^-1/2.
// The backward of these forms is kda_backward.cc.
#include <algorithm>
#include <vector>

#include "backend/cpu/backend.h"
#include "backend/cpu/kda_chunk.h"

namespace klinear::cpu {

void normalized_head(const float* src, int64_t t_len, int64_t h_count, int64_t h, int64_t d, float scale,
                     KdaQkNorm norm, float* dst) {
  for (int64_t t = 0; t < t_len; ++t) {
    const float* x = src + (t * h_count + h) * d;
    float ss = 0.0f;
    for (int64_t j = 0; j < d; ++j) ss += x[j] * x[j];
    const float s = norm == KdaQkNorm::kInside ? scale / std::sqrt(ss + 1e-6f) : scale;
    for (int64_t j = 0; j < d; ++j) dst[t * d + j] = x[j] * s;
  }
}

namespace {

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

struct KdaShapes {
  int64_t t_len, heads, dk, dv;
};

// A snapshot of one sequence: after its first `pos` rows, its state [H, dk, dv] is copied to `dst`.
struct StateSnapshot {
  int64_t pos;
  float* dst;
};
using Snapshots = std::vector<StateSnapshot>;

// Copies head h's state S [dk, dv] into every snapshot taken after `pos` rows.
void take_snapshots(const Snapshots& snaps, int64_t pos, int64_t h, const float* S, int64_t dk, int64_t dv) {
  for (const StateSnapshot& s : snaps)
    if (s.pos == pos) std::copy(S, S + dk * dv, s.dst + h * dk * dv);
}

KdaShapes check_kda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                    const Tensor& state, const Tensor& out) {
  KdaShapes s{q.dim(0), q.dim(1), q.dim(2), v.dim(2)};
  KL_CHECK(k.shape() == q.shape() && g.shape() == q.shape() && v.dim(0) == s.t_len && v.dim(1) == s.heads &&
               beta.numel() == s.t_len * s.heads && state.shape() == Shape({s.heads, s.dk, s.dv}) &&
               out.shape() == v.shape(),
           "kda shapes q " + shape_to_string(q.shape()) + " v " + shape_to_string(v.shape()) + " state " +
               shape_to_string(state.shape()));
  return s;
}

}  // namespace

void CpuBackend::kda_gate(const Tensor& f, const Tensor& dt_bias, const Tensor& a_log, const KdaGateParams& p,
                          const Tensor& g) {
  const int64_t p_width = dt_bias.numel(), heads = a_log.numel(), d = p_width / heads, t_len = f.numel() / p_width;
  KL_CHECK(f.numel() == g.numel() && p_width % heads == 0 && f.dim(-1) == p_width, "kda_gate shapes");
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t c = 0; c < p_width; ++c) {
      const float x = f.f32()[t * p_width + c] + dt_bias.f32()[c];
      const float a = std::exp(a_log.f32()[c / d]);
      g.f32()[t * p_width + c] =
          p.kind == KdaGate::kSoftplus ? -a * softplus(x) : p.lower_bound * sigmoidf(a * x);
    }
  }
}

// MODEL.md 4.10: with x = f + dt_bias and a = e^{A_log}, softplus form g = −a·softplus(x):
// dx = −dg·a·σ(x), dA_log = dg·g; lower-bound form g = lb·σ(z), z = a·x: dz = dg·lb·σ(z)(1 − σ(z)),
// dx = dz·a, dA_log = dz·z. df = dx; dt_bias and A_log sum theirs over the rows (and channels).
void CpuBackend::kda_gate_backward(const KdaGateBackwardArgs& a) {
  const int64_t p_width = a.dt_bias.numel(), heads = a.a_log.numel();
  KL_CHECK(heads > 0 && p_width % heads == 0 && a.f.dim(-1) == p_width && a.dg.shape() == a.f.shape() &&
               a.df.shape() == a.f.shape() && a.d_dt_bias.shape() == a.dt_bias.shape() &&
               a.d_a_log.shape() == a.a_log.shape(),
           "kda_gate_backward f " + shape_to_string(a.f.shape()) + " dt_bias " + shape_to_string(a.dt_bias.shape()) +
               " A_log " + shape_to_string(a.a_log.shape()) + " dg " + shape_to_string(a.dg.shape()));
  const int64_t d = p_width / heads, t_len = a.f.numel() / p_width;
  std::fill(a.d_dt_bias.f32(), a.d_dt_bias.f32() + p_width, 0.0f);
  std::fill(a.d_a_log.f32(), a.d_a_log.f32() + heads, 0.0f);
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t c = 0; c < p_width; ++c) {
      const float x = a.f.f32()[t * p_width + c] + a.dt_bias.f32()[c];
      const float e = std::exp(a.a_log.f32()[c / d]);
      const float dg = a.dg.f32()[t * p_width + c];
      float dx = 0.0f, da = 0.0f;
      if (a.gate.kind == KdaGate::kSoftplus) {
        dx = -dg * e * sigmoidf(x);
        da = dg * -e * softplus(x);
      } else {
        const float z = e * x, sz = sigmoidf(z), dz = dg * a.gate.lower_bound * sz * (1.0f - sz);
        dx = dz * e;
        da = dz * z;
      }
      a.df.f32()[t * p_width + c] = dx;
      a.d_dt_bias.f32()[c] += dx;
      a.d_a_log.f32()[c / d] += da;
    }
  }
}

namespace {

// MODEL.md 4.5 over one sequence, per head: S ← diag(e^g)S; u = β(v − Sᵀk); S ← S + k uᵀ; o = Sᵀ q.
void recurrent_one(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                   const Tensor& state, const Tensor& out, const Snapshots& snaps, KdaQkNorm norm) {
  const KdaShapes s = check_kda(q, k, v, g, beta, state, out);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.dk));
#pragma omp parallel for
  for (int64_t h = 0; h < s.heads; ++h) {
    std::vector<float> qn(s.t_len * s.dk), kn(s.t_len * s.dk), u(s.dv);
    normalized_head(q.f32(), s.t_len, s.heads, h, s.dk, scale, norm, qn.data());
    normalized_head(k.f32(), s.t_len, s.heads, h, s.dk, 1.0f, norm, kn.data());
    float* S = state.f32() + h * s.dk * s.dv;
    for (int64_t t = 0; t < s.t_len; ++t) {
      const float* gt = g.f32() + (t * s.heads + h) * s.dk;
      const float* vt = v.f32() + (t * s.heads + h) * s.dv;
      const float* kt = kn.data() + t * s.dk;
      const float* qt = qn.data() + t * s.dk;
      const float bt = beta.f32()[t * s.heads + h];
      for (int64_t j = 0; j < s.dk; ++j) {
        const float decay = std::exp(gt[j]);
        for (int64_t c = 0; c < s.dv; ++c) S[j * s.dv + c] *= decay;
      }
      for (int64_t c = 0; c < s.dv; ++c) u[c] = vt[c];
      for (int64_t j = 0; j < s.dk; ++j)
        for (int64_t c = 0; c < s.dv; ++c) u[c] -= S[j * s.dv + c] * kt[j];
      for (int64_t c = 0; c < s.dv; ++c) u[c] *= bt;
      for (int64_t j = 0; j < s.dk; ++j)
        for (int64_t c = 0; c < s.dv; ++c) S[j * s.dv + c] += kt[j] * u[c];
      float* ot = out.f32() + (t * s.heads + h) * s.dv;
      for (int64_t c = 0; c < s.dv; ++c) ot[c] = 0.0f;
      for (int64_t j = 0; j < s.dk; ++j)
        for (int64_t c = 0; c < s.dv; ++c) ot[c] += S[j * s.dv + c] * qt[j];
      take_snapshots(snaps, t + 1, h, S, s.dk, s.dv);
    }
  }
}

}  // namespace

void chunk_factors(const HeadChunk& c, ChunkFactors& f) {
  const int64_t L = c.L, dk = c.dk, dv = c.dv;
  auto g_at = [&](int64_t i) { return c.g + (i * c.heads + c.h) * dk; };
  auto beta_at = [&](int64_t i) { return c.beta[i * c.heads + c.h]; };
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < dk; ++j) {
      f.G[i * dk + j] = g_at(i)[j] + (i > 0 ? f.G[(i - 1) * dk + j] : 0.0f);
      f.eg[i * dk + j] = std::exp(g_at(i)[j]);
    }
  // Decayed dots over pairs m ≤ i. e^{G_i − G_m} = Π_{m<t≤i} e^{g_t} is built as a running
  // product down the column (factors ≤ 1, so it underflows gracefully and never overflows).
  std::fill(f.lm.begin(), f.lm.end(), 0.0f);
  std::fill(f.aqk.begin(), f.aqk.end(), 0.0f);
  for (int64_t m = 0; m < L; ++m) {
    const float* km = c.kn + m * dk;
    for (int64_t j = 0; j < dk; ++j) f.dec[j] = km[j];  // k_m ⊙ e^{G_i − G_m}, starting at i = m
    for (int64_t i = m; i < L; ++i) {
      if (i > m)
        for (int64_t j = 0; j < dk; ++j) f.dec[j] *= f.eg[i * dk + j];
      float kk = 0.0f, qk = 0.0f;
      for (int64_t j = 0; j < dk; ++j) kk += c.kn[i * dk + j] * f.dec[j];
      if (c.qn != nullptr)
        for (int64_t j = 0; j < dk; ++j) qk += c.qn[i * dk + j] * f.dec[j];
      if (i > m) f.lm[i * kChunk + m] = beta_at(i) * kk;
      f.aqk[i * kChunk + m] = qk;
    }
  }
  // Forward substitution: row i of [W | U] = β_i·[e^{G_i}⊙k_i | v_i] − Σ_{m<i} Lm[i,m]·row m.
  for (int64_t i = 0; i < L; ++i) {
    const float bi = beta_at(i);
    const float* vi = c.v + (i * c.heads + c.h) * dv;
    for (int64_t j = 0; j < dk; ++j) f.W[i * dk + j] = bi * std::exp(f.G[i * dk + j]) * c.kn[i * dk + j];
    for (int64_t col = 0; col < dv; ++col) f.U[i * dv + col] = bi * vi[col];
    for (int64_t m = 0; m < i; ++m) {
      const float l = f.lm[i * kChunk + m];
      for (int64_t j = 0; j < dk; ++j) f.W[i * dk + j] -= l * f.W[m * dk + j];
      for (int64_t col = 0; col < dv; ++col) f.U[i * dv + col] -= l * f.U[m * dv + col];
    }
  }
  // The decayed keys stored transposed, and the chunk's total decay.
  const float* glast = f.G.data() + (L - 1) * dk;
  for (int64_t j = 0; j < dk; ++j) {
    f.gamma[j] = std::exp(glast[j]);
    for (int64_t m = 0; m < L; ++m) f.kd[j * kChunk + m] = c.kn[m * dk + j] * std::exp(glast[j] - f.G[m * dk + j]);
  }
}

void chunk_state_step(const ChunkFactors& f, int64_t L, int64_t dk, int64_t n, const float* vn, float* S) {
  for (int64_t j = 0; j < dk; ++j)
    for (int64_t c = 0; c < n; ++c) S[j * n + c] *= f.gamma[j];
  gemm(dk, n, L, f.kd.data(), kChunk, vn, n, /*b_transposed=*/false, S, n, /*beta=*/1.0f);
}

namespace {

// MODEL.md 4.6, per head and chunk (chunk_factors), then
//   Vn = U − W·S;  O = (Q⊙e^G)·S + Aqk·Vn;  S ← γ⊙S + Kd·Vn
void chunked_one(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                 const Tensor& state, const Tensor& out, const Snapshots& snaps, KdaQkNorm norm) {
  const KdaShapes s = check_kda(q, k, v, g, beta, state, out);
  const int64_t dk = s.dk, dv = s.dv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
#pragma omp parallel for
  for (int64_t h = 0; h < s.heads; ++h) {
    std::vector<float> qn(s.t_len * dk), kn(s.t_len * dk);
    normalized_head(q.f32(), s.t_len, s.heads, h, dk, scale, norm, qn.data());
    normalized_head(k.f32(), s.t_len, s.heads, h, dk, 1.0f, norm, kn.data());
    ChunkFactors f(dk, dv);
    std::vector<float> vn(kChunk * dv), qdec(kChunk * dk);
    float* S = state.f32() + h * dk * dv;
    for (int64_t c0 = 0; c0 < s.t_len; c0 += kChunk) {
      const int64_t L = std::min(kChunk, s.t_len - c0);
      const float* qc = qn.data() + c0 * dk;
      chunk_factors({kn.data() + c0 * dk, qc, g.f32() + c0 * s.heads * dk, v.f32() + c0 * s.heads * dv,
                     beta.f32() + c0 * s.heads, L, s.heads, h, dk, dv},
                    f);
      // Vn = U − W·S
      std::copy(f.U.begin(), f.U.begin() + L * dv, vn.begin());
      gemm(L, dv, dk, f.W.data(), dk, S, dv, /*b_transposed=*/false, vn.data(), dv, /*beta=*/1.0f, /*alpha=*/-1.0f);
      // O = (Q⊙e^G)·S + Aqk·Vn
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < dk; ++j) qdec[i * dk + j] = qc[i * dk + j] * std::exp(f.G[i * dk + j]);
      float* oc = out.f32() + (c0 * s.heads + h) * dv;
      const int64_t ldo = s.heads * dv;
      gemm(L, dv, dk, qdec.data(), dk, S, dv, /*b_transposed=*/false, oc, ldo);
      gemm(L, dv, L, f.aqk.data(), kChunk, vn.data(), dv, /*b_transposed=*/false, oc, ldo, /*beta=*/1.0f);
      chunk_state_step(f, L, dk, dv, vn.data(), S);
      take_snapshots(snaps, c0 + L, h, S, dk, dv);
    }
  }
}

// Runs `one` on each sequence of the step with its rows and its state slot.
template <typename OneSequence>
void per_sequence(const KdaArgs& a, const SeqLayout& layout, OneSequence one) {
  const int64_t h = a.q.dim(1), dk = a.q.dim(2), dv = a.v.dim(2);
  KL_CHECK(a.q.dim(0) == layout.num_rows() && a.states.dim(1) == h && a.states.dim(2) == dk && a.states.dim(3) == dv,
           "kda step: q " + shape_to_string(a.q.shape()) + " states " + shape_to_string(a.states.shape()) + " for " +
               std::to_string(layout.num_rows()) + " rows");
  for (int64_t b = 0; b < layout.num_seqs(); ++b) {
    const int64_t r0 = layout.cu_seqlens[b], r1 = layout.cu_seqlens[b + 1], slot = layout.slots[b];
    Snapshots snaps;
    for (size_t k = 0; k < layout.snap_seq.size(); ++k)
      if (layout.snap_seq[k] == b) snaps.push_back({layout.snap_pos[k], a.states.f32() + layout.snap_slot[k] * h * dk * dv});
    one(a.q.rows(r0, r1), a.k.rows(r0, r1), a.v.rows(r0, r1), a.g.rows(r0, r1), a.beta.rows(r0, r1),
        a.states.rows(slot, slot + 1).view({h, dk, dv}), a.out.rows(r0, r1), snaps, a.qk_norm);
  }
}

}  // namespace

void CpuBackend::kda_recurrent(const KdaArgs& a, const SeqLayout& layout) { per_sequence(a, layout, recurrent_one); }
void CpuBackend::kda_chunked(const KdaArgs& a, const SeqLayout& layout) { per_sequence(a, layout, chunked_one); }

// The summary (A, B) of each sequence, per head, by the chunks of kda_chunked: a chunk maps a
// state S to γ⊙S + Kd·(U − W·S) = (diag(γ) − Kd·W)·S + Kd·U, so the augmented state X = [A | B]
// [dk, dk + dv], started at [I | 0], takes the same state step with the right-hand side [0 | U]:
// Vn = [0 | U] − W·X, X ← γ⊙X + Kd·Vn. Every factor of γ and Kd is at most 1 (exp of sums of
// g ≤ 0), so strong decay underflows to 0 and never overflows. Cost per chunk and head:
// 2·64·dk·(dk + dv) for the two products, beside the chunk factors of kda_chunked.
void CpuBackend::kda_summary(const KdaSummaryArgs& a, const SeqLayout& layout) {
  const KdaSummaryDims d = check_kda_summary(a, layout);
  const int64_t heads = d.heads, dk = d.dk, dv = d.dv, seqs = d.seqs;
  const int64_t w = dk + dv;
  for (int64_t b = 0; b < seqs; ++b) {
    const int64_t r0 = layout.cu_seqlens[b], t_len = layout.new_tokens(b);
#pragma omp parallel for
    for (int64_t h = 0; h < heads; ++h) {
      std::vector<float> kn(t_len * dk), X(dk * w, 0.0f), vn(kChunk * w);
      normalized_head(a.k.f32() + r0 * heads * dk, t_len, heads, h, dk, 1.0f, a.qk_norm, kn.data());
      for (int64_t j = 0; j < dk; ++j) X[j * w + j] = 1.0f;
      ChunkFactors f(dk, dv);
      for (int64_t c0 = 0; c0 < t_len; c0 += kChunk) {
        const int64_t L = std::min(kChunk, t_len - c0), r = r0 + c0;
        chunk_factors({kn.data() + c0 * dk, nullptr, a.g.f32() + r * heads * dk, a.v.f32() + r * heads * dv,
                       a.beta.f32() + r * heads, L, heads, h, dk, dv},
                      f);
        for (int64_t i = 0; i < L; ++i) {
          std::fill(vn.begin() + i * w, vn.begin() + i * w + dk, 0.0f);
          std::copy(f.U.begin() + i * dv, f.U.begin() + (i + 1) * dv, vn.begin() + i * w + dk);
        }
        gemm(L, w, dk, f.W.data(), dk, X.data(), w, /*b_transposed=*/false, vn.data(), w, /*beta=*/1.0f,
             /*alpha=*/-1.0f);
        chunk_state_step(f, L, dk, w, vn.data(), X.data());
      }
      float* A = a.a.f32() + (b * heads + h) * dk * dk;
      float* B = a.b.f32() + (b * heads + h) * dk * dv;
      for (int64_t j = 0; j < dk; ++j) {
        std::copy(X.begin() + j * w, X.begin() + j * w + dk, A + j * dk);
        std::copy(X.begin() + j * w + dk, X.begin() + (j + 1) * w, B + j * dv);
      }
    }
  }
}

void CpuBackend::kda_decode(const KdaDecodeArgs& a, const SeqLayout& decode) { kda_decode_by_ops(*this, a, decode); }

}  // namespace klinear::cpu
