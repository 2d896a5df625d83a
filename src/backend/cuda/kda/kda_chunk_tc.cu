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
// state, a block per (16·warps value columns, head, walk: a sequence's chunks, or a segment of them
// below), chunks in order, with two warps per 16 value columns; the head dim is a template
// argument, so every shared-memory offset is a constant (ncu: address arithmetic was half the
// instructions). The recurrence warp keeps Sᵀ (16 value columns × dk) as fp32 mma accumulators in
// registers and per chunk computes
//   Vnᵀ = Uᵀ − Sᵀ·Wᵀ,  Sᵀ ← Sᵀ·diag(e^{G_last}) + Vnᵀ·Kd
// and its partner, the output warp, from the chunk-start Sᵀ and Vnᵀ it is handed through shared
// memory as bf16 A fragments,
//   Oᵀ = Sᵀ·Qdᵀ + Vnᵀ·Aqkᵀ
// with bf16 m16n8k16 (Sᵀ and Vnᵀ rounded to bf16 as operands; the state itself stays fp32 and
// accumulates in fp32); B fragments come from shared memory by ldmatrix. The output does not feed
// the recurrence, so the recurrence warps go on to the next chunk while their partners finish the
// output (one warp of each kind per scheduler). The workspace streams into shared memory as bulk
// copies (TMA), issued by one output thread, three stages: a chunk's stage lives until its output is
// written, and the load of chunk i + 3 is issued as chunk i's ends (with per-thread cp.async the
// issue took a third of the output warps' time, ncu, and the recurrence waited for it). Snapshots
// are written by the recurrence warps from their registers at chunk ends.
//
// The sequence split (issue 9; MODEL.md 4.9): a segment of chunks maps its
// incoming state affinely, S_out = A·S_in + B, A the product of its chunks' diag(e^{G_last}) − Kdᵀ·W.
// The state launch walks A as a state of dk value columns from the identity with U = 0, and B from
// zero; both are the recurrence above, fp32 accumulators with bf16 operands like the state's own.
// A sequence cut into P segments runs as three launches: segment 0 from its slot beside the maps of
// segments 1 .. P−2; the chain S_in(p+1) = A_p·S_in(p) + B_p in fp32 (kda_tc_chain_kernel); segments
// 1 .. P−1 from their true incoming states, with outputs and snapshots. It does 2P − 3 extra walks
// of a segment to cut the serial chain from n chunks to about 2n/P, so it pays where the unsplit
// grid leaves SMs idle: a state block holds an SM's shared memory, so at B = 1, H = 32, d = 128 the
// 128 blocks of 32 columns already fill the H200's 132 SMs and the op keeps the unsplit plan; with
// 16 heads (a two-way tensor-parallel shard) it cuts 16k tokens into 3 segments, with 8 into 5
// (state pass 0.48 -> 0.41 and 0.36 ms). The plan is the one of least predicted time (plan_cost:
// the launches' blocks list-scheduled onto the SMs).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend/cuda/common/ptx.cuh"
#include "backend/cuda/kda/kda_chunk.cuh"

