// CUDA kda_decode (MODEL.md 4.8): the decode rows of a KDA layer in three launches, each a programmatic
// dependent of the one before (it starts while that one finishes and waits before reading its
// output):
//   prelude, a block per (2 heads, sequence), per head two warps of four 16-lane groups (q, k | v,
//     the gate), a lane per 8 channels: the conv step of the head's q/k/v channels (window =
//     [conv state ; x], SiLU, the conv pool shifted in place), the gate e^g, β, the L2 norms and
//     q̂·k̂, into a small fp32 workspace (3·dk + dv + 2 floats per head);
//   state, a block per (32-column tile, head, sequence), 128 threads: the tile's 128 × 32 fp32
//     state slice in registers, read first (16-byte loads, before waiting for the prelude), then
//     S' = diag(e^g) S, column sums Σ_k S'_kj k̂_k and Σ_k S'_kj q̂_k over the block,
//     u_j = β (v_j − the first), o_j = the second + u_j (q̂·k̂) (= Σ_k S''_kj q̂_k), S'' = S' + k̂ uᵀ
//     written back in place, o to a workspace (rounded to the activation dtype);
//   norm, a 16-lane group per (sequence, head), 16 per block: the gated RMSNorm of the head's o row
//     into y.
//
// The state is the traffic: dk·dv·4 bytes read and written per head, 1.07 GB at B = 256, H = 32,
// d = 128, whose floor is 0.26 ms (the state pool copy measures 0.261 ms, 98 % of 4.2 TB/s); the
// rest is ~3 % of it. The state launch has the shape of FLA's fused_recurrent_kda (a 128 × 32 tile
// per 4-warp block), which reaches 62 % of the copy at B = 256 where a block per head doing all of
// the work reached 55-57 % (docs/perf-log.md: four designs of that kind measured); what was the
// per-head chain of dependent loads and block reductions runs once per head in the prelude instead
// of once per tile, off the state launch's path. The intermediates are rounded where the
// composition of ops stores them (conv output and o in the activation dtype), so both agree up to
// summation order. Padded sequences leave both pools as they are and get zero y rows.
//
// The prelude and the norm keep every memory access off a chain of dependent round trips:
//   - the prelude's lane loads its 8 channels' taps, window rows and x (or f) with 16-byte
//     accesses all issued together, the weights before waiting for the kernel before the op;
//     computes the conv from registers and shifts the pool from the same registers (16-byte
//     stores, no reads back); the L2 norms and q̂·k̂ are shuffles within the q/k warp (the k lane
//     16 lanes from the q lane holding the same columns): no shared memory, no barrier; two
//     memory round trips after the wait (slot and row, then the data);
//   - the prelude is itself a programmatic dependent of the kernel before the op: it loads the
//     weights, waits, and only then lets the state launch start (whose state loads come before its
//     own wait, so the kernel before the op must be done by then; every prelude block waits, the
//     padded ones too);
//   - the norm: 16-byte accesses, og and the norm weight loaded before its wait, the sum of squares
//     four shuffles in the group.
// Head dims not a multiple of 8 or unaligned tensors take element-wise accesses (`vec` false),
// the same lanes and sums. The prelude is instantiated per conv width Kc ≤ 4 (taps in registers);
// a wider conv (the config allows 64) runs as the composition of ops (kda_decode_by_ops).
// Per launch at H = 32, d = 128, Kc = 4, bf16 (bytes; floor at 4.2 TB/s):
//   prelude: qkv 24.6 KB, conv pool 73.7 KB read and written, f 16.4 KB, workspace 66.0 KB per
//     sequence (conv weights 98 KB once, L2): B = 1 / 64 / 256: 0.37 / 16.3 / 65.2 MB, floor
//     0.1 / 3.9 / 15.5 µs (B = 1: latency, ~3 round trips);
//   state: 4.19 MB per sequence: 4.2 / 268 / 1,074 MB, floor 1.0 / 64 / 256 µs (copy 8.2 / 72.6 /
//     259.6 µs);
//   norm: o 16.4 KB, og 8.2 KB, y 8.2 KB per sequence: 0.03 / 2.1 / 8.4 MB, floor ~0 / 0.5 / 2 µs.
// Registers (ptxas, sm_90a): prelude 44 / 60 / 72 / 92 for Kc = 1 / 2 / 3 / 4 (launch bounds for 5
// blocks of 128 threads per SM), norm 40, state 96 (launch bounds for 5 blocks per SM: 20 warps,
// FLA's has 16, 1 KB of shared memory); no spills, no shared memory or barriers outside the state
// launch.
// Measured against these floors, and the fusions not done: docs/perf-log.md, "Notes moved from the CUDA sources".
#include <cmath>

