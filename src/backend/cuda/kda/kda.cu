// CUDA KDA (MODEL.md 4.3-4.6): the decay gate, the recurrent decode and the chunk-64 prefill, over the
// sequences of a step and their fp32 state slots [slots, H, dk, dv] (K-first).
//
// kda_chunked with bf16 activations runs the tensor-core prefill (kda_tc_prep.cu, kda_tc_state.cu,
// composed here). The fp32 forms
// here (the decode, and the prefill with f32 activations, exact to the CPU) keep a state tile of
// dk rows × 32 columns of one (sequence, head) in registers: 4 warps, lane = column, warp w owns
// rows [32w, 32w+32) (so dk ≤ 128); a block per (32-column tile, head, sequence). Products over k
// (Sᵀk, Sᵀq) are per-thread partial sums over the owned rows combined through shared memory.
//
// The fp32 kda_chunked follows the CPU's chunk algorithm (backend/cpu/kda.cc) in two launches:
//   chunk_prep, one block per (chunk, head), all chunks in parallel: L2 norms, G = cumsum(g), the
//     decayed dots Lm and Aqk (running products e^{G_i−G_m}, factors ≤ 1, never overflowing), the
//     forward substitution (I + Lm)[W | U] = β[e^G⊙K | V] (a thread per column, the column in
//     registers), Qd = Q⊙e^G, Kd = K⊙e^{G_last−G}, e^{G_last}; all fp32 into a step workspace.
//   chunk_state, one block per (column tile, head, sequence), chunks in order: Vn = U − W·S,
//     O = Qd·S + Aqk·Vn, S ← e^{G_last}⊙S + Kdᵀ·Vn, and the layout's snapshots at chunk ends.
// No per-chunk state goes to memory.
//
// kda_summary (the affine map of each sequence's rows, for splitting a sequence: MODEL.md 4.9)
// runs the same chunk_prep without q, then a state pass over the augmented state [A | B]
// (kda_summary_state_kernel), in fp32 whatever the activation dtype. No model path calls it yet;
// it stays for context parallelism (backend.h).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/kda/kda_chunk.cuh"

namespace klinear::cuda {

namespace {

constexpr int kCols = 32;                  // state columns per block
constexpr int kRowsPerWarp = kMaxDk / 4;   // state rows per warp
constexpr int kStateThreads = 128;

__global__ void kda_gate_kernel(In f, const float* dt_bias, const float* a_log, int64_t rows, int64_t width, int64_t d,
                                KdaGate kind, float lower_bound, float* g) {
  const int64_t n = rows * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % width;
    const float x = f[i] + dt_bias[c];
    const float a = expf(a_log[c / d]);
    g[i] = kda_gate_value(kind, a, x, lower_bound);
  }
}

__device__ __forceinline__ void load_state(const KdaStep& s, const float* st, int col, float (&reg)[kRowsPerWarp]) {
  const int warp = threadIdx.x / 32;
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int j = warp * kRowsPerWarp + i;
    reg[i] = (j < s.dk && col < s.dv) ? st[static_cast<int64_t>(j) * s.dv + col] : 0.0f;
  }
}

__device__ __forceinline__ void store_state(const KdaStep& s, float* st, int col, const float (&reg)[kRowsPerWarp]) {
  const int warp = threadIdx.x / 32;
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int j = warp * kRowsPerWarp + i;
    if (j < s.dk && col < s.dv) st[static_cast<int64_t>(j) * s.dv + col] = reg[i];
  }
}

