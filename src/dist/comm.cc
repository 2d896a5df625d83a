// The argument checks every communicator shares (comm.h): sizes, dtypes, devices, counts and
// ranks are checked here once, so an implementation only moves bytes.
#include "dist/comm.h"

#include <numeric>
#include <string>

namespace klinear {

namespace {

std::string describe(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_to_string(t.shape());
}

void check_tensor(const Comm& comm, const Tensor& t, const char* what) {
  KL_CHECK(t.numel() == 0 || t.data() != nullptr, std::string(what) + " has no storage");
  KL_CHECK(t.device() == comm.device(),
           std::string(what) + " is on the wrong device for this communicator");
}

void check_pair(const Comm& comm, const Tensor& input, const Tensor& output) {
  check_tensor(comm, input, "input");
  check_tensor(comm, output, "output");
  KL_CHECK(input.dtype() == output.dtype(), "input " + describe(input) + " and output " + describe(output) +
                                                " differ in dtype");
}

void check_reduction(const Tensor& t) {
  KL_CHECK(comm_reduces(t.dtype()), std::string("no reduction over ") + dtype_name(t.dtype()));
}

void check_peer(const Comm& comm, int peer) {
  KL_CHECK(peer >= 0 && peer < comm.size() && peer != comm.rank(),
           "peer " + std::to_string(peer) + " is not another rank of " + std::to_string(comm.size()));
}

// `whole` holds one `part`-sized block per rank (all_gather's output, reduce_scatter's input).
void check_blocks(const Comm& comm, const char* call, const Tensor& whole, const char* whole_name, const Tensor& part,
                  const char* part_name) {
  KL_CHECK(whole.numel() == part.numel() * comm.size(),
           std::string(call) + ": " + whole_name + " " + describe(whole) + " is not " + std::to_string(comm.size()) +
               " x " + part_name + " " + describe(part));
}

void check_counts(const Comm& comm, const std::vector<int64_t>& counts, const Tensor& t, const char* what) {
  KL_CHECK(static_cast<int>(counts.size()) == comm.size(),
           std::string(what) + " has " + std::to_string(counts.size()) + " entries for " +
               std::to_string(comm.size()) + " ranks");
  for (int64_t c : counts) KL_CHECK(c >= 0, std::string(what) + " has a negative count");
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  KL_CHECK(total == t.numel(), std::string(what) + " add up to " + std::to_string(total) + " elements, the tensor " +
                                   describe(t) + " holds " + std::to_string(t.numel()));
}

}  // namespace

bool comm_reduces(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kI32 || dtype == DType::kI64;
}

Status comm_error(const char* call, const Comm& comm, const std::string& message) {
  return Status::IOError(std::string(call) + " on rank " + std::to_string(comm.rank()) + " of " +
                         std::to_string(comm.size()) + ": " + message);
}

Status Comm::all_gather(const AllGatherArgs& args) {
  check_pair(*this, args.input, args.output);
  check_blocks(*this, "all_gather", args.output, "output", args.input, "input");
  return do_all_gather(args);
}

Status Comm::reduce_scatter(const ReduceScatterArgs& args) {
  check_pair(*this, args.input, args.output);
  check_reduction(args.input);
  check_blocks(*this, "reduce_scatter", args.input, "input", args.output, "output");
  return do_reduce_scatter(args);
}

Status Comm::all_reduce(const AllReduceArgs& args) {
  check_pair(*this, args.input, args.output);
  check_reduction(args.input);
  KL_CHECK(args.input.numel() == args.output.numel(),
           "all_reduce: input " + describe(args.input) + " and output " + describe(args.output) + " differ in size");
  return do_all_reduce(args);
}

Status Comm::all_to_all(const AllToAllArgs& args) {
  check_pair(*this, args.input, args.output);
  check_counts(*this, args.send_counts, args.input, "all_to_all send_counts");
  check_counts(*this, args.recv_counts, args.output, "all_to_all recv_counts");
  KL_CHECK(args.send_counts[rank()] == args.recv_counts[rank()],
           "all_to_all: this rank sends itself " + std::to_string(args.send_counts[rank()]) + " elements but expects " +
               std::to_string(args.recv_counts[rank()]));
  return do_all_to_all(args);
}

Status Comm::broadcast(const BroadcastArgs& args) {
  check_tensor(*this, args.data, "broadcast data");
  KL_CHECK(args.root >= 0 && args.root < size(),
           "broadcast root " + std::to_string(args.root) + " is not a rank of " + std::to_string(size()));
  return do_broadcast(args);
}

Status Comm::send(const PeerArgs& args) {
  check_tensor(*this, args.data, "send data");
  check_peer(*this, args.peer);
  return do_send(args);
}

Status Comm::recv(const PeerArgs& args) {
  check_tensor(*this, args.data, "recv data");
  check_peer(*this, args.peer);
  return do_recv(args);
}

Status Comm::barrier() { return do_barrier(); }

Result<std::unique_ptr<Comm>> Comm::split(const SplitArgs& args) {
  KL_CHECK(args.color >= 0, "split color " + std::to_string(args.color) + " is negative");
  return do_split(args);
}

}  // namespace klinear
