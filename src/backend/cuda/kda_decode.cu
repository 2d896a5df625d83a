// CUDA kda_decode (SPEC 4.8): one launch per layer for the decode rows. An item is one (head,
// sequence) pair and gets the whole token: the conv step of the head's q/k/v channels (window =
// [conv state ; x], SiLU, state shifted in place), the gate and β, the L2 norms, one pass over the
// fp32 state tile (read, decay, delta rule, write) and the gated RMSNorm of the head's output row.
//
// The state is the traffic (dk·dv·4 bytes read and written per item; the rest is ~3 % of it at
// d = 128: 64 KB each way against ~4 KB of q/k/v, conv window, f, og and y), so the tile is streamed
// once in 16-byte accesses: lane l owns columns [4l, 4l+4), warp w owns rows w, w+8, …, so each
// warp instruction moves 512 contiguous bytes of one row, held in 16 float4 registers per thread
// through the update. One block owns a head's whole output row, so the RMSNorm over dv is a block
// reduction and o never leaves the SM (column tiles would need a second pass or a cluster exchange
// for the norm's sum, for no fewer bytes). The intermediates are rounded where the composition of
// ops stores them (conv output and o in the activation dtype), so both agree up to summation order.
//
// Two tilings (KdaDecodeTiling, kda_decode.h) run the same item code (the helpers below):
//
// kBlockPerHead: a block per item. Each thread issues its 16 state loads and every other load
// before the first store or barrier, and then the chain runs: conv → norms (barriers) → decay and
// Sᵀk → u → update, Sᵀq and the state store → gated norm. At most 128 registers (the launch
// bound of both kernels; ptxas, nvcc 13: 110 here, 116 for kPipelined, no spills), 2 blocks
// (16 warps) per SM. H200, H = 32, d = 128: batch 1 (32 items) 0.0156 ms eager, 0.009 as a graph replay; batch 64
// 0.130 ms, batch 256 0.480 ms, against a byte floor of 0.067 and 0.268 (2 × 64 KB per item at
// 4.2 TB/s): a block spends most of its life in the latency-bound chain, and with 2 blocks per SM
// the DRAM idles between one block's loads and the next block's.
//
// kPipelined: persistent blocks, grid = min(items, SMs × blocks per SM), block k taking items k,
// k + grid, … (item = sequence · H + head, so neighbouring blocks read neighbouring tiles). While a
// block computes item i, its item i + grid's state tile streams into shared memory by cp.async
// (16 bytes, bypassing L1). Each thread copies exactly the 16 float4 it will own (same row and
// column map as the registers, stored [slot][thread] so a warp's accesses are conflict-free), so
// the copy needs no barrier to be read: a thread's cp.async.wait_all makes its own copies visible
// to it. The registers are the second stage: at the top of an item each thread moves its slots to
// registers, the block passes a barrier (every read of the buffer done before any refill), and the
// next tile is issued into the same buffer; the updated state goes from the registers straight to
// global memory (posted stores, never waited on). So one 64 KB buffer per block: with the 128
// registers of the state pass two blocks fit per SM (2 × (64 KB + 6.6 KB static) = 141 KB of the
// 227 KB), which keeps two chains per SM interleaved, where one block with two 64 KB buffers would
// leave the SM a single chain (a third buffer or a third block does not fit: 3 × 71 KB of shared
// memory would, but 3 × 256 threads × 128 registers exceeds the 64 K register file).
// Cost per item at d = 128 on an H200: 64 KB read + 64 KB written; an SM's share of 4.2 TB/s is
// ~32 GB/s, so ~2 µs to read a tile and ~2 µs to write one, ~4 µs of DRAM time per item per SM.
// The chain per item (the small inputs' DRAM latency ~1 µs, 11 barriers, ~250 FMA per thread) is
// ~3 µs per block, so two blocks per SM ask for ~2 × 128 KB per ~3 µs ≈ 85 GB/s, more than the
// share: the SMs are bandwidth-bound, the tile of item i + grid lands during item i, and the
// time is the bytes plus one tile's start-up (~3 µs) and the tail of the last wave. Predicted
// (H = 32, d = 128): batch 64 (2048 items, 264 blocks, 7.8 items each) ≈ 0.067 + 0.005 ≈ 0.072 ms;
// batch 256 (8192 items) ≈ 0.268 + 0.005 ≈ 0.275 ms; batch 1 (32 items, one per block) as
// kBlockPerHead plus the cp.async round trip, ~0.016 ms, which is why the default below keeps
// kBlockPerHead there. The small per-item inputs (q/k/v channels and their conv pool rows, f, og,
// β: ~4 KB) are loaded at the top of their item, before the tile wait, all in flight together;
// their DRAM latency is in the chain, which the second block on the SM covers. They are not
// carried one item ahead: with reg[] live through the whole item there is no room in the 128
// registers (holding them, or even warming L2 for them with prefetch.global.L2 from the loop,
// made ptxas spill 76 to 136 bytes).
//
// Default: kPipelined when every resident block gets at least two items (items ≥ 2 × 2 × SMs,
// 528 on the H200, i.e. from batch 17 at H = 32): below that the persistent grid has nothing to
// prefetch for most blocks and kBlockPerHead starts every item at once.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/device.cuh"
#include "backend/cuda/kda_decode.h"

