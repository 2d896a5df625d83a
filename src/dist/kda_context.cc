#include "dist/kda_context.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace klinear {

Result<KdaCpMode> parse_kda_cp_mode(const std::string& name) {
  if (name == "p2p") return KdaCpMode::kP2p;
  if (name == "allgather") return KdaCpMode::kAllGather;
  if (name == "grouped") return KdaCpMode::kGrouped;
  if (name == "ulysses") return KdaCpMode::kUlysses;
  if (name == "hybrid") return KdaCpMode::kHybrid;
  return Status::InvalidArgument("--cp-mode " + name + ": expected one of p2p, allgather, grouped, ulysses, hybrid");
}

Result<KdaCpMesh> kda_cp_mesh(KdaCpMode mode, int ranks, int64_t heads, int group_size, int ulysses_degree) {
  const std::string p = std::to_string(ranks);
  const bool grouped = mode == KdaCpMode::kGrouped, hybrid = mode == KdaCpMode::kHybrid;
  if (group_size != 0 && !grouped && !hybrid)
    return Status::InvalidArgument("--allgather-group-size applies to --cp-mode grouped and hybrid only");
  if (ulysses_degree != 0 && mode != KdaCpMode::kUlysses && !hybrid)
    return Status::InvalidArgument("--ulysses-degree applies to --cp-mode ulysses and hybrid only");
  if (grouped && group_size == 0)
    return Status::InvalidArgument("--cp-mode grouped needs --allgather-group-size G (G dividing the " + p +
                                   " ranks)");
  if (hybrid && ulysses_degree == 0)
    return Status::InvalidArgument("--cp-mode hybrid needs --ulysses-degree U (U dividing the " + p +
                                   " ranks and the heads)");
  KdaCpMesh mesh;
  switch (mode) {
    case KdaCpMode::kP2p: mesh = {1, ranks, 1}; break;
    case KdaCpMode::kAllGather: mesh = {1, ranks, ranks}; break;
    case KdaCpMode::kGrouped: mesh = {1, ranks, group_size}; break;
    case KdaCpMode::kUlysses: mesh = {ulysses_degree == 0 ? ranks : ulysses_degree, 1, 1}; break;
    case KdaCpMode::kHybrid: mesh = {ulysses_degree, 0, 0}; break;
  }
  if (mesh.ulysses < 1 || ranks % mesh.ulysses != 0 || (mode == KdaCpMode::kUlysses && mesh.ulysses != ranks))
    return Status::InvalidArgument("--ulysses-degree " + std::to_string(mesh.ulysses) + ": must " +
                                   (mode == KdaCpMode::kUlysses ? "equal" : "divide") + " the " + p +
                                   " ranks (--context-parallel-size)");
  if (heads % mesh.ulysses != 0)
    return Status::InvalidArgument("ulysses degree " + std::to_string(mesh.ulysses) + " does not divide the " +
                                   std::to_string(heads) + " heads");
  if (hybrid) {
    mesh.state = ranks / mesh.ulysses;
    mesh.group = group_size == 0 ? mesh.state : group_size;
  }
  if (mesh.group < 1 || mesh.state % mesh.group != 0)
    return Status::InvalidArgument("--allgather-group-size " + std::to_string(mesh.group) + ": must divide the " +
                                   std::to_string(mesh.state) + (hybrid ? " state-parallel segments (ranks / "
                                                                          "--ulysses-degree)" : " ranks"));
  return mesh;
}

