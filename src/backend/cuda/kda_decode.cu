// CUDA kda_decode (SPEC 4.8): the decode rows of a KDA layer in three launches, each a programmatic
// dependent of the one before (it starts while that one finishes and waits before reading its
// output):
//   prelude, a block per (head, sequence): the conv step of the head's q/k/v channels (window =
//     [conv state ; x], SiLU, the conv pool shifted in place), the gate e^g, β, the L2 norms and
//     q̂·k̂, into a small fp32 workspace (3·dk + dv + 2 floats per head);
//   state, a block per (32-column tile, head, sequence), 128 threads: the tile's 128 × 32 fp32
//     state slice in registers, read first (16-byte loads, before waiting for the prelude), then
//     S' = diag(e^g) S, column sums Σ_k S'_kj k̂_k and Σ_k S'_kj q̂_k over the block,
//     u_j = β (v_j − the first), o_j = the second + u_j (q̂·k̂) (= Σ_k S''_kj q̂_k), S'' = S' + k̂ uᵀ
//     written back in place, o to a workspace (rounded to the activation dtype);
//   norm, a block per (head, sequence): the gated RMSNorm of the head's o row into y.
//
// The state is the traffic: dk·dv·4 bytes read and written per head, 1.07 GB at B = 256, H = 32,
// d = 128, whose floor is 0.26 ms (the state pool copy measures 0.261 ms, 98 % of 4.2 TB/s); the
// rest is ~3 % of it. The state launch has the shape of FLA's fused_recurrent_kda (a 128 × 32 tile
// per 4-warp block), which reaches 62 % of the copy at B = 256 where a block per head doing all of
// the work reached 55-57 % (docs/PERF.md: four designs of that kind measured); what was the
// per-head chain of dependent loads and block reductions runs once per head in the prelude instead
// of once per tile, off the state launch's path. The intermediates are rounded where the
// composition of ops stores them (conv output and o in the activation dtype), so both agree up to
// summation order. Padded sequences leave both pools as they are and get zero y rows.
// The state launch: 96 registers (launch bounds for 5 blocks per SM: 20 warps, FLA's has 16).
// Measured on the H200 (2026-12-01, ops_bench kda_decode beside fla_bench in one command): 0.0213 /
// 0.1069 / 0.3712 ms at B = 1 / 64 / 256 (graph replays 0.0118 / 0.0981 / 0.3613), FLA's
// fused_recurrent_kda 0.1199 / 0.1879 / 0.4722; the single-block fused kernel before this measured
// 0.0142 / 0.1248 / 0.4651 (predicted for this one: 0.36-0.42 at B = 256, 0.09-0.11 at B = 64, B = 1
// a few µs slower for its three launches).
#include <cmath>

#include "backend/cuda/device.cuh"