namespace klinear::cuda {

namespace {

using namespace ptx;
using bf16 = __nv_bfloat16;

constexpr int kPrepThreads = 512;
constexpr int kLx = kChunk + 4;  // row stride of the fp32 [64, 64] matrices (fragment reads spread over banks)
// The bf16 workspace of one (chunk, head), dense, offsets in bytes: W [64][dk] at 0, e^{G_last} [dk]
// in fp32, Qd [64][dk], Kdᵀ [dk][64], Aqk [64][64], Uᵀ [rows][64], each bf16 array's rows with their
// 16-byte pieces permuted (swz). In global memory it holds all dv rows of Uᵀ; a stage of the state
// pass in shared memory has the same layout with the block's rows of Uᵀ only, so a stage loads as
// two or three bulk copies, and the permutation spreads ldmatrix's reads over the banks there.
struct ChunkLayout {
  int dl, q, kt, a, u, bytes;
  constexpr __host__ __device__ ChunkLayout(int dk, int u_rows)
      : dl(2 * kChunk * dk), q(dl + 4 * dk), kt(q + 2 * kChunk * dk), a(kt + 2 * dk * kChunk),
        u(a + 2 * kChunk * kChunk), bytes(u + 2 * u_rows * kChunk) {}
};

// The permutation of a dense bf16 array of rows of kLd elements (n = kLd / 8 pieces of 16 bytes):
// row r's piece c is stored as piece c ^ swz_key(r), so that eight rows from a multiple of 8 give
// one column's pieces from eight distinct 16-byte bank groups (ldmatrix, and the state pass's reads
// of Uᵀ). With n ≥ 8 the key is r mod 8; with fewer, 8 / n rows share a 128-byte line and the key
// is the line's index mod n. A row offset by a multiple of 8 keeps its key.
template <int kLd>
__host__ __device__ constexpr int swz_key(int r) {
  constexpr int n = kLd / 8;
  return n >= 8 ? (r & 7) : ((r * n / 8) & (n - 1));
}
// The byte offset of element (r, c).
template <int kLd>
__host__ __device__ constexpr int swz(int r, int c) {
  return 2 * r * kLd + 16 * ((c >> 3) ^ swz_key<kLd>(r)) + 2 * (c & 7);
}

struct TcWork {
  unsigned char* ws;  // [chunks, H, ChunkLayout(dk, dv).bytes]
};

// Prep keeps G in log2 units, so its exps e^{G_i − G_m} are 2^x of differences of the stored G with
// no multiply (ptx::exp2_ftz); they are decays (x ≤ 0) and underflow to 0 by design; the flush
// spares the subnormal fix-up (~10% of prep's instructions in ncu).
constexpr float kLog2e = 1.4426950408889634f;
// How this file uses ptx.cuh's loads: ldsm_x4 over rows = n with 8 consecutive k per row gives in
// r[0], r[1] the m16n8k16 B fragment of the first 8 rows and in r[2], r[3] that of the next 8 (see the
// addresses in the state pass); ldsm_x2_trans over rows = k with 8 consecutive n per row gives the B
// fragment of a row-major [k][n] operand at rows 16ks.., columns n..n+7. The state pass's stage loads
// are bulk copies completing on a stage's mbarrier: one thread arms the barrier with the stage's byte
// count and issues the copies; every reader waits for the barrier's phase (chunk i of a walk is phase
// i / kStages of stage i % kStages); fence_proxy_async orders a thread's reads of a stage before a
// load into it, and its writes of prep's image before their store (prep stores W and Uᵀ from shared
// memory by bulk copies).
// m16n8 fp32 accumulator tiles (16 rows × 8 columns each) as bf16 m16n8k16 A fragments: tiles
// 2ks and 2ks+1 are k-step ks (the accumulator and A layouts share their rows and column pairs).
template <int kSteps>
__device__ __forceinline__ void to_a_fragments(const float (&c)[2 * kSteps][4], uint32_t (&a)[kSteps][4]) {
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    a[ks][0] = pack_bf16(c[2 * ks][0], c[2 * ks][1]);
    a[ks][1] = pack_bf16(c[2 * ks][2], c[2 * ks][3]);
    a[ks][2] = pack_bf16(c[2 * ks + 1][0], c[2 * ks + 1][1]);
    a[ks][3] = pack_bf16(c[2 * ks + 1][2], c[2 * ks + 1][3]);
  }
}
// A lane's ldmatrix address in a permuted (swz) [rows][kLd] bf16 array in shared memory: the
// shared-space address of its row (lrow below a multiple of 8: see the state pass) and its key, the
// lane's column half (lcol / 8) folded in, so that the piece of k-step ks is (2ks) ^ key.
struct SwzLane {
  uint32_t row;
  int key;
};

// acc (kNt n-tiles of 8 columns) += A·B over kKs k-steps: a holds the bf16 A fragments of each
// k-step; B's column r at k-step ks is row r, columns 16ks .. 16ks + 15 of a permuted [n][kLd] bf16
// array in shared memory, of which `b` is this lane's ldmatrix address. One k-step at a time: its B
// fragments are loaded together, then the mma's run on independent accumulators.
// kLower: B is zero where its 16-block of k lies past its 16-block of n (Aqk: zero above its
// diagonal), so n-tiles 2p, 2p + 1 take k-steps ≤ p only.
template <int kLd, bool kLower = false, int kKs, int kNt>
__device__ __forceinline__ void mma_steps(float (&acc)[kNt][4], const uint32_t (&a)[kKs][4], SwzLane b) {
#pragma unroll
  for (int ks = 0; ks < kKs; ++ks) {
    uint32_t bq[kNt / 2][4];
    const uint32_t col = b.row + 16 * ((2 * ks) ^ b.key);
#pragma unroll
    for (int np = kLower ? ks : 0; np < kNt / 2; ++np) ldsm_x4(bq[np], col + 2 * 16 * np * kLd);
#pragma unroll
    for (int np = kLower ? ks : 0; np < kNt / 2; ++np) {
      mma_bf16(acc[2 * np], a[ks], bq[np][0], bq[np][1]);
      mma_bf16(acc[2 * np + 1], a[ks], bq[np][2], bq[np][3]);
    }
  }
}

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

// Shared memory of the state pass: kStages stages (ChunkLayout with the block's 16·warps rows of Uᵀ),
// then the handoff, per warp pair 16·dk bf16 (Sᵀ as A fragments, lane-major 16-byte pieces),
// then a full mbarrier per stage (the stage's bulk copies have landed). At dk = 128 and 64 columns:
// 3 × 66,048 + 16,384 + 24 = 214,552 bytes of the 232,448 a block may have (32 columns: 194,072).
// Three stages, not two: with two, chunk i + 2 could only load once the output of chunk i is
// written, which would leave the recurrence waiting for the load; a fourth does not fit.
constexpr int kStages = 3;  // chunks in flight in the state pass's shared memory

size_t state_smem_bytes(int dk, int warps) {
  return kStages * static_cast<size_t>(ChunkLayout(dk, 16 * warps).bytes) + static_cast<size_t>(warps) * 32 * dk +
         kStages * sizeof(uint64_t);
}

// One serial walk of the state pass (a grid z-index): chunks [begin, end) of the layout's sequence
// `seq` (whose rows and snapshots they are). kOutput starts from the tile `in`, writes the chunks'
// output rows and the snapshots taken inside them (and the one after 0 rows where the walk starts
// the sequence); kFromZero (B of the segment's map) starts from 0 and kMap (A) from the identity
// with U = 0, both writing nothing but their end state. The end state goes to the tile `out`.
enum class RunKind : int32_t { kOutput, kFromZero, kMap };
struct StateRun {
  int32_t begin, end;  // chunks of the step
  int32_t seq;
  RunKind kind;
  int32_t in, out;  // state tiles [H, dk, dv]: a pool slot (≥ 0), scratch tile −1 − i, or kNoTile
};
constexpr int32_t kNoTile = INT32_MIN;
__device__ __forceinline__ float* run_tile(const KdaStep& s, float* scratch, int32_t tile, int h) {
  return tile >= 0 ? state_tile(s, tile, h) : scratch + (static_cast<int64_t>(-1 - tile) * s.heads + h) * s.dk * s.dv;
}

// Warps 0..kWarps−1 run the recurrence, warps kWarps..2kWarps−1 the output; the first output thread
// issues the loads. Warp kWarps + w is the partner of warp w (the same 16 value columns). Chunk i of
// the walk (n in all) lives in stage i % 3. Per chunk i:
//   loaded[i % 3] (mbarrier, phase i / 3) completes when the chunk's bulk copies have landed; every
//                 warp waits for it before reading the stage;
//   full[w]       recurrence warp w arrives once chunk i's Sᵀ (handoff) and Vnᵀ (over its own Uᵀ
//                 rows, which it has read) are written; its partner syncs before reading them;
//   empty[w]      the partner arrives once it holds the handoff in registers; warp w syncs before
//                 writing chunk i + 1's (none before chunk 0, none after the last read);
//   free[i % 3]   only if chunk i + 3 exists: the recurrence warps arrive when done with the stage,
//                 the output warps sync when done with it, then chunk i + 3 is loaded into it.
// Each named barrier completes once per round (arrivals and waits are counted alike on both sides,
// the conditions above are the same on both): a side cannot arrive twice before the other side's
// wait, since its second arrival depends on that wait (full of i + 1 after empty of i; empty of
// i + 1 after full of i + 1; free of i + 3 after the load of i + 3, which follows free of i). No
// wait misses a phase of loaded: the load of chunk i + 3 into a stage follows every warp's free of
// chunk i, after its wait for chunk i. Loads never overwrite a stage a warp still reads (free), the
// handoff is never overwritten before it was read (empty), and the waits form no cycle: the
// recurrence's chunk i waits for the load of chunk i (issued at the end of the output's chunk i − 3)
// and the output's chunk i − 1 for its handoff (empty); the output's chunk i waits for the
// recurrence's chunk i (full). A walk without chunks touches no barrier; the last chunk gives no
// empty, the last three no free.
template <int kWarps, int kDk>
__global__ void __launch_bounds__(64 * kWarps, 1) kda_tc_state_kernel(KdaStep s, ChunkWork cw, TcWork tw,
                                                                      const StateRun* runs, float* scratch) {
  constexpr int kBv = 16 * kWarps, kRec = 32 * kWarps, kAll = 2 * kRec;  // value columns, threads per role, all
  constexpr int kFree = 1, kFull = kFree + kStages, kEmpty = kFull + kWarps;
  static_assert(kEmpty + kWarps <= 16, "16 named barriers per block");
  constexpr int dk = kDk, dv = kDk, nkt = dk / 8, nks = dk / 16;  // state n-tiles (8 channels), k-steps (16)
  constexpr ChunkLayout sl(dk, kBv), wl(dk, dv);  // a stage, a chunk's workspace
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const int H = s.heads;
  const StateRun run = runs[blockIdx.z];
  const int b = run.seq, h = blockIdx.y, tid = threadIdx.x, warp = (tid >> 5) % kWarps, lane = tid & 31,
            g = lane >> 2, t = lane & 3;
  const int vblk = blockIdx.x * kBv, v0 = vblk + 16 * warp;
  const int c_begin = run.begin, n = run.end - run.begin;
  const bool output = run.kind == RunKind::kOutput;
  // The handoff of this warp pair (k-step ks at [32·ks]) and the pair's Vnᵀ in a stage's Uᵀ rows.
  uint4* hand = reinterpret_cast<uint4*>(smem_raw + kStages * sl.bytes) + warp * nks * 32 + lane;
  uint64_t* loaded = reinterpret_cast<uint64_t*>(smem_raw + kStages * sl.bytes + kWarps * 32 * dk);
  auto vn_at = [&](int stage) {
    return reinterpret_cast<uint4*>(smem_raw + stage * sl.bytes + sl.u + 2 * 16 * warp * kChunk) + lane;
  };
  // B fragments of n-tiles (2p, 2p+1) at k-step ks of a [rows n][ld] array: lane l reads row
  // 16p + l % 8 + 8·(l / 16), columns 16ks + 8·((l / 8) % 2) .. + 8: the lane's rows' byte offsets
  // and keys in the arrays of rows dk (W, Qd) and 64 (Kdᵀ, Aqk).
  const int lrow = (lane & 7) + 8 * (lane >> 4), lc = (lane >> 3) & 1;
  const uint32_t row_k = 2 * lrow * dk, row_t = 2 * lrow * kChunk;
  const int key_k = swz_key<dk>(lrow) ^ lc, key_t = swz_key<kChunk>(lrow) ^ lc;
  if (tid == 0)
    for (int x = 0; x < kStages; ++x) mbar_init(loaded + x);
  __syncthreads();

  if (tid < kRec) {  // the recurrence
    // Sᵀ[v][j] of this warp's 16 value columns as m16n8 accumulators: [nt][0..3] ↔ (v0+g, 8nt+2t),
    // (v0+g, 8nt+2t+1), (v0+g+8, 8nt+2t), (v0+g+8, 8nt+2t+1).
    float S[nkt][4];
    auto tile_at = [&](float* st, int nt, int r) -> float& {
      return st[static_cast<int64_t>(8 * nt + 2 * t + (r & 1)) * dv + v0 + g + 8 * (r >> 1)];
    };
    if (output) {
      float* st = run_tile(s, scratch, run.in, h);
#pragma unroll
      for (int nt = 0; nt < nkt; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) S[nt][r] = tile_at(st, nt, r);
    } else {  // from zero, or (the map) from the identity: Sᵀ[v][j] = [v = j]
      const float one = run.kind == RunKind::kMap ? 1.0f : 0.0f;
#pragma unroll
      for (int nt = 0; nt < nkt; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) S[nt][r] = 8 * nt + 2 * t + (r & 1) == v0 + g + 8 * (r >> 1) ? one : 0.0f;
    }
    auto store = [&](float* st) {
#pragma unroll
      for (int nt = 0; nt < nkt; ++nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) tile_at(st, nt, r) = S[nt][r];
    };
    if (output && c_begin == cw.seq_chunk[b]) for_snapshots(s, cw, b, h, 0, store);
    if (n == 0) return;
    const float keep_u = run.kind == RunKind::kMap ? 0.0f : 1.0f;  // the map runs with U = 0
    const int64_t seq_row0 = s.cu[b];
    for (int i = 0; i < n; ++i) {
      const int stage = i % kStages;
      const unsigned char* base = smem_raw + stage * sl.bytes;
      const uint32_t sbase = smem0 + stage * sl.bytes;
      const unsigned char* su = base + sl.u;
      mbar_wait(loaded + stage, (i / kStages) & 1);  // chunk i is in the stage

      uint32_t sa[nks][4];  // Sᵀ as bf16 A fragments
      to_a_fragments(S, sa);
      // Vnᵀ = Uᵀ − Sᵀ·Wᵀ (16 value columns × 64 positions)
      float vn[kChunk / 8][4] = {};
      mma_steps<dk>(vn, sa, SwzLane{sbase + row_k, key_k});
#pragma unroll
      for (int nt = 0; nt < kChunk / 8; ++nt) {
        auto u_at = [&](int r) {  // Uᵀ at row 16·warp + r, positions 8nt + 2t, + 1
          const int at = swz<kChunk>(16 * warp + r, 8 * nt + 2 * t);
          return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(su + at));
        };
        const float2 u0 = u_at(g), u1 = u_at(g + 8);
        vn[nt][0] = keep_u * u0.x - vn[nt][0], vn[nt][1] = keep_u * u0.y - vn[nt][1];
        vn[nt][2] = keep_u * u1.x - vn[nt][2], vn[nt][3] = keep_u * u1.y - vn[nt][3];
      }
      uint32_t va[kChunk / 16][4];  // Vnᵀ as bf16 A fragments
      to_a_fragments(vn, va);
      // Hand chunk i to the partner: Vnᵀ over this warp's Uᵀ rows (read above by every lane), Sᵀ
      // into the handoff once the partner holds the previous chunk's.
      __syncwarp();
      uint4* hv = vn_at(stage);
#pragma unroll
      for (int ks = 0; ks < kChunk / 16; ++ks) hv[32 * ks] = make_uint4(va[ks][0], va[ks][1], va[ks][2], va[ks][3]);
      if (i > 0) bar_sync(kEmpty + warp, 64);
#pragma unroll
      for (int ks = 0; ks < nks; ++ks) hand[32 * ks] = make_uint4(sa[ks][0], sa[ks][1], sa[ks][2], sa[ks][3]);
      bar_arrive(kFull + warp, 64);
      // Sᵀ ← Sᵀ·diag(e^{G_last}) + Vnᵀ·Kd
      const float* dl = reinterpret_cast<const float*>(base + sl.dl) + 2 * t;
#pragma unroll
      for (int nt = 0; nt < nkt; ++nt) {
        const float2 d = *reinterpret_cast<const float2*>(dl + 8 * nt);
        S[nt][0] *= d.x, S[nt][1] *= d.y, S[nt][2] *= d.x, S[nt][3] *= d.y;
      }
      mma_steps<kChunk>(S, va, SwzLane{sbase + sl.kt + row_t, key_t});
      if (i + kStages < n) bar_arrive(kFree + stage, kAll);
      if (output && cw.snaps > 0) {
        const int c = c_begin + i;
        for_snapshots(s, cw, b, h, static_cast<int>(cw.chunk_row[c] + cw.chunk_len[c] - seq_row0), store);
      }
    }
    if (run.out != kNoTile) store(run_tile(s, scratch, run.out, h));
    return;
  }