namespace {

// The communicators of a mesh: the U ranks of this segment (Ulysses, ordered by u), the C ranks
// holding the same heads (the state scan, ordered by segment), and the G consecutive segments of
// this one's scan group (ordered by segment; the same group whichever way the scan runs).
struct MeshComms {
  std::unique_ptr<Comm> ulysses, state, group;
};

Result<MeshComms> split_mesh(Comm& comm, const KdaCpMesh& m) {
  KL_CHECK(m.ulysses * m.state == comm.size() && m.group >= 1 && m.state % m.group == 0,
           "kda_cp: a mesh of U " + std::to_string(m.ulysses) + " x C " + std::to_string(m.state) + " (G " +
               std::to_string(m.group) + ") on " + std::to_string(comm.size()) + " ranks");
  const int r = comm.rank();
  MeshComms c;
  KL_ASSIGN_OR_RETURN(c.ulysses, comm.split({r / m.ulysses, r % m.ulysses}));
  KL_ASSIGN_OR_RETURN(c.state, comm.split({r % m.ulysses, r / m.ulysses}));
  KL_ASSIGN_OR_RETURN(c.group, c.state->split({c.state->rank() / m.group, c.state->rank()}));
  return c;
}

// Every rank's row count, in the communicator's rank order.
Result<std::vector<int64_t>> rows_of_ranks(Comm& comm, int64_t n) {
  Tensor mine = Tensor::empty(DType::kI64, {1}), all = Tensor::empty(DType::kI64, {comm.size()});
  mine.data_as<int64_t>()[0] = n;
  KL_RETURN_IF_ERROR(comm.all_gather({mine, all}));
  return std::vector<int64_t>(all.data_as<int64_t>(), all.data_as<int64_t>() + comm.size());
}

// Per-row fields of one all-to-all: host F32 tensors, each [rows, heads, width] (heads H on the
// sequence side, H/U on the head side).
struct Fields {
  std::vector<Tensor> t;
  std::vector<int64_t> width;
};

Fields empty_fields(const std::vector<int64_t>& widths, int64_t rows, int64_t heads) {
  Fields f{{}, widths};
  for (int64_t w : widths) f.t.push_back(Tensor::empty(DType::kF32, {rows, heads, w}));
  return f;
}

// Ulysses, forward way: this rank's rows of every head (`counts[rank]` rows, H heads) become the
// group's rows (every rank's, in rank order) of this rank's H/U heads.
Result<Fields> rows_to_heads(Comm& comm, const Fields& in, const std::vector<int64_t>& counts, int64_t heads) {
  const int ranks = comm.size();
  const int64_t hu = heads / ranks, n = counts[comm.rank()];
  const int64_t per_row = hu * std::accumulate(in.width.begin(), in.width.end(), int64_t{0});
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  AllToAllArgs x{Tensor::empty(DType::kF32, {ranks * n * per_row}), {}, Tensor::empty(DType::kF32, {total * per_row}), {}};
  float* p = x.input.f32();
  for (int j = 0; j < ranks; ++j) {
    x.send_counts.push_back(n * per_row);
    x.recv_counts.push_back(counts[j] * per_row);
    for (size_t f = 0; f < in.t.size(); ++f)
      for (int64_t row = 0; row < n; ++row, p += hu * in.width[f]) {
        const float* src = in.t[f].f32() + (row * heads + j * hu) * in.width[f];
        std::copy(src, src + hu * in.width[f], p);
      }
  }
  KL_RETURN_IF_ERROR(comm.all_to_all(x));
  Fields out = empty_fields(in.width, total, hu);
  const float* q = x.output.f32();
  int64_t first = 0;
  for (int j = 0; j < ranks; first += counts[j], ++j)
    for (size_t f = 0; f < out.t.size(); ++f)
      for (int64_t row = 0; row < counts[j]; ++row, q += hu * out.width[f])
        std::copy(q, q + hu * out.width[f], out.t[f].f32() + (first + row) * hu * out.width[f]);
  return out;
}

// Ulysses, the way back: the group's rows of this rank's H/U heads return to their ranks, which
// get their rows of every head.
Result<Fields> heads_to_rows(Comm& comm, const Fields& in, const std::vector<int64_t>& counts, int64_t heads) {
  const int ranks = comm.size();
  const int64_t hu = heads / ranks, n = counts[comm.rank()];
  const int64_t per_row = hu * std::accumulate(in.width.begin(), in.width.end(), int64_t{0});
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  AllToAllArgs x{Tensor::empty(DType::kF32, {total * per_row}), {}, Tensor::empty(DType::kF32, {ranks * n * per_row}), {}};
  float* p = x.input.f32();
  int64_t first = 0;
  for (int j = 0; j < ranks; first += counts[j], ++j) {
    x.send_counts.push_back(counts[j] * per_row);
    x.recv_counts.push_back(n * per_row);
    for (size_t f = 0; f < in.t.size(); ++f)
      for (int64_t row = first; row < first + counts[j]; ++row, p += hu * in.width[f]) {
        const float* src = in.t[f].f32() + row * hu * in.width[f];
        std::copy(src, src + hu * in.width[f], p);
      }
  }
  KL_RETURN_IF_ERROR(comm.all_to_all(x));
  Fields out = empty_fields(in.width, n, heads);
  const float* q = x.output.f32();
  for (int j = 0; j < ranks; ++j)
    for (size_t f = 0; f < out.t.size(); ++f)
      for (int64_t row = 0; row < n; ++row, q += hu * out.width[f])
        std::copy(q, q + hu * out.width[f], out.t[f].f32() + (row * heads + j * hu) * out.width[f]);
  return out;
}

// This rank's heads [first, first + count) of a host [1, H, dk, dv] state, flat.
std::vector<float> state_heads(const Tensor& state, int64_t first, int64_t count) {
  const int64_t per_head = state.dim(2) * state.dim(3);
  return std::vector<float>(state.f32() + first * per_head, state.f32() + (first + count) * per_head);
}

// Every rank's heads of a state (ranks of the Ulysses group in head order) into `state`.
Status gather_state_heads(Comm& comm, const std::vector<float>& mine, const Tensor& state) {
  Tensor part = Tensor::empty(DType::kF32, {static_cast<int64_t>(mine.size())});
  std::copy(mine.begin(), mine.end(), part.f32());
  return comm.all_gather({part, state.view({state.numel()})});
}

enum class ScanWay { kForward, kBackward };

// S ← A·S + B (forward) or Aᵀ·S + B (backward) per head: A [H, dk, dk], S and B [H, dk, dv], fp32.
void apply_summary(ScanWay way, const float* a, const float* b, int64_t heads, int64_t dk, int64_t dv,
                   std::vector<float>& s) {
  std::vector<float> next(s.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < dk; ++i) {
      float* row = next.data() + (h * dk + i) * dv;
      std::copy(b + (h * dk + i) * dv, b + (h * dk + i + 1) * dv, row);
      for (int64_t j = 0; j < dk; ++j) {
        const float aij = way == ScanWay::kForward ? a[(h * dk + i) * dk + j] : a[(h * dk + j) * dk + i];
        const float* sj = s.data() + (h * dk + j) * dv;
        for (int64_t c = 0; c < dv; ++c) row[c] += aij * sj[c];
      }
    }
  s.swap(next);
}

struct ScanResult {
  std::vector<float> in;   // the state entering this rank's segment
  std::vector<float> end;  // the state after every segment (the same on every rank)
};

// The scan of the segments' maps (a: [H, dk, dk], b: [H, dk, dv] this rank's) from x0, over the
// ranks of `comm` in rank order (forward) or in reverse (backward), in the groups of consecutive
// ranks `group` holds (split_mesh): all-gather inside a group, a chain between groups, the end
// broadcast from the last rank when there is more than one group.
Result<ScanResult> scan(Comm& comm, Comm& group, ScanWay way, const Tensor& a, const Tensor& b, std::vector<float> x0,
                        int64_t heads, int64_t dk, int64_t dv) {
  const bool forward = way == ScanWay::kForward;
  const int ranks = comm.size(), size = group.size(), v = forward ? comm.rank() : ranks - 1 - comm.rank();
  auto real = [&](int virt) { return forward ? virt : ranks - 1 - virt; };
  auto member = [&](int m) { return forward ? m : size - 1 - m; };  // the group rank of its m-th segment in scan order
  const int64_t sa = a.numel(), sb = b.numel();
  const Tensor all_a = Tensor::empty(DType::kF32, {size * sa}), all_b = Tensor::empty(DType::kF32, {size * sb});
  KL_RETURN_IF_ERROR(group.all_gather({a, all_a}));
  KL_RETURN_IF_ERROR(group.all_gather({b, all_b}));
  std::vector<float> s = std::move(x0);
  Tensor link = Tensor::empty(DType::kF32, {sb});
  if (v >= size) {  // the group's entering state: from the previous group's last rank
    if (v % size == 0) KL_RETURN_IF_ERROR(comm.recv({link, real(v - 1)}));
    KL_RETURN_IF_ERROR(group.broadcast({link, member(0)}));
    s.assign(link.f32(), link.f32() + sb);
  }
  ScanResult r;
  for (int m = 0; m < size; ++m) {
    if (m == v % size) r.in = s;
    apply_summary(way, all_a.f32() + member(m) * sa, all_b.f32() + member(m) * sb, heads, dk, dv, s);
  }
  std::copy(s.begin(), s.end(), link.f32());
  if (v % size == size - 1 && v + 1 < ranks) KL_RETURN_IF_ERROR(comm.send({link, real(v + 1)}));
  if (size < ranks) KL_RETURN_IF_ERROR(comm.broadcast({link, real(ranks - 1)}));
  r.end.assign(link.f32(), link.f32() + sb);
  return r;
}

// One segment of the sequence for some heads, on the backend, as the local KDA ops take it.
struct Segment {
  int64_t rows = 0, heads = 0, dk = 0, dv = 0;
  Tensor q, k, v, g, beta, d_out;  // [rows, heads, *] (beta [rows, heads]); undefined when rows is 0
  KdaQkNorm qk_norm = KdaQkNorm::kInside;
  SeqLayout layout;
};

// The host fields of a rank's rows: q, k, v, g, beta (and d_out when given).
Fields host_rows(Backend& be, int64_t n, int64_t heads, int64_t dk, int64_t dv, const std::vector<Tensor>& t) {
  Fields f{{}, {dk, dk, dv, dk, 1, dv}};
  f.width.resize(t.size());
  for (size_t i = 0; i < t.size(); ++i)
    f.t.push_back(n > 0 ? be.to_host(t[i]).view({n, heads, f.width[i]})
                        : Tensor::empty(DType::kF32, {0, heads, f.width[i]}));
  return f;
}

Segment upload_segment(Backend& be, const Fields& f, int64_t heads, int64_t dk, int64_t dv, KdaQkNorm qk_norm) {
  Segment s;
  s.rows = f.t[0].dim(0);
  s.heads = heads;
  s.dk = dk;
  s.dv = dv;
  s.qk_norm = qk_norm;
  if (s.rows == 0) return s;
  const DType act = be.activation_dtype();
  s.q = be.to_device(f.t[0], act);
  s.k = be.to_device(f.t[1], act);
  s.v = be.to_device(f.t[2], act);
  s.g = be.to_device(f.t[3], DType::kF32);
  s.beta = be.to_device(f.t[4].view({s.rows, heads}), DType::kF32);
  if (f.t.size() > 5) s.d_out = be.to_device(f.t[5], act);
  s.layout.cu_seqlens = {0, static_cast<int32_t>(s.rows)};
  s.layout.cached = {0};
  s.layout.slots = {0};
  be.upload_layout(s.layout);
  return s;
}

Tensor state_tensor(Backend& be, const std::vector<float>& s, const Segment& seg) {
  Tensor host = Tensor::empty(DType::kF32, {1, seg.heads, seg.dk, seg.dv});
  std::copy(s.begin(), s.end(), host.f32());
  return be.to_device(host, DType::kF32);
}

std::vector<float> host_values(Backend& be, const Tensor& t) {
  const Tensor h = be.to_host(t);
  return std::vector<float>(h.f32(), h.f32() + h.numel());
}

// The segment's map S_end = A·S_start + B on the host; the identity for no rows.
void summarise(Backend& be, const Segment& s, Tensor& a, Tensor& b) {
  if (s.rows == 0) {
    a = Tensor::zeros(DType::kF32, {s.heads * s.dk * s.dk});
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.dk; ++i) a.f32()[(h * s.dk + i) * s.dk + i] = 1.0f;
    b = Tensor::zeros(DType::kF32, {s.heads * s.dk * s.dv});
    return;
  }
  const Tensor da = be.alloc(DType::kF32, {1, s.heads, s.dk, s.dk}), db = be.alloc(DType::kF32, {1, s.heads, s.dk, s.dv});
  be.kda_summary({s.k, s.v, s.g, s.beta, da, db, s.qk_norm}, s.layout);
  a = be.to_host(da).view({da.numel()});
  b = be.to_host(db).view({db.numel()});
}

