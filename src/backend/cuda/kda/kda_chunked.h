// The CUDA KDA chunked prefill's variants, named for the benchmark (bench/cuda/ops_bench.cc times
// the two launches of the bf16 tensor-core path apart and the state pass at several widths).
#pragma once

#include "backend/backend.h"

namespace klinear::cuda {

class CudaBackend;

// Which launches of the tensor-core prefill run: both (the op), or one of them over the
// workspace the previous call left (timing only: alone they do not compute the op).
enum class KdaChunkStages { kBoth, kPrepOnly, kStateOnly };

struct KdaChunkedVariant {
  int state_cols = 0;  // value columns per state-pass block: 16, 32 or 64; 0: by the grid's size (the op's choice)
  KdaChunkStages stages = KdaChunkStages::kBoth;
  // Segments of each sequence's state pass (the sequence split, kda_chunk_tc.cu): 1 none, 3..16
  // every sequence of at least that many chunks; 0: the plan of least predicted time (the op's choice).
  int segments = 0;
};

// kda_chunked through the bf16 tensor-core path with a chosen variant (BF16 activations,
// dk = dv in {16, 32, 64, 128}; aborts otherwise).
void kda_chunked_variant(CudaBackend& be, const KdaArgs& a, const SeqLayout& layout, const KdaChunkedVariant& v);

}  // namespace klinear::cuda