// MODEL.md 4.5, token by token: S ← diag(e^g)S; u = β(v − Sᵀk); S ← S + k uᵀ; o = Sᵀ q.
// Launch bounds for 4 blocks per SM (128 registers, 8 bytes spilled outside the token loop): at 156
// registers it ran 3 per SM, 18 % achieved occupancy, 2.09 TB/s in ncu at batch 256, where FLA's
// kernel of the same tile runs 4 per SM at 2.45 TB/s.
__global__ void __launch_bounds__(kStateThreads, 4) kda_recurrent_kernel(KdaStep s) {
  __shared__ float qn[kMaxDk], kn[kMaxDk], eg[kMaxDk], part[4][kCols], u_sh[kCols], scratch[32];
  const int b = blockIdx.z, h = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32, tid = threadIdx.x;
  const int col = blockIdx.x * kCols + lane;
  const int64_t row0 = s.cu[b], t_len = s.cu[b + 1] - row0;
  if (t_len == 0) return;
  float* st = state_tile(s, s.slots[b], h);
  float reg[kRowsPerWarp];
  load_state(s, st, col, reg);
  for (int64_t t = 0; t < t_len; ++t) {
    const int64_t row = row0 + t;
    const int64_t qk_base = (row * s.heads + h) * s.dk;
    const float qv = tid < s.dk ? s.q[qk_base + tid] : 0.0f;
    const float kv = tid < s.dk ? s.k[qk_base + tid] : 0.0f;
    // Warp 0's v and β with the other loads (not after the barriers that need none of them).
    const float vv = warp == 0 && col < s.dv ? s.v[(row * s.heads + h) * s.dv + col] : 0.0f;
    const float bt = warp == 0 ? s.beta[row * s.heads + h] : 0.0f;
    const float ssq = block_sum(qv * qv, scratch), ssk = block_sum(kv * kv, scratch);
    qn[tid] = qv * (s.scale / sqrtf(ssq + 1e-6f));
    kn[tid] = kv * (1.0f / sqrtf(ssk + 1e-6f));
    eg[tid] = tid < s.dk ? expf(s.g[qk_base + tid]) : 0.0f;
    __syncthreads();
    float p = 0.0f;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int j = warp * kRowsPerWarp + i;
      reg[i] *= eg[j];
      p += reg[i] * kn[j];
    }
    part[warp][lane] = p;
    __syncthreads();
    if (warp == 0) {
      const float kS = part[0][lane] + part[1][lane] + part[2][lane] + part[3][lane];
      u_sh[lane] = bt * (vv - kS);
    }
    __syncthreads();
    const float u = u_sh[lane];
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int j = warp * kRowsPerWarp + i;
      reg[i] += kn[j] * u;
      o += reg[i] * qn[j];
    }
    __syncthreads();  // everyone has read part[] of the k product
    part[warp][lane] = o;
    __syncthreads();
    if (warp == 0 && col < s.dv)
      s.out.set((row * s.heads + h) * s.dv + col, part[0][lane] + part[1][lane] + part[2][lane] + part[3][lane]);
    __syncthreads();  // qn/kn/eg/part are rewritten by the next token
  }
  store_state(s, st, col, reg);
}

// ---- chunked prefill

// The fp32 prefill's workspace.
struct Fp32Ws {
  float* ws;         // [chunks, H, per_head]
  int64_t per_head;  // floats per (chunk, head)
};

// Offsets of the workspace pieces of one (chunk, head), in floats.
struct WsLayout {
  int64_t w, u, aqk, qd, kd, dl;
  __host__ __device__ WsLayout(int dk, int dv)
      : w(0), u(int64_t{kChunk} * dk), aqk(u + int64_t{kChunk} * dv), qd(aqk + kChunk * kChunk),
        kd(qd + int64_t{kChunk} * dk), dl(kd + int64_t{kChunk} * dk) {}
  __host__ __device__ int64_t total(int dk) const { return dl + dk; }
};

constexpr int kPrepThreads = 256;
constexpr int kPad = 1;  // row padding of the [64][dk] shared arrays (bank spread)