// The backward of the segment's rows from start state h0 and end-state gradient d_ht (undefined:
// zero); returns the start-state gradient, and the row gradients in `grads` unless it is null.
std::vector<float> segment_backward(Backend& be, const Segment& s, const Tensor& h0, const Tensor& d_ht,
                                    std::vector<Tensor>* grads) {
  const DType act = be.activation_dtype();
  const Shape qk{s.rows, s.heads, s.dk};
  KdaBackwardArgs b{s.q, s.k, s.v, s.g, s.beta, h0, s.d_out, d_ht, s.qk_norm,
                    be.alloc(act, qk), be.alloc(act, qk), be.alloc(act, {s.rows, s.heads, s.dv}),
                    be.alloc(DType::kF32, qk), be.alloc(DType::kF32, {s.rows, s.heads}),
                    be.alloc(DType::kF32, {1, s.heads, s.dk, s.dv})};
  be.kda_chunked_backward(b, s.layout);
  if (grads) *grads = {b.dq, b.dk, b.dv, b.dg, b.dbeta};
  return host_values(be, b.dh0);
}

void check_state(const Tensor& t, const char* name) {
  KL_CHECK(t.device() == Device::kCpu && t.dtype() == DType::kF32 && t.rank() == 4 && t.dim(0) == 1,
           std::string("kda_cp: ") + name + " must be a host F32 [1, H, dk, dv], got " + shape_to_string(t.shape()));
}

}  // namespace

