// The bf16 absorbed MLA decode attention (MODEL.md 5.2) on FlashInfer 0.7.2's Hopper MLA kernel
// (flashinfer/attention/mla_hopper.cuh: a persistent cooperative grid, one CTA an SM; warpgroup 0
// loads Q and 64-key tiles of the latent cache into a two-stage pipeline and the two others run
// wgmma for S = Q'·Kᵀ (Q' = [q_lat ‖ q_r], 64 query rows × 64 keys × 576) and O += P·V (64 × 512 ×
// 64, each consumer warpgroup half of the 512 columns), online softmax in registers; long key
// ranges split over CTAs and merged after a grid-wide sync).
//
// Math, per sequence b, head h, new row i (position p = cached[b] + i):
//   o_lat[i, h] = Σ_{τ ≤ p} softmax_τ(scale · q'_h[i]·k'[τ]) · c[τ],
//   k'[τ] = [c[τ] ‖ k_r[τ]] the page row (576), c[τ] its latent (512), scale = 1/√192 (MODEL.md 5). The
//   kernel takes the scale in natural units (sm_scale; mla.cuh multiplies it by log2(e)).
//
// Shapes (Kimi-Linear-48B decode): N = B rows, H = 32: the planner packs the rows' heads as query
// rows (qo_len·H = 32 of a 64-row tile). Ownership: mla.cu computes q_lat = q_n·W_UK into the step
// arena and applies W_UV after; this file reads q_lat and q_r through the kernel's strides, the
// cache through its page table (kv_indices = the layout's page table, kv_indptr[b] = b·max_pages),
// and writes o_lat. The plan (work lists balanced over the SMs by FlashInfer's MLAPlan on the host)
// lives in fixed device buffers owned by MlaDecodeSm90, uploaded per step.
//
// Cost and floor (batch 64 × 32k context): the latent cache 64 · 32,768 · 576 · 2 B = 2.42 GB,
// 0.58 ms at 4.2 TB/s; FLOPs 2·64·32·32,768·(576 + 512) = 0.15 TFLOP (0.2 ms at 770; the kernel
// computes 64 query rows for our 32, so twice that). mla.cu's absorbed_kernel (mma.sync, Q re-read
// from shared memory for every key tile) measured 1.049 ms there and 1.30 ms a layer at 256 × 8k in
// the 48B decode step (docs/perf-log.md, eighth and ninth rounds).
// At 1-3 sequences mla.cu's own kernel is faster and keeps those steps (kFlashInferDecodeMinSeqs);
// measured: docs/perf-log.md, "Notes moved from the CUDA sources".
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/attention/mla_hopper.cuh>
#include <flashinfer/attention/scheduler.cuh>

#include <cuda_bf16.h>

#include <utility>

#include "backend/cuda/common/device.cuh"
#include "backend/cuda/mla/flashinfer_plan.h"
#include "backend/cuda/mla/mla_decode_sm90.h"

namespace klinear::cuda {

namespace {

using Params = flashinfer::MLAParams<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int32_t>;
constexpr int64_t kWidth = kSm90Latent + kSm90LatentRope;
constexpr int64_t kTileQ = 64;                      // the kernel's CTA_TILE_Q, which the planner assumes
constexpr size_t kIntBytes = size_t{1} << 20;       // 9 lists of 16,384 works + 5 of one entry an SM
constexpr int64_t kMaxWorks = 16384;                // MLAPlan's fixed list length

}  // namespace

MlaDecodeSm90::MlaDecodeSm90(CudaBackend& be) : be_(be) {
  int_dev_ = be.alloc_persistent(DType::kI32, {static_cast<int64_t>(kIntBytes / 4)});
  // MLAPlan's partial outputs: 2 per cluster of 64 packed rows, 512 bf16 each, and their lse.
  const int64_t partial = 2 * be.num_sms() * kTileQ;
  float_dev_ = be.alloc_persistent(DType::kU8, {partial * kSm90Latent * 2 + partial * 4 + 1024});
  KL_CUDA(cudaMallocHost(&int_host_, kIntBytes), "mla_decode (FlashInfer sm90) plan staging");
  KL_CUDA(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming), "mla_decode (FlashInfer sm90) plan event");
}

