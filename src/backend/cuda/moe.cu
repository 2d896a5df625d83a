// CUDA MoE (SPEC 3.3, 3.4).
//
// Router: one kernel, a warp per token (sigmoid, bias for the choice only, grouped top-k,
// renormalise, scale; ties go to the lower index as on the CPU).
//
// Routed experts, two paths (moe.h):
// - kGrouped (decode, N ≤ kMoeGroupedMaxTokens): two launches, no host synchronisation, grids fixed
//   by N and the shapes. Block (tile, a) serves the a-th smallest expert index picked by any token
//   (blocks past the number of picked experts return at once); it finds that expert and the slots
//   (token·K + k) that picked it from idx itself, in slot order, so no planning launch runs. Its
//   16 weight rows are streamed once (16-byte loads) for all its tokens, 32 at a time:
//     gate/up: rows = 8 gate + the 8 matching up rows; epilogue GLU → act[slot] (activation dtype).
//     down:    rows = 16 output features; epilogue y[slot] = expert output rounded to the activation
//              dtype (SPEC 3.4); then per (token, tile) a counter: the block whose slot completes a
//              token's K outputs sums them in k order in fp32 and writes out. Deterministic (no float
//              atomics; the integer counters only pick which block adds).
//   bf16 uses tensor cores (mma.sync m16n8k16, fp32 accumulate; each thread loads 8 consecutive
//   k of a row, permuting k identically in A and B), the K dimension split over the 4 warps and
//   summed in a fixed order; f32 uses fp32 FMAs (the exact mode). Down is a programmatic dependent
//   launch: its blocks find their expert while gate/up finishes, then wait for it (griddepcontrol).
// - kPerExpertGemm (prefill): the routing read to the host, slots grouped by expert, one grouped
//   cuBLAS launch per projection over the active experts (a problem each), the same combine in a
//   separate kernel.
#include <algorithm>
#include <climits>
#include <type_traits>
#include <vector>

#include "backend/cuda/device.cuh"
#include "backend/cuda/moe.h"

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
    idx[t * p.top_k + i] = chosen[warp][i];
    weights[t * p.top_k + i] = w * p.scale;
  }
}

// ---- grouped experts

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kTileRows = 16;           // weight rows per block: 8 gate + 8 up, or 16 down
constexpr int kGroup = 32;              // tokens per pass over the rows (4 mma n-tiles of 8)
constexpr int kChunk = 32;              // k per warp step: 4 threads × 8 consecutive elements
constexpr int kUnroll = 4;              // chunks whose weight loads are issued together
constexpr int kStaticSmem = kWarps * kTileRows * kGroup * 4 + kGroup * 8 + 64;
constexpr int kSmemLimit = 48 * 1024;   // the default per-block limit (no opt-in attribute)

struct ExpertsArgs {
  const void* x;        // [N, din]
  int64_t din;
  const int32_t* idx;   // [N, K]
  const float* weights; // [N, K]
  int n, k, num_experts;
  const void* w13;      // [E, 2f, din]
  const void* w2;       // [E, dout, f]
  int64_t f, dout;
  void* act;            // [N·K, f] GLU outputs per slot
  void* y;              // [N·K, dout] expert outputs per slot
  int32_t* counters;    // [N, dout tiles] finished slots per (token, tile); zeroed by the gate/up launch
  int64_t num_counters;
  Activation kind;
  float beta;
  bool has_linear_beta;
  float linear_beta;
  Out o;                // [N, dout]
};

struct BlockExpert {
  int e;  // -1: this block has no expert
  int m;  // its slots, in list[0, m)
};