Status kda_cp_forward(Backend& be, Comm& comm, const KdaCpMesh& mesh, const KdaCpArgs& a) {
  KL_CHECK(comm.device() == Device::kCpu, "kda_cp_forward: the scan travels on a host communicator");
  check_state(a.state, "state");
  const int64_t heads = a.state.dim(1), dk = a.state.dim(2), dv = a.state.dim(3), n = a.q.defined() ? a.q.dim(0) : 0;
  KL_ASSIGN_OR_RETURN(MeshComms mc, split_mesh(comm, mesh));
  KL_ASSIGN_OR_RETURN(std::vector<int64_t> counts, rows_of_ranks(*mc.ulysses, n));
  const int64_t hu = heads / mesh.ulysses, first_head = mc.ulysses->rank() * hu;
  KL_ASSIGN_OR_RETURN(Fields mine,
                      rows_to_heads(*mc.ulysses, host_rows(be, n, heads, dk, dv, {a.q, a.k, a.v, a.g, a.beta}),
                                    counts, heads));
  const Segment seg = upload_segment(be, mine, hu, dk, dv, a.qk_norm);

  std::vector<float> start = state_heads(a.state, first_head, hu), end = start;
  if (mesh.state > 1) {
    Tensor sa, sb;
    summarise(be, seg, sa, sb);
    KL_ASSIGN_OR_RETURN(ScanResult r, scan(*mc.state, *mc.group, ScanWay::kForward, sa, sb, start, hu, dk, dv));
    start = std::move(r.in);
    end = std::move(r.end);
  }
  Fields out = empty_fields({dv}, seg.rows, hu);
  if (seg.rows > 0) {
    const Tensor states = state_tensor(be, start, seg), o = be.alloc(be.activation_dtype(), {seg.rows, hu, dv});
    be.kda_chunked({seg.q, seg.k, seg.v, seg.g, seg.beta, states, o, seg.qk_norm}, seg.layout);
    out.t[0] = be.to_host(o);
    if (mesh.state == 1) end = host_values(be, states);
  }
  KL_ASSIGN_OR_RETURN(Fields rows, heads_to_rows(*mc.ulysses, out, counts, heads));
  if (n > 0) be.copy(be.to_device(rows.t[0], a.out.dtype()), a.out);
  return gather_state_heads(*mc.ulysses, end, a.state);
}

