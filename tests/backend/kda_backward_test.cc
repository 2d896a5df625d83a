// The KDA backward (CPU rows: the backward runs on the CPU only so far, issue 37): both forms'
// gradients of q, k, v, g, β and the start state against central differences of a double-precision
// recurrence (fresh random inputs, q/k normalised inside and given, start state and end-state
// gradient present and absent, lengths 1 to 200 and several sequences), with the forward of q/k as
// given against the same recurrence; the chunked backward against the recurrent one in fp32 over
// lengths up to 1000 with both gate forms; and the gate's backward against central differences of
// the gate in double, both forms.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend_cases.h"
#include "kda_reference.h"
#include "test_util.h"

namespace klinear {
namespace {

using testing::all_close;

std::vector<testing::BackendCase> cpu_cases() {
  std::vector<testing::BackendCase> cpu;
  for (const testing::BackendCase& c : testing::backend_cases())
    if (c.device == Device::kCpu) cpu.push_back(c);
  return cpu;
}

// The inputs of one call in double, and the gradients of the loss Σ o·d_out + Σ ht·d_ht.
struct Inputs {
  int64_t heads, dk, dv;
  std::vector<int32_t> cu;                    // cu_seqlens
  std::vector<double> q, k, v, g, beta, h0;   // as KdaBackwardArgs, h0 [B, H, dk, dv] (zero: absent)
  std::vector<double> d_out, d_ht;            // d_ht zero: absent
  int64_t rows() const { return cu.back(); }
  int64_t seqs() const { return static_cast<int64_t>(cu.size()) - 1; }
};

// MODEL.md 4.4-4.5 in double: the outputs o [N, H, dv] and the end states ht [B, H, dk, dv].
struct Forward {
  std::vector<double> o, ht;
};
Forward forward(const Inputs& x, KdaQkNorm norm) {
  const int64_t H = x.heads, dk = x.dk, dv = x.dv;
  Forward r{std::vector<double>(x.d_out.size()), x.h0};
  for (int64_t b = 0; b < x.seqs(); ++b)
    for (int64_t h = 0; h < H; ++h) {
      double* S = r.ht.data() + (b * H + h) * dk * dv;
      for (int64_t t = x.cu[b]; t < x.cu[b + 1]; ++t) {
        const double* qh = x.q.data() + (t * H + h) * dk;
        const double* kh = x.k.data() + (t * H + h) * dk;
        testing::kda_token_double(testing::kda_prepared_double(qh, dk, 1.0 / std::sqrt(double(dk)), norm),
                                  testing::kda_prepared_double(kh, dk, 1.0, norm), x.g.data() + (t * H + h) * dk,
                                  x.v.data() + (t * H + h) * dv, x.beta[t * H + h], dk, dv, S,
                                  r.o.data() + (t * H + h) * dv);
      }
    }
  return r;
}

// The loss whose gradients the op computes: Σ o·d_out + Σ ht·d_ht.
double loss(const Inputs& x, KdaQkNorm norm) {
  const Forward f = forward(x, norm);
  double total = 0;
  for (size_t i = 0; i < f.o.size(); ++i) total += f.o[i] * x.d_out[i];
  for (size_t i = 0; i < f.ht.size(); ++i) total += f.ht[i] * x.d_ht[i];
  return total;
}

// ∂loss/∂x[i] for every i by central differences, as an F32 tensor of `shape`.
Tensor central_differences(Inputs x, std::vector<double> Inputs::*field, KdaQkNorm norm, const Shape& shape) {
  constexpr double kStep = 1e-6;
  Tensor grad = Tensor::empty(DType::kF32, shape);
  std::vector<double>& values = x.*field;
  for (size_t i = 0; i < values.size(); ++i) {
    const double keep = values[i];
    values[i] = keep + kStep;
    const double up = loss(x, norm);
    values[i] = keep - kStep;
    const double down = loss(x, norm);
    values[i] = keep;
    grad.f32()[i] = static_cast<float>((up - down) / (2 * kStep));
  }
  return grad;
}

Tensor to_tensor(const std::vector<double>& v, const Shape& shape) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  for (size_t i = 0; i < v.size(); ++i) t.f32()[i] = static_cast<float>(v[i]);
  return t;
}

std::vector<double> uniform(std::mt19937_64& rng, int64_t n, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = d(rng);
  return v;
}

// Random inputs whose values are exactly float32 (what the op sees is what the double loss sees).
// Keys given unnormalised are scaled to unit norm (as a caller normalises them); queries are not.
Inputs random_inputs(std::mt19937_64& rng, const std::vector<int32_t>& lens, int64_t heads, int64_t dk, int64_t dv,
                     KdaQkNorm norm, bool with_h0, bool with_d_ht) {
  Inputs x{heads, dk, dv, {0}, {}, {}, {}, {}, {}, {}, {}, {}};
  for (int32_t l : lens) x.cu.push_back(x.cu.back() + l);
  const int64_t n = x.rows(), states = x.seqs() * heads * dk * dv;
  x.q = uniform(rng, n * heads * dk, -1, 1);
  x.k = uniform(rng, n * heads * dk, -1, 1);
  if (norm == KdaQkNorm::kGiven)
    for (int64_t r = 0; r < n * heads; ++r) {
      double ss = 0;
      for (int64_t j = 0; j < dk; ++j) ss += x.k[r * dk + j] * x.k[r * dk + j];
      for (int64_t j = 0; j < dk; ++j) x.k[r * dk + j] /= std::sqrt(ss);
    }
  x.v = uniform(rng, n * heads * dv, -1, 1);
  x.g = uniform(rng, n * heads * dk, -0.5, -0.001);  // some channels carry the state across chunks
  x.beta = uniform(rng, n * heads, 0.05, 0.95);
  x.h0 = with_h0 ? uniform(rng, states, -1, 1) : std::vector<double>(states, 0.0);
  x.d_out = uniform(rng, n * heads * dv, -1, 1);
  x.d_ht = with_d_ht ? uniform(rng, states, -1, 1) : std::vector<double>(states, 0.0);
  for (auto* f : {&x.q, &x.k, &x.v, &x.g, &x.beta, &x.h0, &x.d_out, &x.d_ht})
    for (double& e : *f) e = static_cast<float>(e);
  return x;
}

enum class Form { kChunked, kRecurrent };
const char* form_name(Form f) { return f == Form::kChunked ? "chunked" : "recurrent"; }

// The op's gradients, host F32, in KdaBackwardArgs' order.
struct Grads {
  Tensor dq, dk, dv, dg, dbeta, dh0;
};

void expect_close(const Grads& got, const Grads& want, double bound) {
  EXPECT_TRUE(all_close(got.dq, want.dq, bound)) << "dq";
  EXPECT_TRUE(all_close(got.dk, want.dk, bound)) << "dk";
  EXPECT_TRUE(all_close(got.dv, want.dv, bound)) << "dv";
  EXPECT_TRUE(all_close(got.dg, want.dg, bound)) << "dg";
  EXPECT_TRUE(all_close(got.dbeta, want.dbeta, bound)) << "dbeta";
  EXPECT_TRUE(all_close(got.dh0, want.dh0, bound)) << "dh0";
}

class KdaBackward : public testing::BackendTest {
 public:
  Shape qk_shape(const Inputs& x) const { return {x.rows(), x.heads, x.dk}; }
  Shape v_shape(const Inputs& x) const { return {x.rows(), x.heads, x.dv}; }
  Shape state_shape(const Inputs& x) const { return {x.seqs(), x.heads, x.dk, x.dv}; }