// The a-th smallest expert index in idx [nk] and the slots that picked it, in slot order.
// `flags` holds num_experts bytes, `list` nk ints, `sh` kWarps + 1 ints (all shared).
__device__ BlockExpert block_expert(const int32_t* idx, int nk, int num_experts, int a, unsigned char* flags,
                                    int* list, int* sh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = threadIdx.x; j < num_experts; j += blockDim.x) flags[j] = 0;
  __syncthreads();
  for (int s = threadIdx.x; s < nk; s += blockDim.x) {
    const int e = idx[s];
    if (e < 0 || e >= num_experts) {
      printf("moe_experts: idx[%d] = %d outside [0, %d)\n", s, e, num_experts);
      __trap();
    }
    flags[e] = 1;  // every writer stores the same value
  }
  __syncthreads();
  if (warp == 0) {
    int found = -1, rest = a;
    for (int base = 0; base < num_experts; base += 32) {
      unsigned bits = __ballot_sync(0xffffffffu, base + lane < num_experts && flags[base + lane]);
      const int c = __popc(bits);
      if (rest < c) {
        for (int i = 0; i < rest; ++i) bits &= bits - 1;
        found = base + __ffs(bits) - 1;
        break;
      }
      rest -= c;
    }
    if (lane == 0) sh[kWarps] = found;
  }
  __syncthreads();
  const int e = sh[kWarps];
  if (e < 0) return {-1, 0};
  // Ordered compaction: warp w owns slots [nk·w/4, nk·(w+1)/4); count, then place.
  const int s0 = static_cast<int>(int64_t{nk} * warp / kWarps), s1 = static_cast<int>(int64_t{nk} * (warp + 1) / kWarps);
  int count = 0;
  for (int base = s0; base < s1; base += 32) {
    const int s = base + lane;
    count += __popc(__ballot_sync(0xffffffffu, s < s1 && idx[s] == e));
  }
  if (lane == 0) sh[warp] = count;
  __syncthreads();
  int pos = 0, m = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) pos += sh[w];
    m += sh[w];
  }
  for (int base = s0; base < s1; base += 32) {
    const int s = base + lane;
    const bool hit = s < s1 && idx[s] == e;
    const unsigned bits = __ballot_sync(0xffffffffu, hit);
    if (hit) list[pos + __popc(bits & ((1u << lane) - 1u))] = s;
    pos += __popc(bits);
  }
  __syncthreads();
  return {e, m};
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

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

// red[w][r][j] ← part w of Σ_k W[r][k] · X[j][k] for the block's 16 weight rows (`row(r)`, null
// past the end) and tokens j < gm (`xrows[j]`, null past gm), k < kdim. bf16: warp w takes a
// quarter of k on tensor cores (the parts are summed by the caller, in order). f32: warp w takes
// rows 4w..4w+3 whole, in part 0.
template <typename T, bool kVec, typename RowFn>
__device__ void tile_product(RowFn row, const T* const* xrows, int gm, int64_t kdim,
                             float (*red)[kTileRows][kGroup]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int ntiles = (gm + 7) / 8;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const int g = lane >> 2, t4 = lane & 3;
    const T* wa = row(g);
    const T* wb = row(g + 8);
    const T* xr[kGroup / 8];
#pragma unroll
    for (int nt = 0; nt < kGroup / 8; ++nt) xr[nt] = xrows[nt * 8 + g];
    float acc[kGroup / 8][4] = {};
    const int64_t nc = (kdim + kChunk - 1) / kChunk, c0 = nc * warp / kWarps, c1 = nc * (warp + 1) / kWarps;
    for (int64_t c = c0; c < c1; c += kUnroll) {
      uint4 a[kUnroll], b[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t k = (c + u) * kChunk + t4 * 8;
        const bool in = c + u < c1;
        a[u] = load8<kVec, true>(in ? wa : nullptr, k, kdim);
        b[u] = load8<kVec, true>(in ? wb : nullptr, k, kdim);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (c + u >= c1) break;
        const int64_t k = (c + u) * kChunk + t4 * 8;
#pragma unroll
        for (int nt = 0; nt < kGroup / 8; ++nt) {
          if (nt >= ntiles) break;
          const uint4 xv = load8<kVec, false>(xr[nt], k, kdim);
          mma_bf16(acc[nt], a[u].x, b[u].x, a[u].y, b[u].y, xv.x, xv.y);  // k0..k0+3 of each thread
          mma_bf16(acc[nt], a[u].z, b[u].z, a[u].w, b[u].w, xv.z, xv.w);  // k0+4..k0+7
        }
      }
    }
#pragma unroll
    for (int nt = 0; nt < kGroup / 8; ++nt) {
      if (nt >= ntiles) break;
      const int j = nt * 8 + 2 * t4;
      red[warp][g][j] = acc[nt][0];
      red[warp][g][j + 1] = acc[nt][1];
      red[warp][g + 8][j] = acc[nt][2];
      red[warp][g + 8][j + 1] = acc[nt][3];
    }
  } else {
    constexpr int kRowsPerWarp = kTileRows / kWarps;
    const T* wr[kRowsPerWarp];
    for (int r = 0; r < kRowsPerWarp; ++r) wr[r] = row(warp * kRowsPerWarp + r);
    for (int nt = 0; nt < ntiles; ++nt) {
      float acc[kRowsPerWarp][8] = {};
      const T* xr[8];
      for (int j = 0; j < 8; ++j) xr[j] = xrows[nt * 8 + j];
      for (int64_t k = lane; k < kdim; k += 32) {
        float wv[kRowsPerWarp];
        for (int r = 0; r < kRowsPerWarp; ++r) wv[r] = wr[r] ? wr[r][k] : 0.0f;
        for (int j = 0; j < 8; ++j) {
          const float xv = xr[j] ? xr[j][k] : 0.0f;
          for (int r = 0; r < kRowsPerWarp; ++r) acc[r][j] = fmaf(wv[r], xv, acc[r][j]);
        }
      }
      for (int r = 0; r < kRowsPerWarp; ++r)
        for (int j = 0; j < 8; ++j) {
          const float v = warp_sum(acc[r][j]);
          if (lane == 0) red[0][warp * kRowsPerWarp + r][nt * 8 + j] = v;
        }
    }
  }
}

