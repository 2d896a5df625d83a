// ModelWorld: the ranks of one launch that a model is split over (model/shard.h), and the two
// communicators they talk through.
//
// Decision: the launch decides the world (mpirun -np N: N ranks, one process each; no launcher:
// one rank), the user's degrees decide the layout, and every check runs before a weight is read.
// Two communicators: the host world (MPI) for what the ranks agree on outside the model (rank 0's
// schedule, runtime/rank_runner.h), and the backend's (make_backend_comm: MPI on the CPU, NCCL on
// GPUs) for the model's sums and gathers, so control messages never queue behind device work.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "dist/comm.h"
#include "io/config.h"
#include "model/shard.h"

namespace klinear {

struct ModelWorld {
  std::unique_ptr<Comm> host;    // the launch's world (open_host_world)
  std::unique_ptr<Comm> device;  // the model's communicator; none on one rank
  ModelShard shard;              // this rank's part of the model

  int rank() const { return host->rank(); }
  int size() const { return host->size(); }
  bool leader() const { return host->rank() == 0; }  // owns stdout, the output files and the port
  ModelRanks model_ranks() const { return ModelRanks{shard, device.get()}; }
};

// Opens the launch's world, checks `sizes` against it and `config` (check_parallel; sizes.world is
// the launch's, sizes.expert 0 means every rank) and makes the backend's communicator. A
// collective call of every rank of the launch. The errors name the setting: "tensor_parallel_size 2
// x data_parallel_size 1 = 2 ranks, the launch has world_size 1 (start N ranks with mpirun -np N)".
Result<ModelWorld> open_model_world(ParallelSizes sizes, const ModelConfig& config, Backend& backend);

}  // namespace klinear