  // The output; its first thread issues the loads.
  if (n == 0) return;
  // Chunk i into stage i % 3 as bulk copies: W to Aqk in one (a walk without output: W and Kdᵀ),
  // the block's rows of Uᵀ in another.
  auto issue = [&](int i) {
    const int stage = i % kStages;
    unsigned char* dst = smem_raw + stage * sl.bytes;
    const unsigned char* src = tw.ws + (static_cast<int64_t>(c_begin + i) * H + h) * wl.bytes;
    constexpr uint32_t kUBytes = 2 * kBv * kChunk;
    if (output) {
      mbar_expect_tx(loaded + stage, sl.u + kUBytes);
      bulk_load(dst, src, sl.u, loaded + stage);
    } else {
      mbar_expect_tx(loaded + stage, sl.q + (sl.a - sl.kt) + kUBytes);
      bulk_load(dst, src, sl.q, loaded + stage);
      bulk_load(dst + sl.kt, src + sl.kt, sl.a - sl.kt, loaded + stage);
    }
    bulk_load(dst + sl.u, src + sl.u + 2 * vblk * kChunk, kUBytes, loaded + stage);
  };
  const bool loader = tid == kRec;
  if (loader)
    for (int i = 0; i < kStages && i < n; ++i) issue(i);
  bf16* out = static_cast<bf16*>(s.out.p);
  for (int i = 0; i < n; ++i) {
    const int stage = i % kStages, c = c_begin + i;
    mbar_wait(loaded + stage, (i / kStages) & 1);
    const uint32_t sbase = smem0 + stage * sl.bytes;
    bar_sync(kFull + warp, 64);  // the partner's Sᵀ and Vnᵀ of chunk i
    uint32_t sa[nks][4], va[kChunk / 16][4];
#pragma unroll
    for (int ks = 0; ks < nks; ++ks) {
      const uint4 x = hand[32 * ks];
      sa[ks][0] = x.x, sa[ks][1] = x.y, sa[ks][2] = x.z, sa[ks][3] = x.w;
    }
    const uint4* hv = vn_at(stage);
#pragma unroll
    for (int ks = 0; ks < kChunk / 16; ++ks) {
      const uint4 x = hv[32 * ks];
      va[ks][0] = x.x, va[ks][1] = x.y, va[ks][2] = x.z, va[ks][3] = x.w;
    }
    if (i + 1 < n) bar_arrive(kEmpty + warp, 64);
    if (output) {  // Oᵀ = Sᵀ·Qdᵀ + Vnᵀ·Aqkᵀ with the chunk-start state, written for the chunk's live rows
      float o[kChunk / 8][4] = {};
      mma_steps<dk>(o, sa, SwzLane{sbase + sl.q + row_k, key_k});
      mma_steps<kChunk, true>(o, va, SwzLane{sbase + sl.a + row_t, key_t});
      const int64_t row0 = cw.chunk_row[c];
      const int L = cw.chunk_len[c];
      bf16* oc = out + (row0 * H + h) * dv + v0 + 2 * t;  // row 0 of the chunk, this lane's first pair
      const int ostride = H * dv;
      // n-tile nt holds Oᵀ's columns v0 + g (and + 8) at rows 8nt + 2t, + 1; each half, as a bf16
      // 8×8 matrix transposed, is row 8nt + g at columns v0 + 2t, + 1 (and + 8): a 4-byte store.
#pragma unroll
      for (int nt = 0; nt < kChunk / 8; ++nt) {
        const uint32_t lo = movmatrix_trans(pack_bf16(o[nt][0], o[nt][1]));
        const uint32_t hi = movmatrix_trans(pack_bf16(o[nt][2], o[nt][3]));
        const int r = 8 * nt + g;
        if (r < L) {
          bf16* o0 = oc + r * ostride;
          *reinterpret_cast<uint32_t*>(o0) = lo, *reinterpret_cast<uint32_t*>(o0 + 8) = hi;
        }
      }
    }
    if (i + kStages < n) {
      bar_sync(kFree + stage, kAll);  // every warp is done with chunk i's stage
      if (loader) fence_proxy_async(), issue(i + kStages);
    }
  }
}

