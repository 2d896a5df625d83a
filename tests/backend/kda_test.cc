// The KDA core on every backend row: both forms against the kda-op fixture (the HF recurrence,
// T=200 not a multiple of 64, non-zero initial state, run as a batch of its sequences), and both
// forms against a plain double-precision recurrence over a case table of mixed batches (lengths
// around the chunk size and up to 1000, head dims up to 128, decode rows, both gate forms with
// strong decay, zero and non-zero states, slots out of order), the affine segment summary against
// kda_chunked and against itself composed, and the gate forms on hand-checked values.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backend_cases.h"
#include "io/safetensors.h"
#include "kda_reference.h"
#include "test_util.h"
#if KLINEAR_WITH_CUDA
#include "backend/cuda/backend.h"
#include "backend/cuda/kda/kda_chunked.h"
#endif

namespace klinear {
namespace {

using testing::all_close;

enum class Form { kChunked, kRecurrent };
const char* form_name(Form f) { return f == Form::kChunked ? "chunked" : "recurrent"; }

class KdaOps : public testing::BackendTest {
 public:
  void run(Form form, const KdaArgs& a, const SeqLayout& layout) {
    if (form == Form::kChunked) be().kda_chunked(a, layout);
    else be().kda_recurrent(a, layout);
  }
  // Against the double recurrence over random cases: a recurrence's depth (test_util.h).
  double case_tol() const { return tol(testing::kRecurrence); }