  SeqLayout layout(const Inputs& x) {
    SeqLayout l;
    l.cu_seqlens = x.cu;
    for (int64_t b = 0; b < x.seqs(); ++b) l.cached.push_back(0), l.slots.push_back(static_cast<int32_t>(b));
    return l;
  }

  // Runs one backward form; outputs poisoned first. h0 and d_ht undefined when all zero.
  Grads backward(Form form, const Inputs& x, KdaQkNorm norm, bool with_h0, bool with_d_ht) {
    const Shape qk = qk_shape(x), vs = v_shape(x), st = state_shape(x);
    KdaBackwardArgs a{dev(to_tensor(x.q, qk)), dev(to_tensor(x.k, qk)), dev(to_tensor(x.v, vs)),
                      dev(to_tensor(x.g, qk), DType::kF32), dev(to_tensor(x.beta, {x.rows(), x.heads}), DType::kF32),
                      with_h0 ? dev(to_tensor(x.h0, st), DType::kF32) : Tensor(), dev(to_tensor(x.d_out, vs)),
                      with_d_ht ? dev(to_tensor(x.d_ht, st), DType::kF32) : Tensor(), norm, poisoned(qk), poisoned(qk),
                      poisoned(vs), poisoned(qk, DType::kF32), poisoned({x.rows(), x.heads}, DType::kF32),
                      poisoned(st, DType::kF32)};
    const SeqLayout l = layout(x);
    if (form == Form::kChunked) be().kda_chunked_backward(a, l);
    else be().kda_recurrent_backward(a, l);
    return {host(a.dq), host(a.dk), host(a.dv), host(a.dg), host(a.dbeta), host(a.dh0)};
  }
};


struct FdCase {
  std::vector<int32_t> lens;
  KdaQkNorm norm;
  bool h0, d_ht;
};

TEST_P(KdaBackward, GradientsMatchCentralDifferences) {
  const std::vector<FdCase> cases = {
      // One token from a zero state has dg = 0 (nothing to decay): T = 1 starts from h0.
      {{1}, KdaQkNorm::kInside, true, true},     {{1}, KdaQkNorm::kGiven, true, false},
      {{63}, KdaQkNorm::kInside, true, false},   {{64}, KdaQkNorm::kGiven, false, true},
      {{65}, KdaQkNorm::kGiven, true, true},     {{65}, KdaQkNorm::kInside, false, false},
      {{200}, KdaQkNorm::kInside, true, true},   {{200}, KdaQkNorm::kGiven, false, false},
      {{70, 1, 3}, KdaQkNorm::kInside, true, true},
  };
  std::mt19937_64 rng(testing::fresh_seed());
  // fp32 gradients against exact ones (central differences in double are good to ~1e-9 here);
  // a wrong sign or a missing term is off by O(1).
  const double bound = tol(testing::kGradients);
  for (const FdCase& c : cases) {
    std::string what = "lens";
    for (int32_t l : c.lens) what += " " + std::to_string(l);
    what += c.norm == KdaQkNorm::kInside ? ", q/k normalised inside" : ", q/k given";
    what += c.h0 ? ", h0" : ", no h0";
    what += c.d_ht ? ", d_ht" : ", no d_ht";
    SCOPED_TRACE(what);
    const Inputs x = random_inputs(rng, c.lens, 2, 8, 6, c.norm, c.h0, c.d_ht);
    const Grads fd{central_differences(x, &Inputs::q, c.norm, qk_shape(x)),
                   central_differences(x, &Inputs::k, c.norm, qk_shape(x)),
                   central_differences(x, &Inputs::v, c.norm, v_shape(x)),
                   central_differences(x, &Inputs::g, c.norm, qk_shape(x)),
                   central_differences(x, &Inputs::beta, c.norm, {x.rows(), x.heads}),
                   central_differences(x, &Inputs::h0, c.norm, state_shape(x))};
    for (Form form : {Form::kRecurrent, Form::kChunked}) {
      SCOPED_TRACE(form_name(form));
      expect_close(backward(form, x, c.norm, c.h0, c.d_ht), fd, bound);
    }
  }
}

// The forward with q and k as given (the form `klinear kda` runs) against the double recurrence.
TEST_P(KdaBackward, ForwardWithQkGivenMatchesTheRecurrence) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (int32_t len : {1, 65, 200}) {
    SCOPED_TRACE("T " + std::to_string(len));
    const Inputs x = random_inputs(rng, {len}, 2, 16, 8, KdaQkNorm::kGiven, true, false);
    const Shape qk = qk_shape(x), vs = v_shape(x), st = state_shape(x);
    const Forward expect = forward(x, KdaQkNorm::kGiven);
    for (Form form : {Form::kRecurrent, Form::kChunked}) {
      SCOPED_TRACE(form_name(form));
      SeqLayout l = layout(x);
      be().upload_layout(l);
      Tensor states = persistent(to_tensor(x.h0, st), DType::kF32);
      KdaArgs a{dev(to_tensor(x.q, qk)), dev(to_tensor(x.k, qk)), dev(to_tensor(x.v, vs)),
                dev(to_tensor(x.g, qk), DType::kF32), dev(to_tensor(x.beta, {x.rows(), x.heads}), DType::kF32),
                states, poisoned(vs), KdaQkNorm::kGiven};
      if (form == Form::kChunked) be().kda_chunked(a, l);
      else be().kda_recurrent(a, l);
      EXPECT_TRUE(all_close(host(a.out), to_tensor(expect.o, vs), tol(testing::kRecurrence))) << "o";
      EXPECT_TRUE(all_close(host(states), to_tensor(expect.ht, st), tol(testing::kRecurrence))) << "end state";
    }
  }
}

