// CUDA MoE (MODEL.md 3.3, 3.4).
//
// Router: one kernel, a warp per token (sigmoid, bias for the choice only, grouped top-k,
// renormalise, scale; ties go to the lower index as on the CPU).
//
// Routed experts, four paths (moe.h):
// - kGrouped (decode, kMoeRowsMaxTokens < N < kMoeSwappedMinTokens): three launches, no host synchronisation, grids fixed
//   by N and the shapes.
//   plan: one block sorts the slots (token·K + k) by expert, stably (a counting sort: slot order
//     within an expert is kept), and cuts each picked expert's slots into groups of at most 32, in
//     ascending expert order (e = −1 past the last group). It checks every index (an index outside
//     [0, E) prints and traps).
//   gate/up, then down: block (tile, a) serves group a (blocks past the last group return at once).
//   Its R weight rows are streamed once (16-byte loads) for the group's tokens:
//     gate/up: rows = R/2 gate + the R/2 matching up rows; epilogue: both rounded to the activation
//              dtype (as every linear's output, and the GEMM paths' h), GLU → act[slot] (activation
//              dtype), so a slot's act is the same on every path up to the order of the fp32 sums.
//     down:    rows = R output features; epilogue y[slot] = expert output rounded to the activation
//              dtype (MODEL.md 3.4); then per (token, tile) a counter: the block whose slot completes a
//              token's K outputs sums them in k order in fp32 and writes out. Deterministic (no float
//              atomics; the integer counters only pick which block adds).
//   R = kTileRows = 32 at every N: a block reads each token's input row once for all its R rows, and
//   16 and 64 rows were measured slower at every N and dropped (docs/perf-log.md, "Notes moved from
//   the CUDA sources").
//   bf16 uses tensor cores (mma.sync m16n8k16 per 16-row m-tile, fp32 accumulate; each thread loads
//   8 consecutive k of a row, permuting k identically in A and B), the K dimension split over the 4
//   warps and summed in a fixed order, so a value does not depend on R; f32 uses fp32 FMAs (the
//   exact mode). gate/up and down are programmatic dependent launches: gate/up's blocks start
//   during the plan (they zero the down counters) and down's during gate/up; each waits
//   (cudaGridDependencySynchronize) before reading what the one before writes.
//   Floors (48B shape, route + experts, 4.2 TB/s): 0.030 / 0.75 / 0.87 ms at N = 1 / 64 / 256; the
//   rest to the floor is latency: ~4 µs per picked expert, a block streaming one expert's 32 rows
//   at a time. Groups of at most 32 slots spread a popular expert's tokens over blocks instead of
//   lengthening one. Measured, and a persistent-grid design dropped: docs/perf-log.md, "Notes moved
//   from the CUDA sources". Fallback: up to kMoeGroupedMaxTokens this path also takes what the
//   swapped and rows paths do not fit: F32 activations (the f32 branch, with BF16 weights too) and
//   BF16 with widths that are not multiples of 8 or unaligned data (the bf16 branch without 16-byte
//   loads). So both branches stay, though the models' BF16 decode at 16-256 tokens runs the swapped
//   path.
// - kSwappedGemm (decode, kMoeSwappedMinTokens ≤ N ≤ kMoeGroupedMaxTokens): the plan of kGrouped
//   also writes each expert's slot range (offsets), each slot's position (pos) and each position's
//   token; the tokens' rows are gathered in that order, and CUTLASS's grouped GEMM runs gate/up and
//   down with the expert weights as the M operand (moe_gemm_sm90.cu: problem lists written on the
//   device, capturable), the GLU and the combine in launches of their own. Eight launches; the
//   weights stream at 94-98 % of the copy rate from N = 32 (docs/perf-log.md, "Notes moved from the
//   CUDA sources").
// - kRows (N ≤ kMoeRowsMaxTokens, 8: small decode batches): no plan. gate/up: a warp per (slot, feature)
//   streams the slot's expert's gate and up rows against the token's x in 16-byte loads, rounds both
//   sums to bf16 and writes the GLU to act; down (a programmatic dependent): a warp per (token,
//   output feature) walks the token's picks in order, four rows' loads at a time, each product
//   rounded to bf16 (the expert's output) and summed in fp32 as the combine does. At N = 1 that is
//   113 MB of weights in 8,192 + 2,304 warps over two launches, a 27 µs floor (measured:
//   docs/perf-log.md, "Notes moved from the CUDA sources"). Shared experts (bf16, widths of 8) join
//   both launches: gate/up applies the GLU to their projection (computed with the router's logits),
//   down adds their down row's product to the routed sum, rounded as a separate add stores it; on
//   the other paths add_shared_experts runs glu, linear and add after them. Routing inside the
//   gate/up launch was tried and dropped (docs/perf-log.md, "Notes moved from the CUDA sources").
// - kPerExpertGemm (prefill): the routing read to the host, slots grouped by expert, one grouped
//   GEMM launch per projection over the active experts (a problem each: CUTLASS's kernel for BF16,
//   cuBLAS's grouped call otherwise, gemm.cu), the same combine in a separate kernel.
//
// MXFP4 experts (ExpertMatrix packed U8 + E8M0 scales, 4.25 bits a weight; mxfp4.cuh's arithmetic):
// the rows path reads a 32-value block (16 bytes and a scale) per lane and step; the grouped path's
// bf16 branch gives a quad 128 k per warp step, thread t4 the block 4c + t4 of its two rows per
// m-tile, dequantized a word at a time into the mma's A pairs (its f32 branch reads value by
// value); the swapped GEMMs take dense experts only, so N = 9..256 runs the grouped path; the
// per-expert GEMMs dequantize the active experts into the arena first (dequantize_experts_kernel,
// kDequantBytes at a time). Floors (48B shape, experts only, 4.2 TB/s): 7.3 µs of MXFP4 weights at
// N = 1 (8 experts), 0.20 ms at N = 64 (~87 % of the 256 experts), 0.23 ms with all of them.
#include <algorithm>
#include <climits>
#include <cmath>
#include <type_traits>
#include <vector>

#include "backend/cuda/common/device.cuh"
#include "backend/cuda/common/ptx.cuh"
#include "backend/cuda/moe/moe.h"
#include "backend/cuda/moe/moe_gemm_sm90.h"
#include "backend/cuda/moe/mxfp4.cuh"