namespace klinear::cuda {

namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kMaxD = 128;                  // dk and dv: 32 lanes × 4 columns, 8 warps × 16 rows
constexpr int kRowsPerThread = kMaxD / kWarps;
constexpr int kBlocksPerSm = 2;             // both kernels' launch bound (128 registers)
// The pipelined kernel's state buffer: a thread's 16 float4 slots, [slot][thread].
constexpr size_t kTileBytes = size_t{kRowsPerThread} * kThreads * sizeof(float4);

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

// The block's shared arrays of one item (free again after the item's last barrier).
struct DecodeShared {
  float qn[kMaxD], kn[kMaxD], eg[kMaxD], vv[kMaxD], u[kMaxD], scratch[32];
  alignas(16) float part[kWarps][kMaxD];
};

// One item: head h of sequence b (32-bit fields: the item is live across the whole state pass).
struct Item {
  int h, row, slot;  // the sequence's row of the step and its pool slot
  bool pad;
};

// The thread's scalars of an item (zero past dk / dv).
struct ItemScalars {
  float fx, dtb, ogx, onw, a_log, beta_logit;
};

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
// x as the activation dtype stores it.
__device__ __forceinline__ float stored(float x, bool bf16) { return bf16 ? __bfloat162float(__float2bfloat16_rn(x)) : x; }

__device__ __forceinline__ void fma4(float4& acc, const float4& x, float s) {
  acc.x += x.x * s, acc.y += x.y * s, acc.z += x.z * s, acc.w += x.w * s;
}

__device__ __forceinline__ Item item_at(const DecodeStep& s, int h, int b) {
  const int slot = s.slots[b];
  return Item{h, s.cu[b], slot, slot == s.pad_slot};
}
// The first element of the item's head in y.
__device__ __forceinline__ int64_t y_row(const DecodeStep& s, const Item& it) {
  return (int64_t{it.row} * s.heads + it.h) * s.dv;
}

// The thread's slots of the state tile: slot i is row warp + kWarps·i, columns [4·lane, +4), so
// element offset + i·stride of the head's tile, inside dk × dv for i < live. (Three numbers rather
// than sixteen predicates and offsets, which a persistent loop would otherwise keep in registers.)
struct SlotMap {
  int offset, stride, live;
};
__device__ __forceinline__ int slot_row(int i) { return threadIdx.x / 32 + kWarps * i; }
__device__ __forceinline__ SlotMap slot_map(const DecodeStep& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // Rows warp + kWarps·i < dk: i < ⌈(dk − warp)/kWarps⌉ (dk − warp + kWarps − 1 ≥ 0 as dk ≥ 1).
  return SlotMap{warp * s.dv + 4 * lane, kWarps * s.dv, 4 * lane < s.dv ? (s.dk - warp + kWarps - 1) / kWarps : 0};
}

// The head's state tile in the pool (not for padding).
__device__ __forceinline__ float* state_tile(const DecodeStep& s, const Item& it) {
  return s.states + (static_cast<int64_t>(it.slot) * s.heads + it.h) * s.dk * s.dv;
}

__device__ __forceinline__ ItemScalars load_scalars(const DecodeStep& s, const Item& it) {
  ItemScalars x{0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  const int tid = threadIdx.x;
  if (tid < s.dk) {
    const int64_t c = int64_t{it.h} * s.dk + tid;
    x.fx = s.f[int64_t{it.row} * s.heads * s.dk + c], x.dtb = s.dt_bias[c];
  }
  if (tid < s.dv) x.ogx = s.og[y_row(s, it) + tid], x.onw = s.o_norm[tid];
  x.a_log = s.a_log[it.h], x.beta_logit = s.beta[int64_t{it.row} * s.heads + it.h];
  return x;
}

// Channel of the head's conv index i: q [h·dk, +dk), k H·dk + the same, v 2·H·dk + [h·dv, +dv).
__device__ __forceinline__ int64_t conv_channel(const DecodeStep& s, int h, int i) {
  return i < s.dk       ? int64_t{h} * s.dk + i
         : i < 2 * s.dk ? int64_t{s.heads + h} * s.dk + (i - s.dk)
                        : int64_t{2} * s.heads * s.dk + int64_t{h} * s.dv + (i - 2 * s.dk);
}
// Row r of channel ch's window [conv state ; x].
__device__ __forceinline__ float conv_window(const DecodeStep& s, const Item& it, int64_t ch, int64_t r) {
  const int64_t hist = s.kc - 1;
  return r < hist ? s.conv_states[(static_cast<int64_t>(it.slot) * hist + r) * s.channels + ch]
                  : s.qkv[int64_t{it.row} * s.channels + ch];
}

// The conv outputs of the head's channels into qn, kn, vv (loads only: the pool's shift is
// shift_conv_pool, after the item's last barrier).
__device__ __forceinline__ void conv_outputs(const DecodeStep& s, const Item& it, DecodeShared& sh) {
  for (int i = threadIdx.x; i < 2 * s.dk + s.dv; i += kThreads) {
    const int64_t ch = conv_channel(s, it.h, i);
    float acc = 0.0f;
    for (int64_t j = 0; j < s.kc; ++j) acc += s.conv_w[ch * s.kc + j] * conv_window(s, it, ch, j);
    const float x = stored(acc * sigmoid_f(acc), s.qkv.bf16);
    if (i < s.dk) sh.qn[i] = x;
    else if (i < 2 * s.dk) sh.kn[i - s.dk] = x;
    else sh.vv[i - 2 * s.dk] = x;
  }
}

// Shift the conv pool: new row r = window row r + 1, read before row r + 1 is written (each
// channel is one thread's, so the reads see the rows the outputs were computed from).
__device__ __forceinline__ void shift_conv_pool(const DecodeStep& s, const Item& it) {
  const int64_t hist = s.kc - 1;
  for (int i = threadIdx.x; i < 2 * s.dk + s.dv; i += kThreads) {
    const int64_t ch = conv_channel(s, it.h, i);
    for (int64_t r = 0; r < hist; ++r)
      s.conv_states.set((static_cast<int64_t>(it.slot) * hist + r) * s.channels + ch, conv_window(s, it, ch, r + 1));
  }
}

// The decay factor e^g of a key row from its gate pre-activation x = f + dt_bias.
__device__ __forceinline__ float decay(const DecodeStep& s, float x, float a_log) {
  const float a = expf(a_log);
  return expf(s.gate == KdaGate::kSoftplus ? -a * softplus(x) : s.lower_bound * sigmoid_f(a * x));
}

// A padding item: its row of y is zero, the pools stay as they are.
__device__ __forceinline__ void zero_row(const DecodeStep& s, const Item& it) {
  for (int c = threadIdx.x; c < s.dv; c += kThreads) s.y.set(y_row(s, it) + c, 0.0f);
}

// The rest of an item once the conv outputs are in qn, kn, vv (not yet visible to the block) and
// the thread's state slots in `reg` (zero where not live): norms, gate, the state pass with the
// store of the new state, the gated norm into y and the conv pool's shift. Every thread of the
// block calls it; it ends with the block's shared arrays free.
__device__ __forceinline__ void finish_item(const DecodeStep& s, const Item& it, const ItemScalars& x,
                                            float4 (&reg)[kRowsPerThread], DecodeShared& sh) {
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, col = 4 * lane;
  const bool col_live = col < s.dv;
  __syncthreads();
  const float qx = tid < s.dk ? sh.qn[tid] : 0.0f, kx = tid < s.dk ? sh.kn[tid] : 0.0f;
  const float ssq = block_sum(qx * qx, sh.scratch), ssk = block_sum(kx * kx, sh.scratch);
  if (tid < kMaxD) {
    sh.qn[tid] = qx * (s.scale / sqrtf(ssq + 1e-6f));  // zero past dk, so the row loops need no bound
    sh.kn[tid] = kx * (1.0f / sqrtf(ssk + 1e-6f));
    sh.eg[tid] = tid < s.dk ? decay(s, x.fx + x.dtb, x.a_log) : 0.0f;
  }
  const float beta = sigmoid_f(x.beta_logit);
  __syncthreads();

  // S ← diag(e^g)S; Sᵀk over the thread's rows.
  float4 p = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int j = slot_row(i);
    const float e = sh.eg[j];
    reg[i].x *= e, reg[i].y *= e, reg[i].z *= e, reg[i].w *= e;
    fma4(p, reg[i], sh.kn[j]);
  }
  *reinterpret_cast<float4*>(&sh.part[warp][col]) = p;
  __syncthreads();
  if (tid < s.dv) {
    float ks = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) ks += sh.part[w][tid];
    sh.u[tid] = beta * (sh.vv[tid] - ks);
  }
  __syncthreads();  // part[] is free again
  // S ← S + k uᵀ; o = Sᵀq over the thread's rows.
  const float4 u = col_live ? *reinterpret_cast<const float4*>(&sh.u[col]) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float* const st = state_tile(s, it);
  const SlotMap m = slot_map(s);
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int j = slot_row(i);
    fma4(reg[i], u, sh.kn[j]);
    fma4(o, reg[i], sh.qn[j]);
    if (i < m.live) *reinterpret_cast<float4*>(st + m.offset + i * m.stride) = reg[i];
  }
  *reinterpret_cast<float4*>(&sh.part[warp][col]) = o;
  __syncthreads();

  // Gated RMSNorm of the head's row (o as the activation dtype stores it).
  float ov = 0.0f;
  if (tid < s.dv) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) ov += sh.part[w][tid];
    ov = stored(ov, s.y.bf16);
  }
  const float inv = rsqrtf(block_sum(ov * ov, sh.scratch) / static_cast<float>(s.dv) + s.eps);
  if (tid < s.dv) s.y.set(y_row(s, it) + tid, ov * inv * x.onw * sigmoid_f(x.ogx));
  shift_conv_pool(s, it);
}