MlaDecodeSm90::~MlaDecodeSm90() {
  if (uploaded_) {
    cudaEventSynchronize(uploaded_);
    cudaEventDestroy(uploaded_);
  }
  if (int_host_) cudaFreeHost(int_host_);
}

std::vector<int32_t> MlaDecodeSm90::key(const SeqLayout& layout, int64_t heads) const {
  std::vector<int32_t> k{static_cast<int32_t>(heads), static_cast<int32_t>(layout.max_pages),
                         static_cast<int32_t>(layout.page_size)};
  k.insert(k.end(), layout.cu_seqlens.begin(), layout.cu_seqlens.end());
  k.insert(k.end(), layout.cached.begin(), layout.cached.end());
  return k;
}

bool MlaDecodeSm90::planned(const SeqLayout& layout, int64_t heads) const { return key_ == key(layout, heads); }

void MlaDecodeSm90::plan(const SeqLayout& layout, int64_t heads) {
  std::vector<int32_t> k = key(layout, heads);
  if (k == key_) return;
  const int64_t nseq = layout.num_seqs();
  const std::string what = "mla_decode (FlashInfer sm90) plan of " + std::to_string(nseq) + " sequences";
  KL_CHECK(nseq > 0 && heads > 0 && layout.max_pages * nseq <= INT32_MAX, what + ": nothing to plan or too many pages");
  std::vector<int32_t> qo_indptr(layout.cu_seqlens.begin(), layout.cu_seqlens.end()), kv_indptr(nseq + 1),
      kv_len(nseq);
  int64_t works = 0;  // query tiles: checked before MLAPlan writes its fixed-length lists
  for (int64_t b = 0; b < nseq; ++b) {
    kv_indptr[b] = static_cast<int32_t>(b * layout.max_pages);
    kv_len[b] = layout.cached[b] + static_cast<int32_t>(layout.new_tokens(b));
    works += (layout.new_tokens(b) * heads + kTileQ - 1) / kTileQ;
  }
  kv_indptr[nseq] = static_cast<int32_t>(nseq * layout.max_pages);
  KL_CHECK(works <= kMaxWorks / 2,
           what + ": " + std::to_string(works) + " query tiles, more than the planner's lists hold");
  // The staging buffer is rewritten only after the last upload out of it has run.
  KL_CUDA(cudaEventSynchronize(uploaded_), what);
  flashinfer::MLAPlanInfo info;
  size_t staged = 0;
  try {
    KL_CUDA(flashinfer::MLAPlan<int32_t>(float_dev_.data(), static_cast<size_t>(float_dev_.nbytes()), int_dev_.data(),
                                         int_host_, kIntBytes, info, staged, qo_indptr.data(), kv_indptr.data(),
                                         kv_len.data(), static_cast<uint32_t>(nseq), static_cast<uint32_t>(heads),
                                         static_cast<uint32_t>(kSm90Latent), /*causal=*/true, be_.stream()),
            what);
  } catch (const std::exception& e) {
    KL_CHECK(false, what + ": FlashInfer's planner: " + e.what());
  }
  KL_CUDA(cudaMemcpyAsync(int_dev_.data(), int_host_, staged, cudaMemcpyHostToDevice, be_.stream()), what);
  KL_CUDA(cudaEventRecord(uploaded_, be_.stream()), what);
  info_ = info.ToVector();
  key_ = std::move(k);
}

