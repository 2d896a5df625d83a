// The bf16 KDA chunked prefill on tensor cores (MODEL.md 4.6, chunk 64), two launches:
//
// prep, a block of 512 threads per (chunk, head), two blocks per SM (≤ 64 registers, 108,288 bytes of
// shared memory at d = 128), every chunk in parallel (dk = dv = 16, 32, 64 or 128, a template
// argument). q, k and g go straight to shared memory by cp.async; q and k stay their raw bf16
// values, their L2 norms become row factors fq_i = scale/‖q_i‖, fk_i = 1/‖k_i‖ applied where the
// rows are consumed; G = cumsum(g) in fp32 (segments of rows in registers, then their carries).
//   The decayed dots Akk (β included: L) and Aqk:
//   - the ten 16×16 blocks on or below the diagonal with tf32 mma.sync m16n8k8 about reference rows
//     r: q_i·fq_i·e^{G_i−G_r} and k_m·fk_m·e^{G_r−G_m}; below the diagonal, a warp each, r is the
//     later block's first row and both factors are ≤ 1; a diagonal block on one warp about its middle
//     row, or where its decay is too steep for that, as three 8×8 quadrants on two warps, the
//     lower-left about its row 8 (factors ≤ 1), the two on the diagonal about their middle rows 4 and
//     12; either when the decay keeps the factors within e^{±80} (always the first under the
//     lower-bound gate: tc_diagonal), else
//   - exactly, the dots of raw rows against k_m ⊙ e^{G_i−G_m} as running products of e^{G_i−G_{i−1}}
//     (factors ≤ 1: strong decay underflows to 0, never overflows; one exp per row and channel
//     serves a lane's keys), times the row factors, on the block's four warps.
//   (I + L)⁻¹ in fp32: forward substitution inside the diagonal blocks, then below them by doubling
//   (the 32×32 inverses, then the 64×64). W = T·diag(β)·(e^G ⊙ K) and U = T·diag(β)·V with bf16 m16n8k16
//   (fp32 accumulate), the right-hand sides row-major in shared memory (ldmatrix.trans): e^G ⊙ K
//   over raw q once q is spent, V (loaded during the merge) over raw k.
//   It writes a bf16 workspace per (chunk, head): W [64, dk], Qd = Q⊙e^G [64, dk],
//   Kdᵀ = (K⊙e^{G_last−G})ᵀ [dk, 64], Aqk [64, 64], Uᵀ [dv, 64], and e^{G_last} [dk] in fp32, dense
//   with each row's 16-byte pieces permuted (ChunkLayout, swz); W and Uᵀ as one image in shared
//   memory, stored by two bulk copies (their mma fragments, stored directly, wrote parts of sectors).
//   The phases follow each other with barriers between them; the second block on the SM fills the
//   gaps (at one block per SM, 208 KB, the H200 profile showed 30% issue use, 6.3 cycles per
//   instruction, the load latency at the start fully exposed).
//
// Contract: s and ct as kda_chunked checked them (kda_step, chunk_tables), KdaChunkedPath::kTensorCore fits; tw
// holds [chunks, H, ChunkLayout(dk, dv).bytes] bytes (kda_chunk.cuh), every byte of it written for
// each chunk. Reads q, k, v (bf16), g and β (fp32); writes only the workspace.
#include <cstdint>
#include <type_traits>

#include "backend/cuda/common/ptx.cuh"
#include "backend/cuda/kda/kda_chunk.cuh"

