// kda_summary's argument check, shared by the backends.
#include "backend/backend.h"

namespace klinear {

KdaSummaryDims check_kda_summary(const KdaSummaryArgs& a, const SeqLayout& layout) {
  const KdaSummaryDims d{layout.num_rows(), layout.num_seqs(), a.k.rank() == 3 ? a.k.dim(1) : 0,
                         a.k.rank() == 3 ? a.k.dim(2) : 0, a.v.rank() == 3 ? a.v.dim(2) : 0};
  KL_CHECK(a.k.rank() == 3 && a.k.dim(0) == d.rows && a.g.shape() == a.k.shape() && a.v.rank() == 3 &&
               a.v.dim(0) == d.rows && a.v.dim(1) == d.heads && a.beta.numel() == d.rows * d.heads &&
               a.g.dtype() == DType::kF32 && a.beta.dtype() == DType::kF32 && a.a.dtype() == DType::kF32 &&
               a.b.dtype() == DType::kF32 && a.a.shape() == Shape({d.seqs, d.heads, d.dk, d.dk}) &&
               a.b.shape() == Shape({d.seqs, d.heads, d.dk, d.dv}),
           "kda_summary: k " + shape_to_string(a.k.shape()) + " v " + shape_to_string(a.v.shape()) + " g " +
               shape_to_string(a.g.shape()) + " A " + shape_to_string(a.a.shape()) + " B " +
               shape_to_string(a.b.shape()) + " for " + std::to_string(d.seqs) + " sequences of " +
               std::to_string(d.rows) + " rows (g, beta, A and B in F32)");
  return d;
}

}  // namespace klinear
