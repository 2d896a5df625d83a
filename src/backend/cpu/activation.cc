// CPU elementwise ops: embedding lookup, residual add, sigmoid gates and the GLU activations
// (MODEL.md 3.2).
#include <cstring>

#include "backend/cpu/backend.h"

namespace klinear::cpu {

void CpuBackend::embedding(const EmbeddingArgs& a) {
  const int64_t c = a.table.dim(1), n = a.ids.numel(), rows = a.table.dim(0);
  KL_CHECK(a.ids.dtype() == DType::kI32 && a.out.numel() == n * c, "embedding output shape");
  const int32_t* id = a.ids.data_as<const int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    KL_CHECK(id[i] >= 0 && id[i] < a.vocab, "embedding id out of range (callers validate ids)");
    const int64_t row = id[i] - a.first_id;
    if (row >= 0 && row < rows) std::memcpy(a.out.f32() + i * c, a.table.f32() + row * c, c * sizeof(float));
    else std::fill_n(a.out.f32() + i * c, c, 0.0f);
  }
}

void CpuBackend::add(const Tensor& acc, const Tensor& x) {
  KL_CHECK(acc.numel() == x.numel(), "add shape mismatch");
  float* a = acc.f32();
  const float* b = x.f32();
  for (int64_t i = 0; i < acc.numel(); ++i) a[i] += b[i];
}

void CpuBackend::sigmoid_mul(const Tensor& x, const Tensor& gate) {
  KL_CHECK(x.numel() == gate.numel(), "sigmoid_mul shape mismatch");
  float* a = x.f32();
  const float* g = gate.f32();
  for (int64_t i = 0; i < x.numel(); ++i) a[i] *= sigmoidf(g[i]);
}

void CpuBackend::sigmoid(const Tensor& x, const Tensor& y) {
  KL_CHECK(x.numel() == y.numel(), "sigmoid shape mismatch");
  for (int64_t i = 0; i < x.numel(); ++i) y.f32()[i] = sigmoidf(x.f32()[i]);
}

void glu_rows(const float* gate_up, int64_t n, int64_t f, const GluParams& p, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    const float* g = gate_up + r * 2 * f;
    const float* u = g + f;
    float* o = out + r * f;
    if (p.kind == Activation::kSilu) {
      for (int64_t j = 0; j < f; ++j) o[j] = g[j] * sigmoidf(g[j]) * u[j];
    } else {
      for (int64_t j = 0; j < f; ++j) {
        const float ag = p.beta * std::tanh(g[j] / p.beta) * sigmoidf(g[j]);
        const float au = p.linear_beta ? *p.linear_beta * std::tanh(u[j] / *p.linear_beta) : u[j];
        o[j] = ag * au;
      }
    }
  }
}

void CpuBackend::glu(const Tensor& gate_up, const GluParams& p, const Tensor& out) {
  const int64_t f = out.dim(-1), n = out.numel() / f;
  KL_CHECK(gate_up.numel() == n * 2 * f, "glu shapes " + shape_to_string(gate_up.shape()) + " -> " +
                                             shape_to_string(out.shape()));
  glu_rows(gate_up.f32(), n, f, p, out.f32());
}

}  // namespace klinear::cpu