// Without q (s.q.p null: the summary) Aqk and Qd come out 0.
__global__ void __launch_bounds__(kPrepThreads) kda_chunk_prep_kernel(KdaStep s, ChunkWork cw, Fp32Ws fw) {
  extern __shared__ float sm[];
  const int dk = s.dk, ld = dk + kPad;
  float* qn = sm;                        // [64][ld]
  float* kn = qn + kChunk * ld;          // [64][ld]
  float* G = kn + kChunk * ld;           // [64][ld] cumulative log decay
  float* eg = G + kChunk * ld;           // [64][ld] e^{g}
  float* lm = eg + kChunk * ld;          // [64][65]
  float* bsh = lm + kChunk * (kChunk + 1);  // [64] β
  const int chunk = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t row0 = cw.chunk_row[chunk];
  const int L = cw.chunk_len[chunk];
  const WsLayout wl(dk, s.dv);
  float* ws = fw.ws + (static_cast<int64_t>(chunk) * s.heads + h) * fw.per_head;

  for (int e = tid; e < kChunk * dk; e += blockDim.x) {
    const int i = e / dk, j = e % dk;
    const bool live = i < L;
    const int64_t src = ((row0 + i) * s.heads + h) * dk + j;
    qn[i * ld + j] = live && s.q.p != nullptr ? s.q[src] : 0.0f;
    kn[i * ld + j] = live ? s.k[src] : 0.0f;
    const float gv = live ? s.g[src] : 0.0f;
    G[i * ld + j] = gv;
    eg[i * ld + j] = expf(gv);
  }
  if (tid < kChunk) bsh[tid] = tid < L ? s.beta[(row0 + tid) * s.heads + h] : 0.0f;
  __syncthreads();
  // L2 norms, a warp per row.
  for (int i = warp; i < L; i += blockDim.x / 32) {
    float sq = 0.0f, sk = 0.0f;
    for (int j = lane; j < dk; j += 32) {
      sq += qn[i * ld + j] * qn[i * ld + j];
      sk += kn[i * ld + j] * kn[i * ld + j];
    }
    sq = s.scale / sqrtf(warp_sum(sq) + 1e-6f);
    sk = 1.0f / sqrtf(warp_sum(sk) + 1e-6f);
    for (int j = lane; j < dk; j += 32) {
      qn[i * ld + j] *= sq;
      kn[i * ld + j] *= sk;
    }
  }
  // G = cumsum(g) down each channel.
  for (int j = tid; j < dk; j += blockDim.x)
    for (int i = 1; i < kChunk; ++i) G[i * ld + j] += G[(i - 1) * ld + j];
  __syncthreads();

  // Decayed dots: 4 threads per key m (channels j ≡ slice mod 4), rows i walked in order so that
  // dec = k_m ⊙ e^{G_i − G_m} is a running product of factors ≤ 1.
  float* aqk = ws + wl.aqk;
  {
    const int m = tid / 4, slice = tid % 4;
    float dec[kMaxDk / 4];
#pragma unroll
    for (int jj = 0; jj < kMaxDk / 4; ++jj) {
      const int j = jj * 4 + slice;
      dec[jj] = j < dk ? kn[m * ld + j] : 0.0f;
    }
    for (int i = 0; i < kChunk; ++i) {
      float kk = 0.0f, qk = 0.0f;
      if (i >= m) {
#pragma unroll
        for (int jj = 0; jj < kMaxDk / 4; ++jj) {
          const int j = jj * 4 + slice;
          if (j < dk) {
            if (i > m) dec[jj] *= eg[i * ld + j];
            kk += kn[i * ld + j] * dec[jj];
            qk += qn[i * ld + j] * dec[jj];
          }
        }
      }
      kk += __shfl_xor_sync(0xffffffffu, kk, 1);
      kk += __shfl_xor_sync(0xffffffffu, kk, 2);
      qk += __shfl_xor_sync(0xffffffffu, qk, 1);
      qk += __shfl_xor_sync(0xffffffffu, qk, 2);
      if (slice == 0) {
        const bool live = i < L && m <= i;
        lm[i * (kChunk + 1) + m] = (live && m < i) ? bsh[i] * kk : 0.0f;
        aqk[i * kChunk + m] = live ? qk : 0.0f;
      }
    }
  }
  __syncthreads();

  // Forward substitution, a thread per column of [W | U]: x_i = rhs_i − Σ_{m<i} Lm[i,m]·x_m.
  for (int colx = tid; colx < dk + s.dv; colx += blockDim.x) {
    const bool is_w = colx < dk;
    float x[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      float r = 0.0f;
      if (i < L)
        r = is_w ? bsh[i] * expf(G[i * ld + colx]) * kn[i * ld + colx]
                 : bsh[i] * s.v[((row0 + i) * s.heads + h) * s.dv + (colx - dk)];
#pragma unroll
      for (int m = 0; m < i; ++m) r -= lm[i * (kChunk + 1) + m] * x[m];
      x[i] = r;
    }
    float* dst = is_w ? ws + wl.w + colx : ws + wl.u + (colx - dk);
    const int stride = is_w ? dk : s.dv;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) dst[i * stride] = x[i];
  }
  // Qd, Kd and the chunk's total decay.
  const float* glast = G + (L - 1) * ld;
  for (int e = tid; e < kChunk * dk; e += blockDim.x) {
    const int i = e / dk, j = e % dk;
    ws[wl.qd + e] = qn[i * ld + j] * expf(G[i * ld + j]);
    ws[wl.kd + e] = i < L ? kn[i * ld + j] * expf(glast[j] - G[i * ld + j]) : 0.0f;
  }
  for (int j = tid; j < dk; j += blockDim.x) ws[wl.dl + j] = expf(glast[j]);
}

// The state passes' pieces. A block holds 32 columns of a state X [dk, ·] in registers (thread
// (warp w, lane) column blockIdx.x·32 + lane, reg[r] = row 32w + r); `part` is [4][64][32] shared.

// part[w][i][lane] ← Σ_{rows j of warp w} a[i][j]·X[j][col] for a [64][dk] in shared memory.
__device__ __forceinline__ void rows_times_state(const float* a, int dk, const float (&reg)[kRowsPerWarp], float* part) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = 0; i < kChunk; ++i) {
    float p = 0.0f;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int j = warp * kRowsPerWarp + r;
      if (j < dk) p += a[i * dk + j] * reg[r];
    }
    part[(warp * kChunk + i) * kCols + lane] = p;
  }
}

// (a·X)[i][cc] for the tile's column cc: the four warps' parts of rows_times_state summed.
__device__ __forceinline__ float rows_times_state_at(const float* part, int i, int cc) {
  return part[(0 * kChunk + i) * kCols + cc] + part[(1 * kChunk + i) * kCols + cc] +
         part[(2 * kChunk + i) * kCols + cc] + part[(3 * kChunk + i) * kCols + cc];
}

// The state step of a chunk of L rows: X[·][col] ← γ⊙X[·][col] + Σ_{m<L} kd[m][·]·vn[m][lane]
// (kd [64][dk], γ [dk], vn [64][32] in shared memory).
__device__ __forceinline__ void chunk_state_step(const float* kd, const float* gamma, const float* vn, int L, int dk,
                                                 float (&reg)[kRowsPerWarp]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int j = warp * kRowsPerWarp + r;
    if (j < dk) {
      float acc = gamma[j] * reg[r];
      for (int m = 0; m < L; ++m) acc += kd[m * dk + j] * vn[m * kCols + lane];
      reg[r] = acc;
    }
  }
}

