// The seed runner's settings file (RUNTIME.md "Settings"), as klinear reads it: a JSON object with
// up to three sections, model_config, parallel_config and data_config.
//
// parallel_config gives the layout over ranks (model/shard.h parse_parallel_config: the seed's
// names, defaults and checks; its world_size, when given, must be attn_tp_size × attn_dp_size).
// The fields of the other two sections are checked where the seed checks them and klinear has the
// same rule (pa_block_size a positive multiple of 16; next_n 0 without a draft model and positive
// with one; the draft model type none or dspark, and dspark refused until speculative decoding is
// built; sizes positive integers), and listed as unused, for the caller to say so: nothing in the
// file is silently ignored. Any other section is an error naming it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/json.h"
#include "model/shard.h"

namespace klinear {

struct RunnerSettings {
  std::optional<ParallelSizes> parallel;  // parallel_config's layout (world: its world_size or tp × dp)
  std::vector<std::string> unused;        // "data_config.max_new_tokens", ...: checked, not used yet
};

// `where` names the file in the errors ("--settings run.json").
Result<RunnerSettings> parse_runner_settings(const Json& settings, const std::string& where);
Result<RunnerSettings> read_runner_settings(const std::string& path);

}  // namespace klinear