// Gates through the CPU gate op (as kda_test.cc makes them): strong decay for one gate form each.
Tensor gate_g(std::mt19937_64& rng, int64_t n, int64_t H, int64_t d, KdaGate gate) {
  Tensor f = testing::random_tensor(rng, {n, H * d}, -3.0f, 3.0f);
  Tensor dt = testing::random_tensor(rng, {H * d});
  Tensor a_log = testing::random_tensor(rng, {H}, -1.0f, 1.0f);
  Tensor g = Tensor::empty(DType::kF32, {n, H, d});
  auto cpu = make_backend(BackendOptions{});
  (*cpu)->kda_gate(f, dt, a_log, {gate, -5.0f}, g.view({n, H * d}));
  return g;
}

TEST_P(KdaBackward, ChunkedMatchesRecurrent) {
  struct Case {
    std::vector<int32_t> lens;
    int64_t heads, dk, dv;
    KdaGate gate;
    KdaQkNorm norm;
  };
  const std::vector<Case> cases = {
      {{1}, 2, 32, 16, KdaGate::kSoftplus, KdaQkNorm::kInside},
      {{63}, 2, 32, 16, KdaGate::kLowerBound, KdaQkNorm::kGiven},
      {{64}, 2, 64, 32, KdaGate::kSoftplus, KdaQkNorm::kInside},
      {{65}, 2, 32, 64, KdaGate::kLowerBound, KdaQkNorm::kInside},
      {{200}, 2, 32, 32, KdaGate::kSoftplus, KdaQkNorm::kGiven},
      {{1000}, 1, 64, 64, KdaGate::kLowerBound, KdaQkNorm::kInside},
      {{1000}, 1, 128, 128, KdaGate::kSoftplus, KdaQkNorm::kInside},
      {{65, 1, 130}, 2, 32, 32, KdaGate::kLowerBound, KdaQkNorm::kGiven},
  };
  std::mt19937_64 rng(testing::fresh_seed());
  for (const Case& c : cases) {
    std::string what = "H " + std::to_string(c.heads) + " dk " + std::to_string(c.dk) + " dv " + std::to_string(c.dv);
    for (int32_t l : c.lens) what += " " + std::to_string(l);
    what += c.gate == KdaGate::kSoftplus ? " softplus" : " lower-bound";
    SCOPED_TRACE(what);
    Inputs x = random_inputs(rng, c.lens, c.heads, c.dk, c.dv, c.norm, true, true);
    // Decay from the gate op, scaled to 0.05 so that the state carries over chunks.
    const Tensor g = gate_g(rng, x.rows(), c.heads, c.dk, c.gate);
    for (int64_t i = 0; i < g.numel(); ++i) x.g[i] = 0.05f * g.f32()[i];
    const Grads rec = backward(Form::kRecurrent, x, c.norm, true, true);
    const Grads chk = backward(Form::kChunked, x, c.norm, true, true);
    const double bound = tol(testing::kGradients);
    expect_close(chk, rec, bound);
  }
}