#include "backend/cuda/common/device.cuh"

namespace klinear::cuda {

namespace {

constexpr int kMaxD = 128;     // dk and dv
constexpr int kThreads = 128;  // the state launch
constexpr int kTileCols = 32;  // state columns per block: 8 column groups of 4 × 16 row groups
constexpr int kRowGroups = kThreads / (kTileCols / 4);
constexpr int kRowsPerThread = kMaxD / kRowGroups;

// The prelude's output per (sequence, head), fp32: v [dv] | q̂ [dk] | k̂ [dk] | e^g [dk] | β | q̂·k̂,
// padded to 16 bytes (v is read as float4).
struct PreLayout {
  int dk, dv;
  __host__ __device__ int v() const { return 0; }
  __host__ __device__ int q() const { return dv; }
  __host__ __device__ int k() const { return dv + dk; }
  __host__ __device__ int e() const { return dv + 2 * dk; }
  __host__ __device__ int beta() const { return dv + 3 * dk; }
  __host__ __device__ int qk() const { return dv + 3 * dk + 1; }
  __host__ __device__ int stride() const { return (dv + 3 * dk + 2 + 3) / 4 * 4; }
};

struct DecodeStep {
  In qkv, conv_w;      // [N, C], [C, Kc]
  Out conv_states;     // [slots, Kc−1, C]
  const float* f;      // [N, H·dk]
  const float* dt_bias;
  const float* a_log;
  KdaGate gate;
  float lower_bound;
  const float* beta;   // [N, H] logits
  In og, o_norm;       // [N, H·dv], [dv]
  float eps;
  float* states;       // [slots, H, dk, dv]
  float* pre;          // [N, H, PreLayout::stride()]
  float* o;            // [N, H, dv], o as the activation dtype stores it
  Out y;               // [N, H·dv]
  const int32_t* cu;
  const int32_t* slots;
  int rows, pad_slot, heads, dk, dv;
  int64_t channels;
  float scale;         // dk^-1/2
  bool vec;            // every chunk of 8 elements 16-byte aligned: dk, dv multiples of 8, aligned tensors
};

// x as the activation dtype stores it.

__device__ __forceinline__ void fma4(float4& acc, const float4& x, float s) {
  acc.x += x.x * s, acc.y += x.y * s, acc.z += x.z * s, acc.w += x.w * s;
}
__device__ __forceinline__ void add4(float4& acc, const float4& x) { acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w; }
__device__ __forceinline__ float4 shfl_xor4(const float4& x, int m) {
  return make_float4(__shfl_xor_sync(0xffffffffu, x.x, m), __shfl_xor_sync(0xffffffffu, x.y, m),
                     __shfl_xor_sync(0xffffffffu, x.z, m), __shfl_xor_sync(0xffffffffu, x.w, m));
}

// A part of one head's work (prelude) or one head's row (norm) is spread over a group of 16 lanes
// (half a warp), a lane per 8-element chunk (kRowChunk) of a row up to kMaxD wide: the group's sums
// are four shuffles within the half warp, no shared memory, no barrier.
constexpr int kGroup = kMaxD / kRowChunk;
static_assert(kGroup == 16, "a group is half a warp");
__device__ __forceinline__ float group_sum(float v) {
  const unsigned half = 0xffffu << (threadIdx.x % 32 / kGroup * kGroup);  // the other group may have left
  for (int m = kGroup / 2; m > 0; m >>= 1) v += __shfl_xor_sync(half, v, m);
  return v;
}
// Prelude: per head two warps, four groups: q, k (warp 0), v, the gate (warp 1); kPreHeads heads per
// block of one sequence.
constexpr int kPreHeads = 2;
constexpr int kPreThreads = kPreHeads * 2 * 32;
constexpr int kMaxTaps = 4;  // Kc; both models have 4

template <int kTaps>
__global__ void __launch_bounds__(kPreThreads, 5) prelude_kernel(DecodeStep s) {
  constexpr int kHist = kTaps - 1;
  const int b = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = blockIdx.x * kPreHeads + warp / 2;
  const int part = 2 * (warp % 2) + lane / kGroup;  // 0 q, 1 k, 2 v, 3 the gate
  const int width = part == 2 ? s.dv : s.dk, col = (lane % kGroup) * kRowChunk;
  const int n = h < s.heads && col < width ? chunk_size(col, width) : 0;  // the lane's elements
  const int64_t ch = part == 0   ? int64_t{h} * s.dk + col
                     : part == 1 ? int64_t{s.heads + h} * s.dk + col
                                 : int64_t{2} * s.heads * s.dk + int64_t{h} * s.dv + col;  // q, k, v
  const int64_t gc = int64_t{h} * s.dk + col;  // the gate's column of f and dt_bias
  // The weights first: nothing in the step writes them, so they load while the kernel before ends.
  float w[kTaps * kRowChunk] = {}, dtb[kRowChunk] = {}, a = 0.0f;  // w[e·Kc + j]: tap j of element e
  if (n > 0 && part < 3) {
    if (s.vec) {
#pragma unroll
      for (int m = 0; m < kTaps; ++m) {
        float t[kRowChunk];
        load_chunk(s.conv_w, ch * kTaps + m * kRowChunk, kRowChunk, true, t);
#pragma unroll
        for (int e = 0; e < kRowChunk; ++e) w[m * kRowChunk + e] = t[e];
      }
    } else {
#pragma unroll
      for (int e = 0; e < kRowChunk; ++e)
#pragma unroll
        for (int j = 0; j < kTaps; ++j)
          if (e < n) w[e * kTaps + j] = s.conv_w[(ch + e) * kTaps + j];
    }
  } else if (n > 0) {
    load_chunk(In{s.dt_bias, false}, gc, n, s.vec, dtb);
    a = expf(s.a_log[h]);
  }
  // Every block waits, padded or not: the state launch starts once they all have got here, and
  // it reads the state pool before its own wait, so the kernel before this op must be done.
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
  const int slot = s.slots[b];
  const int64_t row = s.cu[b];  // loaded with the slot, not after the test
  if (slot == s.pad_slot || h >= s.heads) return;  // uniform over a warp
  const PreLayout pl{s.dk, s.dv};
  float* pre = s.pre + (int64_t{b} * s.heads + h) * pl.stride();
  const Out pre_out{pre, false};
  if (part == 3) {  // the gate e^g and β
    if (n == 0) return;
    float f[kRowChunk], e[kRowChunk];
    load_chunk(In{s.f, false}, row * s.heads * s.dk + gc, n, s.vec, f);
    const float beta_logit = col == 0 ? s.beta[row * s.heads + h] : 0.0f;
#pragma unroll
    for (int i = 0; i < kRowChunk; ++i) {
      const float fx = f[i] + dtb[i];
      e[i] = expf(kda_gate_value(s.gate, a, fx, s.lower_bound));
    }
    store_chunk(pre_out, pl.e() + col, n, s.vec, e);
    if (col == 0) pre[pl.beta()] = sigmoid_f(beta_logit);
    return;
  }
  // The conv step: window = [conv state rows ; x], all loads issued together; the pool shifted
  // from the registers (new row r = window row r + 1), 16-byte stores where s.vec. Lanes past the
  // row (n = 0) load and store nothing but stay for the q/k warp's shuffles.
  float win[kTaps][kRowChunk] = {}, x[kRowChunk] = {}, ss = 0.0f;
  if (n > 0) {
    const int64_t pool = int64_t{slot} * kHist * s.channels + ch;
#pragma unroll
    for (int r = 0; r < kHist; ++r)
      load_chunk(In{s.conv_states.p, s.conv_states.bf16}, pool + r * s.channels, n, s.vec, win[r]);
    load_chunk(s.qkv, row * s.channels + ch, n, s.vec, win[kHist]);
#pragma unroll
    for (int r = 0; r < kHist; ++r) store_chunk(s.conv_states, pool + r * s.channels, n, s.vec, win[r + 1]);
#pragma unroll
    for (int i = 0; i < kRowChunk; ++i) {
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < kTaps; ++j) acc += w[i * kTaps + j] * win[j][i];
      x[i] = i < n ? stored(acc * sigmoid_f(acc), s.qkv.bf16) : 0.0f;
      ss += x[i] * x[i];
    }
  }
  if (part == 2) {
    if (n > 0) store_chunk(pre_out, pl.v() + col, n, s.vec, x);
    return;
  }
  // Warp 0 of the head, all 32 lanes: q̂ and k̂ (the L2 norms over each half), then q̂·k̂, the
  // partner lane 16 away holding the same columns of the other.
  ss = group_sum(ss);
  const float norm = part == 0 ? s.scale / sqrtf(ss + 1e-6f) : 1.0f / sqrtf(ss + 1e-6f);
  float dot = 0.0f;
#pragma unroll
  for (int i = 0; i < kRowChunk; ++i) {
    x[i] *= norm;
    dot += x[i] * __shfl_xor_sync(0xffffffffu, x[i], kGroup);
  }
  dot = group_sum(dot);
  if (n > 0) store_chunk(pre_out, (part == 0 ? pl.q() : pl.k()) + col, n, s.vec, x);
  if (part == 0 && col == 0) pre[pl.qk()] = dot;
}

// Thread t owns columns [4·(t % 8), +4) of the tile and rows t / 8 + 16·i, i < 8: a warp
// instruction moves four 128-byte row segments.
__global__ void __launch_bounds__(kThreads, 5) state_kernel(DecodeStep s) {
  __shared__ float4 part[kThreads / 32][2][kTileCols / 4];  // per warp: the k and q sums of each column group
  cudaTriggerProgrammaticLaunchCompletion();  // the norm launch may start
  const int tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int cg = tid % (kTileCols / 4), rg = tid / (kTileCols / 4), lane = tid % 32, warp = tid / 32;
  const int slot = s.slots[b];
  if (slot == s.pad_slot) return;
  const int col = tile * kTileCols + 4 * cg;
  const bool live = col < s.dv;  // dv is a multiple of 4: a group is all in or all out
  float* st = s.states + (static_cast<int64_t>(slot) * s.heads + h) * s.dk * s.dv;
  float4 reg[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = rg + kRowGroups * i;
    reg[i] = live && r < s.dk ? *reinterpret_cast<const float4*>(st + static_cast<int64_t>(r) * s.dv + col)
                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  cudaGridDependencySynchronize();  // the prelude's output is complete
  const PreLayout pl{s.dk, s.dv};
  const float* pre = s.pre + (int64_t{b} * s.heads + h) * pl.stride();
  float qr[kRowsPerThread], kr[kRowsPerThread];
  float4 sk = make_float4(0.0f, 0.0f, 0.0f, 0.0f), sq = sk;
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = rg + kRowGroups * i;
    const bool in = r < s.dk;
    const float e = in ? pre[pl.e() + r] : 0.0f;
    qr[i] = in ? pre[pl.q() + r] : 0.0f, kr[i] = in ? pre[pl.k() + r] : 0.0f;
    reg[i].x *= e, reg[i].y *= e, reg[i].z *= e, reg[i].w *= e;
    fma4(sk, reg[i], kr[i]);
    fma4(sq, reg[i], qr[i]);
  }
  // Sum over the warp's four row groups (lanes 8 and 16 apart), then over the warps in order.
#pragma unroll
  for (int m = 8; m < 32; m *= 2) add4(sk, shfl_xor4(sk, m)), add4(sq, shfl_xor4(sq, m));
  if (lane < kTileCols / 4) part[warp][0][cg] = sk, part[warp][1][cg] = sq;
  __syncthreads();
  float4 tk = part[0][0][cg], tq = part[0][1][cg];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) add4(tk, part[w][0][cg]), add4(tq, part[w][1][cg]);
  const float beta = pre[pl.beta()], qk = pre[pl.qk()];
  float4 u = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (live) {
    const float4 v = *reinterpret_cast<const float4*>(pre + pl.v() + col);
    u = make_float4(beta * (v.x - tk.x), beta * (v.y - tk.y), beta * (v.z - tk.z), beta * (v.w - tk.w));
  }
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = rg + kRowGroups * i;
    fma4(reg[i], u, kr[i]);
    if (live && r < s.dk) *reinterpret_cast<float4*>(st + static_cast<int64_t>(r) * s.dv + col) = reg[i];
  }
  if (live && rg == 0) {
    const bool bf16 = s.y.bf16;
    *reinterpret_cast<float4*>(s.o + (int64_t{b} * s.heads + h) * s.dv + col) =
        make_float4(stored(tq.x + u.x * qk, bf16), stored(tq.y + u.y * qk, bf16), stored(tq.z + u.z * qk, bf16),
                    stored(tq.w + u.w * qk, bf16));
  }
}

