// How one model is split over ranks (docs/DESIGN.md "Ranks"): the degrees a user asks for, the
// checks that they divide the model (each a clear error naming the setting, before any weight is
// read), and the part of the model one rank holds.
//
// Layouts (each exact against one rank; the reductions are sums in another order):
// - tensor parallel (attention TP, with the dense FFN and the shared experts at the same degree,
//   as the seed runner pins it): a rank holds a block of the KDA and MLA heads (their projections'
//   rows, o_proj's columns, their states) and of the FFN intermediate (gate/up rows, down columns);
//   the partial outputs of o_proj and down are summed over the ranks (all-reduce), so every rank
//   holds every token's residual stream. The MLA latent cache is the same on every rank.
// - expert parallel: a rank holds a block of the routed experts; the router runs on every rank
//   over all experts, each rank runs the picks of its experts, and the partial sums meet in the
//   FFN's all-reduce.
// - vocab parallel embedding / lm head: a rank holds a block of the vocabulary's rows; the
//   embedding's zero rows for other ranks' ids are filled by an all-reduce, the lm head's logits
//   columns are all-gathered.
// Every degree is 1 or the world for now; the rank of a degree-d part is the world rank.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/json.h"

namespace klinear {

class Comm;

// The degrees, under the seed runner's names where it has one (parallel_config).
struct ParallelSizes {
  int world = 1;      // world_size: the ranks of the launch
  int tensor = 1;     // attn_tp_size = dense_tp_size = shared_tp_size (--tensor-parallel-size)
  int data = 1;       // attn_dp_size (--data-parallel-size)
  int expert = 1;     // moe_ep_size (--expert-parallel-size, or --enable-expert-parallel: the world)
  int embed = 1;      // embed_tp_size (default: tensor)
  int lm_head = 1;    // lmhead_tp_size (default: tensor)
};

// The seed runner's parallel_config object as ParallelSizes: its names, its defaults (1; the
// vocab degrees default to attn_tp_size), its checks (moe_tp_size must be 1, dense_tp_size and
// shared_tp_size equal to attn_tp_size); an unknown name is an error naming it.
Result<ParallelSizes> parse_parallel_config(const Json& parallel_config);

// Every check of the seed runner's "checks before running" that concerns the layout, as
// InvalidArgument naming the setting and the number it must divide ("expert_parallel_size 3 does
// not divide the 16 routed experts"), and the layouts not built yet as NotSupported.
Status check_parallel(const ModelConfig& config, const ParallelSizes& sizes);

// Block `index` of `count` equal blocks of something (heads, experts, rows).
struct Part {
  int index = 0, count = 1;
  bool whole() const { return count == 1; }
  int64_t size(int64_t n) const { return n / count; }
  int64_t first(int64_t n) const { return n / count * index; }
  Slice rows() const { return Slice{whole() ? Along::kWhole : Along::kRows, index, count}; }
  Slice columns() const { return Slice{whole() ? Along::kWhole : Along::kColumns, index, count}; }
};

// The part of the model one rank holds.
struct ModelShard {
  Part heads;    // KDA and MLA heads, the dense FFN's and the shared experts' intermediate
  Part experts;  // routed experts
  Part embed;    // embedding rows (vocabulary)
  Part lm_head;  // lm_head rows (vocabulary)
  bool whole() const { return heads.whole() && experts.whole() && embed.whole() && lm_head.whole(); }
};

// Rank `rank`'s part under `sizes` (check_parallel passed).
ModelShard shard_of(const ParallelSizes& sizes, int rank);

// `config` as one rank holds it: the KDA and MLA heads divided over the tensor-parallel ranks
// (what its caches and mixers are sized by); everything else as in `config`.
ModelConfig rank_config(const ModelConfig& config, const ModelShard& shard);

// A rank's part and the communicator its parts are summed and gathered over (every rank of the
// world, on the backend's device); no communicator for the whole model.
struct ModelRanks {
  ModelShard shard;
  Comm* comm = nullptr;
};

}  // namespace klinear
