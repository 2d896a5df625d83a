// CUDA kda_decode (SPEC 4.8): one launch per layer for the decode rows, a block per (head, sequence)
// doing the whole token: the conv step of the head's q/k/v channels (window = [conv state ; x],
// SiLU, state shifted in place), the gate and β, the L2 norms, one pass over the fp32 state tile
// (read, decay, delta rule, write) and the gated RMSNorm of the head's output row.
//
// The state is the traffic (dk·dv·4 bytes read and written per head; the rest is ~5 % of it), so
// the tile is streamed once in 16-byte accesses: lane l owns columns [4l, 4l+4), warp w owns rows
// w, w+8, …, so each warp instruction moves 512 contiguous bytes of one row, and every thread
// issues its 16 loads before the conv and norm work that hides their latency. One block owns a
// head's whole output row, so the RMSNorm over dv is a block reduction and o never leaves the SM
// (column tiles would need a second pass or a cluster exchange for the norm's sum, for no fewer
// bytes). Measured and left out (docs/PERF.md): persistent blocks prefetching the next tile, the
// columns split over a cluster of four, and the tile moved by bulk copies (TMA) through shared
// memory at three blocks per SM; each was slower than this at batch 64 and 256. The intermediates
// are rounded where the composition of ops stores them (conv output and o in the activation
// dtype), so both agree up to summation order.
#include <cmath>

#include "backend/cuda/device.cuh"

namespace klinear::cuda {

namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kMaxD = 128;                  // dk and dv: 32 lanes × 4 columns, 8 warps × 16 rows
constexpr int kRowsPerThread = kMaxD / kWarps;

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

__global__ void __launch_bounds__(kThreads, 2) kda_decode_kernel(DecodeStep s) {
  __shared__ float qn[kMaxD], kn[kMaxD], eg[kMaxD], vv[kMaxD], u_sh[kMaxD], scratch[32];
  __shared__ __align__(16) float part[kWarps][kMaxD];
  const int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t row = s.cu[b], yrow = (row * s.heads + h) * s.dv;
  const int slot = s.slots[b];
  if (slot == s.pad_slot) {  // padding: the pools stay as they are
    for (int c = tid; c < s.dv; c += kThreads) s.y.set(yrow + c, 0.0f);
    return;
  }
  // The state loads first: nothing below depends on them until the decay.
  float* st = s.states + (static_cast<int64_t>(slot) * s.heads + h) * s.dk * s.dv;
  const int col = 4 * lane;
  const bool col_live = col < s.dv;
  float4 reg[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int j = warp + kWarps * i;
    reg[i] = (col_live && j < s.dk) ? *reinterpret_cast<const float4*>(st + static_cast<int64_t>(j) * s.dv + col)
                                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }

  // Everything else a thread reads, before the first store or barrier, so that all of the block's
  // loads are in flight together (a load placed after a store to the conv pool could not be
  // hoisted above it).
  float fx = 0.0f, dtb = 0.0f, ogx = 0.0f, onw = 0.0f;
  if (tid < s.dk) {
    const int64_t c = int64_t{h} * s.dk + tid;
    fx = s.f[row * s.heads * s.dk + c], dtb = s.dt_bias[c];
  }
  if (tid < s.dv) ogx = s.og[yrow + tid], onw = s.o_norm[tid];
  const float a_log = s.a_log[h], beta_logit = s.beta[row * s.heads + h];

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
    if (i < s.dk) qn[i] = x;
    else if (i < 2 * s.dk) kn[i - s.dk] = x;
    else vv[i - 2 * s.dk] = x;
  }
  __syncthreads();
  const float qx = tid < s.dk ? qn[tid] : 0.0f, kx = tid < s.dk ? kn[tid] : 0.0f;
  const float ssq = block_sum(qx * qx, scratch), ssk = block_sum(kx * kx, scratch);
  if (tid < kMaxD) {
    float e = 0.0f;
    if (tid < s.dk) {
      const float x = fx + dtb, a = expf(a_log);
      e = expf(s.gate == KdaGate::kSoftplus ? -a * softplus(x) : s.lower_bound * sigmoid_f(a * x));
    }
    qn[tid] = qx * (s.scale / sqrtf(ssq + 1e-6f));  // zero past dk, so the row loops need no bound
    kn[tid] = kx * (1.0f / sqrtf(ssk + 1e-6f));
    eg[tid] = e;
  }
  const float beta = sigmoid_f(beta_logit);
  __syncthreads();

