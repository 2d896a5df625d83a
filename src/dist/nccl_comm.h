// The GPU world: NCCL over the ranks of a host world, one GPU per rank (CUDA builds only).
//
// Decision: NCCL is bootstrapped through the host world (mpi_comm.h), not a launcher of its own:
// rank 0 makes the unique id and broadcasts it over the host communicator (MPI under mpirun; a
// one-rank world needs no transport), then every rank joins with ncclCommInitRank. Collectives are
// enqueued on the stream given here and return once enqueued; ordering with other work is the
// stream's (pass the backend's stream, CudaBackend::stream()).
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "dist/comm.h"

namespace klinear {

// A communicator over the same ranks as `host_world` (a host communicator), on each rank's
// current CUDA device (select it with cudaSetDevice first), enqueuing on `stream`. A collective
// call of every rank of `host_world`. Errors name the NCCL call and the rank.
Result<std::unique_ptr<Comm>> open_gpu_world(Comm& host_world, cudaStream_t stream);

}  // namespace klinear
