// CUDA ops against double-precision references of their formulas (SPEC 3-7), on random non-zero
// inputs with a fresh seed per test (printed; replay with KLINEAR_TEST_SEED), outputs poisoned with
// NaN before each op, in both dtypes: F32 (the exact mode) and BF16 (references computed from the
// bf16-rounded inputs the device holds). Case tables cover lengths 1, 63, 64, 65, 1000, mixed
// batches, both KDA gate forms, strong decay and non-zero initial states.
// Every test skips cleanly when no CUDA device is visible (CI) and is not built without CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/cuda/backend.h"

namespace klinear {
namespace {

using cuda::CudaBackend;

uint64_t seed_for_test() {
  if (const char* env = std::getenv("KLINEAR_TEST_SEED")) return std::strtoull(env, nullptr, 10);
  const uint64_t seed = std::random_device{}();
  std::printf("[ seed ] %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

struct Mode {
  DType dtype;
  double tol;  // ‖out − ref‖ / ‖ref‖
};
const Mode kModes[] = {{DType::kF32, 2e-5}, {DType::kBF16, 2e-2}};

std::unique_ptr<CudaBackend> backend_or_skip(DType dtype) {
  auto b = CudaBackend::create(dtype);
  if (!b.ok()) return nullptr;
  return std::move(b).value();
}
#define CUDA_BACKEND_OR_SKIP(be, dtype)                              \
  auto be = backend_or_skip(dtype);                                  \
  if (!be) GTEST_SKIP() << "no usable CUDA device: GPU test skipped"

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen); }
  Tensor tensor(Shape shape, float lo = -1.0f, float hi = 1.0f) {
    Tensor t = Tensor::empty(DType::kF32, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = uniform(lo, hi);
    return t;
  }
};

// Device copy of a host F32 tensor in `dtype` (persistent, so it outlives begin_step) and the exact
// values the device holds, as host doubles.
struct Dev {
  Tensor d;
  std::vector<double> h;
};
Dev put(CudaBackend& be, const Tensor& host, DType dtype) {
  Dev x{be.upload(host, dtype), {}};
  const Tensor back = be.to_host(x.d);
  x.h.assign(back.f32(), back.f32() + back.numel());
  return x;
}
Tensor poisoned(CudaBackend& be, DType dtype, Shape shape) {
  Tensor t = be.alloc_persistent(dtype, shape);
  be.fill(t, NAN);
  return t;
}
std::vector<double> get(CudaBackend& be, const Tensor& t) {
  const Tensor h = be.to_host(t);
  return std::vector<double>(h.f32(), h.f32() + h.numel());
}

void expect_close(const std::vector<double>& out, const std::vector<double>& ref, double tol, const std::string& what) {
  ASSERT_EQ(out.size(), ref.size()) << what;
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_FALSE(std::isnan(out[i])) << what << ": NaN (unwritten or invalid) at " << i;
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  const double rel = std::sqrt(num / std::max(den, 1e-300));
  EXPECT_LE(rel, tol) << what << ": relative error " << rel;
}

double sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// A step layout over `lens` new tokens with `cached` earlier ones each, slots reversed (so slot ≠
// sequence index) and pages handed out in a shuffled order.
SeqLayout make_layout(const std::vector<int>& lens, const std::vector<int>& cached, int64_t page_size, Rng& rng) {
  SeqLayout l;
  l.page_size = page_size;
  const int64_t b = static_cast<int64_t>(lens.size());
  l.cu_seqlens = {0};
  int64_t max_pages = 1;
  for (int64_t i = 0; i < b; ++i) {
    l.cu_seqlens.push_back(l.cu_seqlens.back() + lens[i]);
    l.cached.push_back(cached[i]);
    l.slots.push_back(static_cast<int32_t>(b - 1 - i));
    max_pages = std::max<int64_t>(max_pages, (cached[i] + lens[i] + page_size - 1) / page_size);
  }
  l.max_pages = max_pages;
  std::vector<int32_t> pages(b * max_pages);
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(i);
  std::shuffle(pages.begin(), pages.end(), rng.gen);
  l.page_table.assign(b * max_pages, -1);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t p = 0; p < (cached[i] + lens[i] + page_size - 1) / page_size; ++p)
      l.page_table[i * max_pages + p] = pages[i * max_pages + p];
  return l;
}

// ---------------------------------------------------------------- elementwise, norms, gemm

TEST(CudaOps, NormsActivationsLinear) {
  for (const Mode& mode : kModes) {
    CUDA_BACKEND_OR_SKIP(be, mode.dtype);
    Rng rng(seed_for_test());
    for (int64_t n : {1, 63, 1000}) {
      SCOPED_TRACE("dtype " + std::string(dtype_name(mode.dtype)) + " n " + std::to_string(n));
      const int64_t c = 320, m = 200;
      Dev x = put(*be, rng.tensor({n, c}), mode.dtype), w = put(*be, rng.tensor({c}, 0.5f, 1.5f), mode.dtype);
      Dev gate = put(*be, rng.tensor({n, c}, -3, 3), mode.dtype), wl = put(*be, rng.tensor({m, c}), mode.dtype);
      // rms_norm, gated_rms_norm (rows of 64)
      Tensor y = poisoned(*be, mode.dtype, {n, c});
      be->rms_norm(x.d, w.d, 1e-6f, y);
      std::vector<double> ref(n * c);
      for (int64_t r = 0; r < n; ++r) {
        double ss = 0;
        for (int64_t j = 0; j < c; ++j) ss += x.h[r * c + j] * x.h[r * c + j];
        const double s = 1.0 / std::sqrt(ss / c + 1e-6);
        for (int64_t j = 0; j < c; ++j) ref[r * c + j] = x.h[r * c + j] * s * w.h[j];
      }
      expect_close(get(*be, y), ref, mode.tol, "rms_norm");
      Dev w64 = put(*be, rng.tensor({64}, 0.5f, 1.5f), mode.dtype);
      Tensor yg = poisoned(*be, mode.dtype, {n, c});
      be->gated_rms_norm(x.d, w64.d, gate.d, 1e-5f, yg);
      for (int64_t r = 0; r < n * c / 64; ++r) {
        double ss = 0;
        for (int64_t j = 0; j < 64; ++j) ss += x.h[r * 64 + j] * x.h[r * 64 + j];
        const double s = 1.0 / std::sqrt(ss / 64 + 1e-5);
        for (int64_t j = 0; j < 64; ++j)
          ref[r * 64 + j] = x.h[r * 64 + j] * s * w64.h[j] * sigm(gate.h[r * 64 + j]);
      }
      expect_close(get(*be, yg), ref, mode.tol, "gated_rms_norm");
      // glu: SiLU and SiTU with a linear beta
      for (Activation kind : {Activation::kSilu, Activation::kSitu}) {
        GluParams p{kind, 2.0f, kind == Activation::kSitu ? std::optional<float>(3.0f) : std::nullopt};
        Tensor o = poisoned(*be, mode.dtype, {n, c / 2});
        be->glu(gate.d, p, o);
        std::vector<double> gr(n * c / 2);
        for (int64_t r = 0; r < n; ++r)
          for (int64_t j = 0; j < c / 2; ++j) {
            const double g = gate.h[r * c + j], u = gate.h[r * c + c / 2 + j];
            gr[r * c / 2 + j] = kind == Activation::kSilu
                                    ? g * sigm(g) * u
                                    : 2.0 * std::tanh(g / 2.0) * sigm(g) * 3.0 * std::tanh(u / 3.0);
          }
        expect_close(get(*be, o), gr, mode.tol, "glu");
      }
      // linear into the activation dtype and into F32
      for (DType yd : {mode.dtype, DType::kF32}) {
        Tensor yl = poisoned(*be, yd, {n, m});
        be->linear(x.d, wl.d, yl);
        std::vector<double> lr(n * m, 0.0);
        for (int64_t r = 0; r < n; ++r)
          for (int64_t o = 0; o < m; ++o)
            for (int64_t j = 0; j < c; ++j) lr[r * m + o] += x.h[r * c + j] * wl.h[o * c + j];
        expect_close(get(*be, yl), lr, mode.tol, "linear");
      }
      // add, sigmoid_mul, sigmoid
      Tensor acc = be->upload(be->to_host(x.d), mode.dtype);
      be->add(acc, gate.d);
      std::vector<double> ar(n * c);
      for (int64_t i = 0; i < n * c; ++i) ar[i] = x.h[i] + gate.h[i];
      expect_close(get(*be, acc), ar, mode.tol, "add");
      Tensor sm = be->upload(be->to_host(x.d), mode.dtype);
      be->sigmoid_mul(sm, gate.d);
      for (int64_t i = 0; i < n * c; ++i) ar[i] = x.h[i] * sigm(gate.h[i]);
      expect_close(get(*be, sm), ar, mode.tol, "sigmoid_mul");
      Tensor sg = poisoned(*be, DType::kF32, {n, c});
      be->sigmoid(gate.d, sg);
      for (int64_t i = 0; i < n * c; ++i) ar[i] = sigm(gate.h[i]);
      expect_close(get(*be, sg), ar, mode.tol, "sigmoid");
    }
  }
}

// ---------------------------------------------------------------- KDA

struct KdaCase {
  std::vector<int> lens;
  KdaGate gate;
  float a_log_hi;  // A = exp(A_log) up to e^hi: large values give cumulative decay far below −100
  int64_t heads, dk, dv;
};
const KdaCase kKdaCases[] = {
    {{1}, KdaGate::kSoftplus, 0.5f, 2, 128, 128},
    {{63}, KdaGate::kLowerBound, 0.5f, 2, 128, 128},
    {{64}, KdaGate::kSoftplus, 2.77f, 2, 128, 128},
    {{65}, KdaGate::kLowerBound, 0.5f, 2, 128, 128},
    {{1000}, KdaGate::kSoftplus, 0.5f, 2, 128, 128},
    {{1000}, KdaGate::kSoftplus, 2.77f, 1, 128, 128},
    {{65, 1, 130, 64, 7}, KdaGate::kSoftplus, 1.0f, 3, 128, 128},
    {{1, 1, 1, 1}, KdaGate::kLowerBound, 0.5f, 2, 128, 128},
    {{5, 70}, KdaGate::kSoftplus, 0.5f, 2, 32, 48},
};

TEST(CudaOps, KdaBothFormsAgainstTheTokenRecurrence) {
  for (const Mode& mode : kModes) {
    CUDA_BACKEND_OR_SKIP(be, mode.dtype);
    Rng rng(seed_for_test());
    for (const KdaCase& kc : kKdaCases) {
      const int64_t H = kc.heads, dk = kc.dk, dv = kc.dv, B = static_cast<int64_t>(kc.lens.size());
      SeqLayout layout = make_layout(kc.lens, std::vector<int>(B, 0), 64, rng);
      const int64_t N = layout.num_rows();
      SCOPED_TRACE("dtype " + std::string(dtype_name(mode.dtype)) + " rows " + std::to_string(N) + " seqs " +
                   std::to_string(B) + " gate " + std::to_string(static_cast<int>(kc.gate)) + " dk " +
                   std::to_string(dk));
      be->begin_step();
      be->upload_layout(layout);
      Dev q = put(*be, rng.tensor({N, H, dk}), mode.dtype), k = put(*be, rng.tensor({N, H, dk}), mode.dtype);
      Dev v = put(*be, rng.tensor({N, H, dv}), mode.dtype);
      Dev f = put(*be, rng.tensor({N, H * dk}, -3, 3), mode.dtype);
      Dev dt = put(*be, rng.tensor({H * dk}, -1, 1), DType::kF32), alog = put(*be, rng.tensor({H}, -1, kc.a_log_hi), DType::kF32);
      Dev beta = put(*be, rng.tensor({N, H}, 0.05f, 1.0f), DType::kF32);
      Dev s0 = put(*be, rng.tensor({B, H, dk, dv}, -0.5f, 0.5f), DType::kF32);
      // gate
      const KdaGateParams gp{kc.gate, -5.0f};
      Tensor g = poisoned(*be, DType::kF32, {N, H, dk});
      be->kda_gate(f.d, dt.d, alog.d, gp, g.view({N, H * dk}));
      const std::vector<double> gv = get(*be, g);
      std::vector<double> gref(N * H * dk);
      for (int64_t i = 0; i < N * H * dk; ++i) {
        const double x = f.h[i] + dt.h[i % (H * dk)], a = std::exp(alog.h[(i % (H * dk)) / dk]);
        gref[i] = kc.gate == KdaGate::kSoftplus ? -a * (x > 20 ? x : std::log1p(std::exp(x))) : -5.0 * sigm(a * x);
      }
      expect_close(gv, gref, 2e-5, "kda_gate");
      // reference: the token recurrence in double from each sequence's slot
      std::vector<double> ref(N * H * dv), sref(s0.h);
      for (int64_t b = 0; b < B; ++b) {
        const int64_t slot = layout.slots[b];
        for (int64_t h = 0; h < H; ++h) {
          double* S = sref.data() + (slot * H + h) * dk * dv;
          for (int64_t t = layout.cu_seqlens[b]; t < layout.cu_seqlens[b + 1]; ++t) {
            const int64_t base = (t * H + h) * dk;
            double nq = 0, nk = 0;
            for (int64_t j = 0; j < dk; ++j) nq += q.h[base + j] * q.h[base + j], nk += k.h[base + j] * k.h[base + j];
            nq = 1.0 / std::sqrt(dk) / std::sqrt(nq + 1e-6);
            nk = 1.0 / std::sqrt(nk + 1e-6);
            std::vector<double> u(dv);
            for (int64_t j = 0; j < dk; ++j)
              for (int64_t c = 0; c < dv; ++c) S[j * dv + c] *= std::exp(gv[base + j]);
            for (int64_t c = 0; c < dv; ++c) {
              double ks = 0;
              for (int64_t j = 0; j < dk; ++j) ks += S[j * dv + c] * k.h[base + j] * nk;
              u[c] = beta.h[t * H + h] * (v.h[(t * H + h) * dv + c] - ks);
            }
            for (int64_t j = 0; j < dk; ++j)
              for (int64_t c = 0; c < dv; ++c) S[j * dv + c] += k.h[base + j] * nk * u[c];
            for (int64_t c = 0; c < dv; ++c) {
              double o = 0;
              for (int64_t j = 0; j < dk; ++j) o += S[j * dv + c] * q.h[base + j] * nq;
              ref[(t * H + h) * dv + c] = o;
            }
          }
        }
      }
      for (bool chunked : {true, false}) {
        Tensor states = be->upload(be->to_host(s0.d), DType::kF32);
        Tensor o = poisoned(*be, mode.dtype, {N, H, dv});
        const KdaArgs args{q.d, k.d, v.d, g, beta.d, states, o};
        if (chunked)
          be->kda_chunked(args, layout);
        else
          be->kda_recurrent(args, layout);
        const std::string form = chunked ? "kda_chunked" : "kda_recurrent";
        // bf16 outputs round once; fp32 state and math otherwise, so the state stays tight.
        expect_close(get(*be, o), ref, mode.dtype == DType::kF32 ? 2e-5 : 1e-2, form + " out");
        expect_close(get(*be, states), sref, mode.dtype == DType::kF32 ? 2e-5 : 1e-3, form + " state");
      }
    }
  }
}

TEST(CudaOps, ShortConvMixedBatchContinuesFromItsSlots) {
  for (const Mode& mode : kModes) {
    CUDA_BACKEND_OR_SKIP(be, mode.dtype);
    Rng rng(seed_for_test());
    for (const std::vector<int>& lens : {std::vector<int>{1}, {1, 2, 65}, {1000, 3}, {64, 63, 1, 1}}) {
      const int64_t c = 96, kc = 4, B = static_cast<int64_t>(lens.size());
      SeqLayout layout = make_layout(lens, std::vector<int>(B, 0), 64, rng);
      const int64_t N = layout.num_rows();
      be->begin_step();
      be->upload_layout(layout);
      Dev x = put(*be, rng.tensor({N, c}), mode.dtype), w = put(*be, rng.tensor({c, kc}), mode.dtype);
      Dev st = put(*be, rng.tensor({B, kc - 1, c}), mode.dtype);
      Tensor states = be->upload(be->to_host(st.d), mode.dtype);
      Tensor o = poisoned(*be, mode.dtype, {N, c});
      be->short_conv(ConvArgs{x.d, w.d, states, o}, layout);
      std::vector<double> ref(N * c), sref(st.h);
      for (int64_t b = 0; b < B; ++b) {
        const int64_t slot = layout.slots[b], r0 = layout.cu_seqlens[b], T = lens[b];
        auto win = [&](int64_t r, int64_t ch) {
          return r < kc - 1 ? st.h[(slot * (kc - 1) + r) * c + ch] : x.h[(r0 + r - (kc - 1)) * c + ch];
        };
        for (int64_t t = 0; t < T; ++t)
          for (int64_t ch = 0; ch < c; ++ch) {
            double a = 0;
            for (int64_t j = 0; j < kc; ++j) a += w.h[ch * kc + j] * win(t + j, ch);
            ref[(r0 + t) * c + ch] = a * sigm(a);
          }
        for (int64_t r = 0; r < kc - 1; ++r)
          for (int64_t ch = 0; ch < c; ++ch) sref[(slot * (kc - 1) + r) * c + ch] = win(T + r, ch);
      }
      expect_close(get(*be, o), ref, mode.tol, "short_conv out");
      expect_close(get(*be, states), sref, mode.dtype == DType::kF32 ? 1e-7 : 4e-3, "short_conv state");
    }
  }
}

// ---------------------------------------------------------------- MLA

TEST(CudaOps, MlaPrefillAndDecodeOverThePagedCache) {
  struct Case {
    std::vector<int> lens, cached;
  };
  const Case cases[] = {{{1}, {0}}, {{63}, {0}}, {{65}, {64}}, {{1, 1, 1}, {0, 70, 1000}}, {{5, 1, 200}, {3, 129, 0}}};
  for (const Mode& mode : kModes) {
    CUDA_BACKEND_OR_SKIP(be, mode.dtype);
    Rng rng(seed_for_test());
    const int64_t H = 4, n = 32, r = 16, c = 64, vd = 32, ps = 16, width = c + r;
    const float scale = 1.0f / std::sqrt(static_cast<float>(n + r));
    for (const Case& cs : cases) {
      const int64_t B = static_cast<int64_t>(cs.lens.size());
      SeqLayout layout = make_layout(cs.lens, cs.cached, ps, rng);
      const int64_t N = layout.num_rows();
      be->begin_step();
      be->upload_layout(layout);
      Dev pages = put(*be, rng.tensor({B * layout.max_pages, ps, width}), mode.dtype);
      Dev rows = put(*be, rng.tensor({N, width}), mode.dtype);
      Dev q = put(*be, rng.tensor({N, H, n + r}), mode.dtype), kvb = put(*be, rng.tensor({H * (n + vd), c}, -0.3f, 0.3f), mode.dtype);
      be->mla_cache_write(rows.d, pages.d, layout);
      const std::vector<double> ph = get(*be, pages.d);
      // the new rows landed where the page table says
      auto cache_row = [&](int64_t b, int64_t pos) {
        return (int64_t{layout.page_table[b * layout.max_pages + pos / ps]} * ps + pos % ps) * width;
      };
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < cs.lens[b]; ++t)
          for (int64_t j = 0; j < width; ++j)
            ASSERT_EQ(ph[cache_row(b, cs.cached[b] + t) + j], rows.h[(layout.cu_seqlens[b] + t) * width + j]);
      // reference: expanded attention in double
      std::vector<double> ref(N * H * vd);
      for (int64_t b = 0; b < B; ++b) {
        const int64_t tc = cs.cached[b] + cs.lens[b];
        for (int64_t h = 0; h < H; ++h) {
          std::vector<double> kn(tc * n), vv(tc * vd);
          for (int64_t p = 0; p < tc; ++p) {
            const double* lat = ph.data() + cache_row(b, p);
            for (int64_t o = 0; o < n + vd; ++o) {
              double a = 0;
              for (int64_t j = 0; j < c; ++j) a += lat[j] * kvb.h[(h * (n + vd) + o) * c + j];
              (o < n ? kn[p * n + o] : vv[p * vd + o - n]) = a;
            }
          }
          for (int64_t t = 0; t < cs.lens[b]; ++t) {
            const int64_t row = layout.cu_seqlens[b] + t, vis = cs.cached[b] + t + 1;
            const double* qq = q.h.data() + (row * H + h) * (n + r);
            std::vector<double> s(vis);
            double mx = -1e300;
            for (int64_t p = 0; p < vis; ++p) {
              double a = 0;
              for (int64_t j = 0; j < n; ++j) a += qq[j] * kn[p * n + j];
              for (int64_t j = 0; j < r; ++j) a += qq[n + j] * ph[cache_row(b, p) + c + j];
              s[p] = a * scale;
              mx = std::max(mx, s[p]);
            }
            double z = 0;
            for (double& x : s) z += (x = std::exp(x - mx));
            for (int64_t d = 0; d < vd; ++d) {
              double o = 0;
              for (int64_t p = 0; p < vis; ++p) o += s[p] / z * vv[p * vd + d];
              ref[(row * H + h) * vd + d] = o;
            }
          }
        }
      }
      for (bool decode : {false, true}) {
        Tensor o = poisoned(*be, mode.dtype, {N, H, vd});
        const MlaArgs args{q.d, pages.d, kvb.d, scale, o};
        if (decode)
          be->mla_decode(args, layout);
        else
          be->mla_prefill(args, layout);
        expect_close(get(*be, o), ref, mode.tol, decode ? "mla_decode" : "mla_prefill");
      }
    }
  }
}

