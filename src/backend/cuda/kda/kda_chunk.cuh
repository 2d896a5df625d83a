// What the CUDA KDA kernels share (kda.cu: the gate, the decode and the fp32 chunked prefill;
// kda_chunk_tc.cu: the bf16 tensor-core chunked prefill): the step's views, the chunk tables of a
// layout and the snapshots the chunked state kernels write at chunk ends.
#pragma once

#include <string>
#include <vector>

#include "backend/cuda/common/device.cuh"
#include "backend/cuda/kda/kda_chunked.h"

namespace klinear::cuda {

constexpr int kChunk = 64;
constexpr int kMaxDk = 128;

// One step of the KDA core on the device.
struct KdaStep {
  In q, k, v;
  const float* g;     // [N, H, dk]
  const float* beta;  // [N, H]
  float* states;      // [slots, H, dk, dv]
  Out out;            // [N, H, dv]
  const int32_t* cu;
  const int32_t* slots;
  int heads, dk, dv;
  float scale;        // dk^-1/2
};

// Checks the op's shapes and dtypes (aborting with `op` and the shapes) and makes its views.
KdaStep kda_step(const KdaArgs& a, const SeqLayout& layout, const char* op);

// The chunks of a step: each sequence's rows cut into chunks of 64 from its first new row, and the
// layout's snapshots (device arrays of SeqLayout::dev).
struct ChunkWork {
  const int32_t* chunk_row;  // [chunks] first row of each chunk in the step
  const int32_t* chunk_len;  // [chunks] 1..64
  const int32_t* seq_chunk;  // [B+1] chunks of sequence b: [seq_chunk[b], seq_chunk[b+1])
  const int32_t* snap_seq;   // [snaps]
  const int32_t* snap_pos;   // [snaps] rows of the sequence before the snapshot
  const int32_t* snap_slot;  // [snaps] pool slot it is copied to
  int snaps;
};

// The device tables of a layout (valid until the next begin_step). Checks the snapshots against
// the layout and the pool (`slots` rows): a bad one aborts naming it.
struct ChunkTables {
  Tensor rows, lens, seq_chunk;
  ChunkWork work;
  int64_t chunks = 0;
  std::vector<int32_t> host_seq_chunk;  // [B+1] seq_chunk as the host built it
};
ChunkTables chunk_tables(CudaBackend& be, const SeqLayout& layout, int64_t slots);

__device__ __forceinline__ float* state_tile(const KdaStep& s, int slot, int h) {
  return s.states + (static_cast<int64_t>(slot) * s.heads + h) * s.dk * s.dv;
}

// Calls write(tile) with the state tile of every snapshot of sequence b taken after `pos` rows.
template <typename Write>
__device__ __forceinline__ void for_snapshots(const KdaStep& s, const ChunkWork& cw, int b, int h, int pos,
                                              Write write) {
  for (int k = 0; k < cw.snaps; ++k)
    if (cw.snap_seq[k] == b && cw.snap_pos[k] == pos) write(state_tile(s, cw.snap_slot[k], h));
}

// The bf16 tensor-core prefill (kda_chunk_tc.cu): whether it takes these tensors (BF16 activations,
// dk = dv in {16, 32, 64, 128}), and the launch.
bool kda_tc_fits(const KdaArgs& a, const KdaStep& s);
void kda_chunked_tc_launch(CudaBackend& be, const KdaStep& s, const ChunkTables& ct, const SeqLayout& layout,
                           const KdaChunkedVariant& v, const std::string& what);

}  // namespace klinear::cuda
