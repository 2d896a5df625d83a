#include "runtime/model_world.h"

#include "dist/mpi_comm.h"

namespace klinear {

Result<ModelWorld> open_model_world(ParallelSizes sizes, const ModelConfig& config, Backend& backend) {
  ModelWorld w;
  KL_ASSIGN_OR_RETURN(w.host, open_host_world());
  sizes.world = w.host->size();
  if (sizes.expert == 0) sizes.expert = sizes.world;
  if (Status s = check_parallel(config, sizes); !s.ok())
    return sizes.world == 1 && sizes.tensor * sizes.data > 1
               ? Status(s.code(), s.message() + " (start the ranks with mpirun -np " +
                                      std::to_string(sizes.tensor * sizes.data) + " klinear ...)")
               : s;
  w.shard = shard_of(sizes, w.rank());
  if (w.size() > 1) {
    KL_ASSIGN_OR_RETURN(w.device, make_backend_comm(backend, *w.host));
  }
  return w;
}

}  // namespace klinear