namespace klinear::cuda {

namespace {

// ---- router

constexpr int kRouteWarps = 4;
constexpr int kMaxGroups = 64;
constexpr int kRouteMaxExperts = 1024;  // a lane's taken-mask holds 32 experts

// The better of two (value, index) candidates: larger value, then lower index; INT_MAX is none.
__device__ __forceinline__ void warp_best(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (oi != INT_MAX && (i == INT_MAX || ov > v || (ov == v && oi < i))) {
      v = ov;
      i = oi;
    }
  }
}

__global__ void __launch_bounds__(kRouteWarps * 32)
    route_kernel(const float* logits, const float* bias, int e, int64_t n, RouteParams p, int32_t* idx, float* weights) {
  extern __shared__ float route_sm[];
  __shared__ int chosen[kRouteWarps][32];
  pdl_enter();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = blockIdx.x * int64_t{kRouteWarps} + warp;
  if (t >= n) return;  // a whole warp; the kernel has no block barrier
  float* score = route_sm + warp * 2 * e;  // [e]
  float* choice = score + e;               // [e]
  for (int j = lane; j < e; j += 32) {
    score[j] = sigmoid_f(logits[t * e + j]);
    choice[j] = score[j] + bias[j];
  }
  __syncwarp();
  if (p.num_groups > p.topk_group) {
    // Lane l scores groups l and l + 32 (the sum of their top-2 choices) and keeps the best groups.
    const int per_group = e / p.num_groups;
    float gscore[2];
    for (int h = 0; h < 2; ++h) {
      const int gi = lane + 32 * h;
      float a = -INFINITY, b = -INFINITY;
      if (gi < p.num_groups)
        for (int j = gi * per_group; j < (gi + 1) * per_group; ++j) {
          const float v = choice[j];
          if (v > a) { b = a; a = v; } else if (v > b) { b = v; }
        }
      gscore[h] = a + b;
    }
    unsigned kept = 0;  // bit h: group lane + 32h kept
    for (int i = 0; i < p.topk_group; ++i) {
      float v = -INFINITY;
      int arg = INT_MAX;
      for (int h = 0; h < 2; ++h) {
        const int gi = lane + 32 * h;
        if (gi < p.num_groups && !(kept >> h & 1u) && (arg == INT_MAX || gscore[h] > v)) {
          v = gscore[h];
          arg = gi;
        }
      }
      warp_best(v, arg);
      if (arg % 32 == lane) kept |= 1u << (arg / 32);
    }
    const unsigned kept_lo = __ballot_sync(0xffffffffu, kept & 1u), kept_hi = __ballot_sync(0xffffffffu, kept & 2u);
    for (int j = lane; j < e; j += 32) {
      const int gi = j / per_group;
      if (!((gi < 32 ? kept_lo >> gi : kept_hi >> (gi - 32)) & 1u)) choice[j] = -INFINITY;
    }
    __syncwarp();
  }
  unsigned taken = 0;  // bit q: expert lane + 32q chosen
  for (int i = 0; i < p.top_k; ++i) {
    float v = -INFINITY;
    int arg = INT_MAX;
    for (int q = 0, j = lane; j < e; ++q, j += 32)
      if (!(taken >> q & 1u) && (arg == INT_MAX || choice[j] > v)) {  // ascending j: the lower index wins ties
        v = choice[j];
        arg = j;
      }
    warp_best(v, arg);
    if (arg % 32 == lane) taken |= 1u << (arg / 32);
    if (lane == 0) chosen[warp][i] = arg;
  }
  __syncwarp();
  float sum = 0.0f;  // in k order, as the CPU adds them
  for (int i = 0; i < p.top_k; ++i) sum += score[chosen[warp][i]];
  for (int i = lane; i < p.top_k; i += 32) {
    float w = score[chosen[warp][i]];
    if (p.renormalize && p.top_k > 1) w /= (sum + 1e-20f);
    const int local = chosen[warp][i] - p.first_expert;
    idx[t * p.top_k + i] = p.local_experts < 0 || (local >= 0 && local < p.local_experts) ? local : -1;
    weights[t * p.top_k + i] = w * p.scale;
  }
}

// ---- grouped experts

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kGroup = 32;              // slots per group (4 mma n-tiles of 8)
constexpr int kChunk = 32;              // k per warp step: 4 threads × 8 consecutive elements
constexpr int kLoadTiles = 4;           // (16-row tile, chunk) pairs whose weight loads a warp issues together
constexpr int kTileRows = 32;           // weight rows per block (R): two 16-row m-tiles
constexpr int kPlanThreads = 256, kPlanWarps = kPlanThreads / 32;
constexpr int kSmemLimit = 48 * 1024;   // the default per-block limit (no opt-in attribute)

// A group: up to kGroup slots of one expert, plan slots[begin, begin + count).
struct Group {
  int e;  // -1: past the groups of this step
  int begin;
  int count;
};

// Groups the plan may write for nk slots over num_experts experts: one per picked expert, plus one
// per kGroup slots beyond.
int64_t max_groups(int64_t nk, int64_t num_experts) { return std::min(num_experts, nk) + nk / kGroup; }

// Shared memory of the plan: per warp and expert a count, then per expert a total.
size_t plan_smem(int64_t num_experts) { return static_cast<size_t>((kPlanWarps + 1) * num_experts * 4); }

// Exclusive prefix of v over the block's threads in thread order; `total` gets the sum. `scratch`
// holds kPlanWarps ints; the call ends with a barrier so it can be reused.
__device__ int block_exclusive_scan(int v, int* scratch, int& total) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int inclusive = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += u;
  }
  if (lane == 31) scratch[warp] = inclusive;
  __syncthreads();
  int before = 0;
  total = 0;
  for (int w = 0; w < blockDim.x / 32; ++w) {
    if (w < warp) before += scratch[w];
    total += scratch[w];
  }
  __syncthreads();
  return before + inclusive - v;
}

// What the plan writes besides slots; a null pointer is not written.
struct PlanOut {
  Group* groups;     // [num_entries]: the grouped path's runs of at most kGroup slots
  int num_entries;
  int32_t* offsets;  // [num_experts + 1]: expert e's slots are slots[offsets[e] .. offsets[e + 1])
  int32_t* pos;      // [nk]: pos[s] = where slot s sits in slots
  int32_t* tokens;   // [nk]: tokens[i] = slots[i] / k, the token whose row the i-th slot reads
  int k;             // picks per token (for tokens)
};

// One block plans the step: slots [nk], the slots grouped by expert in ascending expert order and
// in slot order within an expert (a stable counting sort), and what `out` asks for; groups[a] for
// a < num_entries are each picked expert's slots in runs of at most kGroup, experts ascending (e =
// −1 past the last run). Warp w owns the slot range [nk·w/8, nk·(w+1)/8): it counts its slots per
// expert, the counts become per-(warp, expert) start positions (experts in order, warps in order
// within an expert), and the warp places its slots 32 at a time in slot order (lanes with the same
// expert ranked by lane).
__global__ void __launch_bounds__(kPlanThreads)
    plan_kernel(const int32_t* idx, int nk, int num_experts, int32_t* slots, PlanOut out) {
  // The gate/up blocks may start: they zero the down counters, then wait for this plan.
  cudaTriggerProgrammaticLaunchCompletion();
  extern __shared__ int plan_sm[];
  __shared__ int scratch[kPlanWarps];
  int* cnt = plan_sm;                                 // [kPlanWarps][num_experts]
  int* total = plan_sm + kPlanWarps * num_experts;    // [num_experts]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < kPlanWarps * num_experts; i += kPlanThreads) cnt[i] = 0;
  __syncthreads();
  const int s0 = static_cast<int>(int64_t{nk} * warp / kPlanWarps);
  const int s1 = static_cast<int>(int64_t{nk} * (warp + 1) / kPlanWarps);
  for (int s = s0 + lane; s < s1; s += 32) {
    const int e = idx[s];
    if (e < 0 || e >= num_experts) {
      printf("moe_experts: idx[%d] = %d outside [0, %d)\n", s, e, num_experts);
      __trap();
    }
    atomicAdd(&cnt[warp * num_experts + e], 1);
  }
  __syncthreads();
  // Thread t owns the experts [E·t/256, E·(t+1)/256): their counts become offsets within the expert.
  const int e0 = static_cast<int>(int64_t{num_experts} * threadIdx.x / kPlanThreads);
  const int e1 = static_cast<int>(int64_t{num_experts} * (threadIdx.x + 1) / kPlanThreads);
  int mine = 0, mine_groups = 0;
  for (int e = e0; e < e1; ++e) {
    int run = 0;
    for (int w = 0; w < kPlanWarps; ++w) {
      const int c = cnt[w * num_experts + e];
      cnt[w * num_experts + e] = run;
      run += c;
    }
    total[e] = run;
    mine += run;
    mine_groups += (run + kGroup - 1) / kGroup;
  }
  int all = 0, all_groups = 0;
  int begin = block_exclusive_scan(mine, scratch, all);
  int a = block_exclusive_scan(mine_groups, scratch, all_groups);
  for (int e = e0; e < e1; ++e) {
    const int c = total[e];
    if (out.groups)
      for (int g = 0; g < c; g += kGroup) out.groups[a++] = Group{e, begin + g, min(kGroup, c - g)};
    if (out.offsets) out.offsets[e] = begin;
    for (int w = 0; w < kPlanWarps; ++w) cnt[w * num_experts + e] += begin;
    begin += c;
  }
  if (out.offsets && threadIdx.x == 0) out.offsets[num_experts] = all;
  if (out.groups)
    for (int i = all_groups + threadIdx.x; i < out.num_entries; i += kPlanThreads) out.groups[i] = Group{-1, 0, 0};
  __syncthreads();
  for (int base = s0; base < s1; base += 32) {
    const int s = base + lane;
    const int e = s < s1 ? idx[s] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const unsigned earlier = peers & ((1u << lane) - 1u);
    if (e >= 0) {
      const int at = cnt[warp * num_experts + e] + __popc(earlier);
      slots[at] = s;
      if (out.pos) out.pos[s] = at;
      if (out.tokens) out.tokens[at] = s / out.k;
    }
    __syncwarp();
    if (e >= 0 && earlier == 0) cnt[warp * num_experts + e] += __popc(peers);
    __syncwarp();
  }
}

struct ExpertsArgs {
  const void* x;          // [N, din]
  int64_t din;
  const float* weights;   // [N, K]
  int k;
  const Group* groups;    // [max_groups] from plan_kernel
  const int32_t* slots;   // [N·K] from plan_kernel
  const void* w13;        // [E, 2f, din], or MXFP4 packed [E, 2f, din/2]
  const void* w2;         // [E, dout, f], or MXFP4 packed [E, dout, f/2]
  const uint8_t* w13_scale;  // MXFP4 [E, 2f, din/32]; null: dense
  const uint8_t* w2_scale;   // MXFP4 [E, dout, f/32]
  int64_t f, dout;
  void* act;              // [N·K, f] GLU outputs per slot
  void* y;                // [N·K, dout] expert outputs per slot
  int32_t* counters;      // [N, dout tiles] finished slots per (token, tile); zeroed by the gate/up launch
  int64_t num_counters;
  Activation kind;
  float beta;
  bool has_linear_beta;
  float linear_beta;
  Out o;                  // [N, dout]
};

