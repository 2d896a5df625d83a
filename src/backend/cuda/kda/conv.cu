// CUDA short convolution (MODEL.md 4.2): causal depthwise conv over time + SiLU for every sequence of a
// step, continuing from its conv-state slot (the last Kc−1 pre-conv rows, oldest first) and
// writing the slot back. Two launches: the outputs (reading the old state), then the new state.
//
// Outputs: a thread owns a chunk of kRowChunk channels (device.cuh: 16-byte accesses where the
// width and alignment allow) and a run of kRunRows rows. It finds the sequence of the run's first
// row once (binary search over cu_seqlens) and walks forward from there (empty sequences included),
// loads its channels' weights once, and for Kc ≤ kRegTaps slides the window along the run in
// registers: each input row is read once, plus the Kc−1 history rows where the run or a sequence
// starts, and the loads of the next kAhead rows are in flight while a row is computed and stored
// (at 3 blocks of 128 threads per SM, which its 168 registers allow, a memory-bound kernel needs
// those bytes in flight; one row ahead, at 146 registers, kept a third of them). Larger Kc (the
// config allows 64) read every tap from memory, as before. Per output: acc = Σ_j w[j]·in[j] in tap
// order, one fma each, then acc·σ(acc) rounded once: the bits of the element-per-thread kernel it
// replaced.
// Cost (Kimi-Linear-48B prefill of 2,048 tokens, q/k/v packed: C = 12,288, Kc = 4, BF16): reads
// x 50.3 MB, writes 50.3 MB (weights and states < 0.2 MB): 101 MB, 24 µs at 4.2 TB/s. Measured at
// about 5.5x that: docs/perf-log.md, "Notes moved from the CUDA sources".
#include "backend/cuda/common/device.cuh"