// The chain of a split sequence: S_in(p+1) = A_p·S_in(p) + B_p for p = 1 .. P−2 in order, fp32
// (each sum over j in order), a block per (32 value columns, head, split sequence) holding A_p and
// its columns of S_in(p) in shared memory. Its tiles sit in the scratch from `base` (indices
// relative to it): S_in(1 .. P−1) at 0 .. P−2, A_p at P−2 + p, B_p at 2P−4 + p.
struct SplitChain {
  int32_t base, segments;
};
constexpr int kChainThreads = 256, kChainCols = 32, kChainRowGroups = kChainThreads / kChainCols;

size_t chain_smem_bytes(int dk) { return sizeof(float) * static_cast<size_t>(dk) * (dk + kChainCols); }

__global__ void __launch_bounds__(kChainThreads)
    kda_tc_chain_kernel(KdaStep s, const SplitChain* chains, float* scratch) {
  extern __shared__ __align__(16) float chain_smem[];
  const int dk = s.dk, dv = s.dv, h = blockIdx.y, cols = min(kChainCols, dv);
  const int v = threadIdx.x % kChainCols, kg = threadIdx.x / kChainCols, col0 = blockIdx.x * cols;
  const SplitChain c = chains[blockIdx.z];
  const int P = c.segments;
  float* sa = chain_smem;            // A_p [dk][dk]
  float* ss = chain_smem + dk * dk;  // S_in(p) [dk][cols], the block's columns
  auto tile = [&](int i) { return run_tile(s, scratch, -1 - (c.base + i), h); };
  {
    const float* s1 = tile(0);
    for (int e = threadIdx.x; e < dk * cols; e += kChainThreads) ss[e] = s1[(e / cols) * dv + col0 + e % cols];
  }
  for (int p = 1; p + 1 < P; ++p) {
    const float4* a = reinterpret_cast<const float4*>(tile(P - 2 + p));
    const float* bm = tile(2 * P - 4 + p);
    float* next = tile(p);
    for (int e = threadIdx.x; e < dk * dk / 4; e += kChainThreads) reinterpret_cast<float4*>(sa)[e] = a[e];
    __syncthreads();  // A_p and S_in(p) are in shared memory
    // The thread's rows k = kg + 8i as independent chains, j outer (A_p's rows read as warp broadcasts).
    float acc[kMaxDk / kChainRowGroups] = {};
    if (v < cols)
      for (int j = 0; j < dk; ++j) {
        const float x = ss[j * cols + v];
#pragma unroll
        for (int i = 0; i < kMaxDk / kChainRowGroups; ++i)
          if (kg + kChainRowGroups * i < dk) acc[i] = fmaf(sa[(kg + kChainRowGroups * i) * dk + j], x, acc[i]);
      }
    __syncthreads();  // every thread is done reading S_in(p)
#pragma unroll
    for (int i = 0; i < kMaxDk / kChainRowGroups; ++i) {
      const int k = kg + kChainRowGroups * i;
      if (k < dk && v < cols) {
        const float x = acc[i] + bm[k * dv + col0 + v];
        ss[k * cols + v] = x;
        next[k * dv + col0 + v] = x;
      }
    }
  }
}

