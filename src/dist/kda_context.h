// Context-parallel KDA, forward and backward (issue 37): one sequence split over the P ranks of a
// communicator in contiguous segments (rank r the r-th), every rank ending with exactly what one
// rank computes for its rows.
//
// Math (MODEL.md 4.9). A segment maps its start state affinely to its end state,
// S_end = A·S_start + B (kda_summary), so the segments' true start states follow by the scan
// S⁽⁰⁾ = S_initial, S⁽ʳ⁺¹⁾ = A_r S⁽ʳ⁾ + B_r, and each rank then runs its rows from its start state
// (kda_chunked). The backward is the same scan in reverse: with C_r = the gradient of the segment's
// start state from its own outputs alone (kda_chunked_backward with a zero end-state gradient),
// dS_start⁽ʳ⁾ = A_rᵀ dS_end⁽ʳ⁾ + C_r and dS_end⁽ʳ⁻¹⁾ = dS_start⁽ʳ⁾, from dS_end⁽ᴾ⁻¹⁾ = dS_final; each
// rank then runs the backward of its rows from its start state and its end-state gradient.
//
// Strategies, as the reference names them, are points of one mesh P = U × C (rank r = c·U + u):
//   ulysses  U ranks trade sequence rows for heads (one all-to-all packing q, k, v, g, β (and dO)
//            each way): each then holds its U ranks' rows for H/U heads and runs them alone;
//   state    the C segments so formed pass the scan in groups of G consecutive segments: inside a
//            group every rank all-gathers the group's summaries and scans them itself, between
//            groups the state travels along a chain (one [H/U, dk, dv] state a hop).
//   p2p = (U 1, G 1), allgather = (U 1, G P), grouped = (U 1, G given), ulysses = (U P, C 1),
//   hybrid = (U given, G given or C).
// Costs per rank: the summary (as a forward), its rows' forward; the backward adds a second
// backward of its rows for C_r (only where C > 1). Bytes: a state chain moves H·dk·dv floats a
// hop, an all-gather G·H·dk·(dk + dv) a rank, Ulysses all its inputs and outputs once.
// Ownership: the caller gives this rank's rows on the backend and the sequence's start state (and
// its end-state gradient) on the host, the same on every rank. Host communicators only (MPI or the
// one-rank world): tensors reach the host through to_host; the scans run there in fp32.
#pragma once

#include <string>

#include "backend/backend.h"
#include "dist/comm.h"

namespace klinear {

enum class KdaCpMode { kP2p, kAllGather, kGrouped, kUlysses, kHybrid };

// "p2p", "allgather", "grouped", "ulysses", "hybrid"; anything else InvalidArgument listing them.
Result<KdaCpMode> parse_kda_cp_mode(const std::string& name);

// The mesh of one run (see above); made by kda_cp_mesh.
struct KdaCpMesh {
  int ulysses = 1;  // U: ranks trading rows for heads
  int state = 1;    // C = P / U: segments the state scan runs over
  int group = 1;    // G: segments all-gathering their summaries (divides C); a chain between groups
};

// The mesh of `mode` on `ranks` ranks for `heads` heads. group_size and ulysses_degree are the
// flags' values, 0 when not given. InvalidArgument naming the flag: a group size not dividing P (or
// C for hybrid), a Ulysses degree not dividing P or the heads, a size given to a mode that has no use
// for it, grouped without a group size, hybrid without a Ulysses degree.
Result<KdaCpMesh> kda_cp_mesh(KdaCpMode mode, int ranks, int64_t heads, int group_size, int ulysses_degree);

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

struct KdaCpBackwardArgs {
  Tensor q, k;     // [n, H, dk] this rank's rows, as KdaCpArgs; all undefined: no rows
  Tensor v;        // [n, H, dv]
  Tensor g;        // [n, H, dk] F32
  Tensor beta;     // [n, H] F32
  Tensor d_out;    // [n, H, dv] gradient of this rank's outputs
  KdaQkNorm qk_norm = KdaQkNorm::kInside;
  Tensor h0;       // [1, H, dk, dv] F32 host: the sequence's start state (the same on every rank)
  Tensor d_state;  // [1, H, dk, dv] F32 host: in, the gradient of the sequence's end state (the same on
                   // every rank); out, the gradient of its start state on every rank
  Tensor dq, dk;   // [n, H, dk] out (the activation dtype)
  Tensor dv;       // [n, H, dv] out
  Tensor dg;       // [n, H, dk] F32 out
  Tensor dbeta;    // [n, H] F32 out
};

// Collectives: every rank of `comm` calls them with the same mesh (of comm.size() ranks), rank r
// with the r-th segment of the sequence.
Status kda_cp_forward(Backend& be, Comm& comm, const KdaCpMesh& mesh, const KdaCpArgs& a);
Status kda_cp_backward(Backend& be, Comm& comm, const KdaCpMesh& mesh, const KdaCpBackwardArgs& a);

}  // namespace klinear
