// CUDA norms: RMSNorm y = x·rsqrt(mean(x²) + eps)·w (MODEL.md 3.1), the gated RMSNorm of the KDA
// output (the same · σ(gate), MODEL.md 4.7, FLA's FusedRMSNormGated with a sigmoid gate) and the
// residual add fused with the next sublayer's RMSNorm (h ← h + x, y = RMSNorm(h)·w; MODEL.md 6).
// Shapes and dtypes: rows x, gate, h, y [N, C] F32 or BF16 in any mix (In / Out), w [C].
// Ownership: reads x, gate and w, writes y (rms_norm's y may alias x); add_rms_norm also writes h
// in place (AddNormArgs); no workspace.
// One block per row; the mean square in fp32 (block_sum), each output rounded once.
// Cost and floor: memory-bound; a row is read twice by rms_norm (the mean square, then the scaling;
// the second read mostly from L1/L2) and written once; add_rms_norm reads h and x once and writes
// h and y once. The floor is the rows' bytes at the copy rate (~4.2 TB/s); small decode batches
// are bound by the launch and one block reduction instead.
#include "backend/cuda/common/device.cuh"

namespace klinear::cuda {

namespace {

constexpr int kThreads = 256;

// y[r] = x[r]·rsqrt(mean(x[r]²) + eps)·w (· σ(gate[r]) when gated).
__global__ void rms_norm_kernel(In x, In w, In gate, bool gated, int64_t c, float eps, Out y) {
  __shared__ float scratch[32];
  pdl_enter();
  const int64_t base = blockIdx.x * c;
  const float s = block_inv_rms(x, base, c, eps, scratch);
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    float v = x[base + j] * s * w[j];
    if (gated) v *= sigmoid_f(gate[base + j]);
    y.set(base + j, v);
  }
}

// The pre-norm residual step (AddNormArgs): h[r] ← h[r] + x[r], stored in h's dtype as add_kernel
// stores it (the fp32 sum rounded once); then y[r] = h[r]·rsqrt(mean(h[r]²) + eps)·w from the stored
// h, with rms_norm_kernel's arithmetic (fp32 squares, block_sum, (h·s)·w rounded once). Only the order
// of the sum of squares differs from add then rms_norm. A thread owns up to kChunks chunks of
// kRowChunk columns (chunk k at column (threadIdx.x + k·blockDim.x)·kRowChunk, 16-byte accesses when
// `vec`) and keeps the stored sums in registers across the reduction: h and x are read once, h and y
// written once, where add then rms_norm read the row three times and write it twice. kChunks = 1
// (rows up to 8,192 wide, every model here) leaves the registers for more blocks per SM.
// Cost (Kimi-Linear-48B, D = 2,304, BF16): decode batch 64 moves 1.18 MB (0.3 µs at 4.2 TB/s), so
// the launch and one block reduction set its time; a 2,048-token prefill step moves 37.8 MB (h and x
// in, h and y out; w stays in cache): 9.0 µs at 4.2 TB/s. Measured:
// docs/perf-log.md, "Notes moved from the CUDA sources".
constexpr int kAddNormMaxThreads = 1024, kAddNormMaxChunks = 4;

template <int kChunks>
__global__ void __launch_bounds__(kAddNormMaxThreads)
    add_rms_norm_kernel(Out h, In x, In w, int64_t c, bool vec, float eps, Out y) {
  __shared__ float scratch[32];
  pdl_enter();
  const int64_t base = blockIdx.x * c;
  float v[kChunks][kRowChunk];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int64_t j = (threadIdx.x + int64_t{k} * blockDim.x) * kRowChunk;
    if (j < c) {
      const int n = chunk_size(j, c);
      float a[kRowChunk] = {}, b[kRowChunk] = {};
      load_chunk(In{h.p, h.bf16}, base + j, n, vec, a);
      load_chunk(x, base + j, n, vec, b);
#pragma unroll
      for (int e = 0; e < kRowChunk; ++e) v[k][e] = a[e] + b[e];
      store_chunk(h, base + j, n, vec, v[k]);
#pragma unroll
      for (int e = 0; e < kRowChunk; ++e) {
        if (h.bf16) v[k][e] = __bfloat162float(__float2bfloat16_rn(v[k][e]));  // what the norm reads back
        ss += v[k][e] * v[k][e];  // past the row's end a and b are 0, so v is too
      }
    }
  }
  const float s = rsqrtf(block_sum(ss, scratch) / static_cast<float>(c) + eps);
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int64_t j = (threadIdx.x + int64_t{k} * blockDim.x) * kRowChunk;
    if (j < c) {
      const int n = chunk_size(j, c);
      float wv[kRowChunk] = {}, o[kRowChunk];
      load_chunk(w, j, n, vec, wv);
#pragma unroll
      for (int e = 0; e < kRowChunk; ++e) o[e] = v[k][e] * s * wv[e];
      store_chunk(y, base + j, n, vec, o);
    }
  }
}

}  // namespace

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
  const int64_t c = w.numel(), rows = c == 0 ? 0 : x.numel() / c;
  KL_CHECK(x.dim(-1) == c && y.numel() == x.numel(), "rms_norm x " + shapes(x) + " w " + shapes(w) + " y " + shapes(y));
  if (rows == 0) return;
  launch_dependent(stream_, rms_norm_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, "rms_norm " + shapes(x),
                   in(x, "rms_norm"), in(w, "rms_norm"), In{nullptr, false}, false, c, eps, out(y, "rms_norm"));
}