// The walks of the state pass, in up to three launches. A sequence is one kOutput walk, or split
// into P ≥ 3 segments of its chunks: launch 1 walks segment 0 from its slot to S_in(1) beside the
// maps (A_p, B_p) of segments 1 .. P−2; launch 2 is the chain; launch 3 walks segments 1 .. P−1
// from S_in(p), the last one into the slot.
struct StatePlan {
  std::vector<StateRun> first, last;
  std::vector<SplitChain> chains;
  int32_t scratch_tiles = 0;
};

// Sequences of at least `segments` · min_chunks chunks are split into `segments` (≥ 3; else none).
StatePlan plan_state(const std::vector<int32_t>& seq_chunk, const std::vector<int32_t>& slots, int segments,
                     int min_chunks) {
  StatePlan p;
  for (size_t b = 0; b + 1 < seq_chunk.size(); ++b) {
    const int32_t c0 = seq_chunk[b], n = seq_chunk[b + 1] - c0, slot = slots[b], seq = static_cast<int32_t>(b);
    const int P = segments >= 3 && n >= int64_t{segments} * min_chunks ? segments : 1;
    if (P == 1) {
      p.first.push_back({c0, c0 + n, seq, RunKind::kOutput, slot, slot});
      continue;
    }
    auto at = [&](int k) { return c0 + static_cast<int32_t>(int64_t{n} * k / P); };
    const int32_t base = p.scratch_tiles;
    auto tile = [&](int i) { return -1 - (base + i); };
    p.scratch_tiles += 3 * P - 5;
    p.first.push_back({at(0), at(1), seq, RunKind::kOutput, slot, tile(0)});
    for (int k = 1; k + 1 < P; ++k) {
      p.first.push_back({at(k), at(k + 1), seq, RunKind::kMap, kNoTile, tile(P - 2 + k)});
      p.first.push_back({at(k), at(k + 1), seq, RunKind::kFromZero, kNoTile, tile(2 * P - 4 + k)});
    }
    p.chains.push_back({base, P});
    for (int k = 1; k < P; ++k)
      p.last.push_back({at(k), at(k + 1), seq, RunKind::kOutput, tile(k - 1), k + 1 < P ? kNoTile : slot});
  }
  return p;
}

