// `klinear kda`: the KDA core alone on .npy files, forward and (with --backward) backward, one
// sequence on one rank. q and k are used as given (normalise them before), q is scaled by dk^-1/2
// inside (KdaQkNorm::kGiven); the forward runs kda_chunked, the backward kda_chunked_backward.
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "cli_util.h"
#include "commands.h"
#include "io/file.h"
#include "io/npy.h"

namespace klinear::cli {
namespace {

struct KdaCmdArgs {
  std::string inputs, out, device = "cpu", dtype;
  bool backward = false;
};

std::string in_dir(const KdaCmdArgs& a, const std::string& name) {
  return (std::filesystem::path(a.inputs) / (name + ".npy")).string();
}

// `name`.npy of the inputs, absent when optional and missing; its shape must be `expect`.
Result<std::optional<Tensor>> read_input(const KdaCmdArgs& a, const std::string& name, const Shape& expect,
                                         bool optional) {
  const std::string path = in_dir(a, name);
  KL_ASSIGN_OR_RETURN(PathKind kind, path_kind(path));
  if (kind == PathKind::kMissing) {
    if (optional) return std::optional<Tensor>();
    return Status::NotFound(path + ": missing (expected float32 " + shape_to_string(expect) + ")");
  }
  KL_ASSIGN_OR_RETURN(Tensor t, read_npy(path));
  if (t.shape() != expect)
    return Status::InvalidArgument(path + ": expected shape " + shape_to_string(expect) + ", got " +
                                   shape_to_string(t.shape()));
  return std::optional<Tensor>(std::move(t));
}

Status write_output(const KdaCmdArgs& a, Backend& be, const std::string& name, const Tensor& t, const Shape& shape) {
  return write_npy((std::filesystem::path(a.out) / (name + ".npy")).string(), be.to_host(t).view(shape));
}

Status run_kda(const KdaCmdArgs& a) {
  KL_ASSIGN_OR_RETURN(Device device, parse_device(a.device));
  KL_ASSIGN_OR_RETURN(DType dtype, parse_compute_dtype(a.dtype, device));
  if (device == Device::kCuda)
    return Status::NotSupported("--device cuda: q and k as given (not normalised inside) and the backward are not "
                                "implemented on CUDA yet (issue 37); use --device cpu");
  // q fixes T, H and dk; v fixes dv.
  KL_ASSIGN_OR_RETURN(Tensor q, read_npy(in_dir(a, "q")));
  if (q.rank() != 3 || q.dim(0) < 1 || q.dim(0) > std::numeric_limits<int32_t>::max() || q.dim(1) < 1 ||
      q.dim(2) < 1)
    return Status::InvalidArgument(in_dir(a, "q") + ": expected shape [T, H, Dk] with every size at least 1 (T below "
                                   "2^31), got " + shape_to_string(q.shape()));
  KL_ASSIGN_OR_RETURN(Tensor v, read_npy(in_dir(a, "v")));
  const int64_t t_len = q.dim(0), heads = q.dim(1), dk = q.dim(2);
  if (v.rank() != 3 || v.dim(0) != t_len || v.dim(1) != heads || v.dim(2) < 1)
    return Status::InvalidArgument(in_dir(a, "v") + ": expected shape [" + std::to_string(t_len) + ", " +
                                   std::to_string(heads) + ", Dv] (T and H of q.npy), got " +
                                   shape_to_string(v.shape()));
  const int64_t dv = v.dim(2);
  const Shape qk{t_len, heads, dk}, vs{t_len, heads, dv}, state{heads, dk, dv};
  KL_ASSIGN_OR_RETURN(std::optional<Tensor> k, read_input(a, "k", qk, false));
  KL_ASSIGN_OR_RETURN(std::optional<Tensor> g, read_input(a, "g", qk, false));
  KL_ASSIGN_OR_RETURN(std::optional<Tensor> beta, read_input(a, "beta", {t_len, heads}, false));
  KL_ASSIGN_OR_RETURN(std::optional<Tensor> h0, read_input(a, "h0", state, true));
  std::optional<Tensor> d_out, d_ht;
  if (a.backward) {
    KL_ASSIGN_OR_RETURN(d_out, read_input(a, "do", vs, false));
    KL_ASSIGN_OR_RETURN(d_ht, read_input(a, "dht", state, true));
  }
  KL_ASSIGN_OR_RETURN(PathKind out_kind, path_kind(a.out));
  if (out_kind != PathKind::kDirectory) return Status::NotFound("--out " + a.out + ": not a directory");

  KL_ASSIGN_OR_RETURN(std::unique_ptr<Backend> be, make_backend(BackendOptions{device, dtype}));
  be->begin_step();
  SeqLayout layout;
  layout.cu_seqlens = {0, static_cast<int32_t>(t_len)};
  layout.cached = {0};
  layout.slots = {0};
  be->upload_layout(layout);
  const DType act = be->activation_dtype();
  auto f32 = [&](const Tensor& host) { return be->to_device(host, DType::kF32); };
  auto state_or_undefined = [&](const std::optional<Tensor>& t) { return t ? f32(t->view({1, heads, dk, dv})) : Tensor(); };
  const Tensor dq_in = be->to_device(q, act), dk_in = be->to_device(*k, act), dv_in = be->to_device(v, act);
  const Tensor dg_in = f32(*g), dbeta_in = f32(*beta);

  Tensor states = be->alloc_persistent(DType::kF32, {1, heads, dk, dv});
  if (h0) be->copy(f32(*h0).view({1, heads, dk, dv}), states);
  else be->fill(states, 0.0f);
  const Tensor o = be->alloc(act, vs);
  be->kda_chunked({dq_in, dk_in, dv_in, dg_in, dbeta_in, states, o, KdaQkNorm::kGiven}, layout);
  KL_RETURN_IF_ERROR(write_output(a, *be, "o", o, vs));
  KL_RETURN_IF_ERROR(write_output(a, *be, "ht", states, state));
  if (!a.backward) return Status();

  KdaBackwardArgs b{dq_in, dk_in, dv_in, dg_in, dbeta_in, state_or_undefined(h0), be->to_device(*d_out, act),
                    state_or_undefined(d_ht), KdaQkNorm::kGiven, be->alloc(act, qk), be->alloc(act, qk),
                    be->alloc(act, vs), be->alloc(DType::kF32, qk), be->alloc(DType::kF32, {t_len, heads}),
                    be->alloc(DType::kF32, {1, heads, dk, dv})};
  be->kda_chunked_backward(b, layout);
  KL_RETURN_IF_ERROR(write_output(a, *be, "dq", b.dq, qk));
  KL_RETURN_IF_ERROR(write_output(a, *be, "dk", b.dk, qk));
  KL_RETURN_IF_ERROR(write_output(a, *be, "dv", b.dv, vs));
  KL_RETURN_IF_ERROR(write_output(a, *be, "dg", b.dg, qk));
  KL_RETURN_IF_ERROR(write_output(a, *be, "dbeta", b.dbeta, {t_len, heads}));
  return write_output(a, *be, "dh0", b.dh0, state);
}

}  // namespace

void add_kda_commands(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<KdaCmdArgs>();
  CLI::App* sub = app.add_subcommand(
      "kda",
      "Run the KDA core (MODEL.md 4.5) on one sequence from .npy files: q, k [T, H, Dk] (used as given: normalise "
      "them first; q is scaled by Dk^-1/2 inside), v [T, H, Dv], g [T, H, Dk] (log decay), beta [T, H], optional "
      "h0 [H, Dk, Dv]; writes o.npy and ht.npy. With --backward it also reads do [T, H, Dv] and optional "
      "dht [H, Dk, Dv] and writes dq, dk, dv, dg, dbeta and dh0 .npy.");
  sub->add_option("--inputs", a->inputs, "Directory with the input .npy files (float32)")->required();
  sub->add_option("--out", a->out, "Existing directory the output .npy files are written to")->required();
  sub->add_flag("--backward", a->backward, "Also compute the gradients (CPU only so far)");
  add_device_options(sub, a->device, a->dtype);
  sub->callback([a, &exit_code] {
    const Status s = run_kda(*a);
    exit_code = s.ok() ? 0 : fail("kda", s);
  });
}

}  // namespace klinear::cli
