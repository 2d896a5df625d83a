// Random-weight checkpoints of either family with real tensor names and layout: the demo model
// of the README (`klinear init`) and test inputs for shapes the fixtures do not cover.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/json.h"

namespace klinear {

// Preset names accepted by write_random_checkpoint.
std::vector<std::string> preset_names();
// The config.json document of a preset (InvalidArgument for an unknown name).
Result<Json> preset_config(const std::string& preset);
// The tokenizer (a folder of the repository's tokenizers/) whose vocabulary a preset has: kimi-k2
// or kimi-k3 for the presets with the real 163,840-id vocabulary, none for the tiny ones.
std::optional<std::string> preset_tokenizer(const std::string& preset);
// Writes `dir`/config.json and `dir`/model.safetensors for `config` (any valid config of either
// family, flat or nested): every tensor the model loads, under its real checkpoint name (K3 under
// `language_model.`), BF16 except the F32 tensors of real K3 checkpoints, MXFP4 experts when the
// config says so. Weights are drawn from N(0, 0.02²) with `seed`; norms are ones.
Status write_random_checkpoint(const Json& config, const std::string& dir, uint64_t seed);

}  // namespace klinear
