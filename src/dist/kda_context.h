// Context-parallel KDA forward (issue 37): one sequence split over the ranks of a communicator in
// contiguous segments, every rank ending with exactly what one rank computes for its rows.
//
// Math (MODEL.md 4.9): each rank summarises its rows as the affine map S_end = A·S_start + B
// (kda_summary), the ranks' true start states follow by the scan S⁽⁰⁾ = S_initial,
// S⁽ʳ⁺¹⁾ = A_r S⁽ʳ⁾ + B_r, and each rank then runs its rows from its start state (kda_chunked).
// The strategies, as the reference names them, differ in how the scan travels:
//   kP2p:       rank r receives S⁽ʳ⁾ from rank r − 1, sends S⁽ʳ⁺¹⁾ to rank r + 1 (P − 1 hops in a
//               chain, one [H, dk, dv] state a hop; the end state is then broadcast from the last);
//   kAllGather: every rank gathers every (A, B) and scans them itself (one collective; P·H·dk·(dk + dv)
//               floats a rank).
// Ownership: the caller gives this rank's rows on the backend and the sequence's start state; the
// scan runs on the host in fp32 (H·dk·dk·dv multiply-adds a segment). Host communicators only (MPI
// or the one-rank world): a backend's tensors reach the host through to_host.
#pragma once

#include "backend/backend.h"
#include "dist/comm.h"

namespace klinear {

enum class KdaCpMode { kP2p, kAllGather };

// "p2p", "allgather"; the reference's other strategies (grouped, ulysses, hybrid) are NotSupported
// naming themselves, anything else InvalidArgument listing the names.
Result<KdaCpMode> parse_kda_cp_mode(const std::string& name);

struct KdaCpArgs {
  Tensor q, k;   // [n, H, dk] this rank's rows, as KdaArgs takes them (qk_norm); all undefined: no rows
  Tensor v;      // [n, H, dv]
  Tensor g;      // [n, H, dk] F32 log decay
  Tensor beta;   // [n, H] F32
  KdaQkNorm qk_norm = KdaQkNorm::kInside;
  Tensor state;  // [1, H, dk, dv] F32, host: in, the sequence's start state (the same on every rank);
                 // out, the sequence's end state on every rank
  Tensor out;    // [n, H, dv] this rank's rows of the output
};

// Collective: every rank of `comm` calls it, rank r with the r-th segment of the sequence.
Status kda_cp_forward(Backend& be, Comm& comm, KdaCpMode mode, const KdaCpArgs& a);

}  // namespace klinear