namespace klinear::cuda {

namespace {

using namespace ptx;
using bf16 = __nv_bfloat16;

constexpr int kPrepThreads = 512;
constexpr int kLx = kChunk + 4;  // row stride of the fp32 [64, 64] matrices (fragment reads spread over banks)

// Prep keeps G in log2 units, so its exps e^{G_i − G_m} are 2^x of differences of the stored G with
// no multiply (ptx::exp2_ftz); they are decays (x ≤ 0) and underflow to 0 by design; the flush
// spares the subnormal fix-up (~10% of prep's instructions in ncu).
constexpr float kLog2e = 1.4426950408889634f;
// ptx.cuh's ldsm_x2_trans over rows = k with 8 consecutive n per row gives the m16n8k16 B fragment of
// a row-major [k][n] operand at rows 16ks.., columns n..n+7; W and Uᵀ leave shared memory by bulk
// stores, after fence_proxy_async orders the threads' writes of that image before them.

// Shared memory of the prep at d = dk = dv: G (fp32 [64][d+8]), X and T (fp32 [64][kLx]), Y (768),
// β, fq, fk (64 each), then q and k as their bf16 inputs ([64][d+8] each). 108,288 bytes at d = 128:
// two blocks per SM (2 × (108,288 + 1,024) ≤ 233,472). The rows of G are 8 words apart in the banks
// and those of q and k 4 (mod 32), so the tensor-core blocks' reads of rows g = 0 .. 7 (8 bytes of G,
// 4 of q or k a lane) and the ldmatrix reads of eight rows are free of bank conflicts.
size_t prep_smem_bytes(int d) {
  return sizeof(float) * (kChunk * (d + 8) + 2 * kChunk * kLx + 3 * 256 + 3 * kChunk) +
         sizeof(bf16) * static_cast<size_t>(2 * kChunk) * (d + 8);
}

// Rows 0..L−1 of a [rows, H, D] tensor (head h, rows from row0) into a [64][ld] shared array by
// cp.async in 16-byte pieces (the caller commits), rows L..63 zeroed. A thread keeps one column
// piece and steps down the rows: one 64-bit address, then 32-bit steps (a chunk spans 64·H·D
// elements), the passes unrolled.
template <int D, typename E>
__device__ __forceinline__ void load_chunk_rows(E* dst, int ld, const E* src, int64_t row0, int L, int H, int h,
                                                int tid) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(E)), kRow = D / kPer;  // elements per piece, pieces per row
  constexpr int kRowsPass = kPrepThreads / kRow, kPasses = kRowsPass >= kChunk ? 1 : kChunk / kRowsPass;
  const int i0 = tid / kRow, j = kPer * (tid % kRow);
  if (kRowsPass > kChunk && i0 >= kChunk) return;  // small D: more threads than pieces
  const E* from = src + ((row0 + i0) * H + h) * D + j;
  const int step = kRowsPass * H * D;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int i = i0 + p * kRowsPass;
    E* d = dst + i * ld + j;
    if (i < L) cp_async16(d, from + p * step);
    else *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
  }
}
__device__ __forceinline__ float4 bf16x4(const bf16* p) {  // four bf16 at an 8-byte aligned address
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}

// dst[0..3] = sign · Σ_{p<kInner} a[p]·b[p·ldb + 0..3]: four columns of one row of a product of
// fp32 blocks in shared memory (a broadcast scalar and a float4 per term: shared-memory bound).
template <int kInner>
__device__ __forceinline__ void product_row4(float* dst, const float* a, const float* b, int ldb, float sign) {
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int p = 0; p < kInner; ++p) {
    const float x = a[p];
    const float4 v = *reinterpret_cast<const float4*>(b + p * ldb);
    acc.x += x * v.x, acc.y += x * v.y, acc.z += x * v.z, acc.w += x * v.w;
  }
  *reinterpret_cast<float4*>(dst) = make_float4(sign * acc.x, sign * acc.y, sign * acc.z, sign * acc.w);
}

// How diagonal block I (rows 16I .. 16I + 15) of a chunk's dots runs (tc_block): on tensor cores
// about reference rows r, where every channel's decay on each side of each r is at most kTcSpan so
// that the factors e^{G_i−G_r} and e^{G_r−G_m} lie in [e^{−80}, e^{80}] (normal floats, finite):
//   kMiddle, on one warp, about its middle row r = 16I + 8: G_{16I} − G_r and G_r − G_{16I+15}
//   (8 and 7 steps); always so under the lower-bound gate (8 · 5 = 40);
//   kQuadrants, on two warps, as three 8×8 quadrants: the two on the diagonal about their middle
//   rows 16I + 4 and 16I + 12 (spans of 4 or 3 steps), the lower-left about row 16I + 8 (factors
//   ≤ 1 whatever the decay);
//   else kExact, the running products on the block's four warps.
// ops_bench's softplus draws, estimated from their distribution over three draws of the heads' A:
// 39-59 % of the diagonal blocks middle, 11-29 % quadrants, 24-32 % exact (41-61 % would be exact
// with the middle row alone). A NaN span takes the exact path. Warp-uniform: the lanes vote. (G in
// log2 units.)
enum class DiagPath { kMiddle, kQuadrants, kExact };
constexpr float kTcSpan = 80.0f;
__device__ __forceinline__ DiagPath tc_diagonal(const float* G, int lg, int dk, int I, int lane) {
  constexpr float kMax = kTcSpan * kLog2e;  // compared one by one: fmaxf would pass a NaN over
  bool middle = true, quadrants = true;
  for (int c = lane; c < dk; c += 32) {
    const float* col = G + 16 * I * lg + c;
    const float g0 = col[0], g4 = col[4 * lg], g7 = col[7 * lg], g8 = col[8 * lg], g12 = col[12 * lg],
                g15 = col[15 * lg];
    middle = middle && g0 - g8 <= kMax && g8 - g15 <= kMax;
    quadrants = quadrants && g0 - g4 <= kMax && g4 - g7 <= kMax && g8 - g12 <= kMax && g12 - g15 <= kMax;
  }
  if (__all_sync(0xffffffffu, middle)) return DiagPath::kMiddle;
  return __all_sync(0xffffffffu, quadrants) ? DiagPath::kQuadrants : DiagPath::kExact;
}

