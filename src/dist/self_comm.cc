// SelfComm (self_comm.h): a one-rank world's collectives as copies.
#include "dist/self_comm.h"

#include <cstring>

namespace klinear {

namespace {

// Comm's checks made the sizes and dtypes equal; in place is a no-op.
Status copy(const Tensor& from, const Tensor& to) {
  if (from.data() != to.data()) std::memcpy(to.data(), from.data(), from.nbytes());
  return {};
}

}  // namespace

Status SelfComm::do_all_gather(const AllGatherArgs& args) { return copy(args.input, args.output); }
Status SelfComm::do_reduce_scatter(const ReduceScatterArgs& args) { return copy(args.input, args.output); }
Status SelfComm::do_all_reduce(const AllReduceArgs& args) { return copy(args.input, args.output); }
Status SelfComm::do_all_to_all(const AllToAllArgs& args) { return copy(args.input, args.output); }
Status SelfComm::do_broadcast(const BroadcastArgs&) { return {}; }

Status SelfComm::do_send(const PeerArgs&) {
  KL_CHECK(false, "send on a one-rank world: Comm::send refuses every peer");
}

Status SelfComm::do_recv(const PeerArgs&) {
  KL_CHECK(false, "recv on a one-rank world: Comm::recv refuses every peer");
}

Status SelfComm::do_barrier() { return {}; }

Result<std::unique_ptr<Comm>> SelfComm::do_split(const SplitArgs&) {
  return std::unique_ptr<Comm>(std::make_unique<SelfComm>());
}

}  // namespace klinear
