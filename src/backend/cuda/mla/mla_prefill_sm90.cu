// The bf16 MLA prefill attention (MODEL.md 5.1 steps 5-7) on FlashInfer 0.7.2's Hopper ragged-KV prefill
// kernel (flashinfer/attention/hopper/prefill_sm90.cuh: FA3's warp-specialised design, one producer
// warp issuing TMA loads of Q, K and V tiles into a two-stage pipeline, two consumer warpgroups
// running wgmma for S = Q·Kᵀ and O += P·V with the online softmax in registers).
//
// Math, per sequence b, head h, new row i (position p = cached[b] + i):
//   out[i, h] = Σ_{τ ≤ p} softmax_τ(scale · Q_h[i]·K_h[τ]) · V_h[τ],
//   Q_h = q_n[h] ‖ q_r[h] (192), K_h = k_n[h] ‖ k_r (192, k_r shared by the heads), V_h = val[h] (128),
//   scale = 1/√192 (MODEL.md 5.1 step 6). FlashInfer takes the scale in natural units (sm_scale) and
//   multiplies it by log2(e) itself (hopper/variants.cuh, StandardAttention), running exp2 on the
//   scaled scores; its causal mask is bottom-right aligned (kv_idx < qo_idx + 1 + kv_len − qo_len,
//   hopper/mainloop_mma.cuh), which is ours: the queries are the last new[b] of cached[b] + new[b] keys.
//
// Shapes (Kimi-Linear-48B, an 8,192-token prefill step): N = 8,192 query rows, H = 32, q/k 192, v 128;
// R = Σ cached + new key rows. Ownership: mla.cu gathers the latent rows from the pages and expands
// them (kv [R, H·256] = latent·kv_bᵀ, cuBLASLt) into the step arena; this file
//   1. builds K [R, H, 192] = k_n ‖ k_r in the arena (`assemble_keys`: TMA reads each key row as one
//      contiguous 192-element box, and k_n and k_r live in different buffers);
//   2. reads Q [N, H, 192] (the op's q), V straight out of kv (row stride H·256, head stride 256) and
//      writes O [N, H, 128] (the op's out) through the kernel's strides, no copies;
//   3. plans on the host per call with FlashInfer's PrefillSM90Plan: the work list of (query tile,
//      head, sequence) items balanced over the SMs, uploaded into an arena buffer by the planner's
//      own cudaMemcpyAsync. That upload cannot be captured, so the call is skipped while a graph
//      capture runs (breaks_capture); prefill steps run eagerly.
//   4. launches FlashInfer's kernel with its mainloop and scheduler but our epilogue (SafeEpilogue
//      below): FlashInfer's own copy-out of O races with itself, see there.
// One kernel is instantiated (CTA 128 queries × 128 keys, causal, the per-head persistent scheduler);
// steps with more than 4,096 query tiles per head, which FlashInfer plans for its other scheduler, go
// to mla.cu's own kernel instead (mla_prefill_sm90_fits).
//
// Cost and floor (T = 8,192 new tokens, no cached ones, H = 32): causal FLOPs 2·H·T(T+1)/2·(192 + 128)
// ≈ 6.9e11: 0.89 ms at the H200's 770 TFLOP/s (bf16 dense, as docs/PERF.md counts it). Bytes are
// small beside that (Q, K, V, O ≈ 0.2 GB, 0.05 ms at 4.2 TB/s; the key assembly reads 67 MB and
// writes 100 MB, ~0.04 ms). The whole op (gather, kv_b GEMM of 69 GFLOP, keys, attention) measured
// 7.33 ms (94 TFLOP/s) on mla.cu's mma.sync kernel (docs/perf-log.md, second round).
// Compiled: 168 registers (the launch bound of 384 threads; the consumer warpgroups raise theirs to
// 240 at run time), 32 bytes of spills, ~208 KB of shared memory (Q 48 KB, K and V two stages each).
// Measured against this floor: docs/perf-log.md, "Notes moved from the CUDA sources".
#include <flashinfer/attention/hopper/default_params.cuh>
#include <flashinfer/attention/hopper/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variants.cuh>
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/attention/scheduler.cuh>

#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/common/device.cuh"
#include "backend/cuda/mla/flashinfer_plan.h"
#include "backend/cuda/mla/mla_prefill_sm90.h"