// Elements k..k+7 of a bf16 row (zeros past kdim or for a null row). kVec: one 16-byte load (kdim
// and the row start multiples of 8 elements); kStream: evict-first (weights are read once).
template <bool kVec, bool kStream>
__device__ __forceinline__ uint4 load8(const __nv_bfloat16* row, int64_t k, int64_t kdim) {
  if (row == nullptr || k >= kdim) return make_uint4(0, 0, 0, 0);
  if constexpr (kVec) {
    const uint4* p = reinterpret_cast<const uint4*>(row + k);
    return kStream ? __ldcs(p) : __ldg(p);
  } else {
    uint32_t h[8];
    for (int i = 0; i < 8; ++i) h[i] = k + i < kdim ? __bfloat16_as_ushort(row[k + i]) : 0u;
    return make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
  }
}

// Row `row` of an expert matrix whose rows are `width` wide: dense T, or MXFP4 (mxfp4.cuh).
template <typename T, bool kMx>
__device__ __forceinline__ auto expert_row(const void* w, const uint8_t* scale, int64_t row, int64_t width) {
  if constexpr (kMx)
    return Mxfp4Row{static_cast<const uint8_t*>(w) + row * (width / 2), scale + row * (width / 32)};
  else
    return static_cast<const T*>(w) + row * width;
}

// Element k of a weight row as a float (zero for a null row).
template <typename T>
__device__ __forceinline__ float weight_at(const T* row, int64_t k) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return row ? __bfloat162float(row[k]) : 0.0f; else return row ? row[k] : 0.0f;
}
__device__ __forceinline__ float weight_at(const Mxfp4Row& row, int64_t k) { return mxfp4_value(row, k); }

// red[warp] ← this warp's mma accumulators acc[m][nt] (16-row m-tile m, 8-token n-tile nt < ntiles).
template <int kRows>
__device__ __forceinline__ void store_parts(const float (&acc)[kRows / 16][kGroup / 8][4], int ntiles,
                                            float (*red)[kRows][kGroup]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int nt = 0; nt < kGroup / 8; ++nt) {
    if (nt >= ntiles) break;
    const int j = nt * 8 + 2 * t4;
#pragma unroll
    for (int m = 0; m < kRows / 16; ++m) {
      red[warp][16 * m + g][j] = acc[m][nt][0];
      red[warp][16 * m + g][j + 1] = acc[m][nt][1];
      red[warp][16 * m + g + 8][j] = acc[m][nt][2];
      red[warp][16 * m + g + 8][j + 1] = acc[m][nt][3];
    }
  }
}

// tile_product's bf16 branch for MXFP4 rows (mxfp4.cuh): per warp step a quad covers 128 k, thread
// t4 the 32-value block 4c + t4 of rows g and g + 8 of each m-tile (16 packed bytes and a scale
// each), dequantized a word at a time into the pairs (i, i + 4) that the tokens' x is paired as.
template <int kRows, typename RowFn>
__device__ void tile_product_mxfp4(RowFn row, const __nv_bfloat16* const* xrows, int gm, int64_t kdim,
                                   float (*red)[kRows][kGroup]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ntiles = (gm + 7) / 8;
  constexpr int kM = kRows / 16;
  const int g = lane >> 2, t4 = lane & 3;
  Mxfp4Row rows[kM][2];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    rows[m][0] = row(16 * m + g);
    rows[m][1] = row(16 * m + g + 8);
  }
  const __nv_bfloat16* xr[kGroup / 8];
#pragma unroll
  for (int nt = 0; nt < kGroup / 8; ++nt) xr[nt] = xrows[nt * 8 + g];
  float acc[kM][kGroup / 8][4] = {};
  const int64_t blocks = kdim / 32, nc = (blocks + 3) / 4, c0 = nc * warp / kWarps, c1 = nc * (warp + 1) / kWarps;
  constexpr int kUnroll = 2;
  for (int64_t c = c0; c < c1; c += kUnroll) {
    uint4 q[kUnroll][kM][2];
    Mxfp4Scale sc[kUnroll][kM][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t b = (c + u) * 4 + t4;
      const bool in = c + u < c1 && b < blocks;
#pragma unroll
      for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const Mxfp4Row& r = rows[m][h];
          const bool live = in && r.q != nullptr;
          q[u][m][h] = live ? __ldcs(reinterpret_cast<const uint4*>(r.q) + b) : make_uint4(0, 0, 0, 0);
          sc[u][m][h] = mxfp4_scale(live ? r.s[b] : 127u);
        }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t b = (c + u) * 4 + t4;
      if (c + u >= c1) break;
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t a[kM][2][4];
#pragma unroll
        for (int m = 0; m < kM; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint4& qq = q[u][m][h];
            mxfp4_pairs(w == 0 ? qq.x : w == 1 ? qq.y : w == 2 ? qq.z : qq.w, sc[u][m][h], a[m][h]);
          }
#pragma unroll
        for (int nt = 0; nt < kGroup / 8; ++nt) {
          if (nt >= ntiles) break;
          uint32_t xp[4];
          x_pairs_0426(b < blocks ? load8<true, false>(xr[nt], b * 32 + w * 8, kdim) : make_uint4(0, 0, 0, 0), xp);
#pragma unroll
          for (int m = 0; m < kM; ++m) {
            ptx::mma_bf16(acc[m][nt], {a[m][0][0], a[m][1][0], a[m][0][1], a[m][1][1]}, xp[0], xp[1]);
            ptx::mma_bf16(acc[m][nt], {a[m][0][2], a[m][1][2], a[m][0][3], a[m][1][3]}, xp[2], xp[3]);
          }
        }
      }
    }
  }
  store_parts<kRows>(acc, ntiles, red);
}

// red[w][r][j] ← part w of Σ_k W[r][k] · X[j][k] for the block's kRows weight rows (`row(r)`, null
// past the end) and tokens j < gm (`xrows[j]`, null past gm), k < kdim. bf16: warp w takes a
// quarter of k for every row on tensor cores (16-row m-tiles; the parts are summed by the caller,
// in order), so a row's sum does not depend on kRows. f32: warp w takes its quarter of the rows
// whole, 4 at a time, in part 0.
template <typename T, bool kVec, int kRows, typename RowFn>
__device__ void tile_product(RowFn row, const T* const* xrows, int gm, int64_t kdim, float (*red)[kRows][kGroup]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ntiles = (gm + 7) / 8;
  using W = decltype(row(0));
  if constexpr (std::is_same_v<T, __nv_bfloat16> && std::is_same_v<W, Mxfp4Row>) {
    tile_product_mxfp4<kRows>(row, xrows, gm, kdim, red);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    constexpr int kM = kRows / 16, kUnroll = kLoadTiles / kM;  // chunks whose loads are issued together
    const int g = lane >> 2, t4 = lane & 3;
    const T* wa[kM];
    const T* wb[kM];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      wa[m] = row(16 * m + g);
      wb[m] = row(16 * m + g + 8);
    }
    const T* xr[kGroup / 8];
#pragma unroll
    for (int nt = 0; nt < kGroup / 8; ++nt) xr[nt] = xrows[nt * 8 + g];
    float acc[kM][kGroup / 8][4] = {};
    const int64_t nc = (kdim + kChunk - 1) / kChunk, c0 = nc * warp / kWarps, c1 = nc * (warp + 1) / kWarps;
    for (int64_t c = c0; c < c1; c += kUnroll) {
      uint4 a[kUnroll][kM], b[kUnroll][kM];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k = (c + u) * kChunk + t4 * 8;
        const bool in = c + u < c1;
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          a[u][m] = load8<kVec, true>(in ? wa[m] : nullptr, k, kdim);
          b[u][m] = load8<kVec, true>(in ? wb[m] : nullptr, k, kdim);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (c + u >= c1) break;
        const int64_t k = (c + u) * kChunk + t4 * 8;
#pragma unroll
        for (int nt = 0; nt < kGroup / 8; ++nt) {
          if (nt >= ntiles) break;
          const uint4 xv = load8<kVec, false>(xr[nt], k, kdim);
#pragma unroll
          for (int m = 0; m < kM; ++m) {
            // k0..k0+3 of each thread, then k0+4..k0+7
            ptx::mma_bf16(acc[m][nt], {a[u][m].x, b[u][m].x, a[u][m].y, b[u][m].y}, xv.x, xv.y);
            ptx::mma_bf16(acc[m][nt], {a[u][m].z, b[u][m].z, a[u][m].w, b[u][m].w}, xv.z, xv.w);
          }
        }
      }
    }
  store_parts<kRows>(acc, ntiles, red);
  } else {
    constexpr int kRowsPerWarp = kRows / kWarps, kRowStep = 4;
    for (int r0 = warp * kRowsPerWarp; r0 < (warp + 1) * kRowsPerWarp; r0 += kRowStep) {
      W wr[kRowStep];
      for (int r = 0; r < kRowStep; ++r) wr[r] = row(r0 + r);
      for (int nt = 0; nt < ntiles; ++nt) {
        float acc[kRowStep][8] = {};
        const T* xr[8];
        for (int j = 0; j < 8; ++j) xr[j] = xrows[nt * 8 + j];
        for (int64_t k = lane; k < kdim; k += 32) {
          float wv[kRowStep];
          for (int r = 0; r < kRowStep; ++r) wv[r] = weight_at(wr[r], k);
          for (int j = 0; j < 8; ++j) {
            const float xv = xr[j] ? xr[j][k] : 0.0f;
            for (int r = 0; r < kRowStep; ++r) acc[r][j] = fmaf(wv[r], xv, acc[r][j]);
          }
        }
        for (int r = 0; r < kRowStep; ++r)
          for (int j = 0; j < 8; ++j) {
            const float v = warp_sum(acc[r][j]);
            if (lane == 0) red[0][r0 + r][nt * 8 + j] = v;
          }
      }
    }
  }
}

