// SelfComm: the world of a process started without a launcher: one rank, host tensors.
//
// Every collective over one rank is a copy (or nothing), so code written for P ranks runs
// unchanged on one; no library is initialised. There is no other rank to send to or receive from,
// so send and recv are never reached (Comm's checks refuse any peer).
#pragma once

#include "dist/comm.h"

namespace klinear {

class SelfComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Device device() const override { return Device::kCpu; }

 private:
  Status do_all_gather(const AllGatherArgs& args) override;
  Status do_reduce_scatter(const ReduceScatterArgs& args) override;
  Status do_all_reduce(const AllReduceArgs& args) override;
  Status do_all_to_all(const AllToAllArgs& args) override;
  Status do_broadcast(const BroadcastArgs& args) override;
  Status do_send(const PeerArgs& args) override;
  Status do_recv(const PeerArgs& args) override;
  Status do_barrier() override;
  Result<std::unique_ptr<Comm>> do_split(const SplitArgs& args) override;
};

}  // namespace klinear
