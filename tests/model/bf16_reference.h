// What a reduced-precision (bf16) whole-model run is compared with (tests only).
//
// The tiny random fixture models route each token among experts whose router scores are often a
// rounding apart. One bf16 rounding then picks another expert and the recurrent layers carry the
// difference to every later token: free-running bf16 logits drift 0.3-1.0 (relative) from the
// fp32 goldens however right every op is. Measured on the fixtures' prefill cases with the
// emulation below (2026-12-01): free routing 0.03-1.0; under the reference's routing 0.009-0.12.
// So a bf16 run is checked in two parts:
//   - under the fp32 reference's routing (RouteTrace records it on the CPU and replays it), its
//     logits must be within twice the error of an independent bf16 evaluation of the same math,
//     Bf16Storage (the CPU reference with every bf16-stored tensor rounded to bf16 where it is
//     stored, as the bf16 backend stores them), and never looser than the row's tolerance;
//   - running free, its greedy tokens must equal the reference's wherever the reference's top-2
//     margin is above the measured error (tests/model/fixtures_test.cc).
#pragma once

#include <algorithm>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "io/config.h"

namespace klinear::testing {

// The MoE layers of a model: the layers a RouteTrace record has.
inline size_t moe_layers(const ModelConfig& c) {
  size_t n = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) n += c.ffn(l) == Ffn::kMoe;
  return n;
}

// Forwards every op to another backend; the decorators below override what they change. Step
// graphs are not forwarded (Backend's default runs each step eagerly): a decorator's own work,
// such as a replayed routing copied to the device, cannot be captured.
class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : in_(inner) {}

  Device device() const override { return in_.device(); }
  const char* name() const override { return in_.name(); }
  DType activation_dtype() const override { return in_.activation_dtype(); }
  size_t weight_element_bytes() const override { return in_.weight_element_bytes(); }
  uint64_t available_bytes() const override { return in_.available_bytes(); }
  void begin_step() override { in_.begin_step(); }
  Tensor alloc(DType d, const Shape& s) override { return in_.alloc(d, s); }
  Tensor alloc_persistent(DType d, const Shape& s) override { return in_.alloc_persistent(d, s); }
  void fill(const Tensor& t, float v) override { in_.fill(t, v); }
  void random_fill(const Tensor& t, uint64_t seed, float lo, float hi, const FillWindow& w) override {
    in_.random_fill(t, seed, lo, hi, w);
  }
  Tensor upload(const Tensor& h, DType d) override { return in_.upload(h, d); }
  ExpertMatrix upload_mxfp4(const Tensor& p, const Tensor& s) override { return in_.upload_mxfp4(p, s); }
  Mxfp4Storage mxfp4_storage() const override { return in_.mxfp4_storage(); }
  Tensor to_device(const Tensor& h, DType d) override { return in_.to_device(h, d); }
  void upload_layout(SeqLayout& l) override { in_.upload_layout(l); }
  void write(const Tensor& h, const Tensor& d) override { in_.write(h, d), stored(d); }
  Tensor to_host(const Tensor& t) override { return in_.to_host(t); }
  void copy(const Tensor& s, const Tensor& d) override { in_.copy(s, d), stored(d); }
  void copy_columns(const Tensor& s, int64_t sc, const Tensor& d, int64_t dc, int64_t w) override {
    in_.copy_columns(s, sc, d, dc, w), stored(d);
  }
  void gather_rows(const Tensor& s, const Tensor& r, const Tensor& o) override { in_.gather_rows(s, r, o), stored(o); }
  void embedding(const EmbeddingArgs& a) override { in_.embedding(a), stored(a.out); }
  void add(const Tensor& a, const Tensor& x) override { in_.add(a, x), stored(a); }
  void sigmoid_mul(const Tensor& x, const Tensor& g) override { in_.sigmoid_mul(x, g), stored(x); }
  void sigmoid(const Tensor& x, const Tensor& y) override { in_.sigmoid(x, y), stored(y); }
  void glu(const Tensor& gu, const GluParams& p, const Tensor& o) override { in_.glu(gu, p, o), stored(o); }
  void linear(const Tensor& x, const Tensor& w, const Tensor& y) override { in_.linear(x, w, y), stored(y); }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) override {
    in_.rms_norm(x, w, eps, y), stored(y);
  }
  void gated_rms_norm(const Tensor& o, const Tensor& w, const Tensor& g, float eps, const Tensor& y) override {
    in_.gated_rms_norm(o, w, g, eps, y), stored(y);
  }
  void add_rms_norm(const AddNormArgs& a) override { in_.add_rms_norm(a), stored(a.h), stored(a.y); }
  void short_conv(const ConvArgs& a, const SeqLayout& l) override { in_.short_conv(a, l), stored(a.out), stored(a.states); }
  void kda_gate(const Tensor& f, const Tensor& dt, const Tensor& al, const KdaGateParams& p, const Tensor& g) override {
    in_.kda_gate(f, dt, al, p, g), stored(g);
  }
  void kda_chunked(const KdaArgs& a, const SeqLayout& l) override { in_.kda_chunked(a, l), stored(a.out); }
  void kda_recurrent(const KdaArgs& a, const SeqLayout& l) override { in_.kda_recurrent(a, l), stored(a.out); }
  void kda_chunked_backward(const KdaBackwardArgs& a, const SeqLayout& l) override { in_.kda_chunked_backward(a, l); }
  void kda_recurrent_backward(const KdaBackwardArgs& a, const SeqLayout& l) override {
    in_.kda_recurrent_backward(a, l);
  }
  void kda_gate_backward(const KdaGateBackwardArgs& a) override { in_.kda_gate_backward(a); }
  void kda_summary(const KdaSummaryArgs& a, const SeqLayout& l) override { in_.kda_summary(a, l); }
  void kda_decode(const KdaDecodeArgs& a, const SeqLayout& l) override {
    in_.kda_decode(a, l), stored(a.y), stored(a.states), stored(a.conv_states);
  }
  void mla_cache_write(const Tensor& r, const Tensor& w, float eps, const Tensor& p, const SeqLayout& l) override {
    in_.mla_cache_write(r, w, eps, p, l), stored(p);
  }
  void mla_prefill(const MlaArgs& a, const SeqLayout& l) override { in_.mla_prefill(a, l), stored(a.out); }
  void mla_decode(const MlaArgs& a, const SeqLayout& l) override { in_.mla_decode(a, l), stored(a.out); }
  void moe_route(const Tensor& lg, const Tensor& b, const RouteParams& p, const Tensor& i, const Tensor& w) override {
    in_.moe_route(lg, b, p, i, w);
  }
  // The shared experts through this backend's ops, so that their outputs are stored as theirs are.
  void moe_experts(const Tensor& x, const Tensor& i, const Tensor& w, const ExpertMatrix& w13, const ExpertMatrix& w2,
                   const GluParams& p, const Tensor& o, const SharedExperts& shared) override {
    in_.moe_experts(x, i, w, w13, w2, p, o, SharedExperts{}), stored(o);
    add_shared_experts(*this, shared, p, o);
  }
  void attn_res_read(std::span<const Tensor> c, const Tensor& e, float eps, const Tensor& o) override {
    in_.attn_res_read(c, e, eps, o), stored(o);
  }
  void sample(const SampleArgs& a) override { in_.sample(a); }

 protected:
  // Called with each tensor an op has just written.
  virtual void stored(const Tensor&) {}
  Backend& in_;
};

