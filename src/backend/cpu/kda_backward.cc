// CPU KDA backward (MODEL.md 4.10): the gradients of the delta rule of kda.cc with respect to q, k,
// v, g, β and the start state, given those of the outputs and of the end state. Two forms, equal
// up to rounding: the token loop run in reverse (the reference) and the chunk-64 algorithm a GPU
// kernel follows (chunk factors and chunk-start states recomputed from the forward, then each
// chunk's products differentiated in reverse order). Per sequence and head, in fp32.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/backend.h"
#include "backend/cpu/kda_chunk.h"

namespace klinear::cpu {

namespace {

// One head of one sequence as both forms read it. Rows of the step tensors are [T, H, width] with
// head h at offset h·width.
struct HeadIn {
  std::vector<float> qn, kn;  // [T, dk] q, k as the forward uses them (normalised, q scaled)
  const float *v, *g, *beta, *d_out;
  const float* h0;            // [dk, dv], null: zero
  int64_t t_len, heads, h, dk, dv;
  const float* v_at(int64_t t) const { return v + (t * heads + h) * dv; }
  const float* g_at(int64_t t) const { return g + (t * heads + h) * dk; }
  float beta_at(int64_t t) const { return beta[t * heads + h]; }
  const float* d_out_at(int64_t t) const { return d_out + (t * heads + h) * dv; }
};

// The gradients of one head: of qn and kn (contiguous [T, dk], turned into dq, dk by the caller),
// and of v, g, β written into the step's outputs. dS holds dS_T on entry and dS_0 on return.
struct HeadGrads {
  std::vector<float> dqn, dkn, dS;
  float *dv, *dg, *dbeta;
  float* dv_at(const HeadIn& in, int64_t t) const { return dv + (t * in.heads + in.h) * in.dv; }
  float* dg_at(const HeadIn& in, int64_t t) const { return dg + (t * in.heads + in.h) * in.dk; }
  float& dbeta_at(const HeadIn& in, int64_t t) const { return dbeta[t * in.heads + in.h]; }
};

// One token of MODEL.md 4.5 on S [dk, dv]: S ← e^{g_t}⊙S, copied to `decayed`;
// u = β_t(v_t − Sᵀk_t), written to `u`; S ← S + k_t uᵀ.
void token_step(const HeadIn& in, int64_t t, float* S, float* decayed, float* u) {
  const int64_t dk = in.dk, dv = in.dv;
  const float* kt = in.kn.data() + t * dk;
  const float* gt = in.g_at(t);
  for (int64_t j = 0; j < dk; ++j) {
    const float decay = std::exp(gt[j]);
    for (int64_t c = 0; c < dv; ++c) S[j * dv + c] *= decay;
  }
  std::copy(S, S + dk * dv, decayed);
  const float* vt = in.v_at(t);
  for (int64_t c = 0; c < dv; ++c) {
    float ks = 0.0f;
    for (int64_t j = 0; j < dk; ++j) ks += S[j * dv + c] * kt[j];
    u[c] = in.beta_at(t) * (vt[c] - ks);
  }
  for (int64_t j = 0; j < dk; ++j)
    for (int64_t c = 0; c < dv; ++c) S[j * dv + c] += kt[j] * u[c];
}

// The token loop in reverse. With S'_t = e^{g_t}⊙S_{t−1}, r_t = v_t − S'_tᵀk_t, u_t = β_t r_t,
// S_t = S'_t + k_t u_tᵀ and o_t = S_tᵀq_t, and dS the gradient of S_t (from the later tokens):
//   dq_t = S_t do_t;  dS += q_t do_tᵀ;  dk_t = dS u_t;  du = dSᵀk_t;  dβ_t = du·r_t;  dv_t = β_t du;
//   dS' = dS − β_t k_t duᵀ;  dk_t −= β_t S'_t du;  dg_t = rowsum(dS' ⊙ S'_t);  dS_{t−1} = e^{g_t}⊙dS'.
// The states S'_t are recomputed a block of kChunk tokens at a time from the block's start state,
// kept by a first forward pass (T/64 states, not T).
void recurrent_backward_head(const HeadIn& in, HeadGrads& d) {
  const int64_t t_len = in.t_len, dk = in.dk, dv = in.dv, blocks = (t_len + kChunk - 1) / kChunk;
  std::vector<float> starts(blocks * dk * dv), S(dk * dv, 0.0f), decayed(kChunk * dk * dv), u(kChunk * dv);
  std::vector<float> du(dv), r(dv);
  if (in.h0 != nullptr) std::copy(in.h0, in.h0 + dk * dv, S.begin());
  for (int64_t t = 0; t < t_len; ++t) {
    if (t % kChunk == 0) std::copy(S.begin(), S.end(), starts.begin() + (t / kChunk) * dk * dv);
    token_step(in, t, S.data(), decayed.data(), u.data());
  }
  float* dS = d.dS.data();
  for (int64_t b = blocks - 1; b >= 0; --b) {
    const int64_t t0 = b * kChunk, t1 = std::min(t_len, t0 + kChunk);
    std::copy(starts.begin() + b * dk * dv, starts.begin() + (b + 1) * dk * dv, S.begin());
    for (int64_t t = t0; t < t1; ++t)
      token_step(in, t, S.data(), decayed.data() + (t - t0) * dk * dv, u.data() + (t - t0) * dv);
    for (int64_t t = t1 - 1; t >= t0; --t) {
      const float* Sp = decayed.data() + (t - t0) * dk * dv;
      const float* ut = u.data() + (t - t0) * dv;
      const float* qt = in.qn.data() + t * dk;
      const float* kt = in.kn.data() + t * dk;
      const float* vt = in.v_at(t);
      const float* dot = in.d_out_at(t);
      const float bt = in.beta_at(t);
      float* dqt = d.dqn.data() + t * dk;
      float* dkt = d.dkn.data() + t * dk;
      // o_t = (S'_t + k_t u_tᵀ)ᵀ q_t
      float u_do = 0.0f;
      for (int64_t c = 0; c < dv; ++c) u_do += ut[c] * dot[c];
      for (int64_t j = 0; j < dk; ++j) {
        float s = 0.0f;
        for (int64_t c = 0; c < dv; ++c) s += Sp[j * dv + c] * dot[c];
        dqt[j] = s + kt[j] * u_do;
      }
      for (int64_t j = 0; j < dk; ++j)
        for (int64_t c = 0; c < dv; ++c) dS[j * dv + c] += qt[j] * dot[c];
      // S_t = S'_t + k_t u_tᵀ
      for (int64_t j = 0; j < dk; ++j) {
        float s = 0.0f;
        for (int64_t c = 0; c < dv; ++c) s += dS[j * dv + c] * ut[c];
        dkt[j] = s;
      }
      for (int64_t c = 0; c < dv; ++c) {
        float s = 0.0f, ks = 0.0f;
        for (int64_t j = 0; j < dk; ++j) s += dS[j * dv + c] * kt[j], ks += Sp[j * dv + c] * kt[j];
        du[c] = s;
        r[c] = vt[c] - ks;
      }
      // u_t = β_t (v_t − S'_tᵀk_t)
      float db = 0.0f;
      float* dvt = d.dv_at(in, t);
      for (int64_t c = 0; c < dv; ++c) {
        db += du[c] * r[c];
        dvt[c] = bt * du[c];
      }
      d.dbeta_at(in, t) = db;
      for (int64_t j = 0; j < dk; ++j) {
        float s = 0.0f;
        for (int64_t c = 0; c < dv; ++c) {
          s += Sp[j * dv + c] * dvt[c];
          dS[j * dv + c] -= kt[j] * dvt[c];
        }
        dkt[j] -= s;
      }
      // S'_t = e^{g_t} ⊙ S_{t−1}
      const float* gt = in.g_at(t);
      float* dgt = d.dg_at(in, t);
      for (int64_t j = 0; j < dk; ++j) {
        float s = 0.0f;
        for (int64_t c = 0; c < dv; ++c) s += dS[j * dv + c] * Sp[j * dv + c];
        dgt[j] = s;
        const float decay = std::exp(gt[j]);
        for (int64_t c = 0; c < dv; ++c) dS[j * dv + c] *= decay;
      }
    }
  }
}

// The chunk form in reverse (MODEL.md 4.10). Per chunk, with S the chunk-start state (kept by a
// forward pass), the factors of chunk_factors, Vn = U − W·S, Qe = Q⊙e^G and dS the gradient of the
// chunk-end state:
//   dVn = Aqkᵀ·dO + Kdᵀ·dS;  dS_start = Qeᵀ·dO + γ⊙dS − Wᵀ·dVn;
//   dAqk = dO·Vnᵀ (m ≤ i);  dQe = dO·Sᵀ;  dKd = dS·Vnᵀ;  dγ = rowsum(dS ⊙ S);  [dW | dU] = [−dVn·Sᵀ | dVn];
//   the solve (I + Lm)[W | U] = R = β⊙[e^G⊙K | V]: dR = (I + Lm)⁻ᵀ[dW | dU] (back substitution),
//   dLm[i,m] = −dR_i·[W | U]_m (m < i);
// then the gradients of Lm, Aqk, Kd, γ, Qe and R reach q, k, v, β and G = cumsum(g), and
// dg is the reverse cumulative sum of dG within the chunk.
void chunked_backward_head(const HeadIn& in, HeadGrads& d) {
  const int64_t t_len = in.t_len, dk = in.dk, dv = in.dv, chunks = (t_len + kChunk - 1) / kChunk;
  ChunkFactors f(dk, dv);
  auto factors = [&](int64_t c0, int64_t L) {
    chunk_factors({in.kn.data() + c0 * dk, in.qn.data() + c0 * dk, in.g_at(c0) - in.h * dk,
                   in.v_at(c0) - in.h * dv, in.beta + c0 * in.heads, L, in.heads, in.h, dk, dv},
                  f);
  };
  std::vector<float> starts(chunks * dk * dv), S(dk * dv, 0.0f), vn(kChunk * dv);
  // Vn = U − W·S of the chunk whose factors f holds, from the state S.
  auto new_values = [&](int64_t L, const float* S) {
    std::copy(f.U.begin(), f.U.begin() + L * dv, vn.begin());
    gemm(L, dv, dk, f.W.data(), dk, S, dv, /*b_transposed=*/false, vn.data(), dv, /*beta=*/1.0f, /*alpha=*/-1.0f);
  };
  if (in.h0 != nullptr) std::copy(in.h0, in.h0 + dk * dv, S.begin());
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t c0 = c * kChunk, L = std::min(kChunk, t_len - c0);
    std::copy(S.begin(), S.end(), starts.begin() + c * dk * dv);
    factors(c0, L);
    new_values(L, S.data());
    chunk_state_step(f, L, dk, dv, vn.data(), S.data());
  }
  std::vector<float> dvn(kChunk * dv), dS0(dk * dv), daqk(kChunk * kChunk), dlm(kChunk * kChunk);
  std::vector<float> dw(kChunk * dk), dr(kChunk * (dk + dv)), dG(kChunk * dk);
  float* dS = d.dS.data();
  for (int64_t c = chunks - 1; c >= 0; --c) {
    const int64_t c0 = c * kChunk, L = std::min(kChunk, t_len - c0);
    const float* S0 = starts.data() + c * dk * dv;
    factors(c0, L);
    new_values(L, S0);
    const float* qn = in.qn.data() + c0 * dk;
    const float* kn = in.kn.data() + c0 * dk;
    float* dqn = d.dqn.data() + c0 * dk;
    float* dkn = d.dkn.data() + c0 * dk;
    const float* G = f.G.data();
    const float* glast = G + (L - 1) * dk;
    std::fill(dG.begin(), dG.end(), 0.0f);
    // dVn = Aqkᵀ·dO + Kdᵀ·dS; dAqk = dO·Vnᵀ on m ≤ i.
    for (int64_t m = 0; m < L; ++m)
      for (int64_t col = 0; col < dv; ++col) {
        float s = 0.0f;
        for (int64_t i = m; i < L; ++i) s += f.aqk[i * kChunk + m] * in.d_out_at(c0 + i)[col];
        for (int64_t j = 0; j < dk; ++j) s += f.kd[j * kChunk + m] * dS[j * dv + col];
        dvn[m * dv + col] = s;
      }
    for (int64_t i = 0; i < L; ++i)
      for (int64_t m = 0; m <= i; ++m) {
        float s = 0.0f;
        for (int64_t col = 0; col < dv; ++col) s += in.d_out_at(c0 + i)[col] * vn[m * dv + col];
        daqk[i * kChunk + m] = s;
      }
    // O's term Qe·S: dQe = dO·Sᵀ, and Qe = Q⊙e^G.
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < dk; ++j) {
        float s = 0.0f;
        for (int64_t col = 0; col < dv; ++col) s += in.d_out_at(c0 + i)[col] * S0[j * dv + col];
        const float e = std::exp(G[i * dk + j]);
        dqn[i * dk + j] = s * e;
        dG[i * dk + j] += s * e * qn[i * dk + j];
      }
    // The state step S_end = γ⊙S + Kd·Vn: dKd = dS·Vnᵀ with Kd[j, m] = k_m[j]·e^{G_last − G_m}; dγ = rowsum(dS⊙S).
    for (int64_t j = 0; j < dk; ++j) {
      float dgamma = 0.0f;
      for (int64_t col = 0; col < dv; ++col) dgamma += dS[j * dv + col] * S0[j * dv + col];
      dG[(L - 1) * dk + j] += dgamma * f.gamma[j];
      for (int64_t m = 0; m < L; ++m) {
        float s = 0.0f;
        for (int64_t col = 0; col < dv; ++col) s += dS[j * dv + col] * vn[m * dv + col];
        const float e = std::exp(glast[j] - G[m * dk + j]);
        dkn[m * dk + j] = s * e;
        dG[m * dk + j] -= s * e * kn[m * dk + j];
        dG[(L - 1) * dk + j] += s * e * kn[m * dk + j];
      }
    }
    // dS_start = Qeᵀ·dO + γ⊙dS − Wᵀ·dVn; dW = −dVn·Sᵀ.
    for (int64_t j = 0; j < dk; ++j)
      for (int64_t col = 0; col < dv; ++col) {
        float s = f.gamma[j] * dS[j * dv + col];
        for (int64_t i = 0; i < L; ++i)
          s += qn[i * dk + j] * std::exp(G[i * dk + j]) * in.d_out_at(c0 + i)[col] - f.W[i * dk + j] * dvn[i * dv + col];
        dS0[j * dv + col] = s;
      }
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < dk; ++j) {
        float s = 0.0f;
        for (int64_t col = 0; col < dv; ++col) s += dvn[i * dv + col] * S0[j * dv + col];
        dw[i * dk + j] = -s;
      }
    // The solve: back substitution dR_i = [dW | dU]_i − Σ_{m>i} Lm[m,i]·dR_m; dLm[i,m] = −dR_i·[W | U]_m.
    const int64_t w = dk + dv;
    for (int64_t i = L - 1; i >= 0; --i) {
      float* dri = dr.data() + i * w;
      std::copy(dw.begin() + i * dk, dw.begin() + (i + 1) * dk, dri);
      std::copy(dvn.begin() + i * dv, dvn.begin() + (i + 1) * dv, dri + dk);
      for (int64_t m = i + 1; m < L; ++m) {
        const float l = f.lm[m * kChunk + i];
        for (int64_t x = 0; x < w; ++x) dri[x] -= l * dr[m * w + x];
      }
    }
    for (int64_t i = 0; i < L; ++i)
      for (int64_t m = 0; m < i; ++m) {
        float s = 0.0f;
        for (int64_t j = 0; j < dk; ++j) s += dr[i * w + j] * f.W[m * dk + j];
        for (int64_t col = 0; col < dv; ++col) s += dr[i * w + dk + col] * f.U[m * dv + col];
        dlm[i * kChunk + m] = -s;
      }
    // R_i = β_i·[e^{G_i}⊙k_i | v_i].
    for (int64_t i = 0; i < L; ++i) {
      const float bi = in.beta_at(c0 + i);
      const float* vi = in.v_at(c0 + i);
      float* dvi = d.dv_at(in, c0 + i);
      float db = 0.0f;
      for (int64_t j = 0; j < dk; ++j) {
        const float kg = std::exp(G[i * dk + j]) * kn[i * dk + j];
        db += dr[i * w + j] * kg;
        dkn[i * dk + j] += bi * dr[i * w + j] * std::exp(G[i * dk + j]);
        dG[i * dk + j] += bi * dr[i * w + j] * kg;
      }
      for (int64_t col = 0; col < dv; ++col) {
        db += dr[i * w + dk + col] * vi[col];
        dvi[col] = bi * dr[i * w + dk + col];
      }
      d.dbeta_at(in, c0 + i) = db;
    }
    // The decayed dots: Lm[i,m] = β_i Σ_j k_i k_m e^{G_i−G_m} (m < i), Aqk[i,m] = Σ_j q_i k_m e^{G_i−G_m} (m ≤ i).
    for (int64_t i = 0; i < L; ++i) {
      const float bi = in.beta_at(c0 + i);
      for (int64_t m = 0; m <= i; ++m) {
        const float a = m < i ? dlm[i * kChunk + m] * bi : 0.0f, b = daqk[i * kChunk + m];
        float kk = 0.0f;
        for (int64_t j = 0; j < dk; ++j) {
          const float e = std::exp(G[i * dk + j] - G[m * dk + j]);
          const float ki = kn[i * dk + j], km = kn[m * dk + j], qi = qn[i * dk + j];
          kk += ki * km * e;
          dkn[i * dk + j] += a * km * e;
          dkn[m * dk + j] += (a * ki + b * qi) * e;
          dqn[i * dk + j] += b * km * e;
          const float p = (a * ki + b * qi) * km * e;
          dG[i * dk + j] += p;
          dG[m * dk + j] -= p;
        }
        if (m < i) d.dbeta_at(in, c0 + i) += dlm[i * kChunk + m] * kk;
      }
    }
    // G = cumsum(g): dg_i = Σ_{i' ≥ i} dG_{i'}.
    for (int64_t j = 0; j < dk; ++j) {
      float s = 0.0f;
      for (int64_t i = L - 1; i >= 0; --i) {
        s += dG[i * dk + j];
        d.dg_at(in, c0 + i)[j] = s;
      }
    }
    std::copy(dS0.begin(), dS0.end(), dS);
  }
}