// Gated RMSNorm of a head's row, y = o / rms(o) · w · σ(og): a group of 16 lanes per (sequence,
// head), kNormRows of them per block.
constexpr int kNormRows = 16;
constexpr int kNormThreads = kNormRows * kGroup;

__global__ void __launch_bounds__(kNormThreads) norm_kernel(DecodeStep s) {
  const int64_t pair = int64_t{blockIdx.x} * kNormRows + threadIdx.x / kGroup;  // b·H + h
  const int col = (threadIdx.x % kGroup) * kRowChunk;
  const bool in = pair < int64_t{s.rows} * s.heads;  // uniform over a group
  const int b = in ? static_cast<int>(pair / s.heads) : 0, h = in ? static_cast<int>(pair % s.heads) : 0;
  const int n = in && col < s.dv ? chunk_size(col, s.dv) : 0;
  float ov[kRowChunk] = {}, ogx[kRowChunk] = {}, onw[kRowChunk] = {};
  const int64_t yrow = (s.cu[b] * int64_t{s.heads} + h) * s.dv + col;
  const bool padded = s.slots[b] == s.pad_slot;
  if (n > 0 && padded) {
    store_chunk(s.y, yrow, n, s.vec, ov);
  } else if (n > 0) {
    load_chunk(s.og, yrow, n, s.vec, ogx);
    load_chunk(s.o_norm, col, n, s.vec, onw);
  }
  cudaGridDependencySynchronize();  // the state launch's o is complete
  cudaTriggerProgrammaticLaunchCompletion();
  if (padded) return;  // uniform over a group
  if (n > 0) load_chunk(In{s.o, false}, pair * s.dv + col, n, s.vec, ov);
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kRowChunk; ++i) ss += ov[i] * ov[i];
  const float inv = rsqrtf(group_sum(ss) / static_cast<float>(s.dv) + s.eps);
  float y[kRowChunk];
