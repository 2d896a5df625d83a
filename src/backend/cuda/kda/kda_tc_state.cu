// The bf16 KDA chunked prefill on tensor cores (MODEL.md 4.6, chunk 64), its second launch; the
// first is kda_tc_prep.cu, the workspace between them ChunkLayout (kda_chunk.cuh).
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
// (measured: docs/perf-log.md, "Notes moved from the CUDA sources"). The plan is the one of least
// predicted time (plan_cost: the launches' blocks list-scheduled onto the SMs).
//
// Contract: s, ct and layout as kda_chunked checked them, KdaChunkedPath::kTensorCore fits, tw the workspace prep
// wrote. Reads it, the states' slots, and writes out (bf16), the slots' new states and the layout's
// snapshots (fp32); the split's scratch tiles live in the step arena. v.state_cols and v.segments
// fix the state pass's shape for tests and benches (kda_chunked.h); 0 is the op's own choice.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/common/ptx.cuh"
#include "backend/cuda/kda/kda_chunk.cuh"

namespace klinear::cuda {

namespace {

using namespace ptx;
using bf16 = __nv_bfloat16;

// ptx.cuh's ldsm_x4 over rows = n with 8 consecutive k per row gives in r[0], r[1] the m16n8k16 B
// fragment of the first 8 rows and in r[2], r[3] that of the next 8 (see the addresses in the state
// pass). The stage loads are bulk copies completing on a stage's mbarrier: one thread arms the
// barrier with the stage's byte count and issues the copies; every reader waits for the barrier's
// phase (chunk i of a walk is phase i / kStages of stage i % kStages); fence_proxy_async orders a
// thread's reads of a stage before a load into it.
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

// The state launch at the head dim (KdaChunkedPath::kTensorCore: 16, 32, 64 or 128), which fixes every shared-memory
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

void launch_tc_state(CudaBackend& be, const KdaStep& s, const ChunkTables& ct, const SeqLayout& layout,
                     const TcWork& tw, const KdaChunkedVariant& v, const std::string& what) {
  const int64_t num_seqs = layout.num_seqs();
  // Value columns per state block (two warps per 16): by default 32 while the 32-column grid fits
  // in one wave of the SMs, else 64 (a block holds a whole SM's shared memory; wider blocks read
  // the shared workspace fewer times). Measured: docs/perf-log.md, "Notes moved
  // from the CUDA sources".
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