// The finished product of row r and token j: the parts summed in warp order.
template <typename T, int kRows>
__device__ __forceinline__ float tile_value(const float (*red)[kRows][kGroup], int r, int j) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    float v = red[0][r][j];
    for (int w = 1; w < kWarps; ++w) v += red[w][r][j];
    return v;
  } else {
    return red[0][r][j];
  }
}

template <typename T>
__device__ __forceinline__ T to_t(float v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(v); else return v;
}
template <typename T>
__device__ __forceinline__ float from_t(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v); else return v;
}

enum class Stage {
  kGateUp,  // block (tile, a): gate rows [R/2·tile, R/2·tile + R/2) of group a's expert and the
            // matching up rows, GLU into act
  kDown,    // block (tile, a): down rows [R·tile, R·tile + R) into y; the block finishing a token's
            // tile adds its K outputs in k order into out
};

// kMx: the weights are MXFP4 (mxfp4.cuh), T the activations' dtype.
template <typename T, bool kVec, int kRows, Stage kStage, bool kMx>
__global__ void __launch_bounds__(kThreads) experts_kernel(ExpertsArgs p) {
  static_assert(kRows % 16 == 0 && kLoadTiles % (kRows / 16) == 0, "rows: 16-row m-tiles, a divisor of kLoadTiles");
  constexpr bool kUp = kStage == Stage::kGateUp;
  constexpr int kHalf = kRows / 2;  // gate/up: gate row r pairs with up row r + kHalf
  __shared__ float red[kWarps][kRows][kGroup];
  __shared__ const T* xrows[kGroup];
  __shared__ int slot[kGroup];  // the group's slots; down: −1 − slot where this block does the combine
  if constexpr (kUp) {
    // The down launch may start (its blocks wait for this grid to finish).
    cudaTriggerProgrammaticLaunchCompletion();
    // Its counters start from zero (every block helps, before any returns).
    const int64_t block = blockIdx.y * int64_t{gridDim.x} + blockIdx.x, nblocks = int64_t{gridDim.x} * gridDim.y;
    for (int64_t i = block * kThreads + threadIdx.x; i < p.num_counters; i += nblocks * kThreads) p.counters[i] = 0;
  }
  // gate/up: the plan is ready; down: act and the counters too (and the plan, which finished
  // before any gate/up block got past this wait).
  cudaGridDependencySynchronize();
  const Group grp = p.groups[blockIdx.y];
  if (grp.e < 0) return;
  const int tile = blockIdx.x;
  // The block's input rows (x per token, or act per slot) and weight rows.
  const T* in = static_cast<const T*>(kUp ? p.x : p.act);
  const int64_t width = kUp ? p.din : p.f;
  // Weight row i of this expert's projection (null past its rows).
  const int64_t first_row = int64_t{grp.e} * (kUp ? 2 * p.f : p.dout);
  auto weight_row = [&](int64_t i, bool live) {
    using W = decltype(expert_row<T, kMx>(nullptr, nullptr, 0, 0));
    return live ? expert_row<T, kMx>(kUp ? p.w13 : p.w2, kUp ? p.w13_scale : p.w2_scale, first_row + i, width) : W{};
  };
  auto row = [&](int r) {
    if constexpr (kUp) {
      const int64_t f = int64_t{tile} * kHalf + r % kHalf;
      return weight_row(r < kHalf ? f : p.f + f, f < p.f);
    } else {
      const int64_t d = int64_t{tile} * kRows + r;
      return weight_row(d, d < p.dout);
    }
  };
  T* act = static_cast<T*>(p.act);
  T* y = static_cast<T*>(p.y);
  const int gm = grp.count;
  if (threadIdx.x < kGroup) {
    const int s = threadIdx.x < gm ? p.slots[grp.begin + threadIdx.x] : 0;
    slot[threadIdx.x] = s;
    xrows[threadIdx.x] = threadIdx.x < gm ? in + int64_t{kUp ? s / p.k : s} * width : nullptr;
  }
  __syncthreads();
  tile_product<T, kVec, kRows>(row, xrows, gm, width, red);
  __syncthreads();
  if constexpr (kUp) {
    for (int i = threadIdx.x; i < kHalf * gm; i += kThreads) {
      const int j = i / kHalf, r = i % kHalf;
      const int64_t f = int64_t{tile} * kHalf + r;
      if (f >= p.f) continue;
      // The gate and up projections' outputs are rounded to the activation dtype first (MODEL.md 0:
      // every linear's output is), as the GEMM paths' h is.
      const float gate = from_t<T>(to_t<T>(tile_value<T, kRows>(red, r, j)));
      const float up = from_t<T>(to_t<T>(tile_value<T, kRows>(red, r + kHalf, j)));
      act[int64_t{slot[j]} * p.f + f] = to_t<T>(glu_value(gate, up, p.kind, p.beta, p.has_linear_beta, p.linear_beta));
    }
  } else {
    for (int i = threadIdx.x; i < kRows * gm; i += kThreads) {
      const int j = i / kRows, r = i % kRows;
      const int64_t d = int64_t{tile} * kRows + r;
      if (d < p.dout) y[int64_t{slot[j]} * p.dout + d] = to_t<T>(tile_value<T, kRows>(red, r, j));
    }
    // Publish these outputs, then count them; a slot completing its token's K marks itself
    // (−1 − slot) and this block does that token's combine.
    __threadfence();
    __syncthreads();
    if (threadIdx.x < gm) {
      const int s = slot[threadIdx.x];
      if (atomicAdd(&p.counters[int64_t{s / p.k} * gridDim.x + tile], 1) == p.k - 1) slot[threadIdx.x] = -1 - s;
    }
    __threadfence();
    __syncthreads();
    for (int i = threadIdx.x; i < kRows * gm; i += kThreads) {
      const int j = i / kRows, r = i % kRows;
      const int64_t d = int64_t{tile} * kRows + r;
      if (slot[j] >= 0 || d >= p.dout) continue;
      const int64_t t = (-1 - slot[j]) / p.k;
      float acc = 0.0f;
      for (int k = 0; k < p.k; ++k) acc += p.weights[t * p.k + k] * from_t<T>(__ldcg(y + (t * p.k + k) * p.dout + d));
      p.o.set(t * p.dout + d, acc);
    }
  }
}

bool grouped_fits(int64_t num_experts) { return plan_smem(num_experts) + kPlanWarps * 4 <= kSmemLimit; }

template <typename T, bool kVec, int kRows, bool kMx>
void launch_stages(CudaBackend& be, ExpertsArgs a, int64_t n, int64_t entries, const std::string& what) {
  const int64_t down_tiles = (a.dout + kRows - 1) / kRows;
  const Tensor counters = be.alloc(DType::kI32, {n, down_tiles});
  a.counters = counters.data_as<int32_t>();
  a.num_counters = n * down_tiles;
  const auto y = static_cast<unsigned>(entries);
  launch_dependent(be.stream(), experts_kernel<T, kVec, kRows, Stage::kGateUp, kMx>,
                   dim3(static_cast<unsigned>((a.f + kRows / 2 - 1) / (kRows / 2)), y), dim3(kThreads),
                   0, what + " (gate_up)", a);
  launch_dependent(be.stream(), experts_kernel<T, kVec, kRows, Stage::kDown, kMx>, dim3(static_cast<unsigned>(down_tiles), y),
                   dim3(kThreads), 0, what + " (down)", a);
}

// plan_kernel over idx [N, K] into slots [N·K] and what `out` asks for.
void launch_plan(CudaBackend& be, const Tensor& idx, int64_t num_experts, const Tensor& slots, const PlanOut& out,
                 const std::string& what) {
  KL_CHECK(grouped_fits(num_experts), what + ": the plan holds " + std::to_string(num_experts) +
                                          " experts in more than " + std::to_string(kSmemLimit) +
                                          " bytes of shared memory");
  plan_kernel<<<1, kPlanThreads, plan_smem(num_experts), be.stream()>>>(
      idx.data_as<const int32_t>(), static_cast<int>(idx.numel()), static_cast<int>(num_experts),
      slots.data_as<int32_t>(), out);
  KL_LAUNCHED(what + " (plan)");
}

