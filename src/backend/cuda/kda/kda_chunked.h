// The CUDA KDA chunked prefill's bf16 tensor-core path with its choices fixed, and its two launches
// apart: for the tests (every state-pass width and split against the CPU) and bench/cuda/ops_bench.cc
// (the launches timed one by one). The op (CudaBackend::kda_chunked) is the state pass over the
// prep's workspace with the default variant.
#pragma once

#include "backend/backend.h"

namespace klinear::cuda {

class CudaBackend;

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