// The finished product of row r and token j: the parts summed in warp order.
template <typename T>
__device__ __forceinline__ float tile_value(const float (*red)[kTileRows][kGroup], int r, int j) {
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
  kGateUp,  // block (tile, a): gate/up rows [8·tile, 8·tile + 8) of the a-th picked expert, GLU into act
  kDown,    // block (tile, a): down rows [16·tile, 16·tile + 16) into y; the block finishing a token's
            // tile adds its K outputs in k order into out
};

template <typename T, bool kVec, Stage kStage>
__global__ void __launch_bounds__(kThreads) experts_kernel(ExpertsArgs p) {
  constexpr bool kUp = kStage == Stage::kGateUp;
  extern __shared__ int dyn_smem[];
  __shared__ float red[kWarps][kTileRows][kGroup];
  __shared__ const T* xrows[kGroup];
  __shared__ int sh[kWarps + 1];
  if constexpr (kUp) {
    // The down launch may start (its blocks find their expert, then wait for this grid to finish).
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    // Its counters start from zero (every block helps, before any returns).
    const int64_t block = blockIdx.y * int64_t{gridDim.x} + blockIdx.x, nblocks = int64_t{gridDim.x} * gridDim.y;
    for (int64_t i = block * kThreads + threadIdx.x; i < p.num_counters; i += nblocks * kThreads) p.counters[i] = 0;
  }
  const int nk = p.n * p.k;
  int* list = dyn_smem;
  unsigned char* flags = reinterpret_cast<unsigned char*>(list + nk);
  const BlockExpert be = block_expert(p.idx, nk, p.num_experts, blockIdx.y, flags, list, sh);
  if (be.e < 0) return;
  if constexpr (!kUp) asm volatile("griddepcontrol.wait;" ::: "memory");  // act and the counters are ready
  const int tile = blockIdx.x;
  // The block's input rows (x per token, or act per slot) and weight rows.
  const T* in = static_cast<const T*>(kUp ? p.x : p.act);
  const int64_t width = kUp ? p.din : p.f;
  const T* w = kUp ? static_cast<const T*>(p.w13) + int64_t{be.e} * 2 * p.f * p.din
                   : static_cast<const T*>(p.w2) + int64_t{be.e} * p.dout * p.f;
  auto row = [&](int r) -> const T* {
    if constexpr (kUp) {
      const int64_t f = int64_t{tile} * 8 + (r & 7);
      return f < p.f ? w + (r < 8 ? f : p.f + f) * p.din : nullptr;
    } else {
      const int64_t d = int64_t{tile} * kTileRows + r;
      return d < p.dout ? w + d * p.f : nullptr;
    }
  };
  T* act = static_cast<T*>(p.act);
  T* y = static_cast<T*>(p.y);
  for (int g0 = 0; g0 < be.m; g0 += kGroup) {
    const int gm = min(kGroup, be.m - g0);
    if (threadIdx.x < kGroup) {
      const int s = threadIdx.x < gm ? list[g0 + threadIdx.x] : 0;
      xrows[threadIdx.x] = threadIdx.x < gm ? in + int64_t{kUp ? s / p.k : s} * width : nullptr;
    }
    __syncthreads();
    tile_product<T, kVec>(row, xrows, gm, width, red);
    __syncthreads();
    if constexpr (kUp) {
      for (int i = threadIdx.x; i < 8 * gm; i += kThreads) {
        const int j = i / 8, r = i % 8;
        const int64_t f = int64_t{tile} * 8 + r;
        if (f < p.f)
          act[int64_t{list[g0 + j]} * p.f + f] = to_t<T>(glu_value(
              tile_value<T>(red, r, j), tile_value<T>(red, r + 8, j), p.kind, p.beta, p.has_linear_beta, p.linear_beta));
      }
    } else {
      for (int i = threadIdx.x; i < kTileRows * gm; i += kThreads) {
        const int j = i / kTileRows, r = i % kTileRows;
        const int64_t d = int64_t{tile} * kTileRows + r;
        if (d < p.dout) y[int64_t{list[g0 + j]} * p.dout + d] = to_t<T>(tile_value<T>(red, r, j));
      }
    }
    __syncthreads();
  }
  if constexpr (!kUp) {
    // Publish this block's outputs, then count them; a slot completing its token's K marks itself
    // (stored as −1 − slot) and this block does that token's combine.
    __threadfence();
    __syncthreads();
    for (int j = threadIdx.x; j < be.m; j += kThreads) {
      const int s = list[j];
      if (atomicAdd(&p.counters[int64_t{s / p.k} * gridDim.x + tile], 1) == p.k - 1) list[j] = -1 - s;
    }
    __threadfence();
    __syncthreads();
    for (int i = threadIdx.x; i < kTileRows * be.m; i += kThreads) {
      const int j = i / kTileRows, r = i % kTileRows;
      const int64_t d = int64_t{tile} * kTileRows + r;
      if (list[j] >= 0 || d >= p.dout) continue;
      const int64_t t = (-1 - list[j]) / p.k;
      float acc = 0.0f;
      for (int k = 0; k < p.k; ++k) acc += p.weights[t * p.k + k] * from_t<T>(__ldcg(y + (t * p.k + k) * p.dout + d));
      p.o.set(t * p.dout + d, acc);
    }
  }
}