// A plan's time in chunk steps of an output walk. A state block holds an SM's shared memory, so
// a launch is list scheduling of its blocks (in grid order, each onto the SM that frees first) with
// a walk's blocks costing its chunks, half that for a walk without output (measured on the H200: a
// second wave of map walks hid under the output walks of the first at H = 16). A split adds the
// chain (a step each) and the two launches (~4 steps).
constexpr double kMapWalkCost = 0.5;
double launch_cost(const std::vector<StateRun>& runs, int64_t blocks_per_walk, int sms) {
  std::vector<double> free(static_cast<size_t>(sms), 0.0);
  for (const StateRun& r : runs) {
    const double cost = (r.end - r.begin) * (r.kind == RunKind::kOutput ? 1.0 : kMapWalkCost);
    for (int64_t left = blocks_per_walk; left > 0;) {
      const int64_t k = std::min<int64_t>(left, sms);
      std::nth_element(free.begin(), free.begin() + (k - 1), free.end());  // the k SMs that free first
      for (int64_t x = 0; x < k; ++x) free[x] += cost;
      left -= k;
    }
  }
  return *std::max_element(free.begin(), free.end());
}
double plan_cost(const StatePlan& p, int64_t blocks_per_walk, int sms) {
  int chain = 0;
  for (const SplitChain& c : p.chains) chain = std::max(chain, c.segments - 2);
  return launch_cost(p.first, blocks_per_walk, sms) +
         (p.chains.empty() ? 0.0 : launch_cost(p.last, blocks_per_walk, sms) + 4.0 + chain);
}