// kBlockPerHead: block (h, b).
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) kda_decode_kernel(DecodeStep s) {
  __shared__ DecodeShared sh;
  const Item it = item_at(s, blockIdx.x, blockIdx.y);
  if (it.pad) {
    zero_row(s, it);
    return;
  }
  // The state loads first: nothing below depends on them until the decay. Then everything else a
  // thread reads, before the first store or barrier, so that all of the block's loads are in
  // flight together (a load placed after a store to the conv pool could not be hoisted above it).
  const float* st = state_tile(s, it);
  const SlotMap m = slot_map(s);
  float4 reg[kRowsPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i)
    reg[i] = i < m.live ? *reinterpret_cast<const float4*>(st + m.offset + i * m.stride)
                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const ItemScalars x = load_scalars(s, it);
  conv_outputs(s, it, sh);
  finish_item(s, it, x, reg, sh);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// kPipelined: persistent blocks over `items` = rows × heads items (item = b·heads + h); dynamic
// shared memory: the state buffer (kTileBytes).
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) kda_decode_pipelined_kernel(DecodeStep s, int items) {
  extern __shared__ float4 tile[];  // [kRowsPerThread][kThreads]
  __shared__ DecodeShared sh;
  const int tid = threadIdx.x;
  auto at = [&](int item) { return item_at(s, item % s.heads, item / s.heads); };
  // Issues the thread's copies of `item`'s tile (none past the end or for padding) as one group.
  auto prefetch = [&](int item) {
    if (item < items) {
      const Item next = at(item);
      if (!next.pad) {
        const float* st = state_tile(s, next);
        const SlotMap m = slot_map(s);
#pragma unroll 1  // one address at a time: reg[] holds 64 registers meanwhile (unrolled, this spills)
        for (int i = 0; i < kRowsPerThread; ++i)
          if (i < m.live) cp_async16(&tile[i * kThreads + tid], st + m.offset + i * m.stride);
      }
    }
    cp_async_commit();
  };

  prefetch(blockIdx.x);
  for (int item = blockIdx.x; item < items; item += gridDim.x) {  // uniform over the block
    const Item it = at(item);
    const int live = it.pad ? 0 : slot_map(s).live;
    const ItemScalars x = it.pad ? ItemScalars{} : load_scalars(s, it);
    cp_async_wait_all();  // this thread's copies of the tile have landed and are visible to it
    float4 reg[kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
      reg[i] = i < live ? tile[i * kThreads + tid] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // Every read of the buffer is done (the barrier orders this thread's shared loads before its
    // own refill, and the previous item's last barrier is behind every thread), so refill it.
    __syncthreads();
    prefetch(item + gridDim.x);
    if (it.pad) {
      zero_row(s, it);
      continue;
    }
    conv_outputs(s, it, sh);
    finish_item(s, it, x, reg, sh);
  }
}

}  // namespace