// D = dk = dv (compile time: the index arithmetic is shifts). Two blocks per SM: 64 registers.
template <int D>
__global__ void __launch_bounds__(kPrepThreads, 2) kda_tc_prep_kernel(KdaStep s, ChunkWork cw, TcWork tw) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int dk = D, dv = D, lg = D + 8, lr = D + 8, kWarpsP = kPrepThreads / 32;
  // Lifetimes (phases: 1 loads, 2 cumsum and norms, 3 Akk/Aqk with Kdᵀ, 4 Aqk out, 5 inverse with Qd,
  // e^G ⊙ K, 6 the merge below the diagonal blocks, 7 W/U):
  float* G = reinterpret_cast<float*>(smem_raw);  // [64][lg] g, then its cumulative sum in log2 units (1-5)
  float* X = G + kChunk * lg;                     // [64][kLx] L = β_i·Akk, strictly lower (1-6); Z of 6 above
  float* T = X + kChunk * kLx;                    // [64][kLx] Aqk in fp32 (1-4), then (I + L)⁻¹ (5-7)
  float* Y = T + kChunk * kLx;                    // [768] cumsum carries (2), then the merge's first products (6)
  float* bsh = Y + 3 * 256;                       // [64] β
  float* fq = bsh + kChunk;                       // [64] scale / ‖q_i‖
  float* fk = fq + kChunk;                        // [64] 1 / ‖k_i‖
  bf16* Qs = reinterpret_cast<bf16*>(fk + kChunk);  // [64][lr] raw q (1-5); phase 5 writes e^G ⊙ K over it
                                                    // in place (each thread its own q), read in 7
  bf16* Ks = Qs + kChunk * lr;                      // [64][lr] raw k (1-5); V is loaded over it in 6 for 7
  const int chunk = blockIdx.x, h = blockIdx.y, H = s.heads, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t row0 = cw.chunk_row[chunk];
  const int L = cw.chunk_len[chunk];
  constexpr ChunkLayout wl(dk, dv);  // the workspace's offsets in bytes
  unsigned char* ws = tw.ws + (static_cast<int64_t>(chunk) * H + h) * wl.bytes;

  // Phase 1: q, k, g straight into shared memory by cp.async (no registers held), β; zero past L.
  load_chunk_rows<D>(Qs, lr, static_cast<const bf16*>(s.q.p), row0, L, H, h, tid);
  load_chunk_rows<D>(Ks, lr, static_cast<const bf16*>(s.k.p), row0, L, H, h, tid);
  load_chunk_rows<D>(G, lg, s.g, row0, L, H, h, tid);
  cp_async_commit();
  if (tid < kChunk) bsh[tid] = tid < L ? s.beta[(row0 + tid) * H + h] : 0.0f;
  for (int e = tid; e < kChunk * kLx / 4; e += kPrepThreads)
    reinterpret_cast<float4*>(X)[e] = reinterpret_cast<float4*>(T)[e] = make_float4(0.f, 0.f, 0.f, 0.f);
  cp_async_wait<0>();
  __syncthreads();
  {  // G = cumsum(g) down each channel (padding has g = 0): kSeg segments of rows per channel summed
     // in registers, then each segment adds the totals of the segments above it, in order; stored
     // times log2 e (exp2_ftz).
    constexpr int kSeg = kPrepThreads / D, kRowsSeg = kChunk / kSeg;
    const int j = tid % D, sg = tid / D;
    float run[kRowsSeg], acc = 0.0f;
#pragma unroll
    for (int r = 0; r < kRowsSeg; ++r) acc += G[(sg * kRowsSeg + r) * lg + j], run[r] = acc;
    Y[sg * D + j] = acc;
    __syncthreads();
    float carry = 0.0f;
    for (int p = 0; p < sg; ++p) carry += Y[p * D + j];
#pragma unroll
    for (int r = 0; r < kRowsSeg; ++r) G[(sg * kRowsSeg + r) * lg + j] = (run[r] + carry) * kLog2e;
  }
  {  // L2 norms into the row factors fq, fk (q and k stay raw), a warp per row; the warp's rows
     // reduced together (independent shuffle chains)
    constexpr int kRows = kChunk / kWarpsP;
    float sq[kRows], sk[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int i = warp + r * kWarpsP;
      sq[r] = sk[r] = 0.0f;
#pragma unroll
      for (int j = 2 * lane; j < dk; j += 64) {
        const float2 qq = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(Qs + i * lr + j));
        const float2 kk = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(Ks + i * lr + j));
        sq[r] += qq.x * qq.x + qq.y * qq.y, sk[r] += kk.x * kk.x + kk.y * kk.y;
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) sq[r] = warp_sum(sq[r]), sk[r] = warp_sum(sk[r]);
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int i = warp + r * kWarpsP;
        fq[i] = s.scale * rsqrtf(sq[r] + 1e-6f), fk[i] = rsqrtf(sk[r] + 1e-6f);
      }
  }
  __syncthreads();

  // Aqk is built in fp32 in T (zeroed: above the diagonal stays 0), L in X; the dots run on raw q, k
  // and take the row factors at the end.
  float* aqk = T;
  // A block (I, M), M ≤ I, of both dots on tf32 tensor cores, one warp, plain stores: operands
  // q_i·e^{G_i−G_r} and k_i·e^{G_i−G_r} (i in block I; their row factors fq_i, fk_i scale the sums at
  // the end) against k_m·fk_m·e^{G_r−G_m} (m in block M, the row factor folded into the decay
  // factor), about reference rows r (tc_diagonal bounds a factor ≥ 1). `TcPart::kWhole`: the block
  // about one row, below the diagonal (M < I) r = 16I, the block's first row, where both factors are
  // ≤ 1; on it (M = I) r = 16I + 8, its middle row. As quadrants, each its own mma's with the other
  // rows' operands zero, on two warps: columns 16I .. 16I + 7 (kDiagLeft) by rows 16I .. 16I + 7
  // about r = 16I + 4 and by rows 16I + 8 .. 16I + 15 about r = 16I + 8 (factors ≤ 1), into the same
  // accumulators; columns 16I + 8 .. 16I + 15 (kDiagRight) by rows 16I + 8 .. 16I + 15 about
  // r = 16I + 12 (three quadrants cost a warp about 1.5 blocks, so a block that allows it runs about
  // its middle row, and the right quadrant goes to a second warp). Only the lower triangle is
  // stored. The sum over channels takes them in any order: in k-step pair p, lane t's slots t, t + 4
  // are channels 16p + 2t, + 1 in the first step and 16p + 8 + 2t, + 1 in the second, so each operand
  // row comes as 8 bytes of G and 4 of bf16 a step, conflict-free (prep_smem_bytes).
  struct RowPair {  // a row's two channels of k and q and their decay factors; {} is a row left out
    float2 k, q, e;
  };
  enum class TcPart { kWhole, kDiagLeft, kDiagRight };
  auto tc_block = [&](int I, int M, auto part) {
    constexpr TcPart kPart = decltype(part)::value;
    constexpr int nt_begin = kPart == TcPart::kDiagRight ? 1 : 0, nt_end = kPart == TcPart::kDiagLeft ? 1 : 2;
    const int g = lane >> 2, t = lane & 3, ia = 16 * I + g, ib = ia + 8;
    const float fkm[2] = {fk[16 * M + g], fk[16 * M + 8 + g]};
    auto g2 = [&](int i, int c) { return *reinterpret_cast<const float2*>(G + i * lg + c); };
    auto b2 = [&](const bf16* m, int i, int c) {
      return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(m + i * lr + c));
    };
    auto decay = [](float2 gi, float2 gr) { return make_float2(exp2_ftz(gi.x - gr.x), exp2_ftz(gi.y - gr.y)); };
    float ck[2][4] = {}, cq[2][4] = {};
    // Both dots of n-tile nt at channels c, c + 1, rows ia and ib against the keys about row G gr.
    auto dots = [&](int nt, int c, float2 gr, RowPair a, RowPair b) {
      const int mm = 16 * M + 8 * nt + g;
      const float2 gm = g2(mm, c), km = b2(Ks, mm, c);
      const float f = fkm[nt];
      const uint32_t b0 = tf32(km.x * (f * exp2_ftz(gr.x - gm.x))), b1 = tf32(km.y * (f * exp2_ftz(gr.y - gm.y)));
      const uint32_t ak[4] = {tf32(a.k.x * a.e.x), tf32(b.k.x * b.e.x), tf32(a.k.y * a.e.y), tf32(b.k.y * b.e.y)};
      const uint32_t aq[4] = {tf32(a.q.x * a.e.x), tf32(b.q.x * b.e.x), tf32(a.q.y * a.e.y), tf32(b.q.y * b.e.y)};
      mma_tf32(ck[nt], ak, b0, b1);
      mma_tf32(cq[nt], aq, b0, b1);
    };