size_t grouped_smem(int64_t nk, int64_t num_experts) { return static_cast<size_t>((nk * 4 + num_experts + 15) / 16 * 16); }

bool grouped_fits(int64_t n, int64_t k, int64_t num_experts) {
  return grouped_smem(n * k, num_experts) + kStaticSmem <= kSmemLimit;
}

template <typename T, bool kVec>
void launch_grouped(CudaBackend& be, const ExpertsArgs& a, int64_t slots, const std::string& what) {
  const size_t smem = grouped_smem(int64_t{a.n} * a.k, a.num_experts);
  const dim3 up_grid(static_cast<unsigned>((a.f + 7) / 8), static_cast<unsigned>(slots));
  const dim3 down_grid(static_cast<unsigned>((a.dout + kTileRows - 1) / kTileRows), static_cast<unsigned>(slots));
  experts_kernel<T, kVec, Stage::kGateUp><<<up_grid, kThreads, smem, be.stream()>>>(a);
  KL_LAUNCHED(what + " (gate_up)");
  // Down as a programmatic dependent launch: its blocks start while gate/up's last ones run.
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = down_grid;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = be.stream();
  cfg.attrs = &overlap;
  cfg.numAttrs = 1;
  KL_CUDA(cudaLaunchKernelEx(&cfg, experts_kernel<T, kVec, Stage::kDown>, a), what + " (down)");
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void experts_grouped(CudaBackend& be, const Tensor& x, const Tensor& idx, const Tensor& weights, const Tensor& w13,
                     const Tensor& w2, const GluParams& gp, const Tensor& o, const std::string& what) {
  const int64_t n = x.dim(0), din = x.dim(1), num_experts = w13.dim(0), f = w13.dim(1) / 2, dout = w2.dim(1);
  const int64_t k = idx.dim(1), nk = n * k;
  KL_CHECK(grouped_fits(n, k, num_experts) && num_experts <= 65535,
           what + ": the grouped path holds " + std::to_string(nk) + " slots of " + std::to_string(num_experts) +
               " experts in more than " + std::to_string(kSmemLimit) + " bytes of shared memory");
  const int64_t down_tiles = (dout + kTileRows - 1) / kTileRows;
  const Tensor act = be.alloc(x.dtype(), {nk, f}), y = be.alloc(x.dtype(), {nk, dout});
  const Tensor counters = be.alloc(DType::kI32, {n, down_tiles});
  ExpertsArgs a;
  a.x = x.data();
  a.din = din;
  a.idx = idx.data_as<const int32_t>();
  a.weights = weights.data_as<const float>();
  a.n = static_cast<int>(n);
  a.k = static_cast<int>(k);
  a.num_experts = static_cast<int>(num_experts);
  a.w13 = w13.data();
  a.w2 = w2.data();
  a.f = f;
  a.dout = dout;
  a.act = act.data();
  a.y = y.data();
  a.counters = counters.data_as<int32_t>();
  a.num_counters = n * down_tiles;
  a.kind = gp.kind;
  a.beta = gp.beta;
  a.has_linear_beta = gp.linear_beta.has_value();
  a.linear_beta = gp.linear_beta.value_or(1.0f);
  a.o = out(o, "moe_experts");
  const int64_t slots = std::min(num_experts, nk);  // at most this many experts are picked
  if (x.dtype() == DType::kBF16) {
    const bool vec = din % 8 == 0 && f % 8 == 0 && aligned16(x.data()) && aligned16(w13.data()) && aligned16(w2.data());
    if (vec)
      launch_grouped<__nv_bfloat16, true>(be, a, slots, what);
    else
      launch_grouped<__nv_bfloat16, false>(be, a, slots, what);
  } else {
    launch_grouped<float, false>(be, a, slots, what);
  }
}

// ---- per-expert GEMMs

// out[t] = Σ_k weights[t, k] · y[pos[t, k]] in k order (fp32).
__global__ void combine_kernel(In y, const int32_t* pos, const float* weights, int64_t n, int k, int64_t dout, Out o) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * dout; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / dout, d = i % dout;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc += weights[t * k + j] * y[int64_t{pos[t * k + j]} * dout + d];
    o.set(i, acc);
  }
}