#pragma unroll
  for (int i = 0; i < kRowChunk; ++i) y[i] = ov[i] * inv * onw[i] * sigmoid_f(ogx[i]);
  if (n > 0) store_chunk(s.y, yrow, n, s.vec, y);
}

}  // namespace

void CudaBackend::kda_decode(const KdaDecodeArgs& a, const SeqLayout& decode) {
  const KdaDecodeDims d = check_kda_decode(a, decode);
  KL_CHECK(d.dk <= kMaxD && d.dv <= kMaxD && decode.dev.cu_seqlens.defined() && a.conv_states.dtype() == dtype_ &&
               a.qkv.dtype() == dtype_ && a.y.dtype() == dtype_,
           "kda_decode: head dims dk " + std::to_string(d.dk) + " dv " + std::to_string(d.dv) +
               " (the CUDA KDA ops take dk, dv ≤ 128), qkv, conv states and y in the activation dtype, and an "
               "uploaded layout");
  // What the three kernels do not take runs as the composition of the other ops (a config with
  // more than 4 conv taps, an odd dv, a state pool off 16 bytes, more sequences than a grid's y).
  if (d.kc > kMaxTaps || d.dv % 4 != 0 || !aligned16(a.states.data()) || d.rows > 65535) {
    kda_decode_by_ops(*this, a, decode);
    return;
  }
  if (d.rows == 0) return;
  const char* op = "kda_decode";
  const PreLayout pl{static_cast<int>(d.dk), static_cast<int>(d.dv)};
  const Tensor pre = alloc(DType::kF32, {d.rows, d.heads, pl.stride()});
  const Tensor o = alloc(DType::kF32, {d.rows, d.heads, d.dv});
  const DecodeStep s{in(a.qkv, op),
                     in(a.conv_w, op),
                     out(a.conv_states, op),
                     a.f.data_as<const float>(),
                     a.dt_bias.data_as<const float>(),
                     a.a_log.data_as<const float>(),
                     a.gate.kind,
                     a.gate.lower_bound,
                     a.beta_logits.data_as<const float>(),
                     in(a.og, op),
                     in(a.o_norm, op),
                     a.eps,
                     a.states.data_as<float>(),
                     pre.data_as<float>(),
                     o.data_as<float>(),
                     out(a.y, op),
                     decode.dev.cu_seqlens.data_as<const int32_t>(),
                     decode.dev.slots.data_as<const int32_t>(),
                     static_cast<int>(d.rows),
                     static_cast<int>(a.pad_slot),
                     static_cast<int>(d.heads),
                     static_cast<int>(d.dk),
                     static_cast<int>(d.dv),
                     d.channels,
                     1.0f / std::sqrt(static_cast<float>(d.dk)),
                     d.dk % kRowChunk == 0 && d.dv % kRowChunk == 0 && aligned16(a.qkv.data()) &&
                         aligned16(a.conv_w.data()) && aligned16(a.conv_states.data()) && aligned16(a.f.data()) &&
                         aligned16(a.dt_bias.data()) && aligned16(a.og.data()) && aligned16(a.o_norm.data()) &&
                         aligned16(a.y.data()) && aligned16(pre.data()) && aligned16(o.data())};
  const std::string what = "kda_decode qkv " + shapes(a.qkv) + " states " + shapes(a.states);
  const auto heads = static_cast<unsigned>(d.heads), rows = static_cast<unsigned>(d.rows);
  void (*prelude)(DecodeStep) = d.kc == 1   ? prelude_kernel<1>
                                : d.kc == 2 ? prelude_kernel<2>
                                : d.kc == 3 ? prelude_kernel<3>
                                            : prelude_kernel<4>;
  launch_dependent(stream_, prelude, dim3((heads + kPreHeads - 1) / kPreHeads, rows), dim3(kPreThreads),
                   0, what + " (prelude)", s);
  const auto tiles = static_cast<unsigned>((d.dv + kTileCols - 1) / kTileCols);
  launch_dependent(stream_, state_kernel, dim3(tiles, heads, rows), dim3(kThreads), 0, what + " (state)", s);
  const int64_t pairs = d.rows * d.heads;
  launch_dependent(stream_, norm_kernel, dim3(static_cast<unsigned>((pairs + kNormRows - 1) / kNormRows)),
                   dim3(kNormThreads), 0, what + " (norm)", s);
}

}  // namespace klinear::cuda