// dx of head h of x [T, H, d] from dn, the gradient of its prepared rows n = scale·x/‖x‖ (kInside,
// ‖x‖ = √(Σx² + 1e-6)) or scale·x (kGiven): with y = x/‖x‖, dx = (scale·dn − y (y·scale·dn)) / ‖x‖.
void input_grad(const float* x_all, const std::vector<float>& dn, int64_t t_len, int64_t heads, int64_t h, int64_t d,
                float scale, KdaQkNorm norm, float* dx_all) {
  for (int64_t t = 0; t < t_len; ++t) {
    const float* x = x_all + (t * heads + h) * d;
    const float* dnt = dn.data() + t * d;
    float* dx = dx_all + (t * heads + h) * d;
    if (norm == KdaQkNorm::kGiven) {
      for (int64_t j = 0; j < d; ++j) dx[j] = scale * dnt[j];
      continue;
    }
    float ss = 0.0f;
    for (int64_t j = 0; j < d; ++j) ss += x[j] * x[j];
    const float inv = 1.0f / std::sqrt(ss + 1e-6f);
    float ydy = 0.0f;
    for (int64_t j = 0; j < d; ++j) ydy += x[j] * inv * scale * dnt[j];
    for (int64_t j = 0; j < d; ++j) dx[j] = (scale * dnt[j] - x[j] * inv * ydy) * inv;
  }
}