void experts_grouped(CudaBackend& be, const Tensor& x, const Tensor& idx, const Tensor& weights,
                     const ExpertMatrix& w13, const ExpertMatrix& w2, const GluParams& gp, const Tensor& o,
                     const std::string& what) {
  const int64_t n = x.dim(0), din = x.dim(1), num_experts = w13.experts(), f = w13.rows() / 2, dout = w2.rows();
  const int64_t k = idx.dim(1), nk = n * k;
  const int64_t entries = max_groups(nk, num_experts);
  const Tensor act = be.alloc(x.dtype(), {nk, f}), y = be.alloc(x.dtype(), {nk, dout});
  const Tensor groups = be.alloc(DType::kI32, {entries, 3}), slots = be.alloc(DType::kI32, {nk});
  static_assert(sizeof(Group) == 3 * sizeof(int32_t));
  PlanOut plan{};
  plan.groups = static_cast<Group*>(groups.data());
  plan.num_entries = static_cast<int>(entries);
  launch_plan(be, idx, num_experts, slots, plan, what);
  ExpertsArgs a;
  a.x = x.data();
  a.din = din;
  a.weights = weights.data_as<const float>();
  a.k = static_cast<int>(k);
  a.groups = static_cast<const Group*>(groups.data());
  a.slots = slots.data_as<const int32_t>();
  a.w13 = w13.w.data();
  a.w2 = w2.w.data();
  a.w13_scale = w13.mxfp4() ? w13.scale.data_as<const uint8_t>() : nullptr;
  a.w2_scale = w2.mxfp4() ? w2.scale.data_as<const uint8_t>() : nullptr;
  a.f = f;
  a.dout = dout;
  a.act = act.data();
  a.y = y.data();
  a.kind = gp.kind;
  a.beta = gp.beta;
  a.has_linear_beta = gp.linear_beta.has_value();
  a.linear_beta = gp.linear_beta.value_or(1.0f);
  a.o = out(o, "moe_experts");
  if (w13.mxfp4()) {
    // MXFP4 widths are multiples of 32 and its bf16 path reads x in 16-byte loads (grouped_fits).
    if (x.dtype() == DType::kBF16)
      launch_stages<__nv_bfloat16, true, kTileRows, true>(be, a, n, entries, what);
    else
      launch_stages<float, false, kTileRows, true>(be, a, n, entries, what);
  } else if (x.dtype() == DType::kBF16) {
    const bool vec =
        din % 8 == 0 && f % 8 == 0 && aligned16(x.data()) && aligned16(w13.w.data()) && aligned16(w2.w.data());
    if (vec)
      launch_stages<__nv_bfloat16, true, kTileRows, false>(be, a, n, entries, what);
    else
      launch_stages<__nv_bfloat16, false, kTileRows, false>(be, a, n, entries, what);
  } else {
    launch_stages<float, false, kTileRows, false>(be, a, n, entries, what);
  }
}

// ---- per-expert GEMMs

// out[t] = Σ_k weights[t, k] · y[pos[t, k]] in k order (fp32, an fma each), rounded once. A thread
// owns a chunk of kRowChunk output columns (device.cuh: 16-byte accesses when dout % 8 == 0 and the
// data is aligned) and walks tokens (x over the chunks, y over the tokens, striding past 65535): no
// per-element division, a token's weights and positions read once per chunk.
// Cost (Kimi-Linear-48B prefill of 2,048 tokens, K = 8, dout = 2,304, BF16): reads y 75.5 MB,
// writes 9.4 MB (weights and positions 0.13 MB): 85 MB, 20 µs at 4.2 TB/s. Measured:
// docs/perf-log.md, "Notes moved from the CUDA sources".
__global__ void combine_kernel(In y, const int32_t* pos, const float* weights, int64_t n, int k, int64_t dout, bool vec,
                               Out o) {
  const int64_t d = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * kRowChunk;
  if (d >= dout) return;
  const int cn = chunk_size(d, dout);
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    float acc[kRowChunk] = {};
    for (int j = 0; j < k; ++j) {
      const float w = weights[t * k + j];
      float v[kRowChunk] = {};
      load_chunk(y, int64_t{pos[t * k + j]} * dout + d, cn, vec, v);
#pragma unroll
      for (int e = 0; e < kRowChunk; ++e) acc[e] = fmaf(w, v[e], acc[e]);
    }
    store_chunk(o, t * dout + d, cn, vec, acc);
  }
}

// o[t] = Σ_k weights[t, k] · y[pos[t·K + k]] (combine_kernel).
void combine(CudaBackend& be, const Tensor& y, const Tensor& pos, const Tensor& weights, const Tensor& o,
             const std::string& what) {
  const int64_t n = o.dim(0), dout = o.dim(1), k = weights.numel() / n;
  const bool vec = dout % kRowChunk == 0 && aligned16(y.data()) && aligned16(o.data());
  const RowGrid g = row_grid((dout + kRowChunk - 1) / kRowChunk, n);
  combine_kernel<<<g.grid, g.block, 0, be.stream()>>>(in(y, "moe_experts"), pos.data_as<const int32_t>(),
                                                      weights.data_as<const float>(), n, static_cast<int>(k), dout, vec,
                                                      out(o, "moe_experts"));
  KL_LAUNCHED(what + " (combine)");
}

// MXFP4 experts for the per-expert GEMMs: out[i] ← expert experts[i] of packed / scale (rows × in
// each), dequantized (mxfp4.cuh's values) into out's dtype; a thread per 32-value block.
// Cost: reads 17/32 byte a value, writes 2 (BF16) or 4 (F32): bound by the writes.
__global__ void dequantize_experts_kernel(const uint8_t* packed, const uint8_t* scale, const int32_t* experts,
                                          int64_t count, int64_t blocks_per_expert, Out out) {
  const int64_t total = count * blocks_per_expert;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t b = experts[i / blocks_per_expert] * blocks_per_expert + i % blocks_per_expert;
    const uint4 q = __ldcs(reinterpret_cast<const uint4*>(packed) + b);
    const Mxfp4Scale sc = mxfp4_scale(scale[b]);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      uint32_t pr[4];  // (value i, value i + 4) of the word
      mxfp4_pairs(w == 0 ? q.x : w == 1 ? q.y : w == 2 ? q.z : q.w, sc, pr);
      if (out.bf16) {
        const uint4 v = make_uint4(__byte_perm(pr[0], pr[1], 0x5410), __byte_perm(pr[2], pr[3], 0x5410),
                                   __byte_perm(pr[0], pr[1], 0x7632), __byte_perm(pr[2], pr[3], 0x7632));
        reinterpret_cast<uint4*>(out.p)[i * 4 + w] = v;
      } else {
        float* o = static_cast<float*>(out.p) + i * 32 + w * 8;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pr[j]));
          o[j] = v.x;
          o[j + 4] = v.y;
        }
      }
    }
  }
}

// The most bytes the per-expert path's dequantized MXFP4 experts take at once (one expert at least).
constexpr int64_t kDequantBytes = int64_t{512} << 20;

