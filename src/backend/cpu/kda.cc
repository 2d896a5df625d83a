// CPU KDA (SPEC 4.3-4.6): the decay gate, the token-by-token recurrence (the oracle) and the
// chunk-64 algorithm used for prefill. State layout [H, dk, dv] (FLA's default, K-first): row j of
// a head's state is scaled by exp(g[j]).
//
// Both core forms normalise q and k per head inside (q, k / sqrt(Σx² + 1e-6), SPEC 4.4, D8) and
// scale q by dk^-1/2, so callers pass the raw conv outputs.
#include <vector>

#include "backend/cpu/backend.h"

namespace klinear::cpu {

namespace {

constexpr int64_t kChunk = 64;

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// Copies head h of q/k [T, H, d] into contiguous fp32 rows, L2-normalised, q also scaled.
void normalized_head(const float* src, int64_t t_len, int64_t h_count, int64_t h, int64_t d, float scale, float* dst) {
  for (int64_t t = 0; t < t_len; ++t) {
    const float* x = src + (t * h_count + h) * d;
    float ss = 0.0f;
    for (int64_t j = 0; j < d; ++j) ss += x[j] * x[j];
    const float s = scale / std::sqrt(ss + 1e-6f);
    for (int64_t j = 0; j < d; ++j) dst[t * d + j] = x[j] * s;
  }
}

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

namespace {

// SPEC 4.5 over one sequence, per head: S ← diag(e^g)S; u = β(v − Sᵀk); S ← S + k uᵀ; o = Sᵀ q.
void recurrent_one(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                   const Tensor& state, const Tensor& out, const Snapshots& snaps) {
  const KdaShapes s = check_kda(q, k, v, g, beta, state, out);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.dk));
#pragma omp parallel for
  for (int64_t h = 0; h < s.heads; ++h) {
    std::vector<float> qn(s.t_len * s.dk), kn(s.t_len * s.dk), u(s.dv);
    normalized_head(q.f32(), s.t_len, s.heads, h, s.dk, scale, qn.data());
    normalized_head(k.f32(), s.t_len, s.heads, h, s.dk, 1.0f, kn.data());
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

// SPEC 4.6, per head and chunk of L ≤ 64 tokens (a short last chunk equals zero padding):
//   G = cumsum(g); Lm[i,m] = β_i Σ_j k_i k_m e^{G_i−G_m} (m < i); (I + Lm)·[W | U] = β ⊙ [e^G⊙K | V]
//   Vn = U − W·S;  O = (Q⊙e^G)·S + Aqk·Vn with Aqk[i,m] = Σ_j q_i k_m e^{G_i−G_m} (m ≤ i)
//   S ← diag(e^{G_last})·S + (K⊙e^{G_last−G})ᵀ·Vn
void chunked_one(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                 const Tensor& state, const Tensor& out, const Snapshots& snaps) {
  const KdaShapes s = check_kda(q, k, v, g, beta, state, out);
  const int64_t dk = s.dk, dv = s.dv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
#pragma omp parallel for
  for (int64_t h = 0; h < s.heads; ++h) {
    std::vector<float> qn(s.t_len * dk), kn(s.t_len * dk);
    normalized_head(q.f32(), s.t_len, s.heads, h, dk, scale, qn.data());
    normalized_head(k.f32(), s.t_len, s.heads, h, dk, 1.0f, kn.data());
    std::vector<float> G(kChunk * dk), lm(kChunk * kChunk), aqk(kChunk * kChunk), W(kChunk * dk), U(kChunk * dv),
        vn(kChunk * dv), kdec(dk * kChunk), qdec(kChunk * dk), eg(kChunk * dk), dec(dk);
    float* S = state.f32() + h * dk * dv;
    for (int64_t c0 = 0; c0 < s.t_len; c0 += kChunk) {
      const int64_t L = std::min(kChunk, s.t_len - c0);
      const float* kc = kn.data() + c0 * dk;
      const float* qc = qn.data() + c0 * dk;
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < dk; ++j)
          G[i * dk + j] = g.f32()[((c0 + i) * s.heads + h) * dk + j] + (i > 0 ? G[(i - 1) * dk + j] : 0.0f);
      // Decayed dots over pairs m ≤ i. e^{G_i − G_m} = Π_{m<t≤i} e^{g_t} is built as a running
      // product down the column (factors ≤ 1, so it underflows gracefully and never overflows).
      std::fill(lm.begin(), lm.end(), 0.0f);
      std::fill(aqk.begin(), aqk.end(), 0.0f);
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < dk; ++j) eg[i * dk + j] = std::exp(g.f32()[((c0 + i) * s.heads + h) * dk + j]);
      for (int64_t m = 0; m < L; ++m) {
        const float* km = kc + m * dk;
        for (int64_t j = 0; j < dk; ++j) dec[j] = km[j];  // k_m ⊙ e^{G_i − G_m}, starting at i = m
        for (int64_t i = m; i < L; ++i) {
          if (i > m)
            for (int64_t j = 0; j < dk; ++j) dec[j] *= eg[i * dk + j];
          float kk = 0.0f, qk = 0.0f;
          for (int64_t j = 0; j < dk; ++j) {
            kk += kc[i * dk + j] * dec[j];
            qk += qc[i * dk + j] * dec[j];
          }
          if (i > m) lm[i * kChunk + m] = beta.f32()[(c0 + i) * s.heads + h] * kk;
          aqk[i * kChunk + m] = qk;
        }
      }
      // Forward substitution: row i of [W | U] = β_i·[e^{G_i}⊙k_i | v_i] − Σ_{m<i} Lm[i,m]·row m.
      for (int64_t i = 0; i < L; ++i) {
        const float bi = beta.f32()[(c0 + i) * s.heads + h];
        const float* vi = v.f32() + ((c0 + i) * s.heads + h) * dv;
        for (int64_t j = 0; j < dk; ++j) W[i * dk + j] = bi * std::exp(G[i * dk + j]) * kc[i * dk + j];
        for (int64_t c = 0; c < dv; ++c) U[i * dv + c] = bi * vi[c];
        for (int64_t m = 0; m < i; ++m) {
          const float l = lm[i * kChunk + m];
          for (int64_t j = 0; j < dk; ++j) W[i * dk + j] -= l * W[m * dk + j];
          for (int64_t c = 0; c < dv; ++c) U[i * dv + c] -= l * U[m * dv + c];
        }
      }
      // Vn = U − W·S
      std::copy(U.begin(), U.begin() + L * dv, vn.begin());
      gemm(L, dv, dk, W.data(), dk, S, dv, /*b_transposed=*/false, vn.data(), dv, /*beta=*/1.0f, /*alpha=*/-1.0f);
      // O = (Q⊙e^G)·S + Aqk·Vn
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < dk; ++j) qdec[i * dk + j] = qc[i * dk + j] * std::exp(G[i * dk + j]);
      float* oc = out.f32() + (c0 * s.heads + h) * dv;
      const int64_t ldo = s.heads * dv;
      gemm(L, dv, dk, qdec.data(), dk, S, dv, /*b_transposed=*/false, oc, ldo);
      gemm(L, dv, L, aqk.data(), kChunk, vn.data(), dv, /*b_transposed=*/false, oc, ldo, /*beta=*/1.0f);
      // S ← diag(e^{G_last})·S + (K⊙e^{G_last−G})ᵀ·Vn, with the decayed keys stored transposed.
      const float* glast = G.data() + (L - 1) * dk;
      for (int64_t j = 0; j < dk; ++j) {
        const float d = std::exp(glast[j]);
        for (int64_t c = 0; c < dv; ++c) S[j * dv + c] *= d;
        for (int64_t m = 0; m < L; ++m) kdec[j * kChunk + m] = kc[m * dk + j] * std::exp(glast[j] - G[m * dk + j]);
      }
      gemm(dk, dv, L, kdec.data(), kChunk, vn.data(), dv, /*b_transposed=*/false, S, dv, /*beta=*/1.0f);
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
        a.states.rows(slot, slot + 1).view({h, dk, dv}), a.out.rows(r0, r1), snaps);
  }
}

}  // namespace

void CpuBackend::kda_recurrent(const KdaArgs& a, const SeqLayout& layout) { per_sequence(a, layout, recurrent_one); }
void CpuBackend::kda_chunked(const KdaArgs& a, const SeqLayout& layout) { per_sequence(a, layout, chunked_one); }

}  // namespace klinear::cpu

namespace klinear::cpu {

void CpuBackend::kda_decode(const KdaDecodeArgs& a, const SeqLayout& decode) { kda_decode_by_ops(*this, a, decode); }

}  // namespace klinear::cpu