// dst[0, n) ← src[0, n), by the block's threads.
__device__ __forceinline__ void block_load(float* dst, const float* src, int n) {
  for (int e = threadIdx.x; e < n; e += blockDim.x) dst[e] = src[e];
}

// The residual a chunk's state step takes: vn[i][cc] ← rhs(i, column) − (W·X)[i][cc] over the tile
// (column = blockIdx.x·32 + cc), W [64][dk] loaded from the chunk's factors `ws` into buf. Loads the
// caller issued before it are complete on return.
template <class Rhs>
__device__ __forceinline__ void chunk_residual(const float* ws, const WsLayout& wl, int dk,
                                               const float (&reg)[kRowsPerWarp], float* buf, float* part,
                                               const Rhs& rhs, float* vn) {
  block_load(buf, ws + wl.w, kChunk * dk);
  __syncthreads();
  rows_times_state(buf, dk, reg, part);
  __syncthreads();
  for (int e = threadIdx.x; e < kChunk * kCols; e += blockDim.x) {
    const int i = e / kCols, cc = e % kCols;
    vn[e] = rhs(i, blockIdx.x * kCols + cc) - rows_times_state_at(part, i, cc);
  }
}

__global__ void __launch_bounds__(kStateThreads) kda_chunk_state_kernel(KdaStep s, ChunkWork cw, Fp32Ws fw) {
  extern __shared__ float sm[];
  const int dk = s.dk;
  float* buf = sm;                         // [64][dk]: W, then Qd, then Kd
  float* aqk = buf + kChunk * dk;          // [64][64]
  float* vn = aqk + kChunk * kChunk;       // [64][32]
  float* part = vn + kChunk * kCols;       // [4][64][32]
  float* dl = part + 4 * kChunk * kCols;   // [dk]
  const int b = blockIdx.z, h = blockIdx.y, lane = threadIdx.x % 32, tid = threadIdx.x;
  const int col = blockIdx.x * kCols + lane;
  const int c_begin = cw.seq_chunk[b], c_end = cw.seq_chunk[b + 1];
  const WsLayout wl(dk, s.dv);
  float* st = state_tile(s, s.slots[b], h);
  float reg[kRowsPerWarp];
  load_state(s, st, col, reg);
  auto snapshot = [&](float* dst) { store_state(s, dst, col, reg); };
  for_snapshots(s, cw, b, h, 0, snapshot);
  if (c_begin == c_end) return;

  for (int c = c_begin; c < c_end; ++c) {
    const float* ws = fw.ws + (static_cast<int64_t>(c) * s.heads + h) * fw.per_head;
    const int64_t row0 = cw.chunk_row[c];
    const int L = cw.chunk_len[c];
    block_load(aqk, ws + wl.aqk, kChunk * kChunk);
    block_load(dl, ws + wl.dl, dk);
    // U − W·S (the state's columns past dv are zero, and so is their residual).
    chunk_residual(ws, wl, dk, reg, buf, part, [&](int i, int gc) {
      return gc < s.dv ? ws[wl.u + static_cast<int64_t>(i) * s.dv + gc] : 0.0f;
    }, vn);
    block_load(buf, ws + wl.qd, kChunk * dk);
    __syncthreads();
    rows_times_state(buf, dk, reg, part);  // Qd·S
    __syncthreads();
    for (int e = tid; e < L * kCols; e += blockDim.x) {
      const int i = e / kCols, cc = e % kCols, gc = blockIdx.x * kCols + cc;
      float o = rows_times_state_at(part, i, cc);
      for (int m = 0; m <= i; ++m) o += aqk[i * kChunk + m] * vn[m * kCols + cc];
      if (gc < s.dv) s.out.set(((row0 + i) * s.heads + h) * s.dv + gc, o);
    }
    __syncthreads();
    block_load(buf, ws + wl.kd, kChunk * dk);
    __syncthreads();
    chunk_state_step(buf, dl, vn, L, dk, reg);
    for_snapshots(s, cw, b, h, static_cast<int>(row0 + L - s.cu[b]), snapshot);
    __syncthreads();
  }
  store_state(s, st, col, reg);
}

// ---- segment summary

// Where the summary goes: A [B, H, dk, dk] and B [B, H, dk, dv], F32.
struct SummaryOut {
  float* a;
  float* b;
};