void experts_per_expert_gemm(CudaBackend& be, const Tensor& x, const Tensor& idx, const Tensor& weights,
                             const ExpertMatrix& w13, const ExpertMatrix& w2, const GluParams& p, const Tensor& o,
                             const std::string& what) {
  const int64_t n = x.dim(0), din = x.dim(1), num_experts = w13.experts(), f2 = w13.rows(), f = f2 / 2;
  const int64_t dout = w2.rows(), k = idx.dim(1);
  // Plan on the host: slots grouped by expert, in slot order within each expert.
  const Tensor ids = be.to_host(idx);
  const int32_t* id = ids.data_as<const int32_t>();
  std::vector<int64_t> count(num_experts + 1, 0);
  for (int64_t s = 0; s < n * k; ++s) {
    KL_CHECK(id[s] >= 0 && id[s] < num_experts, what + ": expert index " + std::to_string(id[s]) + " out of range");
    ++count[id[s] + 1];
  }
  std::vector<int64_t> offset(num_experts + 1, 0);
  for (int64_t e = 0; e < num_experts; ++e) offset[e + 1] = offset[e] + count[e + 1];
  std::vector<int32_t> token(n * k), pos(n * k);
  std::vector<int64_t> fill(offset.begin(), offset.end() - 1);
  for (int64_t s = 0; s < n * k; ++s) {
    const int64_t at = fill[id[s]]++;
    token[at] = static_cast<int32_t>(s / k);
    pos[s] = static_cast<int32_t>(at);
  }
  auto dev = [&](std::vector<int32_t> v) {
    return be.to_device(Tensor::wrap(DType::kI32, {static_cast<int64_t>(v.size())}, v.data(), nullptr, Device::kCpu),
                        DType::kI32);
  };
  const Tensor token_t = dev(token), pos_t = dev(pos);
  const Tensor xp = be.alloc(x.dtype(), {n * k, din});
  be.gather_rows(x, token_t, xp);
  // Expert outputs in the activation dtype (MODEL.md 3.4), as the grouped path.
  const Tensor h = be.alloc(x.dtype(), {n * k, f2}), act = be.alloc(x.dtype(), {n * k, f});
  const Tensor y = be.alloc(x.dtype(), {n * k, dout});
  const size_t es = dtype_size(x.dtype());
  // Each expert's rows of `in` [n·k, width] times its weight [out_w, width] of `w` into `c`, in
  // one grouped launch over the active experts; MXFP4 ones dequantized first, as many at a time as
  // kDequantBytes holds, a launch per such chunk.
  std::vector<int32_t> active;
  for (int64_t e = 0; e < num_experts; ++e)
    if (offset[e + 1] > offset[e]) active.push_back(static_cast<int32_t>(e));
  auto per_expert = [&](const Tensor& in, int64_t width, const ExpertMatrix& w, int64_t out_w, const Tensor& c,
                        const char* name) {
    const int64_t matrix = out_w * width * static_cast<int64_t>(es), count = static_cast<int64_t>(active.size());
    const int64_t chunk = w.mxfp4() ? std::clamp<int64_t>(kDequantBytes / matrix, 1, std::max<int64_t>(count, 1)) : count;
    const Tensor scratch = w.mxfp4() && count > 0 ? be.alloc(x.dtype(), {chunk, out_w, width}) : Tensor();
    for (int64_t a0 = 0; a0 < count; a0 += chunk) {
      const int64_t a1 = std::min(count, a0 + chunk);
      if (w.mxfp4()) {
        const Tensor chunk_ids = dev(std::vector<int32_t>(active.begin() + a0, active.begin() + a1));
        const int64_t blocks = out_w * width / 32;
        dequantize_experts_kernel<<<blocks_for((a1 - a0) * blocks, 256), 256, 0, be.stream()>>>(
            w.w.data_as<const uint8_t>(), w.scale.data_as<const uint8_t>(), chunk_ids.data_as<const int32_t>(), a1 - a0,
            blocks, out(scratch, "moe_experts"));
        KL_LAUNCHED(what + " (dequantize " + name + ")");
      }
      std::vector<GemmArgs> problems;
      for (int64_t a = a0; a < a1; ++a) {
        const int64_t e = active[a], rows = offset[e + 1] - offset[e];
        GemmArgs& g = problems.emplace_back();
        g.m = rows;
        g.n = out_w;
        g.k = width;
        g.a = static_cast<const char*>(in.data()) + offset[e] * width * es;
        g.lda = width;
        g.b = w.mxfp4() ? static_cast<const char*>(scratch.data()) + (a - a0) * matrix
                        : static_cast<const char*>(w.w.data()) + e * matrix;
        g.ldb = width;
        g.c = static_cast<char*>(c.data()) + offset[e] * out_w * es;
        g.ldc = out_w;
        g.ab_dtype = x.dtype();
        g.c_dtype = c.dtype();
      }
      be.gemm_grouped(problems, name);
    }
  };
  per_expert(xp, din, w13, f2, h, "moe_experts gate_up");
  be.glu(h, p, act);
  per_expert(act, f, w2, dout, y, "moe_experts down");
  combine(be, y, pos_t, weights, o, what);
}

// ---- rows (one token's picks as matrix-vector products)

constexpr int kRowWarps = 8;  // a block's warps: one output feature each

// Per lane, acc[r] += its part of a[r] · b[r] for the first `live` of kRows row pairs of `width`
// elements (a multiple of 8): lane l takes the 16-byte chunks 8·l + 256·i. The rows' loads are
// issued together, so a warp keeps kRows pairs of loads in flight per step. b: weights, streamed.
template <int kRows>
__device__ __forceinline__ void rows_dot(const __nv_bfloat16* const (&a)[kRows], const __nv_bfloat16* const (&b)[kRows],
                                         int live, int64_t width, float (&acc)[kRows]) {
  const int lane = threadIdx.x % 32;
#pragma unroll 2
  for (int64_t j = 8 * lane; j < width; j += 8 * 32) {
    uint4 ra[kRows], rb[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (r < live) {
        ra[r] = __ldg(reinterpret_cast<const uint4*>(a[r] + j));
        rb[r] = __ldcs(reinterpret_cast<const uint4*>(b[r] + j));
      }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (r < live) {
        float av[8], bv[8];
        unpack_bf16x8(ra[r], av);
        unpack_bf16x8(rb[r], bv);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r] = fmaf(av[e], bv[e], acc[r]);
      }
  }
}

// rows_dot for MXFP4 weight rows: lane l takes the 32-value blocks l + 32·i (16 packed bytes and a
// scale each), against the matching 32 values of a (four 16-byte loads), paired as mxfp4_pairs
// pairs the weights.
template <int kRows>
__device__ __forceinline__ void rows_dot(const __nv_bfloat16* const (&a)[kRows], const Mxfp4Row (&b)[kRows], int live,
                                         int64_t width, float (&acc)[kRows]) {
  const int lane = threadIdx.x % 32;
#pragma unroll 2
  for (int64_t blk = lane; blk < width / 32; blk += 32) {
    uint4 rb[kRows];
    uint32_t e[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (r < live) {
        rb[r] = __ldcs(reinterpret_cast<const uint4*>(b[r].q) + blk);
        e[r] = b[r].s[blk];
      }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (r < live) {
        const Mxfp4Scale sc = mxfp4_scale(e[r]);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          uint32_t wp[4], xp[4];
          mxfp4_pairs(w == 0 ? rb[r].x : w == 1 ? rb[r].y : w == 2 ? rb[r].z : rb[r].w, sc, wp);
          x_pairs_0426(__ldg(reinterpret_cast<const uint4*>(a[r] + blk * 32 + w * 8)), xp);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 wf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&wp[i]));
            const float2 xf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&xp[i]));
            acc[r] = fmaf(wf.y, xf.y, fmaf(wf.x, xf.x, acc[r]));
          }
        }
      }
  }
}

// The expert of slot s, checked (an index outside [0, E) prints and traps, as the plan does).
__device__ __forceinline__ int slot_expert(const int32_t* idx, int64_t s, int num_experts) {
  const int e = idx[s];
  if (e < 0 || e >= num_experts) {
    printf("moe_experts: idx[%lld] = %d outside [0, %d)\n", static_cast<long long>(s), e, num_experts);
    __trap();
  }
  return e;
}

struct RowsArgs {
  const __nv_bfloat16* x;    // [N, din]
  int64_t n, din;
  const int32_t* idx;        // [N, K]
  const float* weights;      // [N, K]
  int k, num_experts;
  const void* w13;           // bf16 [E, 2f, din], or MXFP4 packed [E, 2f, din/2]
  const void* w2;            // bf16 [E, dout, f], or MXFP4 packed [E, dout, f/2]
  const uint8_t* w13_scale;  // MXFP4 [E, 2f, din/32]; null: bf16
  const uint8_t* w2_scale;   // MXFP4 [E, dout, f/32]
  int64_t f, dout;
  __nv_bfloat16* act;        // [N·K, f]
  Activation kind;
  float beta;
  bool has_linear_beta;
  float linear_beta;
  Out o;                     // [N, dout]
  // The shared experts (SharedExperts; shared_down null: none): their projection of x, down weight
  // and activations.
  const __nv_bfloat16* shared_gu;    // [N, 2·fs]
  const __nv_bfloat16* shared_down;  // [dout, fs]
  int64_t fs;
  __nv_bfloat16* shared_act;         // [N, fs]
};

