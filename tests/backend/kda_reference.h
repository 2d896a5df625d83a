// MODEL.md 4.4-4.5 in double precision, one head and token at a time: the plain recurrence the KDA
// tests (kda_test.cc, kda_backward_test.cc) hold the ops to.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/kinds.h"

namespace klinear::testing {

// q or k of one head and token [d] as the recurrence uses it: L2-normalised (eps inside the sum)
// when `norm` is kInside, times `scale`.
template <typename T>
std::vector<double> kda_prepared_double(const T* x, int64_t d, double scale, KdaQkNorm norm) {
  double ss = 0;
  for (int64_t j = 0; j < d; ++j) ss += double(x[j]) * x[j];
  const double s = norm == KdaQkNorm::kInside ? scale / std::sqrt(ss + 1e-6) : scale;
  std::vector<double> r(d);
  for (int64_t j = 0; j < d; ++j) r[j] = x[j] * s;
  return r;
}

// One token on a head's state S [dk, dv] (K-first): rows decayed by e^{g[j]}, u = β(v − Sᵀk),
// S ← S + k uᵀ, then o [dv] = Sᵀq from the updated state (q, k prepared).
template <typename T>
void kda_token_double(const std::vector<double>& q, const std::vector<double>& k, const T* g, const T* v, double beta,
                      int64_t dk, int64_t dv, double* S, double* o) {
  for (int64_t j = 0; j < dk; ++j)
    for (int64_t c = 0; c < dv; ++c) S[j * dv + c] *= std::exp(double(g[j]));
  for (int64_t c = 0; c < dv; ++c) {
    double ks = 0;
    for (int64_t j = 0; j < dk; ++j) ks += k[j] * S[j * dv + c];
    const double u = beta * (v[c] - ks);
    for (int64_t j = 0; j < dk; ++j) S[j * dv + c] += k[j] * u;
  }
  for (int64_t c = 0; c < dv; ++c) {
    o[c] = 0;
    for (int64_t j = 0; j < dk; ++j) o[c] += q[j] * S[j * dv + c];
  }
}

}  // namespace klinear::testing