// The summary's state pass (the math is the CPU's, backend/cpu/kda.cc kda_summary): a chunk maps
// X to γ⊙X + Kd·(rhs − W·X), so the augmented state X = [A | B] [dk, dk + dv], started at [I | 0],
// takes the prefill's state step with rhs = [0 | U]. Column c < dk of X is column c of A, column
// dk + c is column c of B. One block per (32-column tile of X, head, sequence), chunks in order,
// every product in fp32 (A multiplies over all the chunks of a segment); the chunk factors W, U,
// Kd, γ come from kda_chunk_prep_kernel run without q. Cost per (chunk, head): 2·64·dk·(dk + dv)
// FMAs on the CUDA cores, and W, U, Kd read once per column tile.
__global__ void __launch_bounds__(kStateThreads) kda_summary_state_kernel(KdaStep s, ChunkWork cw, Fp32Ws fw,
                                                                          SummaryOut o) {
  extern __shared__ float sm[];
  const int dk = s.dk, dv = s.dv;
  float* buf = sm;                        // [64][dk]: W, then Kd
  float* vn = buf + kChunk * dk;          // [64][32]
  float* part = vn + kChunk * kCols;      // [4][64][32]
  float* gamma = part + 4 * kChunk * kCols;  // [dk]
  const int b = blockIdx.z, h = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int col = blockIdx.x * kCols + lane;
  const WsLayout wl(dk, dv);
  float reg[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) reg[r] = warp * kRowsPerWarp + r == col ? 1.0f : 0.0f;
  for (int c = cw.seq_chunk[b]; c < cw.seq_chunk[b + 1]; ++c) {
    const float* ws = fw.ws + (static_cast<int64_t>(c) * s.heads + h) * fw.per_head;
    block_load(gamma, ws + wl.dl, dk);
    // [0 | U] − W·X.
    chunk_residual(ws, wl, dk, reg, buf, part, [&](int i, int gc) {
      return gc >= dk && gc < dk + dv ? ws[wl.u + static_cast<int64_t>(i) * dv + (gc - dk)] : 0.0f;
    }, vn);
    block_load(buf, ws + wl.kd, kChunk * dk);
    __syncthreads();
    chunk_state_step(buf, gamma, vn, cw.chunk_len[c], dk, reg);
    __syncthreads();  // buf, gamma and vn are rewritten by the next chunk
  }
  const int64_t head = static_cast<int64_t>(b) * s.heads + h;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int j = warp * kRowsPerWarp + r;
    if (j >= dk) continue;
    if (col < dk) o.a[(head * dk + j) * dk + col] = reg[r];
    else if (col < dk + dv) o.b[(head * dk + j) * dv + (col - dk)] = reg[r];
  }
}

}  // namespace

KdaStep kda_step(const KdaArgs& a, const SeqLayout& layout, const char* op) {
  const int64_t n = a.q.dim(0), heads = a.q.dim(1), dk = a.q.dim(2), dv = a.v.dim(2);
  KL_CHECK(a.k.shape() == a.q.shape() && a.g.shape() == a.q.shape() && a.v.dim(0) == n && a.v.dim(1) == heads &&
               a.beta.numel() == n * heads && a.states.rank() == 4 && a.states.dim(1) == heads &&
               a.states.dim(2) == dk && a.states.dim(3) == dv && a.out.shape() == a.v.shape() &&
               a.g.dtype() == DType::kF32 && a.beta.dtype() == DType::kF32 && a.states.dtype() == DType::kF32 &&
               layout.num_rows() == n && layout.dev.cu_seqlens.defined(),
           std::string(op) + " q " + shapes(a.q) + " v " + shapes(a.v) + " g " + shapes(a.g) + " states " +
               shapes(a.states) + " rows " + std::to_string(layout.num_rows()));
  KL_CHECK(dk >= 1 && dk <= kMaxDk, std::string(op) + ": key head dim " + std::to_string(dk) + " is over " +
                                        std::to_string(kMaxDk) + " (not supported by the CUDA kernels)");
  return KdaStep{in(a.q, op), in(a.k, op), in(a.v, op), a.g.data_as<const float>(), a.beta.data_as<const float>(),
                 a.states.data_as<float>(), out(a.out, op), layout.dev.cu_seqlens.data_as<const int32_t>(),
                 layout.dev.slots.data_as<const int32_t>(), static_cast<int>(heads), static_cast<int>(dk),
                 static_cast<int>(dv), 1.0f / std::sqrt(static_cast<float>(dk))};
}


void CudaBackend::kda_gate(const Tensor& f, const Tensor& dt_bias, const Tensor& a_log, const KdaGateParams& p,
                           const Tensor& g) {
  const int64_t width = dt_bias.numel(), heads = a_log.numel();
  KL_CHECK(heads > 0 && width % heads == 0 && f.numel() == g.numel() && f.dim(-1) == width &&
               dt_bias.dtype() == DType::kF32 && a_log.dtype() == DType::kF32 && g.dtype() == DType::kF32,
           "kda_gate f " + shapes(f) + " dt_bias " + shapes(dt_bias) + " A_log " + shapes(a_log) + " g " + shapes(g));
  const int64_t rows = f.numel() / width;
  if (g.numel() == 0) return;
  kda_gate_kernel<<<blocks_for(g.numel(), 256), 256, 0, stream_>>>(in(f, "kda_gate"), dt_bias.data_as<const float>(),
                                                                    a_log.data_as<const float>(), rows, width,
                                                                    width / heads, p.kind, p.lower_bound,
                                                                    g.data_as<float>());
  KL_LAUNCHED("kda_gate " + shapes(f));
}