constexpr int kMinSegmentChunks = 4;  // the op splits no segment shorter
constexpr int kMaxSegments = 16;

template <int kWarps, int kDk>
void launch_state(CudaBackend& be, const KdaStep& s, const ChunkWork& cw, const TcWork& tw, const StateRun* runs,
                  int64_t count, float* scratch, const std::string& what) {
  const size_t smem = state_smem_bytes(kDk, kWarps);
  KL_CUDA(cudaFuncSetAttribute(kda_tc_state_kernel<kWarps, kDk>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)),
          what);
  const dim3 grid(static_cast<unsigned>(kDk / (16 * kWarps)), s.heads, static_cast<unsigned>(count));
  kda_tc_state_kernel<kWarps, kDk><<<grid, 64 * kWarps, smem, be.stream()>>>(s, cw, tw, runs, scratch);
  KL_LAUNCHED(what + " (tensor-core state pass, " + std::to_string(16 * kWarps) + " columns, " +
              std::to_string(count) + " walks)");
}

// The state launch at the head dim (kda_tc_fits: 16, 32, 64 or 128), which fixes every shared-memory
// offset at compile time.
template <int kWarps>
void launch_walks(CudaBackend& be, const KdaStep& s, const ChunkWork& cw, const TcWork& tw, const StateRun* runs,
                  int64_t count, float* scratch, const std::string& what) {
  if (s.dk == 16) launch_state<kWarps, 16>(be, s, cw, tw, runs, count, scratch, what);
  else if (s.dk == 32) launch_state<kWarps, 32>(be, s, cw, tw, runs, count, scratch, what);
  else if (s.dk == 64) launch_state<kWarps, 64>(be, s, cw, tw, runs, count, scratch, what);
  else launch_state<kWarps, 128>(be, s, cw, tw, runs, count, scratch, what);
}

}  // namespace

bool kda_tc_fits(const KdaArgs& a, const KdaStep& s) {
  const DType bf = DType::kBF16;
  return a.q.dtype() == bf && a.k.dtype() == bf && a.v.dtype() == bf && a.out.dtype() == bf && s.dk == s.dv &&
         (s.dk == 16 || s.dk == 32 || s.dk == 64 || s.dk == 128);
}

