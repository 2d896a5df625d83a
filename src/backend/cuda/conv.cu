// CUDA short convolution (SPEC 4.2): causal depthwise conv over time + SiLU for every sequence of a
// step, continuing from its conv-state slot (the last Kc−1 pre-conv rows, oldest first) and
// writing the slot back. Two launches: the outputs (reading the old state), then the new state.
#include "backend/cuda/device.cuh"

namespace klinear::cuda {

namespace {

struct ConvStep {
  const int32_t* cu;     // [B+1]
  const int32_t* slots;  // [B]
  int num_seqs;
  int64_t c, kc;
};

// Row `r` (0 ≤ r < Kc−1+T) of sequence b's window [state ; x], channel ch.
__device__ __forceinline__ float window(const ConvStep& s, In x, In st, int b, int64_t r, int64_t ch) {
  const int64_t hist = s.kc - 1;
  return r < hist ? st[(s.slots[b] * hist + r) * s.c + ch] : x[(s.cu[b] + r - hist) * s.c + ch];
}

__global__ void conv_out_kernel(ConvStep s, In x, In w, In st, int64_t rows, Out o) {
  const int64_t n = rows * s.c;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / s.c, ch = i % s.c;
    const int b = seq_of_row(s.cu, s.num_seqs, row);
    const int64_t t = row - s.cu[b];
    float acc = 0.0f;
    for (int64_t j = 0; j < s.kc; ++j) acc += w[ch * s.kc + j] * window(s, x, st, b, t + j, ch);
    o.set(i, acc * sigmoid_f(acc));
  }
}

// New state row r = window row T + r. Each thread owns one (sequence, channel) and walks r upwards:
// it reads row T + r ≥ r of the old state before any later write, so the update is in place.
__global__ void conv_state_kernel(ConvStep s, In x, Out st) {
  const int64_t n = int64_t{s.num_seqs} * s.c, hist = s.kc - 1;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int b = static_cast<int>(i / s.c);
    const int64_t ch = i % s.c, t_len = s.cu[b + 1] - s.cu[b];
    if (t_len == 0) continue;
    for (int64_t r = 0; r < hist; ++r)
      st.set((s.slots[b] * hist + r) * s.c + ch, window(s, x, In{st.p, st.bf16}, b, t_len + r, ch));
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
  const ConvStep s{layout.dev.cu_seqlens.data_as<const int32_t>(), layout.dev.slots.data_as<const int32_t>(),
                   static_cast<int>(layout.num_seqs()), c, kc};
  if (rows == 0) return;
  conv_out_kernel<<<blocks_for(rows * c, 256), 256, 0, stream_>>>(s, in(a.x, "short_conv"), in(a.w, "short_conv"),
                                                                   in(a.states, "short_conv"), rows,
                                                                   out(a.out, "short_conv"));
  KL_LAUNCHED("short_conv " + shapes(a.x));
  if (kc > 1) {
    conv_state_kernel<<<blocks_for(layout.num_seqs() * c, 256), 256, 0, stream_>>>(s, in(a.x, "short_conv"),
                                                                                  out(a.states, "short_conv"));
    KL_LAUNCHED("short_conv state " + shapes(a.states));
  }
}

}  // namespace klinear::cuda