  // Gates through the CPU gate op: f random with strong decay (A up to e^2.5, lower bound −5: the
  // cumulative log decay falls far below −100 inside a chunk, and inside 16 rows), times `decay`
  // (0.01: the state, and a segment's map A, stay of order 1 over hundreds of rows).
  static Tensor gates(std::mt19937_64& rng, int64_t n, int64_t H, int64_t d, KdaGate gate, float decay = 1.0f) {
    Tensor f = testing::random_tensor(rng, {n, H * d}, -3.0f, 3.0f);
    Tensor dt = testing::random_tensor(rng, {H * d});
    Tensor a_log = testing::random_tensor(rng, {H}, 0.0f, 2.5f);
    Tensor g = Tensor::empty(DType::kF32, {n, H, d});
    auto cpu = make_backend(BackendOptions{});
    (*cpu)->kda_gate(f, dt, a_log, {gate, -5.0f}, g.view({n, H * d}));
    for (int64_t i = 0; i < g.numel(); ++i) g.f32()[i] *= decay;
    return g;
  }
  // A case's trace: heads, head dim, sequence lengths, gate form and decay factor.
  static std::string case_name(int64_t H, int64_t d, const std::vector<int32_t>& lens, KdaGate gate, float decay) {
    std::string what = "H " + std::to_string(H) + " d " + std::to_string(d) + " lens";
    for (int32_t l : lens) what += " " + std::to_string(l);
    what += gate == KdaGate::kSoftplus ? " softplus" : " lower-bound";
    what += " decay ×" + std::to_string(decay);
    return what;
  }
};

Tensor host_copy(const Tensor& t) {
  Tensor c = Tensor::empty(DType::kF32, t.shape());
  convert_to_f32(t.dtype(), t.data(), c.f32(), static_cast<size_t>(t.numel()));
  return c;
}

Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta, Tensor& states,
                 const SeqLayout& layout);

TEST_P(KdaOps, FixtureBothForms) {
  auto f = SafetensorsFile::open(testing::fixture_path("kda-op/kda.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto get = [&](const char* n) { return host_copy(f->tensor(*f->find(n))); };
  const Tensor q = get("q"), v = get("v");
  const int64_t B = q.dim(0), T = q.dim(1), H = q.dim(2), D = q.dim(3);
  std::mt19937_64 rng(testing::fresh_seed());
  std::vector<int32_t> slots(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) slots[b] = static_cast<int32_t>(B - 1 - b);  // reversed slots
  SeqLayout layout = testing::make_layout(std::vector<int32_t>(B, static_cast<int32_t>(T)), std::vector<int32_t>(B, 0),
                                          slots, 64, 64, rng);
  be().upload_layout(layout);
  auto rows = [&](const Tensor& t) { return t.view({B * T, H, t.numel() / (B * T * H)}); };
  // Sequence b's state lives in slot B−1−b.
  Tensor s0 = get("initial_state"), s0_slots = Tensor::empty(DType::kF32, s0.shape());
  Tensor final_expect = get("final_state"), final_slots = Tensor::empty(DType::kF32, s0.shape());
  const size_t per = static_cast<size_t>(H * D * D) * sizeof(float);
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(s0_slots.f32() + slots[b] * H * D * D, s0.f32() + b * H * D * D, per);
    std::memcpy(final_slots.f32() + slots[b] * H * D * D, final_expect.f32() + b * H * D * D, per);
  }
  const Tensor k = get("k"), g = get("g"), beta = get("beta").view({B * T, H});
  Tensor expect_out = rows(get("out"));
  if (act() != DType::kF32) {
    // q, k, v reach the backend rounded to its activation dtype; a near-orthogonal q·k turns that
    // input rounding alone into a few % of a row. Below F32 the op is held to the double recurrence
    // over the values the backend holds (the fixture itself is matched by the F32 rows).
    std::memcpy(final_slots.data(), s0_slots.data(), s0_slots.nbytes());
    expect_out = reference(host(dev(rows(q))), host(dev(rows(k))), host(dev(rows(v))), rows(g), beta, final_slots, layout);
  }
  for (Form form : {Form::kChunked, Form::kRecurrent}) {
    SCOPED_TRACE(form_name(form));
    Tensor states = persistent(s0_slots, DType::kF32);
    Tensor out = poisoned({B * T, H, D});
    run(form, KdaArgs{dev(rows(q)), dev(rows(k)), dev(rows(v)), dev(rows(g), DType::kF32), dev(beta, DType::kF32), states, out},
        layout);
    EXPECT_TRUE(all_close(host(out), expect_out, tol())) << "out";
    EXPECT_TRUE(all_close(host(states), final_slots, tol())) << "final state";
  }
}

// MODEL.md 4.5 in double precision, sequence by sequence, updating `states` [slots, H, dk, dv] and
// writing the layout's snapshots into their slots.
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta, Tensor& states,
                 const SeqLayout& layout) {
  const int64_t H = q.dim(1), dk = q.dim(2), dv = v.dim(2);
  Tensor out = Tensor::empty(DType::kF32, {q.dim(0), H, dv});
  for (int64_t b = 0; b < layout.num_seqs(); ++b)
    for (int64_t h = 0; h < H; ++h) {
      float* Sf = states.f32() + (layout.slots[b] * H + h) * dk * dv;
      std::vector<double> S(Sf, Sf + dk * dv);
      for (int64_t t = layout.cu_seqlens[b]; t < layout.cu_seqlens[b + 1]; ++t) {
        const float* qh = q.f32() + (t * H + h) * dk;
        const float* kh = k.f32() + (t * H + h) * dk;
        const std::vector<double> qt = testing::kda_prepared_double(qh, dk, 1.0 / std::sqrt(double(dk)), KdaQkNorm::kInside);
        const std::vector<double> kt = testing::kda_prepared_double(kh, dk, 1.0, KdaQkNorm::kInside);
        std::vector<double> o(dv);
        testing::kda_token_double(qt, kt, g.f32() + (t * H + h) * dk, v.f32() + (t * H + h) * dv,
                                  double(beta.f32()[t * H + h]), dk, dv, S.data(), o.data());
        for (int64_t c = 0; c < dv; ++c) out.f32()[(t * H + h) * dv + c] = float(o[c]);
        for (size_t s = 0; s < layout.snap_seq.size(); ++s)
          if (layout.snap_seq[s] == b && layout.snap_pos[s] == t + 1 - layout.cu_seqlens[b]) {
            float* dst = states.f32() + (layout.snap_slot[s] * H + h) * dk * dv;
            for (int64_t i = 0; i < dk * dv; ++i) dst[i] = float(S[i]);
          }
      }
      for (int64_t i = 0; i < dk * dv; ++i) Sf[i] = float(S[i]);
    }
  return out;
}

struct KdaCase {
  std::vector<int32_t> lens, cached;  // per sequence: new rows, positions before them
  int64_t heads, d;
  KdaGate gate;
  bool zero_state;
  float decay = 1.0f;  // g = decay · the gate op's g (0.01: a segment's map A stays of order 1)
};

class KdaCases : public KdaOps {
 public:
  static const std::vector<KdaCase>& cases() {
    static const std::vector<KdaCase> c = {
        {{1}, {0}, 2, 16, KdaGate::kSoftplus, false},
        {{63}, {0}, 2, 16, KdaGate::kLowerBound, false},
        {{64}, {0}, 3, 32, KdaGate::kSoftplus, true},
        {{65}, {0}, 2, 32, KdaGate::kLowerBound, true},
        {{150}, {10}, 2, 32, KdaGate::kSoftplus, false},
        {{200}, {0}, 4, 32, KdaGate::kLowerBound, false},
        {{131}, {0}, 1, 64, KdaGate::kSoftplus, false},
        // Mixed steps: prefill chunks of several lengths beside decode rows.
        {{1, 65, 1, 7, 130}, {9, 0, 300, 64, 5}, 2, 32, KdaGate::kSoftplus, false},
        {{3, 1, 64, 1}, {0, 1, 128, 2}, 2, 16, KdaGate::kLowerBound, false},
        {{1, 1, 1, 1, 1, 1}, {4, 5, 6, 7, 8, 9}, 3, 16, KdaGate::kSoftplus, false},
        // The real head dim (128: a GPU state tile's full height) over 16 chunks, and in a mix.
        {{1000}, {0}, 1, 128, KdaGate::kSoftplus, false},
        {{65, 1, 130, 7}, {0, 40, 0, 3}, 2, 128, KdaGate::kLowerBound, false},
        {{1000}, {0}, 1, 128, KdaGate::kLowerBound, false},
        // Eight sequences of a varlen prefill at the real head dim.
        {{64, 200, 1, 63, 128, 65, 30, 129}, {0, 0, 0, 0, 0, 0, 0, 0}, 2, 128, KdaGate::kSoftplus, false},
        // A head dim that is not a multiple of 16 (the bf16 tensor-core path does not take it).
        {{70, 3}, {0, 0}, 2, 24, KdaGate::kSoftplus, false},
        // Weak decay, where the state carries across a whole sequence (and a split's maps matter).
        {{1000}, {0}, 1, 128, KdaGate::kSoftplus, false, 0.01f},
        {{300, 1, 200, 650}, {0, 3, 0, 0}, 2, 64, KdaGate::kLowerBound, false, 0.01f},
    };
    return c;
  }
};

TEST_P(KdaCases, BothFormsMatchTheRecurrence) {
  std::mt19937_64 rng(testing::fresh_seed());
  for (const KdaCase& c : KdaCases::cases()) {
    const int64_t seqs = static_cast<int64_t>(c.lens.size()), slots = seqs + 2;
    std::vector<int32_t> slot_of(static_cast<size_t>(slots));
    std::iota(slot_of.begin(), slot_of.end(), 0);
    std::shuffle(slot_of.begin(), slot_of.end(), rng);
    slot_of.resize(static_cast<size_t>(seqs));
    SeqLayout layout = testing::make_layout(c.lens, c.cached, slot_of, 64, 64, rng);
    be().upload_layout(layout);
    const int64_t n = layout.num_rows(), H = c.heads, d = c.d;
    SCOPED_TRACE(case_name(H, d, c.lens, c.gate, c.decay));

    const Shape nhd{n, H, d};
    Tensor q = testing::random_tensor(rng, nhd), k = testing::random_tensor(rng, nhd), v = testing::random_tensor(rng, nhd);
    const Tensor g = gates(rng, n, H, d, c.gate, c.decay);
    Tensor beta = testing::random_tensor(rng, {n, H}, 0.0f, 1.0f);
    Tensor s0 = c.zero_state ? Tensor::zeros(DType::kF32, {slots, H, d, d}) : testing::random_tensor(rng, {slots, H, d, d}, -0.5f, 0.5f);

    Tensor s_ref = Tensor::empty(DType::kF32, s0.shape());
    std::memcpy(s_ref.data(), s0.data(), s0.nbytes());
    // The reference runs on q, k, v as the backend holds them (rounded to its activation dtype),
    // so the tolerance measures the op and not the rounding of its inputs (see FixtureBothForms).
    const Tensor o_ref = reference(host(dev(q)), host(dev(k)), host(dev(v)), g, beta, s_ref, layout);
    const double t = case_tol();
    // The op's operands on fresh states and a poisoned output.
    auto fresh = [&] {
      return KdaArgs{dev(q), dev(k), dev(v), dev(g, DType::kF32), dev(beta, DType::kF32), persistent(s0, DType::kF32),
                     poisoned(nhd)};
    };
    // Runs `op` on fresh operands and compares its output and states with the reference.
    auto check = [&](const std::string& name, const std::function<void(const KdaArgs&)>& op) {
      const KdaArgs a = fresh();
      op(a);
      EXPECT_TRUE(all_close(host(a.out), o_ref, t)) << name << " out";
      EXPECT_TRUE(all_close(host(a.states), s_ref, t)) << name << " states (untouched slots included)";
    };
    for (Form form : {Form::kChunked, Form::kRecurrent})
      check(form_name(form), [&](const KdaArgs& a) { run(form, a, layout); });
#if KLINEAR_WITH_CUDA
    // Every path that takes these operands, named (the op runs one of them: kda_chunked_path_for).
    auto* cuda = dynamic_cast<cuda::CudaBackend*>(&be());
    for (cuda::KdaChunkedPath path : {cuda::KdaChunkedPath::kTensorCore, cuda::KdaChunkedPath::kFp32})
      if (cuda != nullptr && cuda::kda_chunked_path_fits(path, fresh()))
        check(std::string("path ") + cuda::kda_chunked_path_name(path) + ":",
              [&](const KdaArgs& a) { cuda::kda_chunked_on(*cuda, path, a, layout); });
    // The tensor-core prefill at every state-pass width (the op picks one by the grid's size), and
    // with every sequence of enough chunks split into segments (the op splits by the grid's cost).
    if (cuda != nullptr && act() == DType::kBF16 && (d == 16 || d == 32 || d == 64 || d == 128)) {
      for (int cols : {16, 32, 64})
        check(std::to_string(cols) + " state columns, unsplit:", [&](const KdaArgs& a) {
          cuda::kda_chunked_variant(*cuda, a, layout, cuda::KdaChunkedVariant{cols, 1});
        });
      for (int segments : {3, 5})
        check(std::to_string(segments) + " segments:", [&](const KdaArgs& a) {
          const cuda::KdaChunkedVariant split{0, segments};
          cuda::kda_chunked_variant(*cuda, a, layout, split);
        });
      // The two launches apart over a workspace held outside the step (as ops_bench times them).
      check("prep, then the state pass:", [&](const KdaArgs& a) {
        const Tensor ws = cuda::kda_tc_workspace(*cuda, a, layout);
        cuda::kda_tc_prep(*cuda, a, layout, ws);
        cuda::kda_tc_state(*cuda, a, layout, ws, cuda::KdaChunkedVariant{});
      });
    }
#endif
  }
}

// Snapshots (prefix caching): the state of a sequence after chunk boundaries and at its end copied
// into other slots of the pool by the op itself, every other slot untouched.
TEST_P(KdaOps, SnapshotsAtChunkBoundariesAndEnds) {
  std::mt19937_64 rng(testing::fresh_seed());
  const std::vector<int32_t> lens{200, 64, 130, 1, 100};
  const int64_t seqs = static_cast<int64_t>(lens.size()), H = 2, d = 64, slots = seqs + 8;
  SeqLayout layout =
      testing::make_layout(lens, std::vector<int32_t>(seqs, 0), {3, 0, 4, 1, 2}, 64, 64, rng);
  // (sequence, rows before, slot): boundaries inside sequences, ends on and off a boundary.
  const std::vector<std::array<int32_t, 3>> snaps{{0, 64, 5},  {0, 128, 6}, {0, 200, 7}, {1, 64, 8},
                                                  {2, 128, 9}, {3, 1, 10},  {2, 130, 11}};
  for (const auto& [b, pos, slot] : snaps) {
    layout.snap_seq.push_back(b);
    layout.snap_pos.push_back(pos);
    layout.snap_slot.push_back(slot);
  }
  be().upload_layout(layout);
  const int64_t n = layout.num_rows();
  const Shape nhd{n, H, d};
  Tensor q = testing::random_tensor(rng, nhd), k = testing::random_tensor(rng, nhd), v = testing::random_tensor(rng, nhd);
  for (KdaGate gate : {KdaGate::kSoftplus, KdaGate::kLowerBound}) {
    SCOPED_TRACE(gate == KdaGate::kSoftplus ? "softplus" : "lower-bound");
    const Tensor g = gates(rng, n, H, d, gate);
    Tensor beta = testing::random_tensor(rng, {n, H}, 0.0f, 1.0f);
    Tensor s0 = testing::random_tensor(rng, {slots, H, d, d}, -0.5f, 0.5f);
    Tensor s_ref = Tensor::empty(DType::kF32, s0.shape());
    std::memcpy(s_ref.data(), s0.data(), s0.nbytes());
    const Tensor o_ref = reference(host(dev(q)), host(dev(k)), host(dev(v)), g, beta, s_ref, layout);
    std::vector<std::pair<std::string, std::function<void(const KdaArgs&)>>> ops;
    for (Form form : {Form::kChunked, Form::kRecurrent})
      ops.emplace_back(form_name(form), [&, form](const KdaArgs& a) { run(form, a, layout); });
#if KLINEAR_WITH_CUDA
    // The sequence split: snapshots at the ends of segments and inside them.
    if (auto* cuda = dynamic_cast<cuda::CudaBackend*>(&be()); cuda != nullptr && act() == DType::kBF16)
      ops.emplace_back("3 segments", [&, cuda](const KdaArgs& a) {
        cuda::kda_chunked_variant(*cuda, a, layout, cuda::KdaChunkedVariant{0, 3});
      });
#endif
    for (const auto& [name, op] : ops) {
      Tensor states = persistent(s0, DType::kF32);
      Tensor out = poisoned(nhd);
      op(KdaArgs{dev(q), dev(k), dev(v), dev(g, DType::kF32), dev(beta, DType::kF32), states, out});
      EXPECT_TRUE(all_close(host(out), o_ref, case_tol())) << name << " out";
      const Tensor got = host(states);
      EXPECT_TRUE(all_close(got, s_ref, case_tol())) << name << " states and snapshots";
      for (const auto& [b, pos, slot] : snaps) {  // each snapshot slot on its own
        EXPECT_TRUE(all_close(got.rows(slot, slot + 1).view({H * d, d}), s_ref.rows(slot, slot + 1).view({H * d, d}),
                              case_tol()))
            << name << " snapshot of sequence " << b << " after " << pos << " rows";
      }
    }
  }
}

// The affine summary of a segment (kda_summary, MODEL.md 4.9) on random cases: per
// sequence and head, A·S_start + B equals kda_chunked's end state from a random non-zero S_start
// (and B its end state from zero), and the summaries of a sequence cut in two at a random row
// compose, (A2·A1, A2·B1 + B2), into the summary of the whole. Strong decay (the gate op's) drives
// A of a long sequence to 0, so the cases also run it with g scaled by 1/100, where A stays of
// order 1 over 200 rows. A and B are compared as the rows [A | B] of the augmented map (the error
// of A measured at the scale of the map's effect on a unit start state, never vacuous).
struct SummaryCase {
  std::vector<int32_t> lens;  // per sequence: new rows
  int64_t heads, d;           // dk = dv = d
  KdaGate gate;
  float decay;                // g = decay · the gate op's g
};

class KdaSummary : public KdaOps {
 public:
  static const std::vector<SummaryCase>& cases() {
    static const std::vector<SummaryCase> c = {
        {{1}, 2, 16, KdaGate::kSoftplus, 1.0f},
        {{63}, 2, 32, KdaGate::kLowerBound, 1.0f},
        {{64}, 2, 128, KdaGate::kSoftplus, 1.0f},
        {{65}, 1, 128, KdaGate::kLowerBound, 0.01f},
        {{200}, 2, 32, KdaGate::kSoftplus, 1.0f},
        {{200}, 2, 32, KdaGate::kLowerBound, 0.01f},
        {{200}, 1, 128, KdaGate::kLowerBound, 1.0f},
        {{200}, 1, 128, KdaGate::kSoftplus, 0.01f},
        // Mixed batches, an empty sequence among them (A = I, B = 0).
        {{65, 1, 0, 200, 7, 64}, 2, 32, KdaGate::kLowerBound, 1.0f},
        {{130, 3, 64, 1}, 2, 16, KdaGate::kSoftplus, 0.01f},
        {{64, 200, 1, 63}, 2, 128, KdaGate::kSoftplus, 0.01f},
        // A head dim that is not a multiple of 16.
        {{70, 3, 200}, 2, 24, KdaGate::kLowerBound, 1.0f},
        {{200, 65}, 2, 24, KdaGate::kSoftplus, 0.01f},
    };
    return c;
  }