void CudaBackend::kda_recurrent(const KdaArgs& a, const SeqLayout& layout) {
  KL_CHECK(a.qk_norm == KdaQkNorm::kInside, "kda_recurrent: q and k as given (KdaQkNorm::kGiven) are not implemented on "
                                            "CUDA yet (issue 37); the kernels normalise them");
  for_snapshot_pieces(layout, a.states, [&](int64_t r0, int64_t r1, const SeqLayout& part) {
    kda_recurrent_rows(a.rows(r0, r1), part);
  });
}

namespace {

// The fp32 chunk factors of every (chunk, head) of the tables into a step workspace (one launch of
// kda_chunk_prep_kernel over all chunks).
Fp32Ws chunk_prep(CudaBackend& be, const KdaStep& s, const ChunkTables& ct, const std::string& what) {
  const WsLayout wl(s.dk, s.dv);
  const int64_t per_head = wl.total(s.dk);
  const Tensor ws = be.alloc(DType::kF32, {std::max<int64_t>(ct.chunks, 1), s.heads, per_head});
  const Fp32Ws fw{ws.data_as<float>(), per_head};
  if (ct.chunks > 0) {
    const int ld = s.dk + kPad;
    const size_t prep_smem = sizeof(float) * (4 * kChunk * ld + kChunk * (kChunk + 1) + kChunk);
    KL_CUDA(cudaFuncSetAttribute(kda_chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(prep_smem)),
            what);
    kda_chunk_prep_kernel<<<dim3(static_cast<unsigned>(ct.chunks), s.heads), kPrepThreads, prep_smem, be.stream()>>>(
        s, ct.work, fw);
    KL_LAUNCHED(what + " (chunk prep)");
  }
  return fw;
}

}  // namespace

ChunkTables chunk_tables(CudaBackend& be, const SeqLayout& layout, int64_t slots) {
  const int64_t num_seqs = layout.num_seqs();
  // Chunk tables from the host layout (the truth): each sequence's rows cut into chunks of 64.
  std::vector<int32_t> chunk_row, chunk_len, seq_chunk{0};
  for (int64_t b = 0; b < num_seqs; ++b) {
    for (int32_t r = layout.cu_seqlens[b]; r < layout.cu_seqlens[b + 1]; r += kChunk) {
      chunk_row.push_back(r);
      chunk_len.push_back(std::min<int32_t>(kChunk, layout.cu_seqlens[b + 1] - r));
    }
    seq_chunk.push_back(static_cast<int32_t>(chunk_row.size()));
  }
  const size_t snaps = layout.snap_seq.size();
  KL_CHECK(layout.snap_pos.size() == snaps && layout.snap_slot.size() == snaps &&
               (snaps == 0 || layout.dev.snap_seq.numel() == static_cast<int64_t>(snaps)),
           "kda_chunked: snapshot arrays of " + std::to_string(snaps) + " entries do not match the layout's");
  for (size_t k = 0; k < snaps; ++k) {
    const int32_t b = layout.snap_seq[k], pos = layout.snap_pos[k], slot = layout.snap_slot[k];
    KL_CHECK(b >= 0 && b < num_seqs && slot >= 0 && slot < slots && pos >= 0 && pos <= layout.new_tokens(b) &&
                 (pos % kChunk == 0 || pos == layout.new_tokens(b)),
             "kda_chunked: snapshot " + std::to_string(k) + " (sequence " + std::to_string(b) + ", after " +
                 std::to_string(pos) + " rows, into slot " + std::to_string(slot) + ") is not a chunk boundary or "
                 "the end of a sequence of the step with a slot of the " + std::to_string(slots) + "-slot pool");
  }
  auto dev = [&](std::vector<int32_t>& v) {
    return be.to_device(Tensor::wrap(DType::kI32, {static_cast<int64_t>(v.size())}, v.data(), nullptr, Device::kCpu),
                        DType::kI32);
  };
  ChunkTables t;
  t.chunks = static_cast<int64_t>(chunk_row.size());
  t.rows = dev(chunk_row), t.lens = dev(chunk_len), t.seq_chunk = dev(seq_chunk);
  t.host_seq_chunk = std::move(seq_chunk);
  auto ptr = [&](const Tensor& x) { return snaps == 0 ? nullptr : x.data_as<const int32_t>(); };
  t.work = ChunkWork{t.rows.data_as<const int32_t>(), t.lens.data_as<const int32_t>(),
                     t.seq_chunk.data_as<const int32_t>(), ptr(layout.dev.snap_seq), ptr(layout.dev.snap_pos),
                     ptr(layout.dev.snap_slot), static_cast<int>(snaps)};
  return t;
}

const char* kda_chunked_path_name(KdaChunkedPath path) { return path_name(path, {"tensor-core", "fp32"}); }

