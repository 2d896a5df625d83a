// NcclComm: Comm over NCCL for device tensors, the same shape as MpiComm (mpi_comm.cc).
//
// Data that is only moved travels as bytes (ncclUint8). Reductions use NCCL's types, BF16
// included: NCCL reduces BF16 in BF16, rounding at each step of its ring or tree, so a BF16 sum over
// P ranks may differ from the F32 sum rounded once by up to about P roundings. All-to-all-v is a
// group of ncclSend/ncclRecv, one pair per rank with a non-zero count. Errors become a Status
// naming the call, the rank, NCCL's error string and its last message.
#include "dist/nccl_comm.h"

#include <nccl.h>

#include <string>

namespace klinear {

namespace {

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

ncclDataType_t nccl_reduce_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    default: KL_CHECK(false, std::string("no NCCL reduction over ") + dtype_name(dtype));
  }
}

class NcclComm final : public Comm {
 public:
  NcclComm(ncclComm_t comm, cudaStream_t stream) : comm_(comm), stream_(stream) {
    ncclCommUserRank(comm_, &rank_);
    ncclCommCount(comm_, &size_);
  }
  ~NcclComm() override {
    if (barrier_word_ != nullptr) cudaFree(barrier_word_);
    ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::kCuda; }

 private:
  Status check(ncclResult_t rc, const char* call) const {
    if (rc == ncclSuccess) return {};
    const std::string last = ncclGetLastError(comm_);
    return comm_error(call, *this, std::string(ncclGetErrorString(rc)) + (last.empty() ? "" : " (" + last + ")"));
  }
  Status check_cuda(cudaError_t rc, const char* call) const {
    return rc == cudaSuccess ? Status() : comm_error(call, *this, cudaGetErrorString(rc));
  }

  Status do_all_gather(const AllGatherArgs& args) override {
    return check(ncclAllGather(args.input.data(), args.output.data(), args.input.nbytes(), ncclUint8, comm_, stream_),
                 "ncclAllGather");
  }

  Status do_reduce_scatter(const ReduceScatterArgs& args) override {
    return check(ncclReduceScatter(args.input.data(), args.output.data(), static_cast<size_t>(args.output.numel()),
                                   nccl_reduce_type(args.input.dtype()), nccl_op(args.op), comm_, stream_),
                 "ncclReduceScatter");
  }

  Status do_all_reduce(const AllReduceArgs& args) override {
    return check(ncclAllReduce(args.input.data(), args.output.data(), static_cast<size_t>(args.output.numel()),
                               nccl_reduce_type(args.input.dtype()), nccl_op(args.op), comm_, stream_),
                 "ncclAllReduce");
  }

  Status do_all_to_all(const AllToAllArgs& args) override {
    const size_t element = dtype_size(args.input.dtype());
    const char* input = static_cast<const char*>(args.input.data());
    char* output = static_cast<char*>(args.output.data());
    Status status = check(ncclGroupStart(), "ncclGroupStart");
    size_t sent = 0, received = 0;
    for (int peer = 0; peer < size_ && status.ok(); ++peer) {
      const size_t send_bytes = static_cast<size_t>(args.send_counts[peer]) * element;
      const size_t recv_bytes = static_cast<size_t>(args.recv_counts[peer]) * element;
      if (send_bytes > 0) status = check(ncclSend(input + sent, send_bytes, ncclUint8, peer, comm_, stream_), "ncclSend");
      if (status.ok() && recv_bytes > 0) {
        status = check(ncclRecv(output + received, recv_bytes, ncclUint8, peer, comm_, stream_), "ncclRecv");
      }
      sent += send_bytes;
      received += recv_bytes;
    }
    // The group is closed whatever failed inside it.
    const Status end = check(ncclGroupEnd(), "ncclGroupEnd");
    return status.ok() ? end : status;
  }

  Status do_broadcast(const BroadcastArgs& args) override {
    return check(ncclBroadcast(args.data.data(), args.data.data(), args.data.nbytes(), ncclUint8, args.root, comm_,
                               stream_),
                 "ncclBroadcast");
  }

  Status do_send(const PeerArgs& args) override {
    return check(ncclSend(args.data.data(), args.data.nbytes(), ncclUint8, args.peer, comm_, stream_), "ncclSend");
  }

  Status do_recv(const PeerArgs& args) override {
    return check(ncclRecv(args.data.data(), args.data.nbytes(), ncclUint8, args.peer, comm_, stream_), "ncclRecv");
  }

  // NCCL has no barrier: an all-reduce of one word, then the stream is drained.
  Status do_barrier() override {
    if (barrier_word_ == nullptr) {
      KL_RETURN_IF_ERROR(check_cuda(cudaMalloc(&barrier_word_, sizeof(int32_t)), "cudaMalloc (barrier)"));
    }
    KL_RETURN_IF_ERROR(check(ncclAllReduce(barrier_word_, barrier_word_, 1, ncclInt32, ncclSum, comm_, stream_),
                             "ncclAllReduce (barrier)"));
    return check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (barrier)");
  }

  Result<std::unique_ptr<Comm>> do_split(const SplitArgs& args) override {
    ncclComm_t group = nullptr;
    KL_RETURN_IF_ERROR(check(ncclCommSplit(comm_, args.color, args.key, &group, nullptr), "ncclCommSplit"));
    return std::unique_ptr<Comm>(std::make_unique<NcclComm>(group, stream_));
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_ = 0;
  int size_ = 1;
  void* barrier_word_ = nullptr;  // [1] int32 on the device, allocated by the first barrier
};

}  // namespace

Result<std::unique_ptr<Comm>> open_gpu_world(Comm& host_world, cudaStream_t stream) {
  KL_CHECK(host_world.device() == Device::kCpu, "open_gpu_world needs a host communicator to send the NCCL id");
  // Rank 0's id and whether it made one: the other ranks learn of a failure instead of waiting.
  struct Bootstrap {
    ncclUniqueId id;
    int32_t made;
  } bootstrap{};
  if (host_world.rank() == 0) bootstrap.made = ncclGetUniqueId(&bootstrap.id) == ncclSuccess;
  const Tensor bytes = Tensor::wrap(DType::kU8, {static_cast<int64_t>(sizeof bootstrap)}, &bootstrap, nullptr,
                                    Device::kCpu);
  KL_RETURN_IF_ERROR(host_world.broadcast({.data = bytes, .root = 0}));
  if (!bootstrap.made) return comm_error("ncclGetUniqueId", host_world, "rank 0 could not make the NCCL id");
  ncclComm_t comm = nullptr;
  const ncclResult_t rc = ncclCommInitRank(&comm, host_world.size(), bootstrap.id, host_world.rank());
  if (rc != ncclSuccess) return comm_error("ncclCommInitRank", host_world, ncclGetErrorString(rc));
  return std::unique_ptr<Comm>(std::make_unique<NcclComm>(comm, stream));
}

}  // namespace klinear
