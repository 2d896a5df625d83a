// CPU MoE (MODEL.md 3.3, 3.4): the sigmoid router with bias-corrected grouped top-k, and the routed
// experts computed expert by expert (gather the expert's tokens, two GEMMs, GLU), each token's
// outputs weighted and summed in fp32 in slot order.
#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/backend.h"

namespace klinear::cpu {

namespace {
// Indices of the `k` largest values; ties go to the lower index. `margin` is lowered to the gap
// between the k-th and the (k+1)-th value when both are finite.
std::vector<int> top_k_indices(const std::vector<float>& v, int k, float& margin) {
  std::vector<int> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  const int sorted = std::min<int>(k + 1, static_cast<int>(v.size()));
  std::partial_sort(order.begin(), order.begin() + sorted, order.end(),
                    [&](int a, int b) { return v[a] != v[b] ? v[a] > v[b] : a < b; });
  if (sorted > k && std::isfinite(v[order[k]])) margin = std::min(margin, v[order[k - 1]] - v[order[k]]);
  order.resize(k);
  return order;
}
}  // namespace

void CpuBackend::moe_route(const Tensor& logits, const Tensor& bias, const RouteParams& p, const Tensor& idx,
                           const Tensor& weights) {
  const int64_t n = logits.dim(0), e = logits.dim(1);
  KL_CHECK(bias.numel() == e && idx.dtype() == DType::kI32 && idx.numel() == n * p.top_k &&
               weights.numel() == n * p.top_k && e % p.num_groups == 0,
           "moe_route shapes");
  const int64_t per_group = e / p.num_groups;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<float> score(e), choice(e);
    for (int64_t j = 0; j < e; ++j) {
      score[j] = sigmoidf(logits.f32()[t * e + j]);
      choice[j] = score[j] + bias.f32()[j];
    }
    if (p.num_groups > p.topk_group) {
      // Group score = sum of the top-2 biased scores; experts outside the kept groups get −inf.
      std::vector<float> group_score(p.num_groups);
      for (int gi = 0; gi < p.num_groups; ++gi) {
        std::vector<float> members(choice.begin() + gi * per_group, choice.begin() + (gi + 1) * per_group);
        float unused = 0.0f;  // the top two of a group are summed, never decided between
        auto top2 = top_k_indices(members, 2, unused);
        group_score[gi] = members[top2[0]] + members[top2[1]];
      }
      std::vector<bool> keep(p.num_groups, false);
      for (int gi : top_k_indices(group_score, p.topk_group, route_margin_)) keep[gi] = true;
      for (int64_t j = 0; j < e; ++j)
        if (!keep[j / per_group]) choice[j] = -std::numeric_limits<float>::infinity();
    }
    const std::vector<int> chosen = top_k_indices(choice, p.top_k, route_margin_);
    float sum = 0.0f;
    for (int i = 0; i < p.top_k; ++i) sum += score[chosen[i]];
    for (int i = 0; i < p.top_k; ++i) {
      float w = score[chosen[i]];
      if (p.renormalize && p.top_k > 1) w /= (sum + 1e-20f);
      const int local = chosen[i] - p.first_expert;
      const bool held = p.local_experts < 0 || (local >= 0 && local < p.local_experts);
      idx.data_as<int32_t>()[t * p.top_k + i] = held ? local : -1;
      weights.f32()[t * p.top_k + i] = w * p.scale;
    }
  }
}

void CpuBackend::moe_experts(const Tensor& x, const Tensor& idx, const Tensor& weights, const ExpertMatrix& w13m,
                             const ExpertMatrix& w2m, const GluParams& p, const Tensor& out, const SharedExperts& shared) {
  KL_CHECK(!w13m.mxfp4() && !w2m.mxfp4(), "moe_experts on the CPU takes dense experts (upload_mxfp4 widens them)");
  const Tensor& w13 = w13m.w;
  const Tensor& w2 = w2m.w;
  const int64_t n = x.dim(0), din = x.dim(1), num_experts = w13.dim(0), f2 = w13.dim(1), f = f2 / 2;
  const int64_t dout = w2.dim(1), k = idx.dim(1);
  KL_CHECK(w13.dim(2) == din && w2.dim(0) == num_experts && w2.dim(2) == f && out.shape() == Shape({n, dout}) &&
               idx.dim(0) == n && weights.numel() == n * k,
           "moe_experts shapes x " + shape_to_string(x.shape()) + " w13 " + shape_to_string(w13.shape()) + " w2 " +
               shape_to_string(w2.shape()));
  const int32_t* ids = idx.data_as<const int32_t>();
  // slots[e] = the (token, k) pairs routed to expert e.
  std::vector<std::vector<int64_t>> slots(num_experts);
  for (int64_t s = 0; s < n * k; ++s) {
    KL_CHECK(ids[s] >= -1 && ids[s] < num_experts, "expert index out of range");
    if (ids[s] >= 0) slots[ids[s]].push_back(s);
  }
  std::vector<float> slot_out(static_cast<size_t>(n * k * dout), 0.0f);
#pragma omp parallel for schedule(dynamic)
  for (int64_t e = 0; e < num_experts; ++e) {
    const auto& list = slots[e];
    const int64_t m = static_cast<int64_t>(list.size());
    if (m == 0) continue;
    std::vector<float> xe(m * din), h(m * f2), a(m * f), ye(m * dout);
    for (int64_t i = 0; i < m; ++i) std::copy_n(x.f32() + (list[i] / k) * din, din, xe.data() + i * din);
    gemm(gemm_order_, m, f2, din, xe.data(), din, w13.f32() + e * f2 * din, din, /*b_transposed=*/true, h.data(), f2);
    glu_rows(h.data(), m, f, p, a.data());
    gemm(gemm_order_, m, dout, f, a.data(), f, w2.f32() + e * dout * f, f, /*b_transposed=*/true, ye.data(), dout);
    for (int64_t i = 0; i < m; ++i) std::copy_n(ye.data() + i * dout, dout, slot_out.data() + list[i] * dout);
  }
  for (int64_t t = 0; t < n; ++t) {
    float* o = out.f32() + t * dout;
    std::fill_n(o, dout, 0.0f);
    for (int64_t i = 0; i < k; ++i) {
      if (ids[t * k + i] < 0) continue;  // another rank's expert
      const float w = weights.f32()[t * k + i];
      const float* y = slot_out.data() + (t * k + i) * dout;
      for (int64_t j = 0; j < dout; ++j) o[j] += w * y[j];
    }
  }
  add_shared_experts(*this, shared, p, out);
}

}  // namespace klinear::cpu