void CudaBackend::gated_rms_norm(const Tensor& o, const Tensor& w, const Tensor& gate, float eps, const Tensor& y) {
  const int64_t d = w.numel(), rows = d == 0 ? 0 : o.numel() / d;
  KL_CHECK(d > 0 && o.numel() % d == 0 && gate.numel() == o.numel() && y.numel() == o.numel(),
           "gated_rms_norm o " + shapes(o) + " w " + shapes(w) + " gate " + shapes(gate));
  if (rows == 0) return;
  launch_dependent(stream_, rms_norm_kernel, dim3(static_cast<unsigned>(rows)), dim3(d <= 128 ? 128 : kThreads), 0,
                   "gated_rms_norm " + shapes(o), in(o, "gated_rms_norm"), in(w, "gated_rms_norm"),
                   in(gate, "gated_rms_norm"), true, d, eps, out(y, "gated_rms_norm"));
}

void CudaBackend::add_rms_norm(const AddNormArgs& a) {
  const int64_t c = a.w.numel(), rows = c == 0 ? 0 : a.h.numel() / c;
  const int64_t chunks = (c + kRowChunk - 1) / kRowChunk;
  auto what = [&] {
    return "add_rms_norm h " + shapes(a.h) + " x " + shapes(a.x) + " w " + shapes(a.w) + " y " + shapes(a.y);
  };
  KL_CHECK(c > 0 && a.h.dim(-1) == c && a.x.numel() == a.h.numel() && a.y.numel() == a.h.numel(), what());
  KL_CHECK(a.y.data() != a.h.data() && a.y.data() != a.x.data(), what() + ": y aliases an input");
  KL_CHECK(chunks <= int64_t{kAddNormMaxChunks} * kAddNormMaxThreads,
           what() + ": rows wider than " + std::to_string(kAddNormMaxChunks * kAddNormMaxThreads * kRowChunk));
  if (rows == 0) return;
  // As few chunks a thread as the block size allows (more loads in flight), the block a whole number of warps.
  const int64_t per_thread = (chunks + kAddNormMaxThreads - 1) / kAddNormMaxThreads;
  const int64_t threads = 32 * (((chunks + per_thread - 1) / per_thread + 31) / 32);
  const bool vec = c % kRowChunk == 0 && aligned16(a.h.data()) && aligned16(a.x.data()) && aligned16(a.w.data()) &&
                   aligned16(a.y.data());
  auto* kernel = per_thread == 1 ? add_rms_norm_kernel<1> : add_rms_norm_kernel<kAddNormMaxChunks>;
  launch_dependent(stream_, kernel, dim3(static_cast<unsigned>(rows)), dim3(static_cast<unsigned>(threads)), 0,
                   "add_rms_norm " + shapes(a.h), out(a.h, "add_rms_norm"), in(a.x, "add_rms_norm"),
                   in(a.w, "add_rms_norm"), c, vec, a.eps, out(a.y, "add_rms_norm"));
}

}  // namespace klinear::cuda