namespace klinear::cuda {

namespace {

constexpr int kQk = kSm90Nope + kSm90Rope, kV = kSm90V;
constexpr int kTileQ = 128;  // query rows per work item: the kernel's CTA_Q, which the planner assumes
static_assert(std::get<0>(flashinfer::getCTATileSize<kQk, kV, true>()) == kTileQ,
              "PrefillSM90Plan cuts 128-row query tiles; the kernel must use the same");
constexpr int64_t kMaxTilesPerHead = 4096;  // past this PrefillSM90Plan picks the scheduler not compiled here

using Element = cutlass::bfloat16_t;
using Params = flashinfer::BatchPrefillRaggedParams<Element, Element, Element, int32_t>;

// K [R, H, 192] ← k_n (kv's first 128 of each head) ‖ k_r (shared), 16-byte pieces: a block per key
// row (grid-stride), its threads over the row's H·24 pieces (no run-time divisions).
__global__ void assemble_keys_kernel(const uint4* kv, const __nv_bfloat16* k_r, int64_t kr_stride, int64_t rows,
                                     int heads, uint4* keys) {
  constexpr int kPieces = kQk / 8, kNopePieces = kSm90Nope / 8, kKvPieces = (kSm90Nope + kV) / 8;
  const int row_pieces = heads * kPieces;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint4* kv_row = kv + r * heads * kKvPieces;
    const uint4* kr_row = reinterpret_cast<const uint4*>(k_r + r * kr_stride);
    uint4* key_row = keys + r * row_pieces;
    for (int j = threadIdx.x; j < row_pieces; j += blockDim.x) {
      const int h = j / kPieces, piece = j % kPieces;
      key_row[j] = piece < kNopePieces ? kv_row[h * kKvPieces + piece] : kr_row[piece - kNopePieces];
    }
  }
}

// The epilogue: O from the consumer warpgroups' registers → shared memory → the rows of the work item.
// FlashInfer 0.7.2's CollectiveEpilogue::store (hopper/epilogue.cuh) orders this with two holes:
//   a. its 256 consumer threads `arrive` at the EpilogueBarrier and then `sync` on it with the same
//      count of 256, so the early warps count twice and release the barrier while late warps are
//      still writing their part of O to shared memory;
//   b. shared O aliases the V stages (a union in SharedStorageQKVO), and only the last consumer warp
//      tells the producer that the buffer is free, when it starts its next work item, whether or not
//      the other warps have finished copying the previous O out of it.
// Both depend on timing: the ops tests passed at full speed and failed under compute-sanitizer's
// memcheck (rows off by 0.77 relative, no memory error). SafeEpilogue keeps FlashInfer's layouts,
// shared-memory atom and copy-out (write_O, which masks the rows past the sequence), and orders them
// with full barriers: every consumer thread has written its O before any reads it back, and every
// consumer thread has read O back before any starts the next work item. No LSE is written (the
// launcher passes none).
template <typename Ktraits>
struct SafeEpilogue : flashinfer::CollectiveEpilogue<Ktraits> {
  using Base = flashinfer::CollectiveEpilogue<Ktraits>;

