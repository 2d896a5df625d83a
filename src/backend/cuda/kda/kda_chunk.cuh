// What the CUDA KDA kernels share (kda.cu: the gate, the decode and the fp32 chunked prefill;
// kda_tc_prep.cu and kda_tc_state.cu: the bf16 tensor-core chunked prefill): the step's views, the
// chunk tables of a layout, the snapshots the chunked state kernels write at chunk ends, and the
// tensor-core path's workspace layout and launches.
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

// ---- The bf16 tensor-core prefill: kda_tc_prep.cu writes a workspace per (chunk, head) that the
// state pass of kda_tc_state.cu reads in chunk order.

// The bf16 workspace of one (chunk, head), dense, offsets in bytes: W [64][dk] at 0, e^{G_last} [dk]
// in fp32, Qd [64][dk], Kdᵀ [dk][64], Aqk [64][64], Uᵀ [rows][64], each bf16 array's rows with their
// 16-byte pieces permuted (swz). In global memory it holds all dv rows of Uᵀ; a stage of the state
// pass in shared memory has the same layout with the block's rows of Uᵀ only, so a stage loads as
// two or three bulk copies, and the permutation spreads ldmatrix's reads over the banks there.
struct ChunkLayout {
  int dl, q, kt, a, u, bytes;
  constexpr __host__ __device__ ChunkLayout(int dk, int u_rows)
      : dl(2 * kChunk * dk), q(dl + 4 * dk), kt(q + 2 * kChunk * dk), a(kt + 2 * dk * kChunk),
        u(a + 2 * kChunk * kChunk), bytes(u + 2 * u_rows * kChunk) {}
};

// The permutation of a dense bf16 array of rows of kLd elements (n = kLd / 8 pieces of 16 bytes):
// row r's piece c is stored as piece c ^ swz_key(r), so that eight rows from a multiple of 8 give
// one column's pieces from eight distinct 16-byte bank groups (ldmatrix, and the state pass's reads
// of Uᵀ). With n ≥ 8 the key is r mod 8; with fewer, 8 / n rows share a 128-byte line and the key
// is the line's index mod n. A row offset by a multiple of 8 keeps its key.
template <int kLd>
__host__ __device__ constexpr int swz_key(int r) {
  constexpr int n = kLd / 8;
  return n >= 8 ? (r & 7) : ((r * n / 8) & (n - 1));
}
// The byte offset of element (r, c).
template <int kLd>
__host__ __device__ constexpr int swz(int r, int c) {
  return 2 * r * kLd + 16 * ((c >> 3) ^ swz_key<kLd>(r)) + 2 * (c & 7);
}

struct TcWork {
  unsigned char* ws;  // [chunks, H, ChunkLayout(dk, dv).bytes]
};

// The workspace of a step: [max(chunks, 1), H, ChunkLayout(dk, dv).bytes] U8.
Shape kda_tc_workspace_shape(const KdaStep& s, const ChunkTables& ct);
// The two launches (KdaChunkedPath::kTensorCore fits): prep fills tw for every chunk of ct; the state pass walks it
// from the states' slots (v: its columns and segments; 0 is the op's choice).
void launch_tc_prep(CudaBackend& be, const KdaStep& s, const ChunkTables& ct, const TcWork& tw,
                    const std::string& what);
void launch_tc_state(CudaBackend& be, const KdaStep& s, const ChunkTables& ct, const SeqLayout& layout,
                     const TcWork& tw, const KdaChunkedVariant& v, const std::string& what);

}  // namespace klinear::cuda
