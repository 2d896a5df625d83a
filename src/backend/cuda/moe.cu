// CUDA MoE (SPEC 3.3, 3.4): the router in one kernel (a block per token: sigmoid, bias for the
// choice only, grouped top-k, renormalise, scale; ties go to the lower index as on the CPU), and the
// routed experts as a permutation plus per-expert cuBLASLt GEMMs and a deterministic weighted
// combine (fp32, slot order, no atomics).
//
// The experts read the routing back to the host to plan the per-expert GEMMs: a synchronisation per
// MoE layer, and launches per active expert. This is the baseline issue 9 measures its grouped
// kernels against (docs/PERF.md); it keeps a decode step out of a CUDA graph.
#include <vector>

#include "backend/cuda/device.cuh"

namespace klinear::cuda {

namespace {

constexpr int kRouteThreads = 256;
constexpr int kMaxGroups = 64;

// (value, index) argmax over the block, ties to the lower index; `skip[i]` entries never win.
__device__ int block_argmax(const float* v, const bool* skip, int n, float* sv, int* si) {
  float best = -INFINITY;
  int arg = -1;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (!skip[i] && (arg < 0 || v[i] > best)) {  // strided order: the first index seen wins ties
      best = v[i];
      arg = i;
    }
  sv[threadIdx.x] = best;
  si[threadIdx.x] = arg;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const float ov = sv[threadIdx.x + stride];
      const int oi = si[threadIdx.x + stride];
      const int mi = si[threadIdx.x];
      if (oi >= 0 && (mi < 0 || ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < mi))) {
        sv[threadIdx.x] = ov;
        si[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  const int r = si[0];
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kRouteThreads) route_kernel(const float* logits, const float* bias, int e, RouteParams p,
                                                              int32_t* idx, float* weights) {
  extern __shared__ float sm[];
  float* score = sm;          // [e]
  float* choice = score + e;  // [e]
  bool* taken = reinterpret_cast<bool*>(choice + e);  // [e]
  __shared__ float sv[kRouteThreads], gscore[kMaxGroups];
  __shared__ int si[kRouteThreads], chosen[32];
  __shared__ bool gskip[kMaxGroups], keep[kMaxGroups];
  const int64_t t = blockIdx.x;
  for (int j = threadIdx.x; j < e; j += blockDim.x) {
    score[j] = sigmoid_f(logits[t * e + j]);
    choice[j] = score[j] + bias[j];
    taken[j] = false;
  }
  __syncthreads();
  if (p.num_groups > p.topk_group) {
    const int per_group = e / p.num_groups;
    for (int gi = threadIdx.x; gi < p.num_groups; gi += blockDim.x) {  // sum of the group's top-2 choices
      float a = -INFINITY, b = -INFINITY;
      for (int j = gi * per_group; j < (gi + 1) * per_group; ++j) {
        const float v = choice[j];
        if (v > a) { b = a; a = v; } else if (v > b) { b = v; }
      }
      gscore[gi] = a + b;
      gskip[gi] = false;
      keep[gi] = false;
    }
    __syncthreads();
    for (int i = 0; i < p.topk_group; ++i) {
      const int g = block_argmax(gscore, gskip, p.num_groups, sv, si);
      if (threadIdx.x == 0) { gskip[g] = true; keep[g] = true; }
      __syncthreads();
    }
    for (int j = threadIdx.x; j < e; j += blockDim.x)
      if (!keep[j / per_group]) choice[j] = -INFINITY;
    __syncthreads();
  }
  for (int i = 0; i < p.top_k; ++i) {
    const int c = block_argmax(choice, taken, e, sv, si);
    if (threadIdx.x == 0) { taken[c] = true; chosen[i] = c; }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int i = 0; i < p.top_k; ++i) sum += score[chosen[i]];
    for (int i = 0; i < p.top_k; ++i) {
      float w = score[chosen[i]];
      if (p.renormalize && p.top_k > 1) w /= (sum + 1e-20f);
      idx[t * p.top_k + i] = chosen[i];
      weights[t * p.top_k + i] = w * p.scale;
    }
  }
}

// out[t] = Σ_k weights[t, k] · y[pos[t, k]] in k order.
__global__ void combine_kernel(const float* y, const int32_t* pos, const float* weights, int64_t n, int k, int64_t dout,
                               Out o) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * dout; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / dout, d = i % dout;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc += weights[t * k + j] * y[int64_t{pos[t * k + j]} * dout + d];
    o.set(i, acc);
  }
}

}  // namespace