// Blocks [0, tiles·N·K) (tiles = ⌈f / 8⌉), block tile + tiles·s: warp w computes feature tile·8 + w
// of slot s's expert: the gate and up rows against x[s / K], each sum rounded to bf16 (as every
// linear's output is), the GLU into act. The blocks after them: a thread per shared activation, the
// GLU of the shared experts' projection into shared_act (glu_kernel's arithmetic).
// kMx: the routed experts are MXFP4.
template <bool kMx>
__global__ void __launch_bounds__(kRowWarps * 32) rows_gate_up_kernel(RowsArgs p) {
  pdl_enter();  // idx comes from the router, shared_gu from the projection before it
  const int64_t tiles = (p.f + kRowWarps - 1) / kRowWarps, routed_blocks = tiles * p.n * p.k;
  if (blockIdx.x >= routed_blocks) {
    const int64_t i = (blockIdx.x - routed_blocks) * int64_t{kRowWarps * 32} + threadIdx.x;
    if (i >= p.n * p.fs) return;
    const int64_t t = i / p.fs, j = i % p.fs;
    const float g = __bfloat162float(p.shared_gu[t * 2 * p.fs + j]);
    const float u = __bfloat162float(p.shared_gu[t * 2 * p.fs + p.fs + j]);
    p.shared_act[i] = __float2bfloat16_rn(glu_value(g, u, p.kind, p.beta, p.has_linear_beta, p.linear_beta));
    return;
  }
  const int64_t s = blockIdx.x / tiles;
  const int64_t feature = blockIdx.x % tiles * kRowWarps + threadIdx.x / 32;
  if (feature >= p.f) return;
  const int e = slot_expert(p.idx, s, p.num_experts);
  const __nv_bfloat16* x = p.x + s / p.k * p.din;
  const __nv_bfloat16* const xs[2] = {x, x};
  const decltype(expert_row<__nv_bfloat16, kMx>(nullptr, nullptr, 0, 0)) rows[2] = {
      expert_row<__nv_bfloat16, kMx>(p.w13, p.w13_scale, e * 2 * p.f + feature, p.din),
      expert_row<__nv_bfloat16, kMx>(p.w13, p.w13_scale, e * 2 * p.f + p.f + feature, p.din)};
  float sums[2] = {};
  rows_dot<2>(xs, rows, 2, p.din, sums);
  const float gate = warp_sum(sums[0]), up = warp_sum(sums[1]);
  if (threadIdx.x % 32 == 0) {
    const float g = stored(gate, true), u = stored(up, true);
    p.act[s * p.f + feature] = __float2bfloat16_rn(glu_value(g, u, p.kind, p.beta, p.has_linear_beta, p.linear_beta));
  }
}

// Block tile + tiles·t (tiles = ⌈dout / 8⌉): warp w computes output feature d = tile·8 + w of token
// t: for each pick j in order, the expert's down row against act[t·K + j], rounded to bf16 (the
// expert's output), then summed as combine_kernel does (fp32, an fma each, in pick order), rounded
// once. The picks' rows are read kDownPicks at a time. With shared experts their down row against
// shared_act[t], rounded, is then added to the rounded sum and the result rounded: the values an
// add of their separate output would store (add_shared_experts).
// Held to 64 registers (4 blocks an SM): the shared row's rows_dot site took it from 64 to 92 (2
// blocks an SM), which cost the N = 1 experts more than the registers gain
// (docs/perf-log.md, "Notes moved from the CUDA sources").
constexpr int kDownPicks = 4;
template <bool kMx>
__global__ void __launch_bounds__(kRowWarps * 32, 4) rows_down_kernel(RowsArgs p) {
  const int64_t tiles = (p.dout + kRowWarps - 1) / kRowWarps, t = blockIdx.x / tiles;
  const int64_t d = blockIdx.x % tiles * kRowWarps + threadIdx.x / 32;
  if (d >= p.dout) return;
  pdl_enter();  // act comes from the gate/up launch
  float acc = 0.0f;
  for (int j0 = 0; j0 < p.k; j0 += kDownPicks) {
    const int live = min(kDownPicks, p.k - j0);
    const __nv_bfloat16* acts[kDownPicks] = {};
    decltype(expert_row<__nv_bfloat16, kMx>(nullptr, nullptr, 0, 0)) rows[kDownPicks] = {};
    for (int r = 0; r < live; ++r) {
      const int64_t s = t * p.k + j0 + r;
      acts[r] = p.act + s * p.f;
      rows[r] = expert_row<__nv_bfloat16, kMx>(p.w2, p.w2_scale, slot_expert(p.idx, s, p.num_experts) * p.dout + d, p.f);
    }
    float sums[kDownPicks] = {};
    rows_dot<kDownPicks>(acts, rows, live, p.f, sums);
    for (int r = 0; r < live; ++r) {
      acc = fmaf(p.weights[t * p.k + j0 + r], stored(warp_sum(sums[r]), true), acc);
    }
  }
  if (p.shared_down != nullptr) {
    const __nv_bfloat16* const acts[1] = {p.shared_act + t * p.fs};
    const __nv_bfloat16* const rows[1] = {p.shared_down + d * p.fs};
    float sum[1] = {};
    rows_dot<1>(acts, rows, 1, p.fs, sum);
    acc = stored(acc, p.o.bf16) + stored(warp_sum(sum[0]), true);
  }
  if (threadIdx.x % 32 == 0) p.o.set(t * p.dout + d, acc);
}

// The rows path reads x, w13 and w2 in 16-byte chunks: bf16 x, and bf16 weights with widths of 8 or
// MXFP4 ones (widths of 32, rows of 16-byte multiples).
bool rows_fit(const Tensor& x, const ExpertMatrix& w13, const ExpertMatrix& w2) {
  const int64_t din = x.dim(1), f = w13.rows() / 2;
  const bool weights = w13.mxfp4() || (w13.w.dtype() == DType::kBF16 && w2.w.dtype() == DType::kBF16);
  return x.dtype() == DType::kBF16 && weights && din % 8 == 0 && f % 8 == 0 && aligned16(x.data()) &&
         aligned16(w13.w.data()) && aligned16(w2.w.data()) && w13.experts() <= INT_MAX;
}

// Whether the rows path can add `shared` (defined) itself: bf16, read in 16-byte chunks, into a bf16 out.
bool rows_fit_shared(const SharedExperts& s, const Tensor& x, const Tensor& o) {
  if (!s.gate_up.defined()) return false;
  const int64_t fs = s.down.dim(1);
  return s.gate_up.dtype() == DType::kBF16 && s.down.dtype() == DType::kBF16 && o.dtype() == DType::kBF16 &&
         fs % 8 == 0 && aligned16(s.down.data()) && x.dim(0) * fs <= INT_MAX;
}

// `shared`: undefined, or shared experts that fit (rows_fit_shared), added in the same two launches.
void experts_rows(CudaBackend& be, const Tensor& x, const Tensor& idx, const Tensor& weights, const ExpertMatrix& w13,
                  const ExpertMatrix& w2, const GluParams& gp, const Tensor& o, const SharedExperts& shared,
                  const std::string& what) {
  const int64_t n = x.dim(0), k = idx.dim(1), f = w13.rows() / 2, dout = w2.rows();
  const int64_t fs = shared.gate_up.defined() ? shared.down.dim(1) : 0;
  const Tensor act = be.alloc(DType::kBF16, {n * k, f});
  const Tensor shared_act = fs > 0 ? be.alloc(DType::kBF16, {n, fs}) : Tensor();
  RowsArgs a;
  a.x = x.data_as<const __nv_bfloat16>();
  a.n = n;
  a.din = x.dim(1);
  a.idx = idx.data_as<const int32_t>();
  a.weights = weights.data_as<const float>();
  a.k = static_cast<int>(k);
  a.num_experts = static_cast<int>(w13.experts());
  a.w13 = w13.w.data();
  a.w2 = w2.w.data();
  a.w13_scale = w13.mxfp4() ? w13.scale.data_as<const uint8_t>() : nullptr;
  a.w2_scale = w2.mxfp4() ? w2.scale.data_as<const uint8_t>() : nullptr;
  a.f = f;
  a.dout = dout;
  a.act = act.data_as<__nv_bfloat16>();
  a.kind = gp.kind;
  a.beta = gp.beta;
  a.has_linear_beta = gp.linear_beta.has_value();
  a.linear_beta = gp.linear_beta.value_or(1.0f);
  a.o = out(o, "moe_experts");
  a.shared_gu = fs > 0 ? shared.gate_up.data_as<const __nv_bfloat16>() : nullptr;
  a.shared_down = fs > 0 ? shared.down.data_as<const __nv_bfloat16>() : nullptr;
  a.fs = fs;
  a.shared_act = fs > 0 ? shared_act.data_as<__nv_bfloat16>() : nullptr;
  const int64_t up_blocks = (f + kRowWarps - 1) / kRowWarps * n * k + (n * fs + kRowWarps * 32 - 1) / (kRowWarps * 32);
  const int64_t down_blocks = (dout + kRowWarps - 1) / kRowWarps * n;
  KL_CHECK(up_blocks <= INT_MAX && down_blocks <= INT_MAX, what + ": too many rows for the rows path");
  launch_dependent(be.stream(), w13.mxfp4() ? rows_gate_up_kernel<true> : rows_gate_up_kernel<false>, dim3(static_cast<unsigned>(up_blocks)), dim3(kRowWarps * 32), 0,
                   what + " (rows gate_up)", a);
  launch_dependent(be.stream(), w13.mxfp4() ? rows_down_kernel<true> : rows_down_kernel<false>, dim3(static_cast<unsigned>(down_blocks)), dim3(kRowWarps * 32),
                   0, what + " (rows down)", a);
}

// ---- swapped GEMMs

