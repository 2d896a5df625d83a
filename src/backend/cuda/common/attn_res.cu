// CUDA AttnRes read (MODEL.md 7.1): per row, a softmax over candidates of ρ_i·(v_i·e) mixes the raw
// candidates. One block per row; statistics, logits and the mix in fp32.
// Shapes and dtypes: 1..kMaxCandidates candidates v_i [N, D] (F32 or BF16, as out), e [D] F32, out
// [N, D] rounded once. Ownership: reads the candidates and e, writes out; no workspace.
// Cost: each candidate row is read twice (statistics, then the mix), out written once, so the floor
// is (2·count + 1)·N·D element bytes at the copy rate; the count is one per layer block.
#include <vector>

#include "backend/cuda/common/device.cuh"

namespace klinear::cuda {

namespace {

constexpr int kMaxCandidates = 128;  // AttnRes blocks per model stay far below (one per layer block)

struct Candidates {
  In v[kMaxCandidates];
  int count;
};

__global__ void attn_res_kernel(Candidates cands, In e, int64_t d, float eps, Out o) {
  __shared__ float scratch[32];
  __shared__ float prob[kMaxCandidates];
  const int64_t base = blockIdx.x * d;
  for (int i = 0; i < cands.count; ++i) {
    float ss = 0.0f, dot = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float v = cands.v[i][base + j];
      ss += v * v;
      dot += v * e[j];
    }
    ss = block_sum(ss, scratch);
    dot = block_sum(dot, scratch);
    if (threadIdx.x == 0) prob[i] = dot * rsqrtf(ss / static_cast<float>(d) + eps);
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int i = 0; i < cands.count; ++i) mx = fmaxf(mx, prob[i]);
  float z = 0.0f;
  for (int i = 0; i < cands.count; ++i) z += expf(prob[i] - mx);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < cands.count; ++i) acc += expf(prob[i] - mx) / z * cands.v[i][base + j];
    o.set(base + j, acc);
  }
}

}  // namespace

void CudaBackend::attn_res_read(std::span<const Tensor> candidates, const Tensor& e, float eps, const Tensor& o) {
  const int64_t d = e.numel(), rows = d == 0 ? 0 : o.numel() / d;
  KL_CHECK(!candidates.empty() && static_cast<int>(candidates.size()) <= kMaxCandidates,
           "attn_res_read takes 1 to " + std::to_string(kMaxCandidates) + " candidates, got " +
               std::to_string(candidates.size()));
  Candidates c{};
  c.count = static_cast<int>(candidates.size());
  for (int i = 0; i < c.count; ++i) {
    KL_CHECK(candidates[i].numel() == o.numel(), "attn_res_read candidate " + shapes(candidates[i]) + " out " + shapes(o));
    c.v[i] = in(candidates[i], "attn_res_read");
  }
  if (rows == 0) return;
  attn_res_kernel<<<static_cast<unsigned>(rows), 256, 0, stream_>>>(c, in(e, "attn_res_read"), d, eps,
                                                                     out(o, "attn_res_read"));
  KL_LAUNCHED("attn_res_read " + shapes(o));
}

}  // namespace klinear::cuda
