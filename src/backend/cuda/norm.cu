// CUDA norms: RMSNorm (SPEC 3.1) and the gated RMSNorm of the KDA output (SPEC 4.7, FLA's
// FusedRMSNormGated with a sigmoid gate). One block per row; the mean square in fp32, the output
// rounded once.
#include "backend/cuda/device.cuh"

namespace klinear::cuda {

namespace {

constexpr int kThreads = 256;

// y[r] = x[r]·rsqrt(mean(x[r]²) + eps)·w (· σ(gate[r]) when gated).
__global__ void rms_norm_kernel(In x, In w, In gate, bool gated, int64_t c, float eps, Out y) {
  __shared__ float scratch[32];
  const int64_t base = blockIdx.x * c;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float v = x[base + j];
    ss += v * v;
  }
  const float s = rsqrtf(block_sum(ss, scratch) / static_cast<float>(c) + eps);
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    float v = x[base + j] * s * w[j];
    if (gated) v *= sigmoid_f(gate[base + j]);
    y.set(base + j, v);
  }
}

}  // namespace

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
  const int64_t c = w.numel(), rows = c == 0 ? 0 : x.numel() / c;
  KL_CHECK(x.dim(-1) == c && y.numel() == x.numel(), "rms_norm x " + shapes(x) + " w " + shapes(w) + " y " + shapes(y));
  if (rows == 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream_>>>(in(x, "rms_norm"), in(w, "rms_norm"),
                                                                         In{nullptr, false}, false, c, eps,
                                                                         out(y, "rms_norm"));
  KL_LAUNCHED("rms_norm " + shapes(x));
}

void CudaBackend::gated_rms_norm(const Tensor& o, const Tensor& w, const Tensor& gate, float eps, const Tensor& y) {
  const int64_t d = w.numel(), rows = d == 0 ? 0 : o.numel() / d;
  KL_CHECK(d > 0 && o.numel() % d == 0 && gate.numel() == o.numel() && y.numel() == o.numel(),
           "gated_rms_norm o " + shapes(o) + " w " + shapes(w) + " gate " + shapes(gate));
  if (rows == 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(rows), d <= 128 ? 128 : kThreads, 0, stream_>>>(
      in(o, "gated_rms_norm"), in(w, "gated_rms_norm"), in(gate, "gated_rms_norm"), true, d, eps,
      out(y, "gated_rms_norm"));
  KL_LAUNCHED("gated_rms_norm " + shapes(o));
}

}  // namespace klinear::cuda
