// The host world of this process: Open MPI's when a launcher (mpirun) started it, one rank alone
// otherwise.
//
// Decision: the launcher is detected from its environment (Open MPI's OMPI_COMM_WORLD_SIZE, PMIx's
// PMIX_RANK, PMI's PMI_RANK), never by initialising MPI to look: a process started directly
// (`klinear generate ...`, the tests, the server) then loads no MPI runtime at all and gets a
// SelfComm. Under a launcher, MPI is initialised (MPI_THREAD_SERIALIZED: any one thread at a time
// may call it) by one session object that every MPI communicator holds, so MPI_Finalize runs when
// the last of them is destroyed; MPI cannot start again in the same process afterwards.
#pragma once

#include <memory>

#include "dist/comm.h"

namespace klinear {

// True when the environment says a launcher started this process as one of its ranks.
bool launched_by_mpi();

// This process's rank among the launch's ranks on its host (Open MPI's OMPI_COMM_WORLD_LOCAL_RANK,
// MPICH's MPI_LOCALRANKID, PMI_LOCAL_RANK): the GPU it takes. 0 without a launcher.
int launcher_local_rank();

// The world communicator (host tensors): every rank of the launch under mpirun, a one-rank
// SelfComm otherwise. Errors: MPI failing to start, or starting after it was finalised.
Result<std::unique_ptr<Comm>> open_host_world();

}  // namespace klinear
