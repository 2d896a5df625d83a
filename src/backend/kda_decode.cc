// kda_decode's checks and its composition from the other ops (MODEL.md 4.8), which is the CPU's
// kda_decode and the reference of the fused CUDA kernel; the composition is also what the model
// runs for the rows kda_decode does not take (kda_rows_by_ops).
#include "backend/backend.h"

namespace klinear {

KdaDecodeDims check_kda_decode(const KdaDecodeArgs& a, const SeqLayout& decode) {
  KdaDecodeDims d{a.qkv.defined() ? a.qkv.dim(0) : 0, a.a_log.numel(), 0, a.o_norm.numel(), 0, 0};
  const std::string what = "kda_decode: qkv " + shape_to_string(a.qkv.shape()) + " conv_w " +
                           shape_to_string(a.conv_w.shape()) + " conv_states " + shape_to_string(a.conv_states.shape()) +
                           " f " + shape_to_string(a.f.shape()) + " dt_bias " + shape_to_string(a.dt_bias.shape()) +
                           " A_log " + shape_to_string(a.a_log.shape()) + " beta " +
                           shape_to_string(a.beta_logits.shape()) + " og " + shape_to_string(a.og.shape()) +
                           " o_norm " + shape_to_string(a.o_norm.shape()) + " states " +
                           shape_to_string(a.states.shape()) + " y " + shape_to_string(a.y.shape());
  KL_CHECK(d.heads > 0 && a.dt_bias.numel() % d.heads == 0 && a.qkv.rank() == 2 && a.conv_w.rank() == 2 &&
               a.conv_states.rank() == 3 && a.states.rank() == 4,
           what);
  d.dk = a.dt_bias.numel() / d.heads;
  d.channels = a.qkv.dim(1);
  d.kc = a.conv_w.dim(1);
  const int64_t n = d.rows, h = d.heads;
  KL_CHECK(d.channels == h * (2 * d.dk + d.dv) && a.conv_w.dim(0) == d.channels && d.kc >= 1 &&
               a.conv_states.dim(1) == d.kc - 1 && a.conv_states.dim(2) == d.channels &&
               a.f.numel() == n * h * d.dk && a.beta_logits.numel() == n * h && a.og.numel() == n * h * d.dv &&
               a.y.numel() == n * h * d.dv && a.states.dim(1) == h && a.states.dim(2) == d.dk &&
               a.states.dim(3) == d.dv && a.states.dim(0) == a.conv_states.dim(0) && a.f.dtype() == DType::kF32 &&
               a.dt_bias.dtype() == DType::kF32 && a.a_log.dtype() == DType::kF32 &&
               a.beta_logits.dtype() == DType::kF32 && a.states.dtype() == DType::kF32,
           what);
  KL_CHECK(decode.num_rows() == n && decode.num_rows() == decode.num_seqs() && decode.snap_seq.empty(),
           what + ": the layout must give one row per sequence and no snapshots; it has " +
               std::to_string(decode.num_seqs()) + " sequences, " + std::to_string(decode.num_rows()) + " rows, " +
               std::to_string(decode.snap_seq.size()) + " snapshots");
  for (int64_t b = 0; b < decode.num_seqs(); ++b)
    KL_CHECK(decode.new_tokens(b) == 1 && decode.slots[b] >= 0 && decode.slots[b] < a.states.dim(0),
             what + ": sequence " + std::to_string(b) + " has " + std::to_string(decode.new_tokens(b)) +
                 " rows in slot " + std::to_string(decode.slots[b]) + " (want 1 row in a slot of the pool)");
  return d;
}

void kda_rows_by_ops(Backend& be, const KdaDecodeArgs& a, const SeqLayout& layout,
                     const std::function<void(const KdaArgs&)>& delta_rule) {
  const int64_t n = a.qkv.dim(0), H = a.a_log.numel(), dk = a.dt_bias.numel() / H, dv = a.o_norm.numel();
  const int64_t qk = H * dk, vw = H * dv;
  const DType act = be.activation_dtype();
  Tensor conv = be.alloc(act, {n, a.qkv.dim(1)});
  be.short_conv(ConvArgs{a.qkv, a.conv_w, a.conv_states, conv}, layout);
  Tensor q = be.alloc(act, {n, H, dk}), k = be.alloc(act, {n, H, dk}), v = be.alloc(act, {n, H, dv});
  be.copy_columns(conv, 0, q.view({n, qk}), 0, qk);
  be.copy_columns(conv, qk, k.view({n, qk}), 0, qk);
  be.copy_columns(conv, 2 * qk, v.view({n, vw}), 0, vw);
  Tensor g = be.alloc(DType::kF32, {n, H, dk});
  be.kda_gate(a.f.view({n, qk}), a.dt_bias, a.a_log, a.gate, g.view({n, qk}));
  Tensor beta = be.alloc(DType::kF32, {n, H});
  be.sigmoid(a.beta_logits.view({n, H}), beta);
  Tensor o = be.alloc(act, {n, H, dv});
  delta_rule(KdaArgs{q, k, v, g, beta, a.states, o});
  be.gated_rms_norm(o.view({n * H, dv}), a.o_norm, a.og.view({n * H, dv}), a.eps, a.y.view({n * H, dv}));
}

void kda_decode_by_ops(Backend& be, const KdaDecodeArgs& a, const SeqLayout& decode) {
  const KdaDecodeDims d = check_kda_decode(a, decode);
  const int64_t H = d.heads, qk = H * d.dk, vw = H * d.dv;
  // Sequences [b0, b1) hold rows [b0, b1) (one row each).
  auto run = [&](int64_t b0, int64_t b1) {
    SeqLayout part = decode.part(b0, b1);
    be.upload_layout(part);
    KdaDecodeArgs rows = a;
    rows.qkv = a.qkv.rows(b0, b1);
    rows.f = a.f.view({d.rows, qk}).rows(b0, b1);
    rows.beta_logits = a.beta_logits.view({d.rows, H}).rows(b0, b1);
    rows.og = a.og.view({d.rows, vw}).rows(b0, b1);
    rows.y = a.y.view({d.rows, vw}).rows(b0, b1);
    kda_rows_by_ops(be, rows, part, [&](const KdaArgs& k) { be.kda_recurrent(k, part); });
  };
  auto padded = [&](int64_t b) { return decode.slots[b] == a.pad_slot; };
  int64_t b0 = 0;
  for (int64_t b = 0; b <= decode.num_seqs(); ++b) {
    if (b < decode.num_seqs() && !padded(b)) continue;
    if (b > b0) run(b0, b);
    if (b < decode.num_seqs()) be.fill(a.y.view({d.rows, vw}).rows(b, b + 1), 0.0f);
    b0 = b + 1;
  }
}

}  // namespace klinear