void kda_chunked_tc_launch(CudaBackend& be, const KdaStep& s, const ChunkTables& ct, const SeqLayout& layout,
                           const KdaChunkedVariant& v, const std::string& what) {
  const int64_t num_seqs = layout.num_seqs();
  const ChunkLayout wl(s.dk, s.dv);
  const int64_t chunks = std::max<int64_t>(ct.chunks, 1);
  const Tensor ws = be.alloc(DType::kU8, {chunks, s.heads, wl.bytes});
  const TcWork tw{ws.data_as<unsigned char>()};
  if (v.stages != KdaChunkStages::kStateOnly && ct.chunks > 0) {
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
  if (v.stages == KdaChunkStages::kPrepOnly) return;
  // Value columns per state block (two warps per 16): by default 32 while the 32-column grid fits
  // in one wave of the SMs, else 64 (a block holds a whole SM's shared memory; wider blocks read
  // the shared workspace fewer times). H200, d = 128: B=1 H=32 (128 blocks) at T=16k 0.79 ms
  // against 0.97 at 64 columns, T=64k 3.01 against 3.81; B=8 T=2k 0.53 at 64 against 0.83 at 32.
  int cols = v.state_cols;
  if (cols == 0) cols = int64_t{s.dv / 32} * s.heads * num_seqs <= be.num_sms() ? 32 : 64;
  KL_CHECK(cols == 16 || cols == 32 || cols == 64, what + ": state_cols " + std::to_string(cols) + " (16, 32 or 64)");
  while (s.dv % cols != 0) cols /= 2;
  // Segments per long sequence: the variant's, else the plan of least predicted time (1: no split).
  const int64_t blocks_per_walk = int64_t{s.dv / cols} * s.heads;
  KL_CHECK(v.segments == 0 || v.segments == 1 || (v.segments >= 3 && v.segments <= kMaxSegments),
           what + ": segments " + std::to_string(v.segments) + " (0, 1 or 3.." + std::to_string(kMaxSegments) + ")");
  StatePlan plan = plan_state(ct.host_seq_chunk, layout.slots, v.segments, 1);
  if (v.segments == 0 && num_seqs * blocks_per_walk <= be.num_sms()) {  // a full grid gains nothing from more walks
    double best = plan_cost(plan, blocks_per_walk, be.num_sms());
    for (int p = 3; p <= kMaxSegments; ++p) {
      StatePlan split = plan_state(ct.host_seq_chunk, layout.slots, p, kMinSegmentChunks);
      if (split.chains.empty()) break;  // no sequence is long enough for p segments, nor for more
      const double cost = plan_cost(split, blocks_per_walk, be.num_sms());
      if (cost < best) best = cost, plan = std::move(split);
    }
  }
  const Tensor scratch = be.alloc(DType::kF32, {std::max<int32_t>(plan.scratch_tiles, 1), s.heads, s.dk, s.dv});
  // The plan in one upload: the walks of both launches, then the chains, as int32 words.
  static_assert(sizeof(StateRun) == 6 * sizeof(int32_t) && sizeof(SplitChain) == 2 * sizeof(int32_t),
                "the plan travels as int32 words");
  std::vector<int32_t> words(6 * (plan.first.size() + plan.last.size()) + 2 * plan.chains.size());
  int32_t* at = words.data();
  for (const auto* part : {&plan.first, &plan.last})
    at = std::copy_n(reinterpret_cast<const int32_t*>(part->data()), 6 * part->size(), at);
  std::copy_n(reinterpret_cast<const int32_t*>(plan.chains.data()), 2 * plan.chains.size(), at);
  const Tensor dev = be.to_device(
      Tensor::wrap(DType::kI32, {static_cast<int64_t>(words.size())}, words.data(), nullptr, Device::kCpu),
      DType::kI32);
  const auto* runs = dev.data_as<const StateRun>();
  auto walk = [&](const StateRun* first, size_t count) {
    if (cols == 64) launch_walks<4>(be, s, ct.work, tw, first, count, scratch.data_as<float>(), what);
    else if (cols == 32) launch_walks<2>(be, s, ct.work, tw, first, count, scratch.data_as<float>(), what);
    else launch_walks<1>(be, s, ct.work, tw, first, count, scratch.data_as<float>(), what);
  };
  walk(runs, plan.first.size());
  if (plan.chains.empty()) return;
  const auto* chains = reinterpret_cast<const SplitChain*>(runs + plan.first.size() + plan.last.size());
  const size_t smem = chain_smem_bytes(s.dk);
  KL_CUDA(
      cudaFuncSetAttribute(kda_tc_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
      what);
  const dim3 grid(static_cast<unsigned>(s.dv / std::min(kChainCols, s.dv)), s.heads,
                  static_cast<unsigned>(plan.chains.size()));
  kda_tc_chain_kernel<<<grid, kChainThreads, smem, be.stream()>>>(s, chains, scratch.data_as<float>());
  KL_LAUNCHED(what + " (segment chain, " + std::to_string(plan.chains.size()) + " split sequences)");
  walk(runs + plan.first.size(), plan.last.size());
}

}  // namespace klinear::cuda
