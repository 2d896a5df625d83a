#include "dist/kda_context.h"

#include <algorithm>
#include <vector>

namespace klinear {

Result<KdaCpMode> parse_kda_cp_mode(const std::string& name) {
  if (name == "p2p") return KdaCpMode::kP2p;
  if (name == "allgather") return KdaCpMode::kAllGather;
  if (name == "grouped" || name == "ulysses" || name == "hybrid")
    return Status::NotSupported("--cp-mode " + name + ": not implemented yet (p2p and allgather are)");
  return Status::InvalidArgument("--cp-mode " + name + ": expected one of p2p, allgather, grouped, ulysses, hybrid");
}

namespace {

// S ← A·S + B per head: A [H, dk, dk], S and B [H, dk, dv], row-major fp32.
void apply_summary(const float* a, const float* b, int64_t heads, int64_t dk, int64_t dv, std::vector<float>& s) {
  std::vector<float> next(s.size());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < dk; ++i) {
      float* row = next.data() + (h * dk + i) * dv;
      std::copy(b + (h * dk + i) * dv, b + (h * dk + i + 1) * dv, row);
      for (int64_t j = 0; j < dk; ++j) {
        const float aij = a[(h * dk + i) * dk + j];
        const float* sj = s.data() + (h * dk + j) * dv;
        for (int64_t c = 0; c < dv; ++c) row[c] += aij * sj[c];
      }
    }
  s.swap(next);
}

}  // namespace

Status kda_cp_forward(Backend& be, Comm& comm, KdaCpMode mode, const KdaCpArgs& a) {
  KL_CHECK(comm.device() == Device::kCpu, "kda_cp_forward: the scan travels on a host communicator");
  KL_CHECK(a.state.device() == Device::kCpu && a.state.dtype() == DType::kF32 && a.state.rank() == 4,
           "kda_cp_forward: state must be a host F32 [1, H, dk, dv], got " + shape_to_string(a.state.shape()));
  const int64_t heads = a.state.dim(1), dk = a.state.dim(2), dv = a.state.dim(3), n = a.q.defined() ? a.q.dim(0) : 0;
  const int64_t sa = heads * dk * dk, sb = heads * dk * dv;
  const int rank = comm.rank(), ranks = comm.size();

  // This rank's summary; no rows: the identity map.
  Tensor A = Tensor::empty(DType::kF32, {sa}), B = Tensor::empty(DType::kF32, {sb});
  SeqLayout layout;
  layout.cu_seqlens = {0, static_cast<int32_t>(n)};
  layout.cached = {0};
  layout.slots = {0};
  if (n > 0) {
    be.upload_layout(layout);
    const Tensor da = be.alloc(DType::kF32, {1, heads, dk, dk}), db = be.alloc(DType::kF32, {1, heads, dk, dv});
    be.kda_summary({a.k, a.v, a.g, a.beta, da, db, a.qk_norm}, layout);
    A = be.to_host(da).view({sa});
    B = be.to_host(db).view({sb});
  } else {
    std::fill(A.f32(), A.f32() + sa, 0.0f);
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < dk; ++i) A.f32()[(h * dk + i) * dk + i] = 1.0f;
    std::fill(B.f32(), B.f32() + sb, 0.0f);
  }

  std::vector<float> start(a.state.f32(), a.state.f32() + sb), end;
  if (mode == KdaCpMode::kAllGather) {
    const Tensor all_a = Tensor::empty(DType::kF32, {ranks * sa}), all_b = Tensor::empty(DType::kF32, {ranks * sb});
    KL_RETURN_IF_ERROR(comm.all_gather({A, all_a}));
    KL_RETURN_IF_ERROR(comm.all_gather({B, all_b}));
    std::vector<float> s = start;
    for (int r = 0; r < ranks; ++r) {
      if (r == rank) start = s;
      apply_summary(all_a.f32() + r * sa, all_b.f32() + r * sb, heads, dk, dv, s);
    }
    end = std::move(s);
  } else {
    Tensor link = Tensor::empty(DType::kF32, {sb});
    if (rank > 0) {
      KL_RETURN_IF_ERROR(comm.recv({link, rank - 1}));
      start.assign(link.f32(), link.f32() + sb);
    }
    std::vector<float> s = start;
    apply_summary(A.f32(), B.f32(), heads, dk, dv, s);
    std::copy(s.begin(), s.end(), link.f32());
    if (rank + 1 < ranks) KL_RETURN_IF_ERROR(comm.send({link, rank + 1}));
    KL_RETURN_IF_ERROR(comm.broadcast({link, ranks - 1}));
    end.assign(link.f32(), link.f32() + sb);
  }

  if (n > 0) {
    Tensor host_start = Tensor::empty(DType::kF32, {1, heads, dk, dv});
    std::copy(start.begin(), start.end(), host_start.f32());
    const Tensor states = be.to_device(host_start, DType::kF32);
    be.kda_chunked({a.q, a.k, a.v, a.g, a.beta, states, a.out, a.qk_norm}, layout);
  }
  std::copy(end.begin(), end.end(), a.state.f32());
  return Status();
}

}  // namespace klinear