Status kda_cp_backward(Backend& be, Comm& comm, const KdaCpMesh& mesh, const KdaCpBackwardArgs& a) {
  KL_CHECK(comm.device() == Device::kCpu, "kda_cp_backward: the scans travel on a host communicator");
  check_state(a.h0, "h0");
  check_state(a.d_state, "d_state");
  const int64_t heads = a.h0.dim(1), dk = a.h0.dim(2), dv = a.h0.dim(3), n = a.q.defined() ? a.q.dim(0) : 0;
  KL_ASSIGN_OR_RETURN(MeshComms mc, split_mesh(comm, mesh));
  KL_ASSIGN_OR_RETURN(std::vector<int64_t> counts, rows_of_ranks(*mc.ulysses, n));
  const int64_t hu = heads / mesh.ulysses, first_head = mc.ulysses->rank() * hu;
  KL_ASSIGN_OR_RETURN(
      Fields mine,
      rows_to_heads(*mc.ulysses, host_rows(be, n, heads, dk, dv, {a.q, a.k, a.v, a.g, a.beta, a.d_out}), counts, heads));
  const Segment seg = upload_segment(be, mine, hu, dk, dv, a.qk_norm);

  std::vector<float> start = state_heads(a.h0, first_head, hu), d_end = state_heads(a.d_state, first_head, hu);
  std::vector<float> d_initial;
  if (mesh.state > 1) {
    Tensor sa, sb;
    summarise(be, seg, sa, sb);
    KL_ASSIGN_OR_RETURN(ScanResult fwd, scan(*mc.state, *mc.group, ScanWay::kForward, sa, sb, start, hu, dk, dv));
    start = std::move(fwd.in);
    // C: the start-state gradient from this segment's outputs alone.
    Tensor c = Tensor::zeros(DType::kF32, {hu * dk * dv});
    if (seg.rows > 0) {
      const std::vector<float> own = segment_backward(be, seg, Tensor(), Tensor(), nullptr);
      std::copy(own.begin(), own.end(), c.f32());
    }
    KL_ASSIGN_OR_RETURN(ScanResult bwd, scan(*mc.state, *mc.group, ScanWay::kBackward, sa, c, d_end, hu, dk, dv));
    d_end = std::move(bwd.in);
    d_initial = std::move(bwd.end);
  }
  Fields grads = empty_fields({dk, dk, dv, dk, 1}, seg.rows, hu);
  if (seg.rows > 0) {
    std::vector<Tensor> g;
    const std::vector<float> d_start =
        segment_backward(be, seg, state_tensor(be, start, seg), state_tensor(be, d_end, seg), &g);
    for (size_t i = 0; i < g.size(); ++i) grads.t[i] = be.to_host(g[i]).view(grads.t[i].shape());
    if (mesh.state == 1) d_initial = d_start;
  }
  KL_ASSIGN_OR_RETURN(Fields rows, heads_to_rows(*mc.ulysses, grads, counts, heads));
  if (n > 0) {
    const Tensor outs[] = {a.dq, a.dk, a.dv, a.dg, a.dbeta};
    for (size_t i = 0; i < rows.t.size(); ++i)
      be.copy(be.to_device(rows.t[i].view(outs[i].shape()), outs[i].dtype()), outs[i]);
  }
  return gather_state_heads(*mc.ulysses, d_initial, a.d_state);
}

}  // namespace klinear