namespace klinear::cuda {

namespace {

constexpr int kMaxD = 128;     // dk and dv
constexpr int kThreads = 128;  // every launch
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
  int pad_slot, heads, dk, dv, kc;
  int64_t channels;
  float scale;         // dk^-1/2
};

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
// x as the activation dtype stores it.
__device__ __forceinline__ float stored(float x, bool bf16) { return bf16 ? __bfloat162float(__float2bfloat16_rn(x)) : x; }

__device__ __forceinline__ void fma4(float4& acc, const float4& x, float s) {
  acc.x += x.x * s, acc.y += x.y * s, acc.z += x.z * s, acc.w += x.w * s;
}
__device__ __forceinline__ void add4(float4& acc, const float4& x) { acc.x += x.x, acc.y += x.y, acc.z += x.z, acc.w += x.w; }
__device__ __forceinline__ float4 shfl_xor4(const float4& x, int m) {
  return make_float4(__shfl_xor_sync(0xffffffffu, x.x, m), __shfl_xor_sync(0xffffffffu, x.y, m),
                     __shfl_xor_sync(0xffffffffu, x.z, m), __shfl_xor_sync(0xffffffffu, x.w, m));
}

__global__ void __launch_bounds__(kThreads) prelude_kernel(DecodeStep s) {
  __shared__ float qv[kMaxD], kv[kMaxD], scratch[32];
  cudaTriggerProgrammaticLaunchCompletion();  // the state launch may start: its loads come first
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int slot = s.slots[b];
  if (slot == s.pad_slot) return;
  const int64_t row = s.cu[b];
  const PreLayout pl{s.dk, s.dv};
  float* pre = s.pre + (int64_t{b} * s.heads + h) * pl.stride();
  // The gate's and β's inputs with the conv's loads, not after the barriers.
  const int64_t c = int64_t{h} * s.dk + tid;
  const float fx = tid < s.dk ? s.f[row * s.heads * s.dk + c] + s.dt_bias[c] : 0.0f;
  const float a = expf(s.a_log[h]), beta_logit = s.beta[row * s.heads + h];

  // Conv step of the head's channels: q [h·dk, +dk), k H·dk + the same, v 2·H·dk + [h·dv, +dv).
  // The outputs first (loads only), the shift of the conv pool after the last barrier.
  const int64_t hist = s.kc - 1;
  auto channel = [&](int i) {
    return i < s.dk       ? int64_t{h} * s.dk + i
           : i < 2 * s.dk ? int64_t{s.heads + h} * s.dk + (i - s.dk)
                          : int64_t{2} * s.heads * s.dk + int64_t{h} * s.dv + (i - 2 * s.dk);
  };
  // Row r of channel ch's window [conv state ; x].
  auto window = [&](int64_t ch, int64_t r) {
    return r < hist ? s.conv_states[(static_cast<int64_t>(slot) * hist + r) * s.channels + ch]
                    : s.qkv[row * s.channels + ch];
  };
  for (int i = tid; i < 2 * s.dk + s.dv; i += kThreads) {
    const int64_t ch = channel(i);
    float acc = 0.0f;
    for (int64_t j = 0; j < s.kc; ++j) acc += s.conv_w[ch * s.kc + j] * window(ch, j);
    const float x = stored(acc * sigmoid_f(acc), s.qkv.bf16);
    if (i < s.dk) qv[i] = x;
    else if (i < 2 * s.dk) kv[i - s.dk] = x;
    else pre[pl.v() + i - 2 * s.dk] = x;
  }
  __syncthreads();
  const float qx = tid < s.dk ? qv[tid] : 0.0f, kx = tid < s.dk ? kv[tid] : 0.0f;
  const float ssq = block_sum(qx * qx, scratch), ssk = block_sum(kx * kx, scratch);
  const float qs = qx * (s.scale / sqrtf(ssq + 1e-6f)), ks = kx * (1.0f / sqrtf(ssk + 1e-6f));
  const float qk = block_sum(qs * ks, scratch);
  if (tid < s.dk) {
    pre[pl.q() + tid] = qs, pre[pl.k() + tid] = ks;
    pre[pl.e() + tid] = expf(s.gate == KdaGate::kSoftplus ? -a * softplus(fx) : s.lower_bound * sigmoid_f(a * fx));
  }
  if (tid == 0) pre[pl.beta()] = sigmoid_f(beta_logit), pre[pl.qk()] = qk;

  // Shift the conv pool: new row r = window row r + 1, read before row r + 1 is written (each
  // channel is one thread's, so the reads see the rows the outputs above were computed from).
  for (int i = tid; i < 2 * s.dk + s.dv; i += kThreads) {
    const int64_t ch = channel(i);
    for (int64_t r = 0; r < hist; ++r)
      s.conv_states.set((static_cast<int64_t>(slot) * hist + r) * s.channels + ch, window(ch, r + 1));
  }
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

// Gated RMSNorm of the head's row: y = o / rms(o) · w · σ(og).
__global__ void __launch_bounds__(kThreads) norm_kernel(DecodeStep s) {
  __shared__ float scratch[32];
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int64_t yrow = (s.cu[b] * int64_t{s.heads} + h) * s.dv;
  const bool live = tid < s.dv;
  if (s.slots[b] == s.pad_slot) {
    if (live) s.y.set(yrow + tid, 0.0f);
    return;
  }
  const float ogx = live ? s.og[yrow + tid] : 0.0f, onw = live ? s.o_norm[tid] : 0.0f;
  cudaGridDependencySynchronize();  // the state launch's o is complete
  const float ov = live ? s.o[(int64_t{b} * s.heads + h) * s.dv + tid] : 0.0f;
  const float inv = rsqrtf(block_sum(ov * ov, scratch) / static_cast<float>(s.dv) + s.eps);
  if (live) s.y.set(yrow + tid, ov * inv * onw * sigmoid_f(ogx));
}

}  // namespace

void CudaBackend::kda_decode(const KdaDecodeArgs& a, const SeqLayout& decode) {
  const KdaDecodeDims d = check_kda_decode(a, decode);
  KL_CHECK(d.dk <= kMaxD && d.dv <= kMaxD && d.dv % 4 == 0 && aligned16(a.states.data()) &&
               d.rows <= 65535 && decode.dev.cu_seqlens.defined() && a.conv_states.dtype() == dtype_ &&
               a.qkv.dtype() == dtype_ && a.y.dtype() == dtype_,
           "kda_decode: head dims dk " + std::to_string(d.dk) + " dv " + std::to_string(d.dv) + ", " +
               std::to_string(d.rows) +
               " rows (the kernels take dk, dv ≤ 128 with dv a multiple of 4, a 16-byte aligned state pool and at "
               "most 65,535 sequences), qkv, conv states and y in the activation dtype, and an uploaded layout");
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
                     static_cast<int>(a.pad_slot),
                     static_cast<int>(d.heads),
                     static_cast<int>(d.dk),
                     static_cast<int>(d.dv),
                     static_cast<int>(d.kc),
                     d.channels,
                     1.0f / std::sqrt(static_cast<float>(d.dk))};
  const std::string what = "kda_decode qkv " + shapes(a.qkv) + " states " + shapes(a.states);
  const auto heads = static_cast<unsigned>(d.heads), rows = static_cast<unsigned>(d.rows);
  prelude_kernel<<<dim3(heads, rows), kThreads, 0, stream_>>>(s);
  KL_LAUNCHED(what + " (prelude)");
  const auto tiles = static_cast<unsigned>((d.dv + kTileCols - 1) / kTileCols);
  launch_dependent(stream_, state_kernel, dim3(tiles, heads, rows), dim3(kThreads), what + " (state)", s);
  launch_dependent(stream_, norm_kernel, dim3(heads, rows), dim3(kThreads), what + " (norm)", s);
}

}  // namespace klinear::cuda