#pragma unroll 1
    for (int c0 = 2 * t; c0 < dk; c0 += 16)
#pragma unroll
      for (int c = c0; c < c0 + 16; c += 8) {  // a k-step: channels c, c + 1 in slots t, t + 4
        const float2 ga = g2(ia, c), gb = g2(ib, c);
        const float2 ka = b2(Ks, ia, c), kb = b2(Ks, ib, c), qa = b2(Qs, ia, c), qb = b2(Qs, ib, c);
        if constexpr (kPart == TcPart::kWhole) {
          const float2 gr = g2(16 * I + (M < I ? 0 : 8), c);
          const RowPair a{ka, qa, decay(ga, gr)}, b{kb, qb, decay(gb, gr)};
          dots(0, c, gr, a, b);
          dots(1, c, gr, a, b);
        } else if constexpr (kPart == TcPart::kDiagLeft) {
          const float2 g4 = g2(16 * I + 4, c), g8 = g2(16 * I + 8, c);
          dots(0, c, g4, RowPair{ka, qa, decay(ga, g4)}, RowPair{});
          dots(0, c, g8, RowPair{}, RowPair{kb, qb, decay(gb, g8)});
        } else {
          const float2 g12 = g2(16 * I + 12, c);
          dots(1, c, g12, RowPair{}, RowPair{kb, qb, decay(gb, g12)});
        }
      }