namespace klinear::cuda {

namespace {

constexpr int kRunRows = 16;  // rows per thread
constexpr int kRegTaps = 4;   // Kc up to this: weights and window in registers
constexpr int kAhead = 3;     // input rows loaded ahead of the one computed (4: 179 registers, or spills at 168)
constexpr int kOutThreads = 128;  // 3 blocks per SM at 168 registers (2 blocks of 256 spill)

struct ConvStep {
  const int32_t* cu;     // [B+1]
  const int32_t* slots;  // [B]
  int num_seqs;
  int64_t c, kc;
  bool vec;  // chunks as 16-byte accesses (x, states and out 16-byte aligned, C % kRowChunk == 0)
};

// Row `r` (0 ≤ r < Kc−1+T) of sequence b's window [state ; x], channels [ch, ch + n).
__device__ __forceinline__ void window(const ConvStep& s, In x, In st, int b, int64_t r, int64_t ch, int n,
                                       float (&v)[kRowChunk]) {
  const int64_t hist = s.kc - 1;
  if (r < hist)
    load_chunk(st, (s.slots[b] * hist + r) * s.c + ch, n, s.vec, v);
  else
    load_chunk(x, (s.cu[b] + r - hist) * s.c + ch, n, s.vec, v);
}

__global__ void __launch_bounds__(kOutThreads, 3) conv_out_kernel(ConvStep s, In x, In w, In st, int64_t rows, Out o) {
  const int64_t ch = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * kRowChunk;
  if (ch >= s.c) return;
  const int n = chunk_size(ch, s.c);
  // Register path: tap j of channel ch + e sits at [e][j + lead], right-aligned in kRegTaps slots;
  // win[e][p] holds window row t + p − lead of output row t (the current input at p = kRegTaps − 1).
  const bool regs = s.kc <= kRegTaps;
  const int lead = regs ? kRegTaps - static_cast<int>(s.kc) : 0;
  float wr[kRowChunk][kRegTaps] = {}, win[kRowChunk][kRegTaps] = {};
  if (regs) {
#pragma unroll
    for (int e = 0; e < kRowChunk; ++e)
#pragma unroll
      for (int p = 0; p < kRegTaps; ++p)
        if (e < n && p >= lead) wr[e][p] = w[(ch + e) * s.kc + p - lead];
  }
  const int64_t runs = (rows + kRunRows - 1) / kRunRows;
  for (int64_t run = blockIdx.y; run < runs; run += gridDim.y) {
    const int64_t r0 = run * kRunRows, r1 = r0 + kRunRows < rows ? r0 + kRunRows : rows;
    int b = seq_of_row(s.cu, s.num_seqs, r0);
    int64_t start = s.cu[b], next = s.cu[b + 1];
    float ahead[kAhead][kRowChunk] = {};  // inputs of rows row .. row + kAhead − 1, loaded ahead
    if (regs) {
#pragma unroll
      for (int q = 0; q < kAhead; ++q)
        if (r0 + q < r1) load_chunk(x, (r0 + q) * s.c + ch, n, s.vec, ahead[q]);
    }
    for (int64_t row0 = r0; row0 < r1; row0 += kAhead) {
#pragma unroll
      for (int q = 0; q < kAhead; ++q) {
        const int64_t row = row0 + q;
        if (row >= r1) break;
        float cur[kRowChunk];
#pragma unroll
        for (int e = 0; e < kRowChunk; ++e) cur[e] = ahead[q][e];
        if (regs && row + kAhead < r1) load_chunk(x, (row + kAhead) * s.c + ch, n, s.vec, ahead[q]);
        while (row >= next) start = next, next = s.cu[++b + 1];  // past empty sequences too
        const int64_t t = row - start;
        float acc[kRowChunk] = {};
        if (regs) {
          if (row == r0 || t == 0) {
#pragma unroll
            for (int p = 0; p + 1 < kRegTaps; ++p) {
              if (p < lead) continue;
              float h[kRowChunk];
              window(s, x, st, b, t + p - lead, ch, n, h);
#pragma unroll
              for (int e = 0; e < kRowChunk; ++e) win[e][p] = h[e];
            }
          }
#pragma unroll
          for (int e = 0; e < kRowChunk; ++e) {
            win[e][kRegTaps - 1] = cur[e];
#pragma unroll
            for (int p = 0; p < kRegTaps; ++p)
              if (p >= lead) acc[e] = fmaf(wr[e][p], win[e][p], acc[e]);
#pragma unroll
            for (int p = 0; p + 1 < kRegTaps; ++p) win[e][p] = win[e][p + 1];
          }
        } else {
          for (int64_t j = 0; j < s.kc; ++j) {
            float v[kRowChunk];
            window(s, x, st, b, t + j, ch, n, v);
#pragma unroll
            for (int e = 0; e < kRowChunk; ++e)
              if (e < n) acc[e] = fmaf(w[(ch + e) * s.kc + j], v[e], acc[e]);
          }
        }
#pragma unroll
        for (int e = 0; e < kRowChunk; ++e) acc[e] *= sigmoid_f(acc[e]);
        store_chunk(o, row * s.c + ch, n, s.vec, acc);
      }
    }
  }
}

// New state row r = window row T + r. A thread owns one chunk of one sequence's channels and walks
// r upwards: it reads row T + r ≥ r of the old state before any later write, so the update is in place.
__global__ void conv_state_kernel(ConvStep s, In x, Out st) {
  const int64_t ch = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * kRowChunk, hist = s.kc - 1;
  if (ch >= s.c) return;
  const int n = chunk_size(ch, s.c);
  for (int b = blockIdx.y; b < s.num_seqs; b += gridDim.y) {
    const int64_t t_len = s.cu[b + 1] - s.cu[b];
    if (t_len == 0) continue;
    for (int64_t r = 0; r < hist; ++r) {
      float v[kRowChunk];
      window(s, x, In{st.p, st.bf16}, b, t_len + r, ch, n, v);
      store_chunk(st, (s.slots[b] * hist + r) * s.c + ch, n, s.vec, v);
    }
  }
}

}  // namespace

void CudaBackend::short_conv(const ConvArgs& a, const SeqLayout& layout) {
  for_snapshot_pieces(layout, a.states, [&](int64_t r0, int64_t r1, const SeqLayout& part) {
    short_conv_rows(ConvArgs{a.x.rows(r0, r1), a.w, a.states, a.out.rows(r0, r1)}, part);
  });
}

void CudaBackend::short_conv_rows(const ConvArgs& a, const SeqLayout& layout) {
  const int64_t rows = a.x.dim(0), c = a.x.dim(1), kc = a.w.dim(1);
  KL_CHECK(a.w.dim(0) == c && kc >= 1 && a.states.rank() == 3 && a.states.dim(1) == kc - 1 && a.states.dim(2) == c &&
               a.out.numel() == a.x.numel() && layout.num_rows() == rows && layout.dev.cu_seqlens.defined(),
           "short_conv x " + shapes(a.x) + " w " + shapes(a.w) + " states " + shapes(a.states) + " rows " +
               std::to_string(layout.num_rows()));
  const bool vec = c % kRowChunk == 0 && aligned16(a.x.data()) && aligned16(a.states.data()) && aligned16(a.out.data());
  const ConvStep s{layout.dev.cu_seqlens.data_as<const int32_t>(), layout.dev.slots.data_as<const int32_t>(),
                   static_cast<int>(layout.num_seqs()), c, kc, vec};
  if (rows == 0) return;
  const RowGrid g = row_grid((c + kRowChunk - 1) / kRowChunk, (rows + kRunRows - 1) / kRunRows, kOutThreads);
  conv_out_kernel<<<g.grid, g.block, 0, stream_>>>(s, in(a.x, "short_conv"), in(a.w, "short_conv"),
                                                   in(a.states, "short_conv"), rows, out(a.out, "short_conv"));
  KL_LAUNCHED("short_conv " + shapes(a.x));
  if (kc > 1) {
    const RowGrid gs = row_grid((c + kRowChunk - 1) / kRowChunk, layout.num_seqs());
    conv_state_kernel<<<gs.grid, gs.block, 0, stream_>>>(s, in(a.x, "short_conv"), out(a.states, "short_conv"));
    KL_LAUNCHED("short_conv state " + shapes(a.states));
  }
}

}  // namespace klinear::cuda
