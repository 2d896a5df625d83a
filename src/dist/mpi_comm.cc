// MpiComm: Comm over Open MPI for host tensors, and the session that owns MPI_Init/MPI_Finalize.
//
// Data that is only moved travels as bytes (MPI_BYTE), whatever its dtype. Reductions use MPI's
// types (F32, I32, I64); BF16, which MPI has no type for, is widened to F32, reduced there and
// rounded to BF16 once, so the result is the F32 sum over ranks (in MPI's order) rounded to
// nearest even. MPI's counts are ints: a call of 2^31 bytes or more aborts, naming the call.
// Errors return as codes (MPI_ERRORS_RETURN) and become a Status naming the call and the rank.
#include "dist/mpi_comm.h"

// Only MPI's C interface: its C++ bindings (deprecated since MPI-2.2) do not compile warning-free.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "dist/self_comm.h"

namespace klinear {

namespace {

std::string mpi_error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) return "MPI error code " + std::to_string(rc);
  return std::string(text, length);
}

// Owns MPI's lifetime; every MpiComm holds it (see mpi_comm.h).
class MpiSession {
 public:
  static Result<std::shared_ptr<MpiSession>> start() {
    static std::weak_ptr<MpiSession> current;
    if (auto session = current.lock()) return session;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return Status::NotSupported("MPI: the world was closed already and MPI cannot start twice");
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) return Status::IOError("MPI_Init_thread: " + mpi_error_string(rc));
    auto session = std::shared_ptr<MpiSession>(new MpiSession());
    if (provided < MPI_THREAD_SERIALIZED) {
      return Status::NotSupported("MPI_Init_thread: the MPI library provides thread level " + std::to_string(provided) +
                                  ", klinear needs MPI_THREAD_SERIALIZED (" +
                                  std::to_string(MPI_THREAD_SERIALIZED) + ")");
    }
    // Communicators split from the world inherit this handler.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    current = session;
    return session;
  }
  ~MpiSession() { MPI_Finalize(); }

 private:
  MpiSession() = default;
};

int mpi_count(int64_t n, const char* call) {
  KL_CHECK(n <= INT_MAX, std::string(call) + ": " + std::to_string(n) + " exceeds MPI's int counts");
  return static_cast<int>(n);
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::kSum ? MPI_SUM : MPI_MAX; }

// The buffers an MPI reduction runs on: the tensors themselves, or F32 copies of BF16 ones.
struct ReduceBuffers {
  Tensor input;   // [n_in] what MPI reads
  Tensor output;  // [n_out] what MPI writes
  MPI_Datatype type;
};

ReduceBuffers reduce_buffers(const Tensor& input, const Tensor& output) {
  switch (input.dtype()) {
    case DType::kF32: return {input, output, MPI_FLOAT};
    case DType::kI32: return {input, output, MPI_INT32_T};
    case DType::kI64: return {input, output, MPI_INT64_T};
    case DType::kBF16: {
      Tensor wide = Tensor::empty(DType::kF32, {input.numel()});
      convert_to_f32(DType::kBF16, input.data(), wide.f32(), static_cast<size_t>(input.numel()));
      return {wide, Tensor::empty(DType::kF32, {output.numel()}), MPI_FLOAT};
    }
    default: KL_CHECK(false, std::string("no MPI reduction over ") + dtype_name(input.dtype()));
  }
}

// Rounds a widened BF16 result into `output` (nothing to do when MPI wrote `output` itself).
void finish_reduce(const ReduceBuffers& buffers, const Tensor& output) {
  if (buffers.output.data() == output.data()) return;
  const float* wide = buffers.output.f32();
  uint16_t* out = output.data_as<uint16_t>();
  for (int64_t i = 0; i < output.numel(); ++i) out[i] = f32_to_bf16(wide[i]);
}

// Byte counts and offsets of packed per-rank parts, in MPI's ints.
struct Packing {
  std::vector<int> counts;
  std::vector<int> offsets;
};

Packing packing(const std::vector<int64_t>& counts, DType dtype, const char* call) {
  Packing p;
  int64_t offset = 0;
  for (int64_t c : counts) {
    const int64_t bytes = c * static_cast<int64_t>(dtype_size(dtype));
    p.counts.push_back(mpi_count(bytes, call));
    p.offsets.push_back(mpi_count(offset, call));
    offset += bytes;
  }
  return p;
}