enum class Form { kChunked, kRecurrent };

void check_backward(const KdaBackwardArgs& a, const SeqLayout& layout) {
  const int64_t n = a.q.dim(0), heads = a.q.dim(1), dk = a.q.dim(2), dv = a.v.dim(2), seqs = layout.num_seqs();
  const Shape state{seqs, heads, dk, dv};
  auto f32 = [](const Tensor& t) { return !t.defined() || t.dtype() == DType::kF32; };
  KL_CHECK(a.q.rank() == 3 && a.v.rank() == 3 && n == layout.num_rows() && a.k.shape() == a.q.shape() &&
               a.g.shape() == a.q.shape() && a.v.dim(0) == n && a.v.dim(1) == heads && a.beta.shape() == Shape({n, heads}) &&
               (!a.h0.defined() || a.h0.shape() == state) && a.d_out.shape() == a.v.shape() &&
               (!a.d_ht.defined() || a.d_ht.shape() == state) && a.dq.shape() == a.q.shape() &&
               a.dk.shape() == a.q.shape() && a.dv.shape() == a.v.shape() && a.dg.shape() == a.q.shape() &&
               a.dbeta.shape() == a.beta.shape() && a.dh0.shape() == state && f32(a.q) && f32(a.k) && f32(a.v) &&
               f32(a.g) && f32(a.beta) && f32(a.h0) && f32(a.d_out) && f32(a.d_ht) && f32(a.dq) && f32(a.dk) &&
               f32(a.dv) && f32(a.dg) && f32(a.dbeta) && f32(a.dh0),
           "kda backward: q " + shape_to_string(a.q.shape()) + " v " + shape_to_string(a.v.shape()) + " beta " +
               shape_to_string(a.beta.shape()) + " dh0 " + shape_to_string(a.dh0.shape()) + " for " +
               std::to_string(layout.num_rows()) + " rows of " + std::to_string(seqs) + " sequences");
}

