// The bf16 MLA prefill attention on FlashInfer's Hopper ragged-KV prefill kernel (mla_prefill_sm90.cu),
// called by CudaBackend::mla_prefill (mla.cu) after it has gathered the latent rows and expanded them.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/backend.h"

namespace klinear::cuda {

// The expanded keys and values of a step, and where the attention goes. Rows of every sequence's
// positions 0 .. cached + new are consecutive, sequence b from key row kv_base[b].
struct MlaPrefillSm90Args {
  const void* q;        // [N, H, 192] bf16: q_n (128) ‖ q_r (64) per head
  const void* kv;       // [R, H·256] bf16: per head k_n (128) ‖ v (128) of every key row
  const void* k_r;      // row r's rope key (64 bf16, shared by all heads) at k_r + r·kr_stride
  int64_t kr_stride;    // elements between rope keys of consecutive rows
  void* out;            // [N, H, 128] bf16
  int64_t heads;        // H
  int64_t key_rows;     // R = Σ_b cached[b] + new[b]
  float scale;          // softmax scale in natural units (MODEL.md 5: 1/√192)
};

// The head shape FlashInfer's kernel is compiled for here: q/k 128 + 64, v 128.
inline constexpr int64_t kSm90Nope = 128, kSm90Rope = 64, kSm90V = 128;

// Whether the compiled FlashInfer kernel serves a bf16 step of these shapes: the head shape above,
// and few enough 128-row query tiles per head (FlashInfer's planner switches to a second scheduler,
// not compiled here, past 4,096).
bool mla_prefill_sm90_fits(DType dtype, int64_t nope, int64_t rope, int64_t vd, const SeqLayout& layout);

// out ← causal attention of every new row over its sequence's cached + new keys (bottom-right
// aligned: the queries are the last new[b] of cached[b] + new[b] positions). Plans on the host and
// uploads the plan (not capturable: skipped while a graph capture runs, which then fails naming it).
// kv_base: [B+1] host copy of the key-row offsets.
void mla_prefill_sm90(CudaBackend& be, const MlaPrefillSm90Args& a, const SeqLayout& layout,
                      const std::vector<int32_t>& kv_base);

}  // namespace klinear::cuda