// The fp32 CPU reference storing every tensor the model asks for in the activation dtype as bf16
// does: activation_dtype() is BF16, such tensors are F32 underneath and rounded to the nearest
// bf16 (ties to even) as each op writes them and as weights are uploaded. F32 tensors (KDA state,
// router logits, gates, β, logits) stay fp32, as on the bf16 backend.
class Bf16Storage final : public ForwardingBackend {
 public:
  explicit Bf16Storage(Backend& cpu) : ForwardingBackend(cpu) {
    KL_CHECK(cpu.device() == Device::kCpu && cpu.activation_dtype() == DType::kF32, "Bf16Storage wraps the F32 CPU");
  }
  DType activation_dtype() const override { return DType::kBF16; }
  size_t weight_element_bytes() const override { return 2; }
  void begin_step() override { step_.clear(), in_.begin_step(); }
  Tensor alloc(DType d, const Shape& s) override { return d == DType::kBF16 ? track(in_.alloc(DType::kF32, s), step_) : in_.alloc(d, s); }
  Tensor alloc_persistent(DType d, const Shape& s) override {
    return d == DType::kBF16 ? track(in_.alloc_persistent(DType::kF32, s), kept_) : in_.alloc_persistent(d, s);
  }
  Tensor upload(const Tensor& h, DType d) override {
    return d == DType::kBF16 ? track(round(in_.upload(h, DType::kF32)), kept_) : in_.upload(h, d);
  }
  ExpertMatrix upload_mxfp4(const Tensor& p, const Tensor& s) override {
    return track(round(in_.upload_mxfp4(p, s).w), kept_);
  }
  Mxfp4Storage mxfp4_storage() const override { return in_.mxfp4_storage(); }
  Tensor to_device(const Tensor& h, DType d) override {
    return d == DType::kBF16 ? track(round(in_.to_device(h, DType::kF32)), step_) : in_.to_device(h, d);
  }
  // The composition on this backend, so its intermediates (conv output, o) are stored as bf16 too.
  void kda_decode(const KdaDecodeArgs& a, const SeqLayout& l) override { kda_decode_by_ops(*this, a, l); }
  // The add, then the norm of the stream as stored (rounded), as the bf16 backend's fused op reads it.
  void add_rms_norm(const AddNormArgs& a) override { add(a.h, a.x), rms_norm(a.h, a.w, a.eps, a.y); }

