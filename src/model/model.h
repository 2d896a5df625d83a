// Model: the whole Kimi Linear / K3 forward as backend calls (MODEL.md 6-8). It knows the math and
// the layer table, never the device.
//
// forward() runs one step over many sequences (docs/DESIGN.md "One step, many sequences"): the
// new tokens of every sequence of a planned Batch, each continuing from its state in the Cache.
// Decoding sequences (one token after earlier ones) take the decode forms (recurrent KDA, absorbed
// MLA over the latent pages), the others the prefill forms (chunked KDA, expanded MLA), each part
// in one op call. Token-wise work (embedding, norms, GEMMs, MoE, AttnRes) runs on all N rows at
// once; only the mixers and the logits selection look at the sequences.
//
// How a step runs beyond the math (fixed shapes, graphs, drawing tokens) is the runtime's
// (runtime/step_executor.h): Model computes the logits of a batch and knows nothing of graphs.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "backend/backend.h"
#include "io/config.h"
#include "model/cache.h"
#include "model/shard.h"
#include "model/weights.h"

namespace klinear {

// Where the weights come from: the checkpoint's safetensors, or dummy weights from config.json
// alone (--load-format dummy).
enum class LoadFormat { kSafetensors, kDummy };
Result<LoadFormat> parse_load_format(const std::string& name);

class Model {
 public:
  // Reads config.json and the weights of `dir` onto `backend` (which must outlive the model): the
  // part `ranks.shard` of them, summed and gathered over `ranks.comm` (which must outlive the model
  // too; model/shard.h). Refuses, before loading, weights that do not fit in the backend's memory.
  static Result<std::unique_ptr<Model>> load(const std::string& dir, Backend& backend,
                                             LoadFormat format = LoadFormat::kSafetensors,
                                             const ModelRanks& ranks = {});
  // `config` as the rank holds it (rank_config), `weights` its part.
  Model(ModelConfig config, ModelWeights weights, Backend& backend, const ModelRanks& ranks = {})
      : config_(std::move(config)), weights_(std::move(weights)), backend_(backend), ranks_(ranks) {}

  // The model as this rank holds it: the config's heads are the rank's (rank_config), so caches
  // sized by it hold the rank's part of the states.
  const ModelConfig& config() const { return config_; }
  const ModelShard& shard() const { return ranks_.shard; }
  Backend& backend() const { return backend_; }
  // With checks on, forward() copies each sublayer's output to the host and fails (Corruption)
  // naming the first layer whose output is not finite (the states of the step's sequences are then
  // undefined: close them). Off by default: it synchronises every layer.
  void set_check_finite(bool on) { check_finite_ = on; }

  bool check_finite() const { return check_finite_; }

  // Runs `batch` (from cache.plan) and advances its sequences. Returns the logits of the batch's
  // logit_rows, [R, V] F32 on the backend's device, valid until the backend's next step.
  Result<Tensor> forward(Batch& batch, Cache& cache);
  // One sequence's step: reserve + plan + forward, logits as a host F32 tensor ([1, V] or [T, V]).
  Result<Tensor> forward_one(Cache& cache, SeqId seq, std::span<const int32_t> ids, LogitsMode mode);
  // The layers, the final norm and the lm_head over a batch whose layouts are on the device
  // (Backend::upload_layout, or fixed buffers a graph reads): the logits of `logit_rows` ([R] I32
  // on the device) for the token `ids` ([N] I32 on the device). Advances nothing.
  Result<Tensor> logits(const Batch& batch, Cache& cache, const Tensor& ids, const Tensor& logit_rows);
  // Rank 0's `token` on every rank (a broadcast; `token` itself on one rank): the tokens each rank
  // draws from its copy of the logits then agree whatever the last bits of the sums over ranks.
  Result<int32_t> first_rank_token(int32_t token);

 private:
  Tensor kda(const KdaWeights& w, const Tensor& x, int64_t layer, const Batch& batch, Cache& cache);
  Tensor mla(const MlaWeights& w, const Tensor& x, int64_t layer, const Batch& batch, Cache& cache);
  Tensor mlp(const MlpWeights& w, const Tensor& x);
  Tensor moe(const MoeWeights& w, const Tensor& x);
  Tensor attn_res_read(std::vector<Tensor> candidates, const Tensor& query);
  // The sum over the ranks of their partial `t` (in place): o_proj's and the FFN's outputs under
  // tensor or expert parallelism, the vocab-parallel embedding. A failure is kept for logits().
  void sum_over_ranks(const Tensor& t);
  // shared's part of the FFN output added to `out` (add_shared_experts), its partial sums first
  // summed over the ranks when the shared experts are split.
  void add_shared(const SharedExperts& shared, const Tensor& out);
  Tensor act(const Shape& shape) { return backend_.alloc(backend_.activation_dtype(), shape); }

  ModelConfig config_;
  ModelWeights weights_;
  Backend& backend_;
  ModelRanks ranks_;
  Status comm_failed_;  // the first collective that failed in this step
  bool check_finite_ = false;
};

}  // namespace klinear