// ---------------------------------------------------------------- MoE, AttnRes, memory

TEST(CudaOps, RouterAndExperts) {
  for (const Mode& mode : kModes) {
    CUDA_BACKEND_OR_SKIP(be, mode.dtype);
    Rng rng(seed_for_test());
    for (int64_t n : {1, 65, 300}) {
      const int64_t E = 64, K = 6, din = 96, F = 40, dout = 80;
      const RouteParams rp{static_cast<int>(K), 8, 4, true, 2.5f};
      be->begin_step();
      Dev logits = put(*be, rng.tensor({n, E}, -4, 4), DType::kF32), bias = put(*be, rng.tensor({E}, -0.5f, 0.5f), DType::kF32);
      Tensor idx = be->alloc_persistent(DType::kI32, {n, K});
      Tensor wts = poisoned(*be, DType::kF32, {n, K});
      be->moe_route(logits.d, bias.d, rp, idx, wts);
      const Tensor ih = be->to_host(idx);
      const std::vector<double> wh = get(*be, wts);
      std::vector<double> wref(n * K);
      for (int64_t t = 0; t < n; ++t) {
        std::vector<double> score(E), choice(E), gs(8);
        for (int64_t e = 0; e < E; ++e) score[e] = sigm(logits.h[t * E + e]), choice[e] = score[e] + bias.h[e];
        std::vector<int> order(E);
        for (int g = 0; g < 8; ++g) {
          std::vector<double> m(choice.begin() + g * 8, choice.begin() + g * 8 + 8);
          std::sort(m.rbegin(), m.rend());
          gs[g] = m[0] + m[1];
        }
        std::vector<int> gi(8);
        std::iota(gi.begin(), gi.end(), 0);
        std::stable_sort(gi.begin(), gi.end(), [&](int a, int b) { return gs[a] > gs[b]; });
        std::vector<bool> keep(8, false);
        for (int i = 0; i < 4; ++i) keep[gi[i]] = true;
        for (int64_t e = 0; e < E; ++e)
          if (!keep[e / 8]) choice[e] = -INFINITY;
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return choice[a] > choice[b]; });
        double sum = 0;
        for (int i = 0; i < K; ++i) sum += score[order[i]];
        for (int i = 0; i < K; ++i) {
          ASSERT_EQ(ih.data_as<int32_t>()[t * K + i], order[i]) << "token " << t << " choice " << i;
          wref[t * K + i] = score[order[i]] / (sum + 1e-20) * 2.5;
        }
      }
      expect_close(wh, wref, 1e-6, "moe_route weights");
      // experts on that routing
      Dev x = put(*be, rng.tensor({n, din}), mode.dtype);
      Dev w13 = put(*be, rng.tensor({E, 2 * F, din}, -0.2f, 0.2f), mode.dtype), w2 = put(*be, rng.tensor({E, dout, F}, -0.2f, 0.2f), mode.dtype);
      Tensor o = poisoned(*be, mode.dtype, {n, dout});
      be->moe_experts(x.d, idx, wts, w13.d, w2.d, GluParams{}, o);
      std::vector<double> ref(n * dout, 0.0);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < K; ++i) {
          const int64_t e = ih.data_as<int32_t>()[t * K + i];
          std::vector<double> a(F);
          for (int64_t j = 0; j < F; ++j) {
            double g = 0, u = 0;
            for (int64_t d = 0; d < din; ++d) {
              g += w13.h[(e * 2 * F + j) * din + d] * x.h[t * din + d];
              u += w13.h[(e * 2 * F + F + j) * din + d] * x.h[t * din + d];
            }
            a[j] = g * sigm(g) * u;
          }
          for (int64_t d = 0; d < dout; ++d) {
            double y = 0;
            for (int64_t j = 0; j < F; ++j) y += w2.h[(e * dout + d) * F + j] * a[j];
            ref[t * dout + d] += wh[t * K + i] * y;
          }
        }
      expect_close(get(*be, o), ref, mode.tol, "moe_experts");
    }
  }
}