  // S ← diag(e^g)S; Sᵀk over the thread's rows.
  float4 p = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int j = warp + kWarps * i;
    const float e = eg[j];
    reg[i].x *= e, reg[i].y *= e, reg[i].z *= e, reg[i].w *= e;
    fma4(p, reg[i], kn[j]);
  }
  *reinterpret_cast<float4*>(&part[warp][col]) = p;
  __syncthreads();
  if (tid < s.dv) {
    float ks = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) ks += part[w][tid];
    u_sh[tid] = beta * (vv[tid] - ks);
  }
  __syncthreads();  // part[] is free again
  // S ← S + k uᵀ; o = Sᵀq over the thread's rows.
  const float4 u = col_live ? *reinterpret_cast<const float4*>(&u_sh[col]) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int j = warp + kWarps * i;
    const float kj = kn[j];
    fma4(reg[i], u, kj);
    fma4(o, reg[i], qn[j]);
    if (col_live && j < s.dk) *reinterpret_cast<float4*>(st + static_cast<int64_t>(j) * s.dv + col) = reg[i];
  }
  *reinterpret_cast<float4*>(&part[warp][col]) = o;
  __syncthreads();

  // Gated RMSNorm of the head's row (o as the activation dtype stores it).
  float ov = 0.0f;
  if (tid < s.dv) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) ov += part[w][tid];
    ov = stored(ov, s.y.bf16);
  }
  const float inv = rsqrtf(block_sum(ov * ov, scratch) / static_cast<float>(s.dv) + s.eps);
  if (tid < s.dv) s.y.set(yrow + tid, ov * inv * onw * sigmoid_f(ogx));

  // Shift the conv pool: new row r = window row r + 1, read before row r + 1 is written (each
  // channel is one thread's, so the reads see the rows the outputs above were computed from).
  for (int i = tid; i < 2 * s.dk + s.dv; i += kThreads) {
    const int64_t ch = channel(i);
    for (int64_t r = 0; r < hist; ++r)
      s.conv_states.set((static_cast<int64_t>(slot) * hist + r) * s.channels + ch, window(ch, r + 1));
  }
}

}  // namespace

void CudaBackend::kda_decode(const KdaDecodeArgs& a, const SeqLayout& decode) {
  const KdaDecodeDims d = check_kda_decode(a, decode);
  KL_CHECK(d.dk <= kMaxD && d.dv <= kMaxD && d.dv % 4 == 0 && decode.dev.cu_seqlens.defined() &&
               a.conv_states.dtype() == dtype_ && a.qkv.dtype() == dtype_ && a.y.dtype() == dtype_,
           "kda_decode: head dims dk " + std::to_string(d.dk) + " dv " + std::to_string(d.dv) +
               " (the kernel takes dk, dv ≤ 128 with dv a multiple of 4), qkv, conv states and y in the "
               "activation dtype, and an uploaded layout");
  if (d.rows == 0) return;
  const char* op = "kda_decode";
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
  kda_decode_kernel<<<dim3(static_cast<unsigned>(d.heads), static_cast<unsigned>(d.rows)), kThreads, 0, stream_>>>(s);
  KL_LAUNCHED("kda_decode qkv " + shapes(a.qkv) + " states " + shapes(a.states));
}

}  // namespace klinear::cuda