#pragma unroll
    for (int nt = nt_begin; nt < nt_end; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x) {  // accumulator x: row ia (x < 2) or ib, column col
        const int i = x < 2 ? ia : ib, col = 16 * M + 8 * nt + 2 * t + (x & 1);
        if (M < I || i > col) X[i * kLx + col] = (bsh[i] * fk[i]) * ck[nt][x];
        if (M < I || i >= col) aqk[i * kLx + col] = fq[i] * cq[nt][x];
      }
  };
  // The diagonal blocks: block I = warp / 4 belongs to warps 4I .. 4I + 3.
  const int dblk = warp >> 2;
  const DiagPath path = tc_diagonal(G, lg, dk, dblk, lane);
  if (path == DiagPath::kMiddle) {
    if ((warp & 3) == 0) tc_block(dblk, dblk, std::integral_constant<TcPart, TcPart::kWhole>{});
  } else if (path == DiagPath::kQuadrants) {
    if ((warp & 3) == 0) tc_block(dblk, dblk, std::integral_constant<TcPart, TcPart::kDiagLeft>{});
    if ((warp & 3) == 1) tc_block(dblk, dblk, std::integral_constant<TcPart, TcPart::kDiagRight>{});
  } else {
    // Exact, for a block whose decay is too steep for the tensor cores' factors: warp 4I + x takes
    // keys 16I + 4x .. 16I + 4x + 3. A lane holds kKpl consecutive keys m_x = mk + x on one slice
    // of four channels (kSl slices: 32 at d = 128, 16 at 64, else 8; at d = 16 slices 4-7 idle) and
    // walks the rows i of their block: dec_x = k_{m_x} ⊙ e^{G_i − G_{m_x}} as a running product (0
    // before m_x, k_{m_x} at i = m_x, then times e^{G_i − G_{i−1}}), the step factor (≤ 1: strong
    // decay underflows to 0, never overflows) one exp per channel and row for all the lane's keys.
    // The differences of G telescope: the product is e^{G_i − G_m} of the stored G up to the exps'
    // rounding.
    constexpr int kSl = D >= 128 ? 32 : D >= 64 ? 16 : 8, kKpl = kSl / 8, kNv = 2 * kKpl;
    const int mbase = 16 * dblk + 4 * (warp & 3), end = 16 * dblk + 16;
    const int j = 4 * (lane % kSl), mk = mbase + (lane / kSl) * kKpl;
    const bool live = j < dk;
    float4 dec[kKpl], gprev = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int x = 0; x < kKpl; ++x) dec[x] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (live) gprev = *reinterpret_cast<const float4*>(G + mbase * lg + j);
