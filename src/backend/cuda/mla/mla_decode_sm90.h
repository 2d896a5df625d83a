// The bf16 absorbed MLA decode attention on FlashInfer 0.7.2's Hopper MLA kernel
// (mla_decode_sm90.cu), called by CudaBackend::mla_decode (mla.cu) after the absorption
// q_lat = q_n·W_UK, in place of mla.cu's absorbed_kernel when MlaDecodePath::kFlashInfer runs (mla.h)
// (AttentionKernels::kBest picks it for steps of several sequences).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/backend.h"

namespace klinear::cuda {

// One step's operands. Rows of sequence b are cu_seqlens[b] .. cu_seqlens[b+1] of the layout; row
// i of it sees positions 0 .. cached[b] + i (bottom-right causal).
struct MlaDecodeSm90Args {
  const void* q_lat;   // [N, H, lat_stride] bf16: columns 0 .. 512 are q_n·W_UK
  int64_t lat_stride;  // elements between heads of q_lat
  const void* q;       // [N, H, qk] bf16: columns nope .. nope + 64 are q_r
  int64_t qk, nope;
  const void* pages;   // [pages, page_size, 576] bf16: latent (512) ‖ rope key (64) of each position
  void* out;           // [N, H, 512] bf16: o_lat
  int64_t heads;       // H
  float scale;         // softmax scale in natural units (MODEL.md 5: 1/√192)
};

// The latent shape the kernel is compiled for: 512 + 64.
inline constexpr int64_t kSm90Latent = 512, kSm90LatentRope = 64;

// The plan's buffers and the layout it was made for. A graph captured over the kernel reads the
// plan from the same device buffer at every replay, so each step is planned (host) and uploaded
// before its replay: CudaBackend::plan_step.
class MlaDecodeSm90 {
 public:
  explicit MlaDecodeSm90(CudaBackend& be);
  ~MlaDecodeSm90();
  MlaDecodeSm90(const MlaDecodeSm90&) = delete;
  MlaDecodeSm90& operator=(const MlaDecodeSm90&) = delete;

  // Plans `layout` for `heads` heads with FlashInfer's MLAPlan and uploads the plan (a host→device
  // copy on the stream: not capturable), unless the last plan was for the same lengths and heads.
  void plan(const SeqLayout& layout, int64_t heads);
  // Whether the last plan was for these lengths and heads (a capture may then launch on it).
  bool planned(const SeqLayout& layout, int64_t heads) const;
  // The heads of the last plan (0: none yet).
  int64_t heads() const { return key_.empty() ? 0 : key_[0]; }
  // out ← the attention, on the last plan (planned(layout, a.heads) must hold).
  void run(const MlaDecodeSm90Args& a, const SeqLayout& layout);

 private:
  std::vector<int32_t> key(const SeqLayout& layout, int64_t heads) const;

  CudaBackend& be_;
  Tensor int_dev_, float_dev_;  // the plan's work lists; the split-KV partial outputs
  int32_t* int_host_ = nullptr;  // pinned staging of the work lists
  cudaEvent_t uploaded_ = nullptr;
  std::vector<int64_t> info_;    // flashinfer::MLAPlanInfo as its 18 values
  std::vector<int32_t> key_;     // what the last plan was for (key(): heads first); empty before one
};

}  // namespace klinear::cuda