void experts_per_expert_gemm(CudaBackend& be, const Tensor& x, const Tensor& idx, const Tensor& weights,
                             const Tensor& w13, const Tensor& w2, const GluParams& p, const Tensor& o,
                             const std::string& what) {
  const int64_t n = x.dim(0), din = x.dim(1), num_experts = w13.dim(0), f2 = w13.dim(1), f = f2 / 2;
  const int64_t dout = w2.dim(1), k = idx.dim(1);
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
  auto dev = [&](std::vector<int32_t>& v) {
    return be.to_device(Tensor::wrap(DType::kI32, {static_cast<int64_t>(v.size())}, v.data(), nullptr, Device::kCpu),
                        DType::kI32);
  };
  const Tensor token_t = dev(token), pos_t = dev(pos);
  const Tensor xp = be.alloc(x.dtype(), {n * k, din});
  be.gather_rows(x, token_t, xp);
  // Expert outputs in the activation dtype (SPEC 3.4), as the grouped path.
  const Tensor h = be.alloc(x.dtype(), {n * k, f2}), act = be.alloc(x.dtype(), {n * k, f});
  const Tensor y = be.alloc(x.dtype(), {n * k, dout});
  const size_t es = dtype_size(x.dtype());
  // Each expert's rows of `in` [n·k, width] times its weight [out_w, width] of `w` into `c`, all
  // experts in one grouped launch.
  auto per_expert = [&](const Tensor& in, int64_t width, const Tensor& w, int64_t out_w, const Tensor& c,
                        const char* name) {
    std::vector<GemmArgs> problems;
    for (int64_t e = 0; e < num_experts; ++e) {
      const int64_t rows = offset[e + 1] - offset[e];
      if (rows == 0) continue;
      GemmArgs& g = problems.emplace_back();
      g.m = rows;
      g.n = out_w;
      g.k = width;
      g.a = static_cast<const char*>(in.data()) + offset[e] * width * es;
      g.lda = width;
      g.b = static_cast<const char*>(w.data()) + e * out_w * width * es;
      g.ldb = width;
      g.c = static_cast<char*>(c.data()) + offset[e] * out_w * es;
      g.ldc = out_w;
      g.ab_dtype = x.dtype();
      g.c_dtype = c.dtype();
    }
    be.gemm_grouped(problems, name);
  };
  per_expert(xp, din, w13, f2, h, "moe_experts gate_up");
  be.glu(h, p, act);
  per_expert(act, f, w2, dout, y, "moe_experts down");
  combine_kernel<<<blocks_for(n * dout, 256), 256, 0, be.stream()>>>(in(y, "moe_experts"), pos_t.data_as<const int32_t>(),
                                                                     weights.data_as<const float>(), n,
                                                                     static_cast<int>(k), dout, out(o, "moe_experts"));
  KL_LAUNCHED(what + " (combine)");
}

}  // namespace