  template <typename BlockCoord, typename SharedStorage, typename FrgTensorO, typename FrgTensorLSE,
            typename TiledMma>
  CUTLASS_DEVICE void store(typename Base::Params const& params, FrgTensorO const& acc, FrgTensorLSE const&,
                            SharedStorage& shared, TiledMma tiled_mma, int thread_idx,
                            BlockCoord const& coord) {
    using namespace cute;
    using Barrier = cutlass::arch::NamedBarrier;
    const auto [q_tile, qo_head, kv_head, qo_offset, kv_offset, qo_len, kv_len, batch] = coord;
    auto o_smem = make_tensor(make_smem_ptr(shared.smem_o.data()), typename Base::SmemLayoutO{});
    const auto to_smem = make_tiled_copy_C(typename Base::SmemCopyAtomO{}, tiled_mma);
    const auto mine = to_smem.get_thread_slice(thread_idx);
    auto o_regs = flashinfer::convert_type<typename Base::DTypeO>(acc);

    // Shared O overwrites V: every consumer warp must be done with the last V tile.
    Barrier::sync(Base::NUM_MMA_THREADS, static_cast<int>(flashinfer::NamedBarriers::kValueEmpty));
    auto o_part = mine.partition_D(o_smem);
    copy(to_smem, mine.retile_S(o_regs), o_part);
    Barrier::sync(Base::NUM_MMA_THREADS, cutlass::arch::ReservedNamedBarriers::EpilogueBarrier);
    flashinfer::write_O<Base::NUM_COPY_THREADS>(params.O_ptr, typename Base::TiledCopyO{}, params.layout_O,
                                                select<0, 1>(typename Base::TileShape_PDV{}), o_smem, thread_idx,
                                                q_tile, qo_head, qo_offset, qo_len, Base::NUM_WARPS - 1);
    // The next work item's V lands here once its first consumer warp signals the producer.
    Barrier::sync(Base::NUM_MMA_THREADS, cutlass::arch::ReservedNamedBarriers::EpilogueBarrier);
  }
};

// FlashInfer's BatchPrefillWithRaggedKVCacheKernelTraitsDispatched with SafeEpilogue in place of its
// epilogue (the only difference) and our Params' causal, full-window, per-head-scheduled case.
cudaError_t launch_attention(Params& p, cudaStream_t stream) {
  using namespace flashinfer;
  constexpr auto tile = getCTATileSize<kQk, kV, /*CAUSAL=*/true>();
  using Traits = AttentionKernelTraits</*USE_TMA_LOAD_KV=*/true, kQk, kV, std::get<0>(tile), std::get<1>(tile),
                                       /*NUM_STAGES_=*/2, Element, Element, Element, int32_t, StandardAttention>;
  using Mainloop = CollectiveMainloop<Params::AdditionalParams, Traits, /*CAUSAL=*/true>;
  using Epilogue = SafeEpilogue<Traits>;
  using Scheduler = BatchPrefillPersistentTileScheduler<int32_t>;
  typename Mainloop::Params mainloop = Mainloop::to_underlying_arguments(
      {p.q_ptr, get_gmem_layout(p.nnz_qo, p.num_qo_heads, kQk, p.q_stride_n, p.q_stride_h), p.k_ptr,
       get_gmem_layout(p.nnz_kv, p.num_kv_heads, kQk, p.k_stride_n, p.k_stride_h), p.v_ptr,
       get_gmem_layout(p.nnz_kv, p.num_kv_heads, kV, p.v_stride_n, p.v_stride_h), p.window_left,
       p.additional_params});
  typename Epilogue::Params epilogue = Epilogue::to_underlying_arguments(
      {p.o_ptr, get_gmem_layout(p.nnz_qo, p.num_qo_heads, kV, p.o_stride_n, p.o_stride_h), nullptr,
       get_lse_gmem_layout(p.nnz_qo, p.num_qo_heads)});
  typename Scheduler::Arguments scheduler_args = {
      p.work_indptr, p.head_indices, p.qo_tile_indices, p.qo_indptr, p.kv_indptr, p.qo_lens, p.kv_lens,
      p.batch_indices, cutlass::FastDivmod(p.num_qo_heads / p.num_kv_heads), p.num_qo_heads};
  typename Scheduler::Params scheduler = Scheduler::to_underlying_arguments(scheduler_args);

  void* kernel = reinterpret_cast<void*>(
      PrefillWithKVCacheKernel<Mainloop, Epilogue, Traits, /*LEFT_SLIDING_WINDOW=*/false, /*CAUSAL=*/true, Scheduler>);
  const int smem = sizeof(typename Traits::SharedStorage);
  if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      e != cudaSuccess)
    return e;
  int device = 0, sms = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess)
    return e;
  void* args[] = {&mainloop, &epilogue, &scheduler};
  return cudaLaunchKernel(kernel, Scheduler::get_grid_dim(scheduler_args, sms), dim3(Traits::NUM_WARPS * 32), args,
                          smem, stream);
}

int64_t tiles_per_head(const SeqLayout& layout) {
  int64_t tiles = 0;
  for (int64_t b = 0; b < layout.num_seqs(); ++b) tiles += (layout.new_tokens(b) + kTileQ - 1) / kTileQ;
  return tiles;
}

}  // namespace

bool mla_prefill_sm90_fits(DType dtype, int64_t nope, int64_t rope, int64_t vd, const SeqLayout& layout) {
  // FlashInfer's own bound (scheduler.cuh, PrefillSM90Plan): ceil(rows / 128) + B − 1 tiles.
  const int64_t plan_tiles = (layout.num_rows() + kTileQ - 1) / kTileQ + layout.num_seqs() - 1;
  return dtype == DType::kBF16 && nope == kSm90Nope && rope == kSm90Rope && vd == kSm90V &&
         plan_tiles <= kMaxTilesPerHead;
}