void kda_backward(const KdaBackwardArgs& a, const SeqLayout& layout, Form form) {
  check_backward(a, layout);
  const int64_t heads = a.q.dim(1), dk = a.q.dim(2), dv = a.v.dim(2);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int64_t b = 0; b < layout.num_seqs(); ++b) {
    const int64_t r0 = layout.cu_seqlens[b], t_len = layout.new_tokens(b);
#pragma omp parallel for
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t state = (b * heads + h) * dk * dv;
      HeadIn in{std::vector<float>(t_len * dk), std::vector<float>(t_len * dk), a.v.f32() + r0 * heads * dv,
                a.g.f32() + r0 * heads * dk, a.beta.f32() + r0 * heads, a.d_out.f32() + r0 * heads * dv,
                a.h0.defined() ? a.h0.f32() + state : nullptr, t_len, heads, h, dk, dv};
      normalized_head(a.q.f32() + r0 * heads * dk, t_len, heads, h, dk, scale, a.qk_norm, in.qn.data());
      normalized_head(a.k.f32() + r0 * heads * dk, t_len, heads, h, dk, 1.0f, a.qk_norm, in.kn.data());
      HeadGrads d{std::vector<float>(t_len * dk), std::vector<float>(t_len * dk), std::vector<float>(dk * dv, 0.0f),
                  a.dv.f32() + r0 * heads * dv, a.dg.f32() + r0 * heads * dk, a.dbeta.f32() + r0 * heads};
      if (a.d_ht.defined()) std::copy(a.d_ht.f32() + state, a.d_ht.f32() + state + dk * dv, d.dS.begin());
      if (form == Form::kChunked) chunked_backward_head(in, d);
      else recurrent_backward_head(in, d);
      input_grad(a.q.f32() + r0 * heads * dk, d.dqn, t_len, heads, h, dk, scale, a.qk_norm, a.dq.f32() + r0 * heads * dk);
      input_grad(a.k.f32() + r0 * heads * dk, d.dkn, t_len, heads, h, dk, 1.0f, a.qk_norm, a.dk.f32() + r0 * heads * dk);
      std::copy(d.dS.begin(), d.dS.end(), a.dh0.f32() + state);
    }
  }
}

}  // namespace

void CpuBackend::kda_chunked_backward(const KdaBackwardArgs& a, const SeqLayout& layout) {
  kda_backward(a, layout, Form::kChunked);
}
void CpuBackend::kda_recurrent_backward(const KdaBackwardArgs& a, const SeqLayout& layout) {
  kda_backward(a, layout, Form::kRecurrent);
}

}  // namespace klinear::cpu