  // (A, B) of the layout's sequences on this backend, outputs poisoned first; host [B, H, d, d] each.
  std::pair<Tensor, Tensor> summary(const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                                    SeqLayout& layout, int64_t H, int64_t d) {
    be().upload_layout(layout);
    const Shape shape{layout.num_seqs(), H, d, d};
    Tensor a = poisoned(shape, DType::kF32), b = poisoned(shape, DType::kF32);
    be().kda_summary(KdaSummaryArgs{dev(k), dev(v), dev(g, DType::kF32), dev(beta, DType::kF32), a, b}, layout);
    return {host(a), host(b)};
  }
  // kda_chunked's end states from `s0` [B, H, d, d] (sequence b in slot b).
  Tensor chunked_end(const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta, SeqLayout& layout,
                     const Tensor& s0, std::mt19937_64& rng) {
    be().upload_layout(layout);
    const Shape nhd{layout.num_rows(), s0.dim(1), s0.dim(2)};
    Tensor states = persistent(s0, DType::kF32), out = poisoned(nhd);
    be().kda_chunked(KdaArgs{dev(testing::random_tensor(rng, nhd)), dev(k), dev(v), dev(g, DType::kF32),
                             dev(beta, DType::kF32), states, out},
                     layout);
    return host(states);
  }
};

// Per (sequence, head) block of d rows: y ← x·y + z in double (x, y, z [..., d, d]; z may be empty).
Tensor affine(const Tensor& x, const Tensor& y, const Tensor* z) {
  const int64_t d = x.dim(-1), blocks = x.numel() / (d * d);
  Tensor r = Tensor::empty(DType::kF32, y.shape());
  for (int64_t blk = 0; blk < blocks; ++blk)
    for (int64_t i = 0; i < d; ++i)
      for (int64_t c = 0; c < d; ++c) {
        double acc = z != nullptr ? z->f32()[(blk * d + i) * d + c] : 0.0;
        for (int64_t j = 0; j < d; ++j) acc += double(x.f32()[(blk * d + i) * d + j]) * y.f32()[(blk * d + j) * d + c];
        r.f32()[(blk * d + i) * d + c] = float(acc);
      }
  return r;
}

// The rows [A | B] of (A, B) [S, H, d, d], as [S·H·d, 2d].
Tensor augmented(const Tensor& a, const Tensor& b) {
  const int64_t d = a.dim(-1), rows = a.numel() / d;
  Tensor r = Tensor::empty(DType::kF32, {rows, 2 * d});
  for (int64_t i = 0; i < rows; ++i) {
    std::copy(a.f32() + i * d, a.f32() + (i + 1) * d, r.f32() + i * 2 * d);
    std::copy(b.f32() + i * d, b.f32() + (i + 1) * d, r.f32() + i * 2 * d + d);
  }
  return r;
}

TEST_P(KdaSummary, AppliesAsTheChunkedStateAndComposes) {
  std::mt19937_64 rng(testing::fresh_seed());
  const double t = case_tol();
  double worst_apply = 0, worst_zero = 0, worst_compose = 0;
  for (const SummaryCase& c : KdaSummary::cases()) {
    const int64_t seqs = static_cast<int64_t>(c.lens.size()), H = c.heads, d = c.d;
    std::vector<int32_t> in_order(static_cast<size_t>(seqs));
    std::iota(in_order.begin(), in_order.end(), 0);
    SeqLayout whole = testing::make_layout(c.lens, std::vector<int32_t>(seqs, 0), in_order, 64, 64, rng);
    const int64_t n = whole.num_rows();
    SCOPED_TRACE(case_name(H, d, c.lens, c.gate, c.decay));

    const Tensor k = testing::random_tensor(rng, {n, H, d}), v = testing::random_tensor(rng, {n, H, d});
    const Tensor g = gates(rng, n, H, d, c.gate, c.decay);
    const Tensor beta = testing::random_tensor(rng, {n, H}, 0.0f, 1.0f);
    const auto [A, B] = summary(k, v, g, beta, whole, H, d);

    // Applied to a random start state, and to zero.
    const Tensor s0 = testing::random_tensor(rng, {seqs, H, d, d}, -0.5f, 0.5f);
    const testing::ErrorStats apply = testing::error_stats(affine(A, s0, &B), chunked_end(k, v, g, beta, whole, s0, rng));
    const testing::ErrorStats zero = testing::error_stats(B, chunked_end(k, v, g, beta, whole, Tensor::zeros(DType::kF32, s0.shape()), rng));
    EXPECT_TRUE(apply.problem.empty() && apply.worst() <= t)
        << "A·S_start + B vs kda_chunked: " << apply.problem << " error " << apply.worst();
    EXPECT_TRUE(zero.problem.empty() && zero.worst() <= t)
        << "B vs kda_chunked from zero: " << zero.problem << " error " << zero.worst();

    // Each sequence cut at a random row (0 and its length included: an empty segment composes as
    // the identity); the segments are sequences 2b and 2b+1 of a layout over the same rows.
    std::vector<int32_t> cut_lens;
    for (int32_t len : c.lens) {
      const int32_t p = std::uniform_int_distribution<int32_t>(0, len)(rng);
      cut_lens.insert(cut_lens.end(), {p, len - p});
    }
    std::vector<int32_t> cut_slots(cut_lens.size());
    std::iota(cut_slots.begin(), cut_slots.end(), 0);
    SeqLayout cut = testing::make_layout(cut_lens, std::vector<int32_t>(cut_lens.size(), 0), cut_slots, 64, 64, rng);
    const auto [A12, B12] = summary(k, v, g, beta, cut, H, d);
    // Segment `part` (0: first, 1: second) of every sequence, from the cut layout's [2·seqs, H, d, d].
    const int64_t per = H * d * d;
    auto segment = [&](const Tensor& both, int64_t part) {
      Tensor r = Tensor::empty(DType::kF32, A.shape());
      for (int64_t b = 0; b < seqs; ++b)
        std::copy(both.f32() + (2 * b + part) * per, both.f32() + (2 * b + part + 1) * per, r.f32() + b * per);
      return r;
    };
    const Tensor a1 = segment(A12, 0), a2 = segment(A12, 1), b1 = segment(B12, 0), b2 = segment(B12, 1);
    const testing::ErrorStats compose =
        testing::error_stats(augmented(affine(a2, a1, nullptr), affine(a2, b1, &b2)), augmented(A, B));
    EXPECT_TRUE(compose.problem.empty() && compose.worst() <= t)
        << "[A2·A1 | A2·B1 + B2] vs [A | B] of the whole: " << compose.problem << " error " << compose.worst();
    worst_apply = std::max(worst_apply, apply.worst());
    worst_zero = std::max(worst_zero, zero.worst());
    worst_compose = std::max(worst_compose, compose.worst());
  }
  std::printf("[ errors ] A·S+B vs chunked %.3g, B vs chunked from 0 %.3g, composed vs whole %.3g (tolerance %.3g)\n",
              worst_apply, worst_zero, worst_compose, t);
}

// The gate forms themselves (MODEL.md 4.3) on hand-checked values.
TEST_P(KdaOps, GateForms) {
  Tensor f = Tensor::from_f32({1, 2}, {0.5f, 30.0f});
  Tensor dt = Tensor::from_f32({2}, {0.25f, -1.0f});
  Tensor a_log = Tensor::from_f32({1}, {std::log(2.0f)});
  Tensor g = poisoned({1, 2}, DType::kF32);
  be().kda_gate(dev(f, DType::kF32), persistent(dt, DType::kF32), persistent(a_log, DType::kF32),
                {KdaGate::kSoftplus, 0.0f}, g);
  Tensor gh = host(g);
  EXPECT_NEAR(gh.f32()[0], -2.0f * std::log1p(std::exp(0.75f)), 1e-6);
  EXPECT_NEAR(gh.f32()[1], -2.0f * 29.0f, 1e-4);  // softplus is the identity above 20
  be().kda_gate(dev(f, DType::kF32), persistent(dt, DType::kF32), persistent(a_log, DType::kF32),
                {KdaGate::kLowerBound, -5.0f}, g);
  gh = host(g);
  EXPECT_NEAR(gh.f32()[0], -5.0f / (1.0f + std::exp(-2.0f * 0.75f)), 1e-6);
  EXPECT_NEAR(gh.f32()[1], -5.0f, 1e-5);
}

KL_BACKEND_SUITE(KdaOps);
KL_BACKEND_SUITE(KdaCases);
KL_BACKEND_SUITE(KdaSummary);

}  // namespace
}  // namespace klinear
