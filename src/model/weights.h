// Typed per-layer weights on the backend, and the strict loader that fills them from a
// Checkpoint. Fused at load time (docs/DESIGN.md "Strict loading by demand"): KDA q/k/v projections into
// one [3P, D] weight and their convs into [3P, Kc]; gate/up of every MLP into [2F, D]; routed
// experts into [E, 2F, Din] and [E, Dout, F] (MXFP4 experts through Backend::upload_mxfp4).
#pragma once

#include <map>
#include <vector>

#include "backend/backend.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "model/shard.h"

namespace klinear {

struct KdaWeights {
  Tensor qkv_proj;  // [3P, D]: q rows, then k, then v
  Tensor conv;      // [3P, Kc]
  Tensor f_a;       // [d, D]
  Tensor f_b;       // [P, d]
  Tensor dt_bias;   // [P]
  Tensor a_log;     // [H] (padding trimmed)
  Tensor b_proj;    // [H, D]
  Tensor g_proj;    // [P, D] full-rank output gate, or undefined
  Tensor g_a, g_b;  // [d, D], [P, d] low-rank output gate, or undefined
  Tensor o_norm;    // [d]
  Tensor o_proj;    // [D, P]
};

struct MlaWeights {
  Tensor q_proj;            // [H·(n+r), D] without q-LoRA, else undefined
  Tensor q_a, q_a_norm;     // [r_q, D], [r_q] with q-LoRA
  Tensor q_b;               // [H·(n+r), r_q]
  Tensor kv_a;              // [c + r, D]
  Tensor kv_a_norm;         // [c]
  Tensor kv_b;              // [H·(n+v), c]
  Tensor g_proj;            // [H·v, D] output gate, or undefined
  Tensor o_proj;            // [D, H·v]
};

struct MlpWeights {
  Tensor gate_up;  // [2F, D]
  Tensor down;     // [D, F]
};

struct MoeWeights {
  Tensor router;       // [E, D]
  Tensor router_bias;  // [E] e_score_correction_bias (zeros when absent)
  ExpertMatrix w13;    // [E, 2F, Din]
  ExpertMatrix w2;     // [E, Dout, F]
  bool has_shared = false;
  MlpWeights shared;   // intermediate F·n_shared
  Tensor latent_down;  // [L, D] latent MoE, or undefined
  Tensor latent_norm;  // [L] when latent_moe_use_norm, else undefined
  Tensor latent_up;    // [D, L]
};

struct LayerWeights {
  Mixer mixer;
  Ffn ffn;
  Tensor input_norm, post_norm;  // [D]
  Tensor attn_res_query;         // [D] F32 effective query w_norm ⊙ w_proj (AttnRes only)
  Tensor mlp_res_query;          // [D]
  KdaWeights kda;
  MlaWeights mla;
  MlpWeights mlp;
  MoeWeights moe;
};

struct ModelWeights {
  Tensor embed;              // [V, D]
  Tensor final_norm;         // [D]
  Tensor lm_head;            // [V, D]
  Tensor output_res_query;   // [D] AttnRes only
  std::vector<LayerWeights> layers;
};

// Loads the part `shard` of every parameter `config` needs from `ckpt` onto `backend` (reading
// only that part of the mapped files); fails if anything is missing, has a wrong shape, or is left
// over in the checkpoint. The weights' shapes are the rank's (rank_config's heads).
Result<ModelWeights> load_weights(const ModelConfig& config, Checkpoint& ckpt, Backend& backend,
                                  const ModelShard& shard = {});
// The part `shard` of every parameter of `config` as dummy weights made on the backend
// (Backend::random_fill, seeded by each tensor's name, well scaled, a rank's part holding the
// values of the whole; MXFP4 routed experts, when the config says so, made on the host as random
// nibbles with one scale a matrix and uploaded through upload_mxfp4): real shapes without a download.
Result<ModelWeights> dummy_weights(const ModelConfig& config, Backend& backend, const ModelShard& shard = {});

// How a backend holds weights, which decides their bytes.
struct WeightStorage {
  DType activation = DType::kBF16;              // matrices and norms
  Mxfp4Storage mxfp4 = Mxfp4Storage::kPacked;   // MXFP4 routed experts
};
WeightStorage storage_of(const Backend& backend);

// What the part `shard` of the weights holds: parameters, and bytes by the dtype they are held in
// (MXFP4 experts held packed count as U8: packed and scales).
struct WeightCount {
  uint64_t parameters = 0;
  std::map<DType, uint64_t> bytes;
  uint64_t total_bytes() const;
};
WeightCount count_weights(const ModelConfig& config, const WeightStorage& storage, const ModelShard& shard = {});
// How many parameter elements dummy_weights would make for `shard`.
uint64_t count_parameters(const ModelConfig& config, const ModelShard& shard = {});

}  // namespace klinear