bool kda_chunked_path_fits(KdaChunkedPath path, const KdaArgs& a) {
  switch (path) {
    case KdaChunkedPath::kTensorCore: {
      const DType bf = DType::kBF16;
      const int64_t dk = a.q.dim(2), dv = a.v.dim(2);
      return a.q.dtype() == bf && a.k.dtype() == bf && a.v.dtype() == bf && a.out.dtype() == bf && dk == dv &&
             (dk == 16 || dk == 32 || dk == 64 || dk == 128);
    }
    case KdaChunkedPath::kFp32:
      return true;
  }
  return false;
}

KdaChunkedPath kda_chunked_path_for(const KdaArgs& a) {
  return kda_chunked_path_fits(KdaChunkedPath::kTensorCore, a) ? KdaChunkedPath::kTensorCore : KdaChunkedPath::kFp32;
}

Shape kda_tc_workspace_shape(const KdaStep& s, const ChunkTables& ct) {
  return {std::max<int64_t>(ct.chunks, 1), s.heads, ChunkLayout(s.dk, s.dv).bytes};
}

namespace {

// The tensor-core path: prep into a step workspace, then the state pass over it.
void kda_chunked_tc(CudaBackend& be, const KdaStep& s, const ChunkTables& ct, const SeqLayout& layout,
                    const KdaChunkedVariant& v, const std::string& what) {
  const Tensor ws = be.alloc(DType::kU8, kda_tc_workspace_shape(s, ct));
  const TcWork tw{ws.data_as<unsigned char>()};
  launch_tc_prep(be, s, ct, tw, what);
  launch_tc_state(be, s, ct, layout, tw, v, what);
}

// The checks and tables of the variant entry points (kda_chunked.h).
KdaStep tc_step(const KdaArgs& a, const SeqLayout& layout, const char* op) {
  const KdaStep s = kda_step(a, layout, "kda_chunked");
  KL_CHECK(kda_chunked_path_fits(KdaChunkedPath::kTensorCore, a),
           std::string(op) + ": the tensor-core path takes BF16 activations and dk = dv "
                             "in {16, 32, 64, 128}; got q " + shapes(a.q) + " v " + shapes(a.v));
  return s;
}

}  // namespace

void kda_chunked_on(CudaBackend& be, KdaChunkedPath path, const KdaArgs& a, const SeqLayout& layout) {
  const KdaStep s = kda_step(a, layout, "kda_chunked");
  const int64_t num_seqs = layout.num_seqs();
  const std::string what = "kda_chunked q " + shapes(a.q) + " seqs " + std::to_string(num_seqs);
  KL_CHECK(kda_chunked_path_fits(path, a), what + " v " + shapes(a.v) + ": the " + kda_chunked_path_name(path) +
                                               " path cannot run these tensors (dtypes or head dims)");
  if (num_seqs == 0) return;
  const ChunkTables ct = chunk_tables(be, layout, a.states.dim(0));
  if (path == KdaChunkedPath::kTensorCore) {
    kda_chunked_tc(be, s, ct, layout, KdaChunkedVariant{}, what);
    return;
  }
  const Fp32Ws fw = chunk_prep(be, s, ct, what);
  const size_t state_smem = sizeof(float) * (kChunk * s.dk + kChunk * kChunk + kChunk * kCols + 4 * kChunk * kCols + s.dk);
  KL_CUDA(cudaFuncSetAttribute(kda_chunk_state_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(state_smem)),
          what);
  const dim3 grid((s.dv + kCols - 1) / kCols, s.heads, static_cast<unsigned>(num_seqs));
  kda_chunk_state_kernel<<<grid, kStateThreads, state_smem, be.stream()>>>(s, ct.work, fw);
  KL_LAUNCHED(what + " (chunk state)");
}

void CudaBackend::kda_chunked(const KdaArgs& a, const SeqLayout& layout) {
  KL_CHECK(a.qk_norm == KdaQkNorm::kInside, "kda_chunked: q and k as given (KdaQkNorm::kGiven) are not implemented on "
                                            "CUDA yet (issue 37); the kernels normalise them");
  kda_chunked_on(*this, kda_chunked_path_for(a), a, layout);
}

// The backward ops run on the CPU only so far; a CUDA caller stops here rather than get no gradients.
void CudaBackend::kda_chunked_backward(const KdaBackwardArgs&, const SeqLayout&) {
  KL_CHECK(false, "kda_chunked_backward: the KDA backward is not implemented on CUDA yet (issue 37); use the CPU");
}
void CudaBackend::kda_recurrent_backward(const KdaBackwardArgs&, const SeqLayout&) {
  KL_CHECK(false, "kda_recurrent_backward: the KDA backward is not implemented on CUDA yet (issue 37); use the CPU");
}
void CudaBackend::kda_gate_backward(const KdaGateBackwardArgs&) {
  KL_CHECK(false, "kda_gate_backward: the KDA gate backward is not implemented on CUDA yet (issue 37); use the CPU");
}