#pragma unroll 2
    for (int i = mbase; i < end; ++i) {  // warp-uniform
      float v[kNv] = {};                  // the partial dots: k_i·dec_x of the keys, then q_i·dec_x
      if (live) {
        const float4 gi = *reinterpret_cast<const float4*>(G + i * lg + j);
        const float4 kv = bf16x4(Ks + i * lr + j), qv = bf16x4(Qs + i * lr + j);
        const float4 e = make_float4(exp2_ftz(gi.x - gprev.x), exp2_ftz(gi.y - gprev.y), exp2_ftz(gi.z - gprev.z),
                                     exp2_ftz(gi.w - gprev.w));
        gprev = gi;
#pragma unroll
        for (int x = 0; x < kKpl; ++x) {
          float4& d = dec[x];
          if (i == mk + x) d = kv;
          else d.x *= e.x, d.y *= e.y, d.z *= e.z, d.w *= e.w;
          v[x] = kv.x * d.x + kv.y * d.y + kv.z * d.z + kv.w * d.w;
          v[kKpl + x] = qv.x * d.x + qv.y * d.y + qv.z * d.z + qv.w * d.w;
        }
      }
      // Sums over the kSl lanes of the keys: halving steps (offsets kSl/2 .. 4: the lanes with the
      // offset's bit keep the upper half of the values, their partners the lower) leave value
      // (lane >> 2) % kNv in v[0], then offsets 2 and 1.
#pragma unroll
      for (int n = kNv; n > 1; n >>= 1) {
        const int o = kSl * n / (2 * kNv);
        const bool hi = (lane & o) != 0;
#pragma unroll
        for (int k = 0; k < n / 2; ++k) {
          const float send = hi ? v[k] : v[k + n / 2], keep = hi ? v[k + n / 2] : v[k];
          v[k] = keep + __shfl_xor_sync(0xffffffffu, send, o);
        }
      }
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], 2);
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], 1);
      if ((lane & 3) == 0) {
        const int idx = (lane >> 2) & (kNv - 1), m = mk + (idx & (kKpl - 1));
        if (idx < kKpl) {
          if (i > m) X[i * kLx + m] = bsh[i] * (v[0] * fk[i] * fk[m]);
        } else if (i >= m) {
          aqk[i * kLx + m] = v[0] * fq[i] * fk[m];
        }
      }
    }
  }
  // The six blocks (I, M) below the diagonal ones, a warp each, go to warps with little exact
  // diagonal work (16 − 4·(warp % 4) rows, when their block has any): warps 4I + 3, then 2 and 6.
  // The six other warps with none of them (1, 5, 9, 13, 10, 14; the first four after their diagonal
  // block's right quadrant, if it runs as quadrants) write Kdᵀ (eight positions of a channel each)
  // and e^{G_last}, which need only G, k and fk.
  if ((warp & 3) == 3 || warp == 2 || warp == 6) {
    const int blk = (warp & 3) == 3 ? warp >> 2 : 4 + (warp >> 2);
    // blocks (1,0), (2,0), (2,1), (3,0), (3,1), (3,2) in order (arithmetic: a table would sit in local memory)
    const int I = blk < 1 ? 1 : blk < 3 ? 2 : 3, M = blk - I * (I - 1) / 2;
    tc_block(I, M, std::integral_constant<TcPart, TcPart::kWhole>{});
  } else if ((warp & 3) != 0) {
    const int u = 32 * ((warp & 3) == 1 ? warp >> 2 : 2 + (warp >> 2)) + lane;  // warps 1, 5, 9, 13, 10, 14
    constexpr int kWriters = 6 * 32;
    const float* glast = G + (kChunk - 1) * lg;  // = G at row L−1 (padding has g = 0)
    for (int e = u; e < dk * kChunk / 8; e += kWriters) {
      const int j = e % dk, i0 = 8 * (e / dk);
      auto kd_at = [&](int i) {
        return __bfloat162float(Ks[i * lr + j]) * (fk[i] * exp2_ftz(glast[j] - G[i * lg + j]));
      };
      uint32_t kd[4];
#pragma unroll
      for (int x = 0; x < 4; ++x) kd[x] = pack_bf16(kd_at(i0 + 2 * x), kd_at(i0 + 2 * x + 1));
      *reinterpret_cast<uint4*>(ws + wl.kt + swz<kChunk>(j, i0)) = make_uint4(kd[0], kd[1], kd[2], kd[3]);
    }
    for (int j = u; j < dk; j += kWriters) reinterpret_cast<float*>(ws + wl.dl)[j] = exp2_ftz(glast[j]);
  }
  __syncthreads();
  // Aqk to the workspace in bf16, eight entries per thread, and T back to zero.
  for (int e = tid; e < kChunk * kChunk / 8; e += kPrepThreads) {
    const int i = e >> 3, c = 8 * (e & 7);
    float4* src = reinterpret_cast<float4*>(aqk + i * kLx + c);
    const float4 a = src[0], b = src[1];
    *reinterpret_cast<uint4*>(ws + wl.a + swz<kChunk>(i, c)) =
        make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y), pack_bf16(b.z, b.w));
    src[0] = src[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  __syncthreads();

  if (tid < kChunk) {
    // Inverses of the diagonal blocks of I + L, a thread per column c of block I.
    const int I = tid >> 4, c = tid & 15, o = 16 * I;
    float x[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float r = i == c ? 1.0f : 0.0f;
#pragma unroll
      for (int m = 0; m < i; ++m) r -= X[(o + i) * kLx + o + m] * x[m];
      x[i] = i < c ? 0.0f : r;
      T[(o + i) * kLx + o + c] = x[i];
    }
  } else {
    // The other threads write Qd and the right-hand side e^G ⊙ K (four channels of a row each;
    // e^G ⊙ K over the thread's own raw q: no other thread reads q in this phase).
    const int u = tid - kChunk;
    constexpr int kOthers = kPrepThreads - kChunk;
    for (int e = u; e < kChunk * dk / 4; e += kOthers) {  // a warp reads whole rows
      const int i = e / (dk / 4), j = 4 * (e % (dk / 4));
      const float4 gg = *reinterpret_cast<const float4*>(G + i * lg + j);
      const float4 qq = bf16x4(Qs + i * lr + j), kk = bf16x4(Ks + i * lr + j);
      const float qf = fq[i], kf = fk[i];
      const float e0 = exp2_ftz(gg.x), e1 = exp2_ftz(gg.y), e2 = exp2_ftz(gg.z), e3 = exp2_ftz(gg.w);
      *reinterpret_cast<uint2*>(ws + wl.q + swz<dk>(i, j)) =
          make_uint2(pack_bf16(qq.x * (qf * e0), qq.y * (qf * e1)), pack_bf16(qq.z * (qf * e2), qq.w * (qf * e3)));
      *reinterpret_cast<uint2*>(Qs + i * lr + j) =
          make_uint2(pack_bf16(kk.x * (kf * e0), kk.y * (kf * e1)), pack_bf16(kk.z * (kf * e2), kk.w * (kf * e3)));
    }
  }
  __syncthreads();
  // k is dead: V over it (from global; the load flies during the merge), waited for before W/U.
  load_chunk_rows<D>(Ks, lr, static_cast<const bf16*>(s.v.p), row0, L, H, h, tid);
  cp_async_commit();
  // (I + L)⁻¹ below its diagonal blocks, by doubling (M = [[A, 0], [C, B]] ⇒ the lower-left block of
  // M⁻¹ is −B⁻¹·C·A⁻¹): the 32×32 inverses of blocks 0-1 and 2-3,
  // T_{I,I−1} = −T_II·(L_{I,I−1}·T_{I−1,I−1}) for I = 1, 3 (the products in Y), then the lower-left
  // 32×32 block −T[32:, 32:]·(L[32:, :32]·T[:32, :32]) (the product Z in X's upper-right 32×32 block,
  // which nothing reads: L is strictly lower). The products span whole blocks (T's zeros above its
  // diagonal included); a thread per four columns of a row. Four barriers, rounds of 16 and 32 terms.
  if (tid < 128) {  // round 1: x = tid / 64 is I = 2x + 1; o = 16(I − 1)
    const int o = 32 * (tid >> 6), a = (tid >> 2) & 15, b = 4 * (tid & 3);
    product_row4<16>(Y + 4 * tid, X + (o + 16 + a) * kLx + o, T + o * kLx + o + b, kLx, 1.0f);
  }
  __syncthreads();
  if (tid < 128) {
    const int o = 32 * (tid >> 6), a = (tid >> 2) & 15, b = 4 * (tid & 3);
    float* row = T + (o + 16 + a) * kLx;
    product_row4<16>(row + o + b, row + o + 16, Y + 256 * (tid >> 6) + b, 16, -1.0f);
  }
  __syncthreads();
  float* Z = X + 32;  // [32][kLx]
  if (tid < 256) {  // round 2
    const int a = tid >> 3, b = 4 * (tid & 7);
    product_row4<32>(Z + a * kLx + b, X + (32 + a) * kLx, T + b, kLx, 1.0f);
  }
  __syncthreads();
  if (tid < 256) {
    const int a = tid >> 3, b = 4 * (tid & 7);
    float* row = T + (32 + a) * kLx;
    product_row4<32>(row + b, row + 32, Z + b, kLx, -1.0f);
  }
  cp_async_wait<0>();  // V (this thread's pieces), visible to all after the barrier
  __syncthreads();
  // [W | U] = T·diag(β) · [e^G ⊙ K | V] on bf16 tensor cores: warp → 16 rows (warp % 4) and a
  // quarter of the n-tiles; B fragments of the row-major right-hand sides by ldmatrix.trans. W and Uᵀ
  // go into G's dead shared memory as their workspace image (G holds 64·(dk + 8) floats).
  unsigned char* img = reinterpret_cast<unsigned char*>(G);  // W [64][dk], permuted
  unsigned char* img_u = img + 2 * kChunk * dk;              // Uᵀ [dv][64], permuted
  {
    const bf16* Es = Qs;  // e^G ⊙ K (phase 5)
    const bf16* Vs = Ks;  // V (phase 6)
    constexpr int kPer = (dk + dv) / 32;  // n-tiles per warp
    const int mt = warp & 3, g = lane >> 2, t = lane & 3, nt0 = (warp >> 2) * kPer;
    const int brow = (lane & 7) + 8 * ((lane >> 3) & 1);  // lanes 0-15: rows of the two 8×8 matrices
    uint32_t a[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const int c = 16 * ks + 2 * t;
      const float* r0 = T + (16 * mt + g) * kLx + c;
      const float* r1 = r0 + 8 * kLx;
      const float b0 = bsh[c], b1 = bsh[c + 1], b8 = bsh[c + 8], b9 = bsh[c + 9];
      a[ks][0] = pack_bf16(r0[0] * b0, r0[1] * b1);
      a[ks][1] = pack_bf16(r1[0] * b0, r1[1] * b1);
      a[ks][2] = pack_bf16(r0[8] * b8, r0[9] * b9);
      a[ks][3] = pack_bf16(r1[8] * b8, r1[9] * b9);
    }
    const int i0 = 16 * mt + g, i1 = i0 + 8;
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int n = 8 * (nt0 + q);  // the n-tile's first column: in e^G ⊙ K below dk, in V above
      const bf16* rhs = n < dk ? Es + n : Vs + (n - dk);
      float c[4] = {};
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        uint32_t b[2];
        ldsm_x2_trans(b, rhs + (16 * ks + brow) * lr);
        mma_bf16(c, a[ks], b[0], b[1]);
      }
      if (n < dk) {
        *reinterpret_cast<uint32_t*>(img + swz<dk>(i0, n + 2 * t)) = pack_bf16(c[0], c[1]);
        *reinterpret_cast<uint32_t*>(img + swz<dk>(i1, n + 2 * t)) = pack_bf16(c[2], c[3]);
      } else {  // Uᵀ rows n − dk + g at positions 16mt + 2t, + 1 (and + 8): the halves transposed
        const uint32_t lo = movmatrix_trans(pack_bf16(c[0], c[1])), hi = movmatrix_trans(pack_bf16(c[2], c[3]));
        *reinterpret_cast<uint32_t*>(img_u + swz<kChunk>(n - dk + g, 16 * mt + 2 * t)) = lo;
        *reinterpret_cast<uint32_t*>(img_u + swz<kChunk>(n - dk + g, 16 * mt + 8 + 2 * t)) = hi;
      }
    }
  }
  // W and Uᵀ to the workspace as two bulk copies (the image in shared memory is the global one).
  fence_proxy_async();
  __syncthreads();
  if (tid == 0) {
    bulk_store(ws, img, 2 * kChunk * dk);
    bulk_store(ws + wl.u, img_u, 2 * dv * kChunk);
    bulk_store_wait();
  }
}

}  // namespace

void launch_tc_prep(CudaBackend& be, const KdaStep& s, const ChunkTables& ct, const TcWork& tw,
                    const std::string& what) {
  if (ct.chunks == 0) return;
  auto prep = s.dk == 16 ? kda_tc_prep_kernel<16>
            : s.dk == 32 ? kda_tc_prep_kernel<32>
            : s.dk == 64 ? kda_tc_prep_kernel<64>
                         : kda_tc_prep_kernel<128>;
  const size_t smem = prep_smem_bytes(s.dk);
  KL_CUDA(cudaFuncSetAttribute(prep, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), what);
  // All of the unified L1 as shared memory, so that two blocks fit on an SM (the loads bypass L1).
  KL_CUDA(cudaFuncSetAttribute(prep, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared),
          what);
  prep<<<dim3(static_cast<unsigned>(ct.chunks), s.heads), kPrepThreads, smem, be.stream()>>>(s, ct.work, tw);
  KL_LAUNCHED(what + " (tensor-core chunk prep)");
}

}  // namespace klinear::cuda
