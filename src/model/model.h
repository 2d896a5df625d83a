// Model: the whole Kimi Linear / K3 forward as backend calls (SPEC 6-8). It knows the math and
// the layer table, never the device.
//
// forward() runs T new tokens of one sequence from `state` and advances it: a multi-token step is
// a prefill (chunked KDA, expanded MLA over all cached + new tokens), a single token after earlier
// tokens is a decode step (recurrent KDA, absorbed MLA over the latent cache). Both continue from
// whatever the state holds, so a prompt can be fed in pieces.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "backend/backend.h"
#include "io/config.h"
#include "model/state.h"
#include "model/weights.h"

namespace klinear {

enum class LogitsMode { kAll, kLast };

class Model {
 public:
  // Reads config.json and the safetensors of `dir` onto `backend` (which must outlive the model).
  static Result<std::unique_ptr<Model>> load(const std::string& dir, Backend& backend);
  Model(ModelConfig config, ModelWeights weights, Backend& backend)
      : config_(std::move(config)), weights_(std::move(weights)), backend_(backend) {}

  const ModelConfig& config() const { return config_; }
  SequenceState new_sequence() const;

  // Logits [T, V] (kAll) or [1, V] (kLast) as host F32. Errors: empty input, an id outside the
  // vocabulary, or a sequence that would exceed max_position_embeddings; the state is unchanged.
  Result<Tensor> forward(std::span<const int32_t> ids, SequenceState& state, LogitsMode mode);

 private:
  Tensor kda(const KdaWeights& w, const Tensor& x, KdaLayerState& s, bool decode);
  Tensor mla(const MlaWeights& w, const Tensor& x, MlaLayerState& s, int64_t past, bool decode);
  Tensor mlp(const MlpWeights& w, const Tensor& x);
  Tensor moe(const MoeWeights& w, const Tensor& x);
  Tensor attn_res_read(std::vector<Tensor> candidates, const Tensor& query);

  ModelConfig config_;
  ModelWeights weights_;
  Backend& backend_;
};

}  // namespace klinear