void CudaBackend::kda_summary(const KdaSummaryArgs& a, const SeqLayout& layout) {
  KL_CHECK(a.qk_norm == KdaQkNorm::kInside, "kda_summary: k as given (KdaQkNorm::kGiven) is not implemented on CUDA yet "
                                            "(issue 37); the kernels normalise it");
  const KdaSummaryDims d = check_kda_summary(a, layout);
  const int64_t heads = d.heads, dk = d.dk, dv = d.dv, seqs = d.seqs;
  KL_CHECK(dk >= 1 && dk <= kMaxDk, "kda_summary: key head dim " + std::to_string(dk) + " is over " +
                                        std::to_string(kMaxDk) + " (not supported by the CUDA kernels)");
  if (seqs == 0) return;
  const std::string what = "kda_summary k " + shapes(a.k) + " seqs " + std::to_string(seqs);
  // The summary reads the rows of the layout only (no slots, no snapshots).
  SeqLayout rows_only;
  rows_only.cu_seqlens = layout.cu_seqlens;
  rows_only.cached = layout.cached;
  const ChunkTables ct = chunk_tables(*this, rows_only, 0);
  const KdaStep s{In{nullptr, false}, in(a.k, "kda_summary"), in(a.v, "kda_summary"), a.g.data_as<const float>(),
                  a.beta.data_as<const float>(), nullptr, Out{nullptr, false}, nullptr, nullptr,
                  static_cast<int>(heads), static_cast<int>(dk), static_cast<int>(dv), 1.0f};
  const Fp32Ws fw = chunk_prep(*this, s, ct, what);
  const size_t smem = sizeof(float) * (kChunk * dk + kChunk * kCols + 4 * kChunk * kCols + dk);
  KL_CUDA(cudaFuncSetAttribute(kda_summary_state_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)),
          what);
  const dim3 grid(static_cast<unsigned>((dk + dv + kCols - 1) / kCols), static_cast<unsigned>(heads),
                  static_cast<unsigned>(seqs));
  kda_summary_state_kernel<<<grid, kStateThreads, smem, stream_>>>(s, ct.work, fw,
                                                                   SummaryOut{a.a.data_as<float>(), a.b.data_as<float>()});
  KL_LAUNCHED(what + " (summary state)");
}

void kda_chunked_variant(CudaBackend& be, const KdaArgs& a, const SeqLayout& layout, const KdaChunkedVariant& v) {
  const KdaStep s = tc_step(a, layout, "kda_chunked_variant");
  if (layout.num_seqs() == 0) return;
  const ChunkTables ct = chunk_tables(be, layout, a.states.dim(0));
  kda_chunked_tc(be, s, ct, layout, v, "kda_chunked q " + shapes(a.q));
}

Tensor kda_tc_workspace(CudaBackend& be, const KdaArgs& a, const SeqLayout& layout) {
  const KdaStep s = tc_step(a, layout, "kda_tc_workspace");
  return be.alloc_persistent(DType::kU8, kda_tc_workspace_shape(s, chunk_tables(be, layout, a.states.dim(0))));
}

void kda_tc_prep(CudaBackend& be, const KdaArgs& a, const SeqLayout& layout, const Tensor& ws) {
  const KdaStep s = tc_step(a, layout, "kda_tc_prep");
  if (layout.num_seqs() == 0) return;
  const ChunkTables ct = chunk_tables(be, layout, a.states.dim(0));
  KL_CHECK(ws.shape() == kda_tc_workspace_shape(s, ct), "kda_tc_prep: workspace " + shapes(ws));
  launch_tc_prep(be, s, ct, TcWork{ws.data_as<unsigned char>()}, "kda_tc_prep q " + shapes(a.q));
}

void kda_tc_state(CudaBackend& be, const KdaArgs& a, const SeqLayout& layout, const Tensor& ws,
                  const KdaChunkedVariant& v) {
  const KdaStep s = tc_step(a, layout, "kda_tc_state");
  if (layout.num_seqs() == 0) return;
  const ChunkTables ct = chunk_tables(be, layout, a.states.dim(0));
  KL_CHECK(ws.shape() == kda_tc_workspace_shape(s, ct), "kda_tc_state: workspace " + shapes(ws));
  launch_tc_state(be, s, ct, layout, TcWork{ws.data_as<unsigned char>()}, v, "kda_tc_state q " + shapes(a.q));
}

void CudaBackend::kda_recurrent_rows(const KdaArgs& a, const SeqLayout& layout) {
  const KdaStep s = kda_step(a, layout, "kda_recurrent");
  if (layout.num_seqs() == 0 || layout.num_rows() == 0) return;
  const dim3 grid((s.dv + kCols - 1) / kCols, s.heads, static_cast<unsigned>(layout.num_seqs()));
  kda_recurrent_kernel<<<grid, kStateThreads, 0, stream_>>>(s);
  KL_LAUNCHED("kda_recurrent q " + shapes(a.q) + " seqs " + std::to_string(layout.num_seqs()));
}

}  // namespace klinear::cuda
