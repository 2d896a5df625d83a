// `klinear kda`: the KDA core alone on .npy files, forward and (with --backward) backward, one
// sequence. q and k are used as given (normalise them before), q is scaled by dk^-1/2 inside
// (KdaQkNorm::kGiven); the forward runs kda_chunked, the backward kda_chunked_backward. Under
// `mpirun -np P ... --context-parallel-size P` both run context-parallel (dist/kda_context.h) by
// the strategy --cp-mode names: rank r takes rows [T·r/P, T·(r+1)/P) of the inputs every rank
// reads, and rank 0 gathers the rows and writes the files.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "dist/kda_context.h"
#include "dist/mpi_comm.h"
#include "cli_util.h"
#include "commands.h"
#include "io/file.h"
#include "io/npy.h"

namespace klinear::cli {
namespace {

struct KdaCmdArgs {
  std::string inputs, out, device = "cpu", dtype, cp_mode = "p2p";
  bool backward = false;
  int context_parallel_size = 1;
  int allgather_group_size = 0;  // 0: not given
  int ulysses_degree = 0;        // 0: not given
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

// The world of a context-parallel run: the launch's ranks, as many as --context-parallel-size.
Result<std::unique_ptr<Comm>> cp_world(const KdaCmdArgs& a) {
  KL_ASSIGN_OR_RETURN(std::unique_ptr<Comm> world, open_host_world());
  if (world->size() != a.context_parallel_size)
    return Status::InvalidArgument("--context-parallel-size " + std::to_string(a.context_parallel_size) + ", but " +
                                   std::to_string(world->size()) + " rank(s) run: start it as mpirun -np " +
                                   std::to_string(a.context_parallel_size) + " klinear kda ...");
  return world;
}

// Rank 0 gets every rank's rows of `mine` (host F32 [n, ...], `width` values a row, n = the rows of
// this rank in `bounds`) in order as one [T · width] tensor; other ranks get an undefined one.
Result<Tensor> gather_rows(Comm& comm, const Tensor& mine, const std::vector<int64_t>& bounds, int64_t width) {
  int64_t most = 0;
  for (size_t r = 0; r + 1 < bounds.size(); ++r) most = std::max(most, bounds[r + 1] - bounds[r]);
  const Tensor padded = Tensor::empty(DType::kF32, {most * width}), all = Tensor::empty(DType::kF32, {comm.size() * most * width});
  std::fill(padded.f32(), padded.f32() + most * width, 0.0f);
  std::copy(mine.f32(), mine.f32() + mine.numel(), padded.f32());
  KL_RETURN_IF_ERROR(comm.all_gather({padded, all}));
  if (comm.rank() != 0) return Tensor();
  Tensor out = Tensor::empty(DType::kF32, {bounds.back() * width});
  for (int r = 0; r < comm.size(); ++r)
    std::copy(all.f32() + r * most * width, all.f32() + (r * most + bounds[r + 1] - bounds[r]) * width,
              out.f32() + bounds[r] * width);
  return out;
}

// The inputs as read (host F32); h0, d_out and d_ht as given.
struct KdaInputs {
  Tensor q, k, v, g, beta;
  std::optional<Tensor> h0, d_out, d_ht;
};

// The context-parallel run on `world`: this rank's rows forward (and backward), rank 0 writing
// what one rank writes.
Status run_kda_cp(const KdaCmdArgs& a, Backend& be, Comm& world, const KdaCpMesh& mesh, const KdaInputs& in) {
  const int ranks = world.size(), rank = world.rank();
  const int64_t t_len = in.q.dim(0), heads = in.q.dim(1), dk = in.q.dim(2), dv = in.v.dim(2);
  const Shape qk{t_len, heads, dk}, vs{t_len, heads, dv}, state_shape{heads, dk, dv};
  std::vector<int64_t> bounds;
  for (int r = 0; r <= ranks; ++r) bounds.push_back(t_len * r / ranks);
  const int64_t r0 = bounds[rank], r1 = bounds[rank + 1], n = r1 - r0;
  const DType act = be.activation_dtype();
  auto rows = [&](const Tensor& t, DType dt) { return n > 0 ? be.to_device(t.rows(r0, r1), dt) : Tensor(); };
  auto alloc = [&](DType dt, Shape shape) {
    shape[0] = n;
    return n > 0 ? be.alloc(dt, shape) : Tensor();
  };
  auto state_or_zero = [&](const std::optional<Tensor>& t) {
    Tensor s = Tensor::zeros(DType::kF32, {1, heads, dk, dv});
    if (t) std::copy(t->f32(), t->f32() + t->numel(), s.f32());
    return s;
  };
  // Rank 0 writes `name`.npy of every rank's rows of `mine` (a backend tensor of this rank's rows).
  auto write_rows = [&](const std::string& name, const Tensor& mine, const Shape& shape) -> Status {
    int64_t width = 1;
    for (size_t i = 1; i < shape.size(); ++i) width *= shape[i];
    const Tensor host = n > 0 ? be.to_host(mine) : Tensor::empty(DType::kF32, {0});
    KL_ASSIGN_OR_RETURN(Tensor all, gather_rows(world, host, bounds, width));
    return rank == 0 ? write_output(a, be, name, all, shape) : Status();
  };
  const Tensor q = rows(in.q, act), k = rows(in.k, act), v = rows(in.v, act), g = rows(in.g, DType::kF32),
               beta = rows(in.beta, DType::kF32);
  const Tensor state = state_or_zero(in.h0), o = alloc(act, vs);
  KL_RETURN_IF_ERROR(kda_cp_forward(be, world, mesh, {q, k, v, g, beta, KdaQkNorm::kGiven, state, o}));
  KL_RETURN_IF_ERROR(write_rows("o", o, vs));
  if (rank == 0) KL_RETURN_IF_ERROR(write_output(a, be, "ht", state, state_shape));
  if (!a.backward) return Status();

  const Tensor d_state = state_or_zero(in.d_ht);
  KdaCpBackwardArgs b{q, k, v, g, beta, rows(*in.d_out, act), KdaQkNorm::kGiven, state_or_zero(in.h0), d_state,
                      alloc(act, qk), alloc(act, qk), alloc(act, vs), alloc(DType::kF32, qk),
                      alloc(DType::kF32, {t_len, heads})};
  KL_RETURN_IF_ERROR(kda_cp_backward(be, world, mesh, b));
  KL_RETURN_IF_ERROR(write_rows("dq", b.dq, qk));
  KL_RETURN_IF_ERROR(write_rows("dk", b.dk, qk));
  KL_RETURN_IF_ERROR(write_rows("dv", b.dv, vs));
  KL_RETURN_IF_ERROR(write_rows("dg", b.dg, qk));
  KL_RETURN_IF_ERROR(write_rows("dbeta", b.dbeta, {t_len, heads}));
  return rank == 0 ? write_output(a, be, "dh0", d_state, state_shape) : Status();
}

Status run_kda(const KdaCmdArgs& a) {
  KL_ASSIGN_OR_RETURN(Device device, parse_device(a.device));
  KL_ASSIGN_OR_RETURN(DType dtype, parse_compute_dtype(a.dtype, device));
  if (device == Device::kCuda)
    return Status::NotSupported("--device cuda: q and k as given (not normalised inside) and the backward are not "
                                "implemented on CUDA yet (issue 37); use --device cpu");
  KL_ASSIGN_OR_RETURN(KdaCpMode cp_mode, parse_kda_cp_mode(a.cp_mode));
  if (a.context_parallel_size == 1 && (a.allgather_group_size != 0 || a.ulysses_degree != 0))
    return Status::InvalidArgument("--allgather-group-size and --ulysses-degree need --context-parallel-size > 1");
  std::unique_ptr<Comm> world;
  if (a.context_parallel_size > 1) {
    KL_ASSIGN_OR_RETURN(world, cp_world(a));
  }
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
  const Shape qk{t_len, heads, dk}, vs{t_len, heads, dv}, state_shape{heads, dk, dv};
  KL_ASSIGN_OR_RETURN(std::optional<Tensor> k, read_input(a, "k", qk, false));
  KL_ASSIGN_OR_RETURN(std::optional<Tensor> g, read_input(a, "g", qk, false));
  KL_ASSIGN_OR_RETURN(std::optional<Tensor> beta, read_input(a, "beta", {t_len, heads}, false));
  KL_ASSIGN_OR_RETURN(std::optional<Tensor> h0, read_input(a, "h0", state_shape, true));
  std::optional<Tensor> d_out, d_ht;
  if (a.backward) {
    KL_ASSIGN_OR_RETURN(d_out, read_input(a, "do", vs, false));
    KL_ASSIGN_OR_RETURN(d_ht, read_input(a, "dht", state_shape, true));
  }
  KL_ASSIGN_OR_RETURN(PathKind out_kind, path_kind(a.out));
  if (out_kind != PathKind::kDirectory) return Status::NotFound("--out " + a.out + ": not a directory");

  KL_ASSIGN_OR_RETURN(std::unique_ptr<Backend> be, make_backend(BackendOptions{device, dtype}));
  be->begin_step();
  if (world) {
    KL_ASSIGN_OR_RETURN(KdaCpMesh mesh, kda_cp_mesh(cp_mode, world->size(), heads, a.allgather_group_size,
                                                    a.ulysses_degree));
    return run_kda_cp(a, *be, *world, mesh, {q, *k, v, *g, *beta, h0, d_out, d_ht});
  }
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
  KL_RETURN_IF_ERROR(write_output(a, *be, "ht", states, state_shape));
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
  return write_output(a, *be, "dh0", b.dh0, state_shape);
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
  sub->add_option("--context-parallel-size", a->context_parallel_size,
                  "Ranks the sequence is split over (run under mpirun -np P)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  sub->add_option("--cp-mode", a->cp_mode,
                  "How the ranks share the work: p2p (the state along a chain), allgather (every rank scans every "
                  "segment's summary), grouped (all-gather inside groups of --allgather-group-size, a chain between), "
                  "ulysses (an all-to-all trades rows for heads: heads divisible by P), hybrid (Ulysses over "
                  "--ulysses-degree ranks, the state scan over the rest)")
      ->capture_default_str();
  sub->add_option("--allgather-group-size", a->allgather_group_size,
                  "grouped and hybrid: consecutive segments that all-gather their summaries (dividing P; hybrid: "
                  "dividing P / U, default all of them)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--ulysses-degree", a->ulysses_degree,
                  "ulysses and hybrid: ranks trading rows for heads (dividing P and the heads; ulysses: P)")
      ->check(CLI::Range(1, 1 << 20));
  add_device_options(sub, a->device, a->dtype);
  sub->callback([a, &exit_code] {
    const Status s = run_kda(*a);
    exit_code = s.ok() ? 0 : fail("kda", s);
  });
}

}  // namespace klinear::cli