 private:
  using Ranges = std::vector<std::pair<const char*, const char*>>;
  // Persistent tensors are held until the end so their memory is never reused by an F32 tensor
  // that would then be rounded (step memory is the arena's, whose ranges end with the step).
  Tensor track(Tensor t, Ranges& r) {
    const char* p = static_cast<const char*>(t.data());
    r.emplace_back(p, p + t.nbytes());
    if (&r == &kept_) held_.push_back(t);
    return t;
  }
  static Tensor round(Tensor t) {
    float* p = static_cast<float*>(t.data());
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
    return t;
  }
  void stored(const Tensor& t) override {
    const char* p = static_cast<const char*>(t.data());
    for (const Ranges* r : {&step_, &kept_})
      for (const auto& [b, e] : *r)
        if (p >= b && p < e) {
          round(t);
          return;
        }
  }
  Ranges step_, kept_;
  std::vector<Tensor> held_;
};

// Records the routing of a run (expert ids and weights, per MoE layer and row) or replays a
// record, whatever the backend computes. A row is found by its key: each layer numbers the rows it
// routes in order, so a replayed run of one sequence must call the MoE layers in the same order
// over the same tokens, in any split into steps; or the caller names the keys of the next
// forward's rows (key_rows), so that a batch of several sequences, whose rows come in another order
// than recorded, takes each row's routing by sequence and position.
class RouteTrace final : public ForwardingBackend {
 public:
  enum class Mode { kRecord, kReplay };
  struct Layer {
    std::unordered_map<int64_t, size_t> at;  // a row's key → its offset in idx and weights
    std::vector<int32_t> idx;
    std::vector<float> weights;
    int64_t next = 0;  // the key of the next row routed without named keys
  };
  using Record = std::vector<Layer>;  // one per MoE layer

  RouteTrace(Backend& inner, Mode mode, Record& record, size_t moe_layers)
      : ForwardingBackend(inner), mode_(mode), rec_(record) {
    if (mode == Mode::kRecord) rec_.assign(moe_layers, Layer{});
    KL_CHECK(rec_.size() == moe_layers, "route record of " + std::to_string(rec_.size()) + " layers, model has " +
                                            std::to_string(moe_layers));
    for (Layer& l : rec_) l.next = 0;
  }

  // The keys of the rows of the forwards that follow, in row order (empty: numbered per layer).
  void key_rows(std::vector<int64_t> keys) { keys_ = std::move(keys); }

  void moe_route(const Tensor& logits, const Tensor& bias, const RouteParams& p, const Tensor& idx,
                 const Tensor& weights) override {
    in_.moe_route(logits, bias, p, idx, weights);
    Layer& l = rec_[call_++ % rec_.size()];
    const int64_t rows = idx.dim(0), k = idx.dim(1);
    // Rows past the named keys (the padding of a fixed-size decode step) are left as routed.
    const int64_t named = keys_.empty() ? rows : static_cast<int64_t>(keys_.size());
    KL_CHECK(named <= rows, std::to_string(named) + " row keys for " + std::to_string(rows) + " routed rows");
    auto key = [&](int64_t r) { return keys_.empty() ? l.next + r : keys_[static_cast<size_t>(r)]; };
    if (mode_ == Mode::kRecord) {
      const Tensor hi = in_.to_host(idx), hw = in_.to_host(weights);
      for (int64_t r = 0; r < named; ++r) {
        KL_CHECK(l.at.emplace(key(r), l.idx.size()).second, "route row key " + std::to_string(key(r)) + " recorded twice");
        l.idx.insert(l.idx.end(), hi.data_as<const int32_t>() + r * k, hi.data_as<const int32_t>() + (r + 1) * k);
        l.weights.insert(l.weights.end(), hw.f32() + r * k, hw.f32() + (r + 1) * k);
      }
    } else {
      Tensor hi = in_.to_host(idx), hw = in_.to_host(weights);
      for (int64_t r = 0; r < named; ++r) {
        const auto it = l.at.find(key(r));
        KL_CHECK(it != l.at.end(), "route replay: row key " + std::to_string(key(r)) + " was not recorded");
        std::copy_n(l.idx.begin() + static_cast<std::ptrdiff_t>(it->second), k, hi.data_as<int32_t>() + r * k);
        std::copy_n(l.weights.begin() + static_cast<std::ptrdiff_t>(it->second), k, hw.f32() + r * k);
      }
      in_.copy(in_.to_device(hi, DType::kI32), idx);
      in_.copy(in_.to_device(hw, DType::kF32), weights);
    }
    if (keys_.empty()) l.next += rows;
  }

 private:
  Mode mode_;
  Record& rec_;
  std::vector<int64_t> keys_;
  size_t call_ = 0;
};

}  // namespace klinear::testing
