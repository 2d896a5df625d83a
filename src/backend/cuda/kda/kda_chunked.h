// The ways the CUDA backend runs the KDA chunked prefill (kda_chunked): CudaBackend::kda_chunked
// picks one by the operands (kda_chunked_path_for); kda_chunked_on runs a named one. And the bf16
// tensor-core path with its choices fixed, and its two launches apart: for the tests (every
// state-pass width and split against the CPU) and bench/cuda/ops_bench.cc (the launches timed one
// by one). The op on that path is the state pass over the prep's workspace with the default variant.
#pragma once

#include "backend/backend.h"

namespace klinear::cuda {

class CudaBackend;

// The kernels that run kda_chunked.
enum class KdaChunkedPath {
  // kda_tc_prep.cu's prep into a bf16 workspace, then kda_tc_state.cu's state pass (mma.sync; the
  // sequence split where it predicts a gain): BF16 activations, dk = dv in {16, 32, 64, 128}.
  kTensorCore,
  // kda.cu's fp32 chunk prep and `kda_chunk_state_kernel` (CUDA cores): every step the op takes
  // (the F32 exact mode's only kernel).
  kFp32,
};

// "tensor-core" or "fp32".
const char* kda_chunked_path_name(KdaChunkedPath path);

// Whether `path` can run kda_chunked on these tensors.
bool kda_chunked_path_fits(KdaChunkedPath path, const KdaArgs& a);

// The path kda_chunked takes for these tensors: the tensor-core path where it fits, else fp32.
KdaChunkedPath kda_chunked_path_for(const KdaArgs& a);

// kda_chunked (Backend interface, same arguments) on the given path; aborts naming the operands when
// the path does not fit them (kda_chunked_path_fits).
void kda_chunked_on(CudaBackend& be, KdaChunkedPath path, const KdaArgs& a, const SeqLayout& layout);

// The state pass's shape.
struct KdaChunkedVariant {
  int state_cols = 0;  // value columns per state-pass block: 16, 32 or 64; 0: by the grid's size (the op's choice)
  // Segments of each sequence's state pass (the sequence split, kda_tc_state.cu): 1 none, 3..16
  // every sequence of at least that many chunks; 0: the plan of least predicted time (the op's choice).
  int segments = 0;
};

// kda_chunked through the tensor-core path with a chosen variant (BF16 activations, dk = dv in
// {16, 32, 64, 128}; these functions abort otherwise).
void kda_chunked_variant(CudaBackend& be, const KdaArgs& a, const SeqLayout& layout, const KdaChunkedVariant& v);

// The path's two launches over a workspace the caller holds: kda_tc_workspace allocates one for these
// arguments and layout (persistent), kda_tc_prep fills it, kda_tc_state walks it and writes the op's
// outputs and states. Run in that order over the same inputs they compute the op.
Tensor kda_tc_workspace(CudaBackend& be, const KdaArgs& a, const SeqLayout& layout);
void kda_tc_prep(CudaBackend& be, const KdaArgs& a, const SeqLayout& layout, const Tensor& ws);
void kda_tc_state(CudaBackend& be, const KdaArgs& a, const SeqLayout& layout, const Tensor& ws,
                  const KdaChunkedVariant& v);

}  // namespace klinear::cuda
