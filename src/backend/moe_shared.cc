// moe_experts' shared experts (MODEL.md 3.4): the checks, and their part composed from the other ops,
// which is the CPU's form, what the CUDA paths that do not fuse it run, and the reference the rows
// path's fused form is tested against.
#include "backend/backend.h"

namespace klinear {

int64_t check_shared_experts(const SharedExperts& s, int64_t n, const Tensor& out) {
  if (!s.gate_up.defined()) return 0;
  const int64_t fs = s.down.defined() && s.down.rank() == 2 ? s.down.dim(1) : 0;
  KL_CHECK(fs > 0 && s.gate_up.rank() == 2 && s.gate_up.dim(0) == n && s.gate_up.dim(1) == 2 * fs &&
               s.down.dim(0) == out.dim(1),
           "moe_experts shared gate_up " + shape_to_string(s.gate_up.shape()) + " down " +
               (s.down.defined() ? shape_to_string(s.down.shape()) : std::string("undefined")) + " out " +
               shape_to_string(out.shape()));
  return fs;
}

void add_shared_experts(Backend& be, const SharedExperts& s, const GluParams& p, const Tensor& out) {
  const int64_t n = out.dim(0), fs = check_shared_experts(s, n, out);
  if (fs == 0 || n == 0) return;
  const Tensor a = be.alloc(s.gate_up.dtype(), {n, fs});
  be.glu(s.gate_up, p, a);
  const Tensor y = be.alloc(out.dtype(), {n, out.dim(1)});
  be.linear(a, s.down, y);
  be.add(out, y);
}

}  // namespace klinear