class MpiComm final : public Comm {
 public:
  MpiComm(std::shared_ptr<MpiSession> session, MPI_Comm comm) : session_(std::move(session)), comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiComm() override {
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::kCpu; }

 private:
  Status check(int rc, const char* call) const {
    return rc == MPI_SUCCESS ? Status() : comm_error(call, *this, mpi_error_string(rc));
  }

  Status do_all_gather(const AllGatherArgs& args) override {
    const int bytes = mpi_count(static_cast<int64_t>(args.input.nbytes()), "MPI_Allgather");
    return check(MPI_Allgather(args.input.data(), bytes, MPI_BYTE, args.output.data(), bytes, MPI_BYTE, comm_),
                 "MPI_Allgather");
  }

  Status do_reduce_scatter(const ReduceScatterArgs& args) override {
    const ReduceBuffers buffers = reduce_buffers(args.input, args.output);
    KL_RETURN_IF_ERROR(check(MPI_Reduce_scatter_block(buffers.input.data(), buffers.output.data(),
                                                      mpi_count(args.output.numel(), "MPI_Reduce_scatter_block"),
                                                      buffers.type, mpi_op(args.op), comm_),
                             "MPI_Reduce_scatter_block"));
    finish_reduce(buffers, args.output);
    return {};
  }

  Status do_all_reduce(const AllReduceArgs& args) override {
    const ReduceBuffers buffers = reduce_buffers(args.input, args.output);
    const bool in_place = buffers.input.data() == buffers.output.data();
    KL_RETURN_IF_ERROR(check(MPI_Allreduce(in_place ? MPI_IN_PLACE : buffers.input.data(), buffers.output.data(),
                                           mpi_count(args.output.numel(), "MPI_Allreduce"), buffers.type,
                                           mpi_op(args.op), comm_),
                             "MPI_Allreduce"));
    finish_reduce(buffers, args.output);
    return {};
  }

  Status do_all_to_all(const AllToAllArgs& args) override {
    const Packing send = packing(args.send_counts, args.input.dtype(), "MPI_Alltoallv");
    const Packing recv = packing(args.recv_counts, args.output.dtype(), "MPI_Alltoallv");
    return check(MPI_Alltoallv(args.input.data(), send.counts.data(), send.offsets.data(), MPI_BYTE,
                               args.output.data(), recv.counts.data(), recv.offsets.data(), MPI_BYTE, comm_),
                 "MPI_Alltoallv");
  }

  Status do_broadcast(const BroadcastArgs& args) override {
    const int bytes = mpi_count(static_cast<int64_t>(args.data.nbytes()), "MPI_Bcast");
    return check(MPI_Bcast(args.data.data(), bytes, MPI_BYTE, args.root, comm_), "MPI_Bcast");
  }

  Status do_send(const PeerArgs& args) override {
    const int bytes = mpi_count(static_cast<int64_t>(args.data.nbytes()), "MPI_Send");
    return check(MPI_Send(args.data.data(), bytes, MPI_BYTE, args.peer, kTag, comm_), "MPI_Send");
  }

  Status do_recv(const PeerArgs& args) override {
    const int bytes = mpi_count(static_cast<int64_t>(args.data.nbytes()), "MPI_Recv");
    return check(MPI_Recv(args.data.data(), bytes, MPI_BYTE, args.peer, kTag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
  }

  Status do_barrier() override { return check(MPI_Barrier(comm_), "MPI_Barrier"); }

  Result<std::unique_ptr<Comm>> do_split(const SplitArgs& args) override {
    MPI_Comm group = MPI_COMM_NULL;
    KL_RETURN_IF_ERROR(check(MPI_Comm_split(comm_, args.color, args.key, &group), "MPI_Comm_split"));
    return std::unique_ptr<Comm>(std::make_unique<MpiComm>(session_, group));
  }

  // Point-to-point messages are matched by order between two ranks; one tag serves them all.
  static constexpr int kTag = 0;

  std::shared_ptr<MpiSession> session_;
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
         std::getenv("PMI_RANK") != nullptr;
}

int launcher_local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 0;
}

Result<std::unique_ptr<Comm>> open_host_world() {
  if (!launched_by_mpi()) return std::unique_ptr<Comm>(std::make_unique<SelfComm>());
  KL_ASSIGN_OR_RETURN(auto session, MpiSession::start());
  return std::unique_ptr<Comm>(std::make_unique<MpiComm>(std::move(session), MPI_COMM_WORLD));
}

}  // namespace klinear