TEST(CudaOps, AttnResEmbeddingGatherCopies) {
  for (const Mode& mode : kModes) {
    CUDA_BACKEND_OR_SKIP(be, mode.dtype);
    Rng rng(seed_for_test());
    const int64_t n = 65, d = 200, m = 5;
    std::vector<Dev> cands;
    std::vector<Tensor> cd;
    for (int64_t i = 0; i < m; ++i) cands.push_back(put(*be, rng.tensor({n, d}, -2, 2), mode.dtype)), cd.push_back(cands.back().d);
    Dev e = put(*be, rng.tensor({d}), DType::kF32);
    Tensor o = poisoned(*be, mode.dtype, {n, d});
    be->attn_res_read(cd, e.d, 1e-6f, o);
    std::vector<double> ref(n * d, 0.0);
    for (int64_t r = 0; r < n; ++r) {
      std::vector<double> lg(m);
      for (int64_t i = 0; i < m; ++i) {
        double ss = 0, dot = 0;
        for (int64_t j = 0; j < d; ++j) ss += cands[i].h[r * d + j] * cands[i].h[r * d + j], dot += cands[i].h[r * d + j] * e.h[j];
        lg[i] = dot / std::sqrt(ss / d + 1e-6);
      }
      const double mx = *std::max_element(lg.begin(), lg.end());
      double z = 0;
      for (double& l : lg) z += (l = std::exp(l - mx));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < d; ++j) ref[r * d + j] += lg[i] / z * cands[i].h[r * d + j];
    }
    expect_close(get(*be, o), ref, mode.tol, "attn_res_read");
    // embedding, gather_rows, copy_columns: exact copies
    std::vector<int32_t> ids{3, 0, 64, 3, 10};
    be->begin_step();
    const Tensor ids_d = be->to_device(Tensor::wrap(DType::kI32, {5}, ids.data(), nullptr, Device::kCpu), DType::kI32);
    Tensor emb = poisoned(*be, mode.dtype, {5, d});
    be->embedding(ids_d, cands[0].d, emb);
    Tensor gat = poisoned(*be, mode.dtype, {5, d});
    be->gather_rows(cands[1].d, ids_d, gat);
    Tensor cols = poisoned(*be, mode.dtype, {n, 30});
    be->fill(cols, 1.5f);
    be->copy_columns(cands[2].d, 7, cols, 3, 20);
    const std::vector<double> eh = get(*be, emb), gh = get(*be, gat), ch = get(*be, cols);
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t j = 0; j < d; ++j) {
        ASSERT_EQ(eh[i * d + j], cands[0].h[ids[i] * d + j]);
        ASSERT_EQ(gh[i * d + j], cands[1].h[ids[i] * d + j]);
      }
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < 30; ++j)
        ASSERT_EQ(ch[r * 30 + j], j >= 3 && j < 23 ? cands[2].h[r * d + 7 + j - 3] : 1.5) << r << "," << j;
  }
}

TEST(CudaOps, StepArenaRewindsToTheSameAddresses) {
  CUDA_BACKEND_OR_SKIP(be, DType::kBF16);
  std::vector<void*> first, second;
  for (std::vector<void*>* run : {&first, &second}) {
    be->begin_step();
    for (int64_t n : {10, 1 << 20, 300, 1 << 26}) run->push_back(be->alloc(DType::kBF16, {n}).data());
  }
  be->begin_step();  // after the arena grew once, a third step sees the merged block's addresses
  std::vector<void*> third;
  for (int64_t n : {10, 1 << 20, 300, 1 << 26}) third.push_back(be->alloc(DType::kBF16, {n}).data());
  be->begin_step();
  std::vector<void*> fourth;
  for (int64_t n : {10, 1 << 20, 300, 1 << 26}) fourth.push_back(be->alloc(DType::kBF16, {n}).data());
  EXPECT_EQ(third, fourth);
}

}  // namespace
}  // namespace klinear