void MlaDecodeSm90::run(const MlaDecodeSm90Args& a, const SeqLayout& layout) {
  const std::string what = "mla_decode (FlashInfer sm90) rows " + std::to_string(layout.num_rows()) + " heads " +
                           std::to_string(a.heads);
  KL_CHECK(planned(layout, a.heads), what + ": launched without a plan for this step (CudaBackend::plan_step)");
  for (const void* p : {a.q_lat, a.q, a.pages, static_cast<const void*>(a.out)})
    KL_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0 && a.lat_stride % 8 == 0 && a.qk % 8 == 0 && a.nope % 8 == 0,
             what + ": the kernel copies 16-byte pieces of aligned rows");
  flashinfer::MLAPlanInfo info;
  info.FromVector(info_);
  auto* pages = static_cast<__nv_bfloat16*>(const_cast<void*>(a.pages));
  Params p{};
  p.q_nope = static_cast<__nv_bfloat16*>(const_cast<void*>(a.q_lat));
  p.q_pe = static_cast<__nv_bfloat16*>(const_cast<void*>(a.q)) + a.nope;
  p.ckv = pages;
  p.kpe = pages + kSm90Latent;
  p.partial_o = reinterpret_cast<__nv_bfloat16*>(static_cast<char*>(float_dev_.data()) + info.partial_o_offset);
  p.partial_lse = reinterpret_cast<float*>(static_cast<char*>(float_dev_.data()) + info.partial_lse_offset);
  p.final_o = static_cast<__nv_bfloat16*>(a.out);
  p.final_lse = nullptr;
  p.kv_indices = const_cast<int32_t*>(layout.dev.page_table.data_as<const int32_t>());
  using A = PlanArray<Params>;
  point_at_plan(p, int_dev_.data(),
                {A{&Params::q_indptr, info.q_indptr_offset}, A{&Params::kv_indptr, info.kv_indptr_offset},
                 A{&Params::partial_indptr, info.partial_indptr_offset}, A{&Params::q_len, info.q_len_offset},
                 A{&Params::merge_packed_offset_start, info.merge_packed_offset_start_offset},
                 A{&Params::merge_packed_offset_end, info.merge_packed_offset_end_offset},
                 A{&Params::merge_partial_packed_offset_start, info.merge_partial_packed_offset_start_offset},
                 A{&Params::merge_partial_packed_offset_end, info.merge_partial_packed_offset_end_offset},
                 A{&Params::merge_partial_stride, info.merge_partial_stride_offset},
                 A{&Params::kv_len, info.kv_len_offset}, A{&Params::q_start, info.q_start_offset},
                 A{&Params::kv_start, info.kv_start_offset}, A{&Params::kv_end, info.kv_end_offset},
                 A{&Params::work_indptr, info.work_indptr_offset}});
  p.block_size = flashinfer::uint_fastdiv(static_cast<uint32_t>(layout.page_size));
  p.num_heads = flashinfer::uint_fastdiv(static_cast<uint32_t>(a.heads));
  p.q_nope_stride_n = static_cast<uint32_t>(a.heads * a.lat_stride);
  p.q_nope_stride_h = static_cast<uint32_t>(a.lat_stride);
  p.q_pe_stride_n = static_cast<uint32_t>(a.heads * a.qk);
  p.q_pe_stride_h = static_cast<uint32_t>(a.qk);
  p.ckv_stride_page = p.kpe_stride_page = static_cast<uint32_t>(layout.page_size * kWidth);
  p.ckv_stride_n = p.kpe_stride_n = static_cast<uint32_t>(kWidth);
  p.o_stride_n = static_cast<uint32_t>(a.heads * kSm90Latent);
  p.o_stride_h = static_cast<uint32_t>(kSm90Latent);
  p.sm_scale = a.scale;
  p.return_lse_base_on_e = false;
  const cudaError_t launched =
      flashinfer::mla::BatchMLAPageAttentionHopper<flashinfer::MaskMode::kCausal, kSm90Latent, kSm90LatentRope>(
          p, static_cast<uint32_t>(info.num_blks_x), static_cast<uint32_t>(info.num_blks_y), be_.stream());
  KL_CUDA(launched, what);
}

}  // namespace klinear::cuda
