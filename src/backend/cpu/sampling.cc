// Sampling (backend.h, SampleArgs) the plain way: the weights of backend/sampling.h, the
// candidates by a (partial) sort in logit order, the draw by a walk in id order.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/backend.h"
#include "backend/sampling.h"

namespace klinear::cpu {

namespace {

int32_t sample_row(const float* l, int64_t v, const SampleRow& p) {
  for (int64_t i = 0; i < v; ++i)
    if (!std::isfinite(l[i])) return -1;
  int32_t best = 0;
  for (int64_t i = 1; i < v; ++i)
    if (l[i] > l[best]) best = static_cast<int32_t>(i);
  if (!(p.temperature > 0.0f)) return best;
  const float inv_t = 1.0f / p.temperature, mx = l[best];
  auto weight = [&](int32_t i) { return sample_weight(l[i], mx, inv_t); };
  // Larger logit first, ties lowest id first (the order of sample_key, then id).
  auto before = [&](int32_t a, int32_t b) {
    const uint32_t ka = sample_key(l[a]), kb = sample_key(l[b]);
    return ka != kb ? ka > kb : a < b;
  };
  std::vector<int32_t> order(static_cast<size_t>(v));
  std::iota(order.begin(), order.end(), 0);
  size_t keep = order.size();
  if (p.top_k > 0 && p.top_k < v) {
    keep = static_cast<size_t>(p.top_k);
    std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep) - 1, order.end(), before);
  }
  if (p.top_p < 1.0f) {
    const auto end = order.begin() + static_cast<std::ptrdiff_t>(keep);
    std::sort(order.begin(), end, before);
    uint64_t total = 0;
    for (size_t i = 0; i < keep; ++i) total += weight(order[i]);
    const uint64_t target = top_p_target(p.top_p, total);
    uint64_t cum = 0;
    size_t n = 0;
    while (n < keep && cum < target) cum += weight(order[n++]);
    keep = n;
  }
  std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep));  // by id
  uint64_t total = 0;
  for (size_t i = 0; i < keep; ++i) total += weight(order[i]);
  const uint64_t x = sample_point(sample_bits(p.seed, static_cast<uint32_t>(p.counter)), total);
  uint64_t cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += weight(order[i]);
    if (x < cum) return order[i];
  }
  KL_CHECK(false, "sample: the draw fell outside the candidates' weight");
  return -1;
}

}  // namespace

void CpuBackend::sample(const SampleArgs& a) {
  const int64_t r = a.logits.dim(0), v = a.logits.dim(1);
  KL_CHECK(a.logits.rank() == 2 && a.logits.dtype() == DType::kF32 && a.temperature.numel() == r &&
               a.top_k.numel() == r && a.top_p.numel() == r && a.seed.numel() == 2 * r && a.counter.numel() == r &&
               a.ids.numel() == r && a.top_k.dtype() == DType::kI32 && a.seed.dtype() == DType::kI32 &&
               a.counter.dtype() == DType::kI32 && a.ids.dtype() == DType::kI32 && a.temperature.dtype() == DType::kF32 &&
               a.top_p.dtype() == DType::kF32 && v >= 1,
           "sample logits " + shape_to_string(a.logits.shape()) + " ids " + shape_to_string(a.ids.shape()));
  const int32_t* seed = a.seed.data_as<const int32_t>();
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < r; ++i) {
    const SampleRow p{a.temperature.data_as<const float>()[i], a.top_k.data_as<const int32_t>()[i],
                      a.top_p.data_as<const float>()[i], sample_seed(seed[2 * i], seed[2 * i + 1]),
                      a.counter.data_as<const int32_t>()[i]};
    a.ids.data_as<int32_t>()[i] = sample_row(a.logits.data_as<const float>() + i * v, v, p);
  }
}

}  // namespace klinear::cpu
