// Comm: one group of ranks and the collectives the parallel layouts use, behind one interface.
//
// Decision: the layouts (tensor, data, sequence, expert parallel; issue 36) are written once
// against this interface; the transport is an existing library chosen by where the tensors live:
// MPI (Open MPI) for host tensors on CPU ranks (mpi_comm.h), NCCL for device tensors on GPU ranks
// (nccl_comm.h), and a one-rank world (self_comm.h) for a process started without a launcher, so
// every code path runs the same on one rank. One process per rank; no hand-made transport.
//
// Every collective is a call that all ranks of the group make in the same order with matching
// arguments (the same n, counts that agree between sender and receiver, the same root); a call
// one rank skips makes the others wait forever. Arguments are checked locally before anything is
// sent: a tensor of the wrong size, dtype or device, a count that does not add up or a rank out of
// range is our bug and aborts with file and line (core/check.h). What the library reports (a
// truncated message, a lost peer) returns as a Status naming the call, the rank and the library's
// message.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace klinear {

// The reduction of reduce_scatter and all_reduce.
enum class ReduceOp : uint8_t { kSum, kMax };

// Shapes below: P = size() ranks, n elements per rank. Tensors are read as flat arrays of their
// numel (any shape), contiguous, of one dtype, on the communicator's device().
struct AllGatherArgs {
  Tensor input;   // [n] this rank's part
  Tensor output;  // [P * n] rank r's part at [r * n, (r + 1) * n); same dtype as input
};

struct ReduceScatterArgs {
  Tensor input;   // [P * n] block r (elements [r * n, (r + 1) * n)) is reduced into rank r's output
  Tensor output;  // [n] the reduction over ranks of their block rank(); same dtype as input
  ReduceOp op = ReduceOp::kSum;
};

struct AllReduceArgs {
  Tensor input;   // [n]
  Tensor output;  // [n] the reduction over ranks; may be `input` itself (in place)
  ReduceOp op = ReduceOp::kSum;
};

// All-to-all with per-rank counts (all-to-all-v). Parts are packed in rank order with no gaps.
struct AllToAllArgs {
  Tensor input;                      // [sum(send_counts)] the part for rank r starts at sum(send_counts[0, r))
  std::vector<int64_t> send_counts;  // [P] elements sent to each rank (0 allowed, also to itself)
  Tensor output;                     // [sum(recv_counts)] rank r's part starts at sum(recv_counts[0, r))
  std::vector<int64_t> recv_counts;  // [P] elements from each rank: rank r's send_counts[rank()]
};

struct BroadcastArgs {
  Tensor data;  // [n] read on the root, overwritten with the root's values on every other rank
  int root = 0;
};

// One side of a point-to-point transfer: a send to `peer` pairs with a recv from this rank there.
struct PeerArgs {
  Tensor data;  // [n] read by send, written by recv; both sides give the same n
  int peer = 0; // the other rank, != rank()
};

struct SplitArgs {
  int color = 0;  // ranks giving the same color (>= 0) form one new group
  int key = 0;    // orders the ranks inside a group (ties keep the old rank order)
};

// Which collectives reduce which dtypes: F32, I32 and I64 natively; BF16 is widened to F32, reduced
// and rounded once where the library has no BF16 reduction (MPI). Moving data (gather, all-to-all,
// broadcast, send/recv) takes any dtype.
bool comm_reduces(DType dtype);

// A communicator: contract above. Not thread-safe: one thread (the engine's) calls it. The public
// calls check their arguments once here and hand them to the implementation.
class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the tensors of every call live.
  virtual Device device() const = 0;

  Status all_gather(const AllGatherArgs& args);
  Status reduce_scatter(const ReduceScatterArgs& args);
  Status all_reduce(const AllReduceArgs& args);
  Status all_to_all(const AllToAllArgs& args);
  Status broadcast(const BroadcastArgs& args);
  // Blocking on MPI (returns when `data` may be reused); enqueued on the stream on NCCL.
  Status send(const PeerArgs& args);
  Status recv(const PeerArgs& args);
  // Returns when every rank has reached it (on NCCL: and the stream's work so far is done).
  Status barrier();
  // A new communicator over the ranks of this one giving the same color: a collective call of
  // every rank. The new one may outlive this one.
  Result<std::unique_ptr<Comm>> split(const SplitArgs& args);

 private:
  virtual Status do_all_gather(const AllGatherArgs& args) = 0;
  virtual Status do_reduce_scatter(const ReduceScatterArgs& args) = 0;
  virtual Status do_all_reduce(const AllReduceArgs& args) = 0;
  virtual Status do_all_to_all(const AllToAllArgs& args) = 0;
  virtual Status do_broadcast(const BroadcastArgs& args) = 0;
  virtual Status do_send(const PeerArgs& args) = 0;
  virtual Status do_recv(const PeerArgs& args) = 0;
  virtual Status do_barrier() = 0;
  virtual Result<std::unique_ptr<Comm>> do_split(const SplitArgs& args) = 0;
};

// "MPI_Recv on rank 1 of 2: MPI_ERR_TRUNCATE: message truncated": the Status every implementation
// returns when its library reports `message` from `call`.
Status comm_error(const char* call, const Comm& comm, const std::string& message);

}  // namespace klinear