void CudaBackend::moe_route(const Tensor& logits, const Tensor& bias, const RouteParams& p, const Tensor& idx,
                            const Tensor& weights) {
  const int64_t n = logits.dim(0), e = logits.dim(1);
  KL_CHECK(logits.dtype() == DType::kF32 && bias.dtype() == DType::kF32 && bias.numel() == e &&
               idx.dtype() == DType::kI32 && idx.numel() == n * p.top_k && weights.dtype() == DType::kF32 &&
               weights.numel() == n * p.top_k && p.num_groups >= 1 && e % p.num_groups == 0 && p.top_k >= 1 &&
               p.top_k <= 32 && p.top_k <= e && p.num_groups <= kMaxGroups && p.topk_group <= p.num_groups,
           "moe_route logits " + shapes(logits) + " bias " + shapes(bias) + " top_k " + std::to_string(p.top_k) +
               " groups " + std::to_string(p.num_groups));
  if (n == 0) return;
  const size_t smem = e * (2 * sizeof(float) + sizeof(bool));
  route_kernel<<<static_cast<unsigned>(n), kRouteThreads, smem, stream_>>>(
      logits.data_as<const float>(), bias.data_as<const float>(), static_cast<int>(e), p, idx.data_as<int32_t>(),
      weights.data_as<float>());
  KL_LAUNCHED("moe_route " + shapes(logits));
}

void CudaBackend::moe_experts(const Tensor& x, const Tensor& idx, const Tensor& weights, const Tensor& w13,
                              const Tensor& w2, const GluParams& p, const Tensor& o) {
  const int64_t n = x.dim(0), din = x.dim(1), num_experts = w13.dim(0), f2 = w13.dim(1), f = f2 / 2;
  const int64_t dout = w2.dim(1), k = idx.dim(1);
  KL_CHECK(w13.dim(2) == din && w2.dim(0) == num_experts && w2.dim(2) == f && o.shape() == Shape({n, dout}) &&
               idx.dim(0) == n && idx.dtype() == DType::kI32 && weights.numel() == n * k &&
               weights.dtype() == DType::kF32 && x.dtype() == w13.dtype() && w2.dtype() == w13.dtype(),
           "moe_experts x " + shapes(x) + " w13 " + shapes(w13) + " w2 " + shapes(w2) + " idx " + shapes(idx));
  if (n == 0) return;
  const std::string what = "moe_experts x " + shapes(x) + " w13 " + shapes(w13);
  // Plan on the host: slots grouped by expert, in slot order within each expert.
  const Tensor ids = to_host(idx);
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
    return to_device(Tensor::wrap(DType::kI32, {static_cast<int64_t>(v.size())}, v.data(), nullptr, Device::kCpu),
                     DType::kI32);
  };
  const Tensor token_t = dev(token), pos_t = dev(pos);
  const Tensor xp = alloc(x.dtype(), {n * k, din});
  gather_rows(x, token_t, xp);
  const Tensor h = alloc(x.dtype(), {n * k, f2}), act = alloc(x.dtype(), {n * k, f}), y = alloc(DType::kF32, {n * k, dout});
  const size_t es = dtype_size(x.dtype());
  // Each expert's rows of `in` [n·k, width] times its weight [out_w, width] of `w` into `c`.
  auto per_expert = [&](const Tensor& in, int64_t width, const Tensor& w, int64_t out_w, const Tensor& c,
                        const char* name) {
    const size_t cs = dtype_size(c.dtype());
    for (int64_t e = 0; e < num_experts; ++e) {
      const int64_t rows = offset[e + 1] - offset[e];
      if (rows == 0) continue;
      GemmArgs g;
      g.m = rows;
      g.n = out_w;
      g.k = width;
      g.a = static_cast<const char*>(in.data()) + offset[e] * width * es;
      g.lda = width;
      g.b = static_cast<const char*>(w.data()) + e * out_w * width * es;
      g.ldb = width;
      g.c = static_cast<char*>(c.data()) + offset[e] * out_w * cs;
      g.ldc = out_w;
      g.ab_dtype = x.dtype();
      g.c_dtype = c.dtype();
      gemm(g, name);
    }
  };
  per_expert(xp, din, w13, f2, h, "moe_experts gate_up");
  glu(h, p, act);
  per_expert(act, f, w2, dout, y, "moe_experts down");
  combine_kernel<<<blocks_for(n * dout, 256), 256, 0, stream_>>>(y.data_as<const float>(), pos_t.data_as<const int32_t>(),
                                                                  weights.data_as<const float>(), n, static_cast<int>(k),
                                                                  dout, out(o, "moe_experts"));
  KL_LAUNCHED(what + " (combine)");
}

}  // namespace klinear::cuda
