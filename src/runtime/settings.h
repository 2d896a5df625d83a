// The seed runner's settings file (RUNTIME.md "Settings"), as klinear reads it: a JSON object with
// up to three sections, model_config, parallel_config and data_config.
//
// parallel_config gives the layout over ranks (model/shard.h parse_parallel_config: the seed's
// names, defaults and checks; its world_size, when given, must be attn_tp_size × attn_dp_size).
// The fields of the other two sections are checked where the seed checks them and klinear has the
// same rule (pa_block_size a positive multiple of 16; next_n 0 without a draft model and positive
// with one; the draft model type none or dspark, and dspark refused until speculative decoding is
// built; sizes positive integers); a command takes those it has a setting for (pa_block_size: the
// page size; batch_size_per_rank: the sequences at once; max_new_tokens: a request's default
// max_tokens) and names the rest as unused: nothing in the file is silently ignored. Any other
// section is an error naming it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/json.h"
#include "model/shard.h"

namespace klinear {

struct RunnerSettings {
  // One field of model_config or data_config, checked.
  struct Field {
    std::string name;  // "data_config.pa_block_size"
    Json value;
    bool used = false;  // a command took it (take_setting)
  };
  std::optional<ParallelSizes> parallel;  // parallel_config's layout (world: its world_size or tp × dp)
  std::vector<Field> fields;              // sorted by name

  // The value of `key` (either section) for a command to use, marking it used; null when absent.
  const Json* take(const std::string& key);
  // The fields no command took, by name.
  std::vector<std::string> unused() const;
};

// `where` names the file in the errors ("--settings run.json").
Result<RunnerSettings> parse_runner_settings(const Json& settings, const std::string& where);
Result<RunnerSettings> read_runner_settings(const std::string& path);

}  // namespace klinear