void mla_prefill_sm90(CudaBackend& be, const MlaPrefillSm90Args& a, const SeqLayout& layout,
                      const std::vector<int32_t>& kv_base) {
  const int64_t n = layout.num_rows(), nseq = layout.num_seqs(), heads = a.heads;
  const std::string what = "mla_prefill (FlashInfer sm90) rows " + std::to_string(n) + " keys " +
                           std::to_string(a.key_rows) + " heads " + std::to_string(heads);
  KL_CHECK(static_cast<int64_t>(kv_base.size()) == nseq + 1 && kv_base.back() == a.key_rows && heads > 0,
           what + ": key-row offsets of " + std::to_string(kv_base.size()) + " entries for " + std::to_string(nseq) +
               " sequences");
  for (const void* p : {a.q, a.kv, static_cast<const void*>(a.k_r), static_cast<const void*>(a.out)})
    KL_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0 && a.kr_stride % 8 == 0,
             what + ": TMA and the key assembly need 16-byte aligned rows");
  if (n == 0) return;

  // 1. Keys.
  const Tensor keys = be.alloc(DType::kBF16, {a.key_rows, heads, kQk});
  assemble_keys_kernel<<<static_cast<unsigned>(std::min<int64_t>(a.key_rows, 65536)), 256, 0, be.stream()>>>(
      static_cast<const uint4*>(a.kv), static_cast<const __nv_bfloat16*>(a.k_r), a.kr_stride, a.key_rows,
      static_cast<int>(heads), keys.data_as<uint4>());
  KL_LAUNCHED(what + " (keys)");

  // 2. The plan: 7 int32 arrays of one entry per work item (query tile × head) and the per-SM
  // offsets, each 16-byte aligned inside one arena buffer (and the same offsets in a host mirror).
  const int64_t works = tiles_per_head(layout) * heads;
  const int64_t int_bytes = 7 * (works * 4 + 16) + (be.num_sms() + 1) * 4 + 16;
  const Tensor plan_dev = be.alloc(DType::kI32, {(int_bytes + 3) / 4});
  if (be.breaks_capture(what + " (the plan's host->device copy)")) return;
  std::vector<int32_t> plan_host(plan_dev.numel());
  std::vector<int32_t> qo_indptr(layout.cu_seqlens.begin(), layout.cu_seqlens.end()), kv_indptr(kv_base),
      kv_len(nseq);
  for (int64_t b = 0; b < nseq; ++b) kv_len[b] = kv_base[b + 1] - kv_base[b];
  flashinfer::PrefillPlanSM90Info plan;
  try {
    KL_CUDA(flashinfer::PrefillSM90Plan<int32_t>(
                /*float_buffer=*/nullptr, 0, plan_dev.data(), plan_host.data(), plan_dev.nbytes(), plan,
                qo_indptr.data(), kv_indptr.data(), kv_len.data(), static_cast<uint32_t>(n),
                static_cast<uint32_t>(nseq), static_cast<uint32_t>(heads), static_cast<uint32_t>(heads), kQk, kV,
                /*page_size=*/1, /*causal=*/true, /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/2, be.stream()),
            what + " (plan)");
  } catch (const std::exception& e) {
    KL_CHECK(false, what + ": FlashInfer's planner: " + e.what());
  }
  KL_CHECK(!plan.same_schedule_for_all_heads, what + ": planned for the scheduler not compiled here (" +
                                                  std::to_string(tiles_per_head(layout)) + " query tiles per head)");

  // 3. The kernel.
  Params p{};
  p.q_ptr = static_cast<Element*>(const_cast<void*>(a.q));
  p.k_ptr = keys.data_as<Element>();
  p.v_ptr = static_cast<Element*>(const_cast<void*>(a.kv)) + kSm90Nope;
  p.o_ptr = static_cast<Element*>(a.out);
  p.lse_ptr = nullptr;
  using A = PlanArray<Params>;
  point_at_plan(p, plan_dev.data(),
                {A{&Params::qo_tile_indices, plan.qo_tile_indices_offset}, A{&Params::qo_lens, plan.qo_len_offset},
                 A{&Params::qo_indptr, plan.qo_indptr_offset}, A{&Params::kv_indptr, plan.kv_indptr_offset},
                 A{&Params::kv_lens, plan.kv_len_offset}, A{&Params::head_indices, plan.head_indices_offset},
                 A{&Params::work_indptr, plan.work_indptr_offset}, A{&Params::batch_indices, plan.batch_indices_offset}});
  p.additional_params.logits_soft_cap = 0.0f;
  p.additional_params.sm_scale = a.scale;
  p.q_stride_n = heads * kQk;
  p.q_stride_h = kQk;
  p.k_stride_n = heads * kQk;
  p.k_stride_h = kQk;
  p.v_stride_n = heads * (kSm90Nope + kV);
  p.v_stride_h = kSm90Nope + kV;
  p.o_stride_n = heads * kV;
  p.o_stride_h = kV;
  p.nnz_qo = n;
  p.nnz_kv = a.key_rows;
  p.num_qo_heads = p.num_kv_heads = static_cast<int>(heads);
  p.group_size = 1;
  p.window_left = -1;
  p.causal = true;
  const cudaError_t launched = launch_attention(p, be.stream());
  KL_CUDA(launched, what + " (attention)");
}

}  // namespace klinear::cuda