void experts_swapped_gemm(CudaBackend& be, const Tensor& x, const Tensor& idx, const Tensor& weights,
                          const Tensor& w13, const Tensor& w2, const GluParams& p, const Tensor& o,
                          const std::string& what) {
  const int64_t n = x.dim(0), din = x.dim(1), num_experts = w13.dim(0), f2 = w13.dim(1), f = f2 / 2;
  const int64_t dout = w2.dim(1), k = idx.dim(1), nk = n * k;  // dense experts only (moe_path_fits)
  const Tensor slots = be.alloc(DType::kI32, {nk}), offsets = be.alloc(DType::kI32, {num_experts + 1});
  const Tensor pos = be.alloc(DType::kI32, {nk}), tokens = be.alloc(DType::kI32, {nk});
  PlanOut plan{};
  plan.offsets = offsets.data_as<int32_t>();
  plan.pos = pos.data_as<int32_t>();
  plan.tokens = tokens.data_as<int32_t>();
  plan.k = static_cast<int>(k);
  launch_plan(be, idx, num_experts, slots, plan, what);
  // Expert outputs in the activation dtype (MODEL.md 3.4), as on the other paths.
  const Tensor xp = be.alloc(x.dtype(), {nk, din}), h = be.alloc(x.dtype(), {nk, f2});
  const Tensor act = be.alloc(x.dtype(), {nk, f}), y = be.alloc(x.dtype(), {nk, dout});
  be.gather_rows(x, tokens, xp);
  expert_gemm_sm90(be, {xp.data(), w13.data(), h.data(), offsets.data_as<const int32_t>(), num_experts, f2, din},
                   what + " (gate_up)");
  be.glu(h, p, act);
  expert_gemm_sm90(be, {act.data(), w2.data(), y.data(), offsets.data_as<const int32_t>(), num_experts, dout, f},
                   what + " (down)");
  combine(be, y, pos, weights, o, what);
}

// Checks moe_experts' arguments; returns the name its launches report.
std::string checked_moe_args(const Tensor& x, const Tensor& idx, const Tensor& weights, const ExpertMatrix& w13,
                             const ExpertMatrix& w2, const Tensor& o) {
  const int64_t n = x.dim(0), din = x.dim(1), num_experts = w13.experts(), f2 = w13.rows(), f = f2 / 2;
  const int64_t dout = w2.rows(), k = idx.dim(1);
  const std::string named = (w13.mxfp4() ? "MXFP4 w13 " : "w13 ") + shape_to_string(w13.shape()) + " w2 " +
                            shape_to_string(w2.shape());
  // MXFP4: packed U8 and scales U8 of the shapes ExpertMatrix names, both projections alike.
  const bool mx_ok = !w13.mxfp4() ||
                     (w2.mxfp4() && w13.w.dtype() == DType::kU8 && w2.w.dtype() == DType::kU8 &&
                      w13.scale.shape() == Shape({num_experts, f2, din / 32}) &&
                      w2.scale.shape() == Shape({num_experts, dout, f / 32}) && din % 32 == 0 && f % 32 == 0);
  KL_CHECK(w13.in() == din && f2 == 2 * f && w2.experts() == num_experts && w2.in() == f &&
               o.shape() == Shape({n, dout}) && idx.dim(0) == n && idx.dtype() == DType::kI32 &&
               weights.numel() == n * k && weights.dtype() == DType::kF32 && w13.mxfp4() == w2.mxfp4() && mx_ok &&
               (w13.mxfp4() || (x.dtype() == w13.w.dtype() && w2.w.dtype() == w13.w.dtype())) && n * k <= INT_MAX,
           "moe_experts x " + shapes(x) + " " + named + " idx " + shapes(idx) + " out " + shapes(o));
  return "moe_experts x " + shapes(x) + " " + named;
}

}  // namespace

const char* moe_path_name(MoePath path) {
  return path_name(path, {"grouped", "swapped GEMM", "rows", "per-expert GEMM"});
}

bool moe_path_fits(MoePath path, const Tensor& x, const ExpertMatrix& w13, const ExpertMatrix& w2) {
  const int64_t din = x.dim(1), num_experts = w13.experts(), f2 = w13.rows(), dout = w2.rows();
  switch (path) {
    case MoePath::kGrouped:
      // MXFP4 with bf16 x reads x in 16-byte loads.
      return grouped_fits(num_experts) && (!w13.mxfp4() || x.dtype() != DType::kBF16 || aligned16(x.data()));
    case MoePath::kSwappedGemm:
      // The GEMMs' inputs and outputs are arena blocks (16-byte aligned rows when the widths fit).
      return !w13.mxfp4() && grouped_fits(num_experts) && x.dtype() == w13.w.dtype() &&
             expert_gemm_sm90_fits(w13.w.dtype(), f2, din, w13.w.data()) &&
             expert_gemm_sm90_fits(w2.w.dtype(), dout, f2 / 2, w2.w.data());
    case MoePath::kRows:
      return rows_fit(x, w13, w2);
    case MoePath::kPerExpertGemm:
      return true;
  }
  return false;
}

MoePath moe_path_for(const Tensor& x, const ExpertMatrix& w13, const ExpertMatrix& w2) {
  const int64_t n = x.dim(0);
  if (n > kMoeGroupedMaxTokens) return MoePath::kPerExpertGemm;
  if (n <= kMoeRowsMaxTokens && moe_path_fits(MoePath::kRows, x, w13, w2)) return MoePath::kRows;
  if (n >= kMoeSwappedMinTokens && moe_path_fits(MoePath::kSwappedGemm, x, w13, w2)) return MoePath::kSwappedGemm;
  return moe_path_fits(MoePath::kGrouped, x, w13, w2) ? MoePath::kGrouped : MoePath::kPerExpertGemm;
}

void moe_experts_on(CudaBackend& be, MoePath path, const Tensor& x, const Tensor& idx, const Tensor& weights,
                    const ExpertMatrix& w13, const ExpertMatrix& w2, const GluParams& p, const Tensor& o,
                    const SharedExperts& shared) {
  const std::string what = checked_moe_args(x, idx, weights, w13, w2, o);
  KL_CHECK(moe_path_fits(path, x, w13, w2), what + ": the " + moe_path_name(path) +
                                                " path cannot run these operands (dtype, widths or alignment)");
  check_shared_experts(shared, x.dim(0), o);
  if (x.dim(0) == 0) return;
  const bool fused = path == MoePath::kRows && rows_fit_shared(shared, x, o);  // the rows path adds them itself
  switch (path) {
    case MoePath::kGrouped:
      experts_grouped(be, x, idx, weights, w13, w2, p, o, what);
      break;
    case MoePath::kSwappedGemm:
      experts_swapped_gemm(be, x, idx, weights, w13.w, w2.w, p, o, what);
      break;
    case MoePath::kRows:
      experts_rows(be, x, idx, weights, w13, w2, p, o, fused ? shared : SharedExperts{}, what);
      break;
    case MoePath::kPerExpertGemm:
      experts_per_expert_gemm(be, x, idx, weights, w13, w2, p, o, what);
      break;
  }
  if (!fused) add_shared_experts(be, shared, p, o);
}

void CudaBackend::moe_route(const Tensor& logits, const Tensor& bias, const RouteParams& p, const Tensor& idx,
                            const Tensor& weights) {
  const int64_t n = logits.dim(0), e = logits.dim(1);
  KL_CHECK(logits.dtype() == DType::kF32 && bias.dtype() == DType::kF32 && bias.numel() == e &&
               idx.dtype() == DType::kI32 && idx.numel() == n * p.top_k && weights.dtype() == DType::kF32 &&
               weights.numel() == n * p.top_k && p.num_groups >= 1 && e % p.num_groups == 0 && p.top_k >= 1 &&
               p.top_k <= 32 && p.top_k <= e && e <= kRouteMaxExperts && p.num_groups <= kMaxGroups &&
               p.topk_group <= p.num_groups,
           "moe_route logits " + shapes(logits) + " bias " + shapes(bias) + " top_k " + std::to_string(p.top_k) +
               " groups " + std::to_string(p.num_groups) + " (at most " + std::to_string(kRouteMaxExperts) +
               " experts, 32 picks, " + std::to_string(kMaxGroups) + " groups)");
  if (n == 0) return;
  const size_t smem = kRouteWarps * 2 * e * sizeof(float);
  launch_dependent(stream_, route_kernel, dim3(static_cast<unsigned>((n + kRouteWarps - 1) / kRouteWarps)),
                   dim3(kRouteWarps * 32), smem, "moe_route " + shapes(logits), logits.data_as<const float>(),
                   bias.data_as<const float>(), static_cast<int>(e), n, p, idx.data_as<int32_t>(),
                   weights.data_as<float>());
}

void CudaBackend::moe_experts(const Tensor& x, const Tensor& idx, const Tensor& weights, const ExpertMatrix& w13,
                              const ExpertMatrix& w2, const GluParams& p, const Tensor& o, const SharedExperts& shared) {
  moe_experts_on(*this, moe_path_for(x, w13, w2), x, idx, weights, w13, w2, p, o, shared);
}

}  // namespace klinear::cuda
