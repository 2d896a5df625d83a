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
// A decode-only step (every sequence decodes one token; no snapshots, finite checks off, at most
// 256 sequences) runs at a fixed shape: padded to the next batch bucket (1, 2, 4, ..., 256; see
// Cache::pad), its inputs written into fixed device buffers, the forward, the logits and the
// sampling as one Backend::run_graph body per bucket, which CUDA captures and replays as a graph
// (docs/DESIGN.md "The decode step as a CUDA graph"). Padding happens with graphs off too, so a
// step gives the same bits with and without them.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>

#include "backend/backend.h"
#include "io/config.h"
#include "model/cache.h"
#include "model/weights.h"

namespace klinear {

// Where the weights come from: the checkpoint's safetensors, or dummy weights from config.json
// alone (--load-format dummy).
enum class LoadFormat { kSafetensors, kDummy };
Result<LoadFormat> parse_load_format(const std::string& name);

// The outputs of one step on the backend's device, valid until its next step.
struct StepOutput {
  Tensor logits;  // [R, V] F32: the batch's logit_rows
  Tensor ids;     // [R] I32: the tokens drawn (Backend::sample); undefined when no draws were given
};

class Model {
 public:
  // Reads config.json and the weights of `dir` onto `backend` (which must outlive the model).
  // Refuses, before loading, weights that do not fit in the backend's memory.
  static Result<std::unique_ptr<Model>> load(const std::string& dir, Backend& backend,
                                             LoadFormat format = LoadFormat::kSafetensors);
  Model(ModelConfig config, ModelWeights weights, Backend& backend)
      : config_(std::move(config)), weights_(std::move(weights)), backend_(backend) {}

  const ModelConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }
  // With checks on, forward() copies each sublayer's output to the host and fails (Corruption)
  // naming the first layer whose output is not finite (the states of the step's sequences are then
  // undefined: close them). Off by default: it synchronises every layer.
  void set_check_finite(bool on) { check_finite_ = on; }

  // Runs `batch` (from cache.plan) and advances its sequences. Returns the logits of the batch's
  // logit_rows, [R, V] F32 on the backend's device, valid until the backend's next step.
  Result<Tensor> forward(Batch& batch, Cache& cache);
  // The same, drawing one token per logits row with `draws` ([R], or empty for none).
  Result<StepOutput> step(Batch& batch, Cache& cache, std::span<const SampleRow> draws = {});
  // One sequence's step: plan + forward, logits as a host F32 tensor ([1, V] or [T, V]).
  Result<Tensor> forward_one(Cache& cache, SeqId seq, std::span<const int32_t> ids, LogitsMode mode);

 private:
  // Batch buckets of fixed-shape decode steps.
  static constexpr int64_t kMaxBucket = 256;
  // The fixed device inputs of decode steps (sized for the largest bucket `cache_id`'s slots
  // allow, and its page table), and the outputs each bucket's body produced.
  struct DecodeBuffers {
    uint64_t cache_id = 0;
    int64_t cols = 0;       // page table columns
    Tensor i32, f32;        // ids, cu_seqlens, cached, slots, logit_rows, top_k, seed, counter, page_table | temperature, top_p
    std::map<int64_t, StepOutput> out;  // by bucket
  };
  bool fixed_shape(const Batch& batch) const;
  Result<StepOutput> decode_step(Batch& batch, Cache& cache, std::span<const SampleRow> draws);
  // The layers, the final norm and the lm_head over a batch whose layouts are on the device.
  Result<Tensor> logits(Batch& batch, Cache& cache, const Tensor& ids, const Tensor& logit_rows);

  Tensor kda(const KdaWeights& w, const Tensor& x, int64_t layer, const Batch& batch, Cache& cache);
  Tensor mla(const MlaWeights& w, const Tensor& x, int64_t layer, const Batch& batch, Cache& cache);
  Tensor mlp(const MlpWeights& w, const Tensor& x);
  Tensor moe(const MoeWeights& w, const Tensor& x);
  Tensor attn_res_read(std::vector<Tensor> candidates, const Tensor& query);
  Tensor act(const Shape& shape) { return backend_.alloc(backend_.activation_dtype(), shape); }

  ModelConfig config_;
  ModelWeights weights_;
  Backend& backend_;
  bool check_finite_ = false;
  DecodeBuffers decode_;
};

}  // namespace klinear