MoePath moe_path_for(int64_t n, int64_t k, int64_t num_experts) {
  return n <= kMoeGroupedMaxTokens && grouped_fits(n, k, num_experts) ? MoePath::kGrouped : MoePath::kPerExpertGemm;
}

void moe_experts_on(CudaBackend& be, MoePath path, const Tensor& x, const Tensor& idx, const Tensor& weights,
                    const Tensor& w13, const Tensor& w2, const GluParams& p, const Tensor& o) {
  const int64_t n = x.dim(0), din = x.dim(1), num_experts = w13.dim(0), f2 = w13.dim(1), f = f2 / 2;
  const int64_t dout = w2.dim(1), k = idx.dim(1);
  KL_CHECK(w13.dim(2) == din && f2 == 2 * f && w2.dim(0) == num_experts && w2.dim(2) == f &&
               o.shape() == Shape({n, dout}) && idx.dim(0) == n && idx.dtype() == DType::kI32 &&
               weights.numel() == n * k && weights.dtype() == DType::kF32 && x.dtype() == w13.dtype() &&
               w2.dtype() == w13.dtype() && n * k <= INT_MAX,
           "moe_experts x " + shapes(x) + " w13 " + shapes(w13) + " w2 " + shapes(w2) + " idx " + shapes(idx) + " out " +
               shapes(o));
  if (n == 0) return;
  const std::string what = "moe_experts x " + shapes(x) + " w13 " + shapes(w13);
  if (path == MoePath::kGrouped)
    experts_grouped(be, x, idx, weights, w13, w2, p, o, what);
  else
    experts_per_expert_gemm(be, x, idx, weights, w13, w2, p, o, what);
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
  route_kernel<<<static_cast<unsigned>((n + kRouteWarps - 1) / kRouteWarps), kRouteWarps * 32, smem, stream_>>>(
      logits.data_as<const float>(), bias.data_as<const float>(), static_cast<int>(e), n, p, idx.data_as<int32_t>(),
      weights.data_as<float>());
  KL_LAUNCHED("moe_route " + shapes(logits));
}

void CudaBackend::moe_experts(const Tensor& x, const Tensor& idx, const Tensor& weights, const Tensor& w13,
                              const Tensor& w2, const GluParams& p, const Tensor& o) {
  moe_experts_on(*this, moe_path_for(x.dim(0), idx.dim(1), w13.dim(0)), x, idx, weights, w13, w2, p, o);
}

}  // namespace klinear::cuda