// MODEL.md 4.3 in double: Σ_{t,c} gate(f + dt_bias, A_log)·w.
double gate_loss(const std::vector<double>& f, const std::vector<double>& dt, const std::vector<double>& a_log,
                 const std::vector<double>& w, KdaGateParams p) {
  const size_t width = dt.size(), d = width / a_log.size();
  double total = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const double x = f[i] + dt[i % width], a = std::exp(a_log[(i % width) / d]);
    const double g = p.kind == KdaGate::kSoftplus ? -a * std::log1p(std::exp(x)) : p.lower_bound * testing::sig(a * x);
    total += g * w[i];
  }
  return total;
}

TEST_P(KdaBackward, GateGradientsMatchCentralDifferences) {
  std::mt19937_64 rng(testing::fresh_seed());
  const int64_t n = 5, H = 3, d = 4;
  for (KdaGateParams p : {KdaGateParams{KdaGate::kSoftplus, 0.0f}, KdaGateParams{KdaGate::kLowerBound, -5.0f}}) {
    SCOPED_TRACE(p.kind == KdaGate::kSoftplus ? "softplus" : "lower bound");
    std::vector<double> f = uniform(rng, n * H * d, -3, 3), dt = uniform(rng, H * d, -1, 1),
                        a_log = uniform(rng, H, -1, 1), w = uniform(rng, n * H * d, -1, 1);
    for (auto* v : {&f, &dt, &a_log, &w})
      for (double& e : *v) e = static_cast<float>(e);
    auto fd = [&](std::vector<double>& x, const Shape& shape) {
      Tensor grad = Tensor::empty(DType::kF32, shape);
      for (size_t i = 0; i < x.size(); ++i) {
        const double keep = x[i], step = 1e-6;
        x[i] = keep + step;
        const double up = gate_loss(f, dt, a_log, w, p);
        x[i] = keep - step;
        const double down = gate_loss(f, dt, a_log, w, p);
        x[i] = keep;
        grad.f32()[i] = static_cast<float>((up - down) / (2 * step));
      }
      return grad;
    };
    const Tensor df = fd(f, {n, H * d}), ddt = fd(dt, {H * d}), da = fd(a_log, {H});
    KdaGateBackwardArgs a{dev(to_tensor(f, {n, H * d}), DType::kF32), dev(to_tensor(dt, {H * d}), DType::kF32),
                          dev(to_tensor(a_log, {H}), DType::kF32), p, dev(to_tensor(w, {n, H * d}), DType::kF32),
                          poisoned({n, H * d}, DType::kF32), poisoned({H * d}, DType::kF32),
                          poisoned({H}, DType::kF32)};
    be().kda_gate_backward(a);
    EXPECT_TRUE(all_close(host(a.df), df, tol())) << "df";
    EXPECT_TRUE(all_close(host(a.d_dt_bias), ddt, tol())) << "d dt_bias";
    EXPECT_TRUE(all_close(host(a.d_a_log), da, tol())) << "d A_log";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, KdaBackward, ::testing::ValuesIn(cpu_cases()), testing::backend_case_name);

}  // namespace
}  // namespace klinear