// The rule and its numbers: the header above.
KdaDecodeTiling default_kda_decode_tiling(int64_t items, int num_sms) {
  return items >= int64_t{2} * kBlocksPerSm * num_sms ? KdaDecodeTiling::kPipelined : KdaDecodeTiling::kBlockPerHead;
}

void kda_decode_tiled(CudaBackend& be, const KdaDecodeArgs& a, const SeqLayout& decode, KdaDecodeTiling tiling) {
  const KdaDecodeDims d = check_kda_decode(a, decode);
  const DType act = be.activation_dtype();
  KL_CHECK(d.dk <= kMaxD && d.dv <= kMaxD && d.dv % 4 == 0 && decode.dev.cu_seqlens.defined() &&
               a.conv_states.dtype() == act && a.qkv.dtype() == act && a.y.dtype() == act,
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
  const std::string what = "kda_decode qkv " + shapes(a.qkv) + " states " + shapes(a.states);
  if (tiling == KdaDecodeTiling::kBlockPerHead) {
    const dim3 grid(static_cast<unsigned>(d.heads), static_cast<unsigned>(d.rows));
    kda_decode_kernel<<<grid, kThreads, 0, be.stream()>>>(s);
    KL_LAUNCHED(what);
    return;
  }
  const int64_t items = d.rows * d.heads;
  KL_CHECK(items <= INT32_MAX, what + ": " + std::to_string(items) + " items (at most 2^31 − 1)");
  KL_CUDA(cudaFuncSetAttribute(kda_decode_pipelined_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kTileBytes)),
          what);
  // All of the unified L1 as shared memory, so that kBlocksPerSm blocks fit (the copies bypass L1).
  KL_CUDA(cudaFuncSetAttribute(kda_decode_pipelined_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared),
          what);
  int per_sm = 0;
  KL_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kda_decode_pipelined_kernel, kThreads, kTileBytes),
          what);
  const int64_t grid = std::min<int64_t>(items, int64_t{std::max(per_sm, 1)} * be.num_sms());
  kda_decode_pipelined_kernel<<<static_cast<unsigned>(grid), kThreads, kTileBytes, be.stream()>>>(
      s, static_cast<int>(items));
  KL_LAUNCHED(what + " (pipelined)");
}

void CudaBackend::kda_decode(const KdaDecodeArgs& a, const SeqLayout& decode) {
  const int64_t items = decode.num_seqs() * a.a_log.numel();
  kda_decode_tiled(*this, a, decode, default_kda_decode_tiling(items, num_sms_));
}

}  // namespace klinear::cuda
