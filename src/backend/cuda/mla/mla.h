// The ways the CUDA backend runs MLA attention (MODEL.md 5): the prefill's over the expanded keys,
// the decode's in the latent space (mla.cu). mla_prefill and mla_decode pick one by the backend's
// AttentionKernels and the step (mla_prefill_path_for, mla_decode_path_for); the tests and the
// benchmark name one (mla_prefill_on, mla_decode_on).
#pragma once

#include <cstdint>

#include "backend/cuda/backend.h"

namespace klinear::cuda {

// The kernel that runs the prefill's attention (after the gather of the latent rows and kv = latent·kv_bᵀ).
enum class MlaPrefillPath {
  // FlashInfer's Hopper ragged prefill (mla_prefill_sm90.cu, wgmma + TMA): bf16 at q/k 128 + 64,
  // v 128, within the compiled kernel's tile bound (mla_prefill_sm90_fits).
  kFlashInfer,
  // mla.cu's `expanded_kernel` (mma.sync flash attention): bf16 at q/k 128 + 64, v 128.
  kExpanded,
  // mla.cu's `attend` (a warp per query row and head, fp32): any dtype, q/k up to 640, v up to 512.
  kAttend,
};

// The kernel that runs the decode's attention in the latent space (between q·W_UK and o·W_UV).
enum class MlaDecodePath {
  // FlashInfer's Hopper MLA decode (mla_decode_sm90.cu, wgmma), planned per step on the host
  // (plan_step before a graph's capture): bf16 at latent 512 + 64.
  kFlashInfer,
  // mla.cu's `absorbed_kernel` (mma.sync; capturable without a plan): bf16 at latent 512 + 64.
  kAbsorbed,
  // mla.cu's `attend` over the page rows: any dtype, latent + rope up to 640, latent up to 512.
  kAttend,
};

// The fewest sequences in a decode step for which AttentionKernels::kBest runs FlashInfer's MLA
// kernel. Below it mla.cu's absorbed kernel is faster
// (measured: docs/perf-log.md, "Notes moved from the CUDA sources").
inline constexpr int64_t kFlashInferDecodeMinSeqs = 4;

// "FlashInfer", "expanded" or "attend".
const char* mla_prefill_path_name(MlaPrefillPath path);

// Whether `path` can run a prefill step of `layout` with activations of `dtype` and heads of q/k
// nope + rope, v `v`.
bool mla_prefill_path_fits(MlaPrefillPath path, DType dtype, int64_t nope, int64_t rope, int64_t v,
                           const SeqLayout& layout);

// The path mla_prefill takes under `kernels` (FlashInfer's only with kBest), the first that fits of
// FlashInfer's, expanded, attend.
MlaPrefillPath mla_prefill_path_for(AttentionKernels kernels, DType dtype, int64_t nope, int64_t rope, int64_t v,
                                    const SeqLayout& layout);

// mla_prefill (Backend interface, same arguments) on the given path; aborts naming the operands when
// the path does not fit them (mla_prefill_path_fits).
void mla_prefill_on(CudaBackend& be, MlaPrefillPath path, const MlaArgs& a, const SeqLayout& layout);

// "FlashInfer", "absorbed" or "attend".
const char* mla_decode_path_name(MlaDecodePath path);

// Whether `path` can run a decode step with activations of `dtype` over a cache of latent + rope columns.
bool mla_decode_path_fits(MlaDecodePath path, DType dtype, int64_t latent, int64_t rope);

// The path mla_decode takes under `kernels`: FlashInfer's with kBest in steps of
// kFlashInferDecodeMinSeqs sequences or more, else the first that fits of absorbed, attend.
MlaDecodePath mla_decode_path_for(AttentionKernels kernels, DType dtype, int64_t latent, int64_t rope,
                                  const SeqLayout& layout);

// mla_decode (Backend interface, same arguments) on the given path; aborts naming the operands when
// the path does not fit them (mla_decode_path_fits).
void mla_decode_on(CudaBackend& be, MlaDecodePath path, const MlaArgs& a, const SeqLayout& layout);

}  // namespace klinear::cuda
