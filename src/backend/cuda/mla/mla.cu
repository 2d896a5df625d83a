// CUDA MLA (MODEL.md 5): the paged latent-cache write, the expanded prefill and the absorbed decode.
//
// The cache write normalises the latent on its way into the pages (a block per row): at batch 1 it
// replaces four launches (a column copy out, rms_norm, a copy back, the write) by one, 21 fewer of
// the ~375 a 48B step ran.
//
// bf16 at the model's shapes runs on tensor cores (mma.sync m16n8k16, fp32 accumulators, fp32
// online softmax in base 2):
//   decode (`absorbed_kernel`, latent 512 + rope 64): the heads of a query row share every latent
//     row, so they are the M of both products. A block takes one query row, a tile of 32 heads and
//     a split of the row's keys; it walks 64-key tiles of page rows through shared memory (cp.async,
//     two stages): S = Q'·Kᵀ (32 × 64 × 576), O += P·V (32 × 512 × 64). Each block finds its key
//     range on the device from the row's length, so the launch depends only on the number of rows
//     and the static shapes (a CUDA graph can capture it); `combine` merges the splits.
//     AttentionKernels::kBest runs the same shape on FlashInfer's Hopper MLA kernel instead
//     (mla_decode_sm90.cu, wgmma, planned per step on the host) in steps of kFlashInferDecodeMinSeqs
//     sequences or more; this one takes the smaller steps and AttentionKernels::kOwn.
//   prefill (`expanded_kernel`, q/k 128 + 64, v 128): a flash-attention forward over the expanded
//     keys and values, a block per (64 query rows, head, sequence), causal over cached + new keys.
//     AttentionKernels::kBest runs the same shape on FlashInfer's Hopper kernel instead
//     (mla_prefill_sm90.cu, wgmma and TMA); this one is the fallback (AttentionKernels::kOwn, and
//     steps FlashInfer's is not compiled for).
// Everything else (float32 mode, other head shapes) runs `attend`: a warp per (query row, head),
// 8 heads per block, the key range of each row cut into splits across blocks whose partial softmax
// states `combine` merges. A key is [A part ‖ B part], each read from rows of a buffer: the paged
// cache (row = page·page_size + position % page_size) or a dense per-step buffer (row = base[b] + pos).
//   prefill: latent rows gathered from the pages, kv = latent·kv_bᵀ (cuBLASLt); key = k_n (kv, per
//            head) ‖ k_r (gathered rows), value = v (kv, per head), query = q.
//   decode:  q_lat = q_n·W_UK (batched cuBLASLt), key = the page row [latent ‖ k_r] shared by all
//            heads, value = the latent, query = [q_lat ‖ q_r]; out = o_lat·W_UVᵀ (batched).
// Both forms of the bf16 tensor-core path use the same gather, expansion and absorption steps.
#include <algorithm>
#include <climits>
#include <vector>

#include "backend/cuda/common/device.cuh"
#include "backend/cuda/common/ptx.cuh"
#include "backend/cuda/mla/mla.h"
#include "backend/cuda/mla/mla_decode_sm90.h"
#include "backend/cuda/mla/mla_prefill_sm90.h"

namespace klinear::cuda {

namespace {

constexpr int kHeadsPerBlock = 8;
constexpr int kQPerLane = 20;  // query dims ≤ 640
constexpr int kVPerLane = 16;  // value dims ≤ 512

struct Rows {  // how a (sequence, position) finds its row of a key/value buffer
  bool paged;
  const int32_t* page_table;  // paged: [B, max_pages]
  int64_t max_pages, page_size;
  const int32_t* base;        // dense: [B] first row of each sequence
  __device__ __forceinline__ int64_t row(int b, int64_t pos) const {
    return paged ? int64_t{page_table[b * max_pages + pos / page_size]} * page_size + pos % page_size : base[b] + pos;
  }
};

struct Part {  // a slice of each row: element (row, head, j) at row·row_stride + head·head_stride + j
  In data;
  int64_t row_stride, head_stride;
  int dim;
};

struct Attend {
  In q;  // [N, H, a.dim + b.dim]
  Part a, b, v;
  Rows rows;
  const int32_t* cu;
  const int32_t* cached;
  int num_seqs, heads, splits;  // splits: blocks per row along the keys, each a run of whole 32-key groups
  float scale;
  float* part_o;      // [N, H, splits, v.dim]
  float* part_ml;     // [N, H, splits, 2] running max and sum
};

__global__ void __launch_bounds__(kHeadsPerBlock * 32) attend_kernel(Attend p) {
  const int lane = threadIdx.x % 32, h = blockIdx.y * kHeadsPerBlock + threadIdx.x / 32, split = blockIdx.z;
  const int64_t n = blockIdx.x;
  if (h >= p.heads) return;
  const int b = seq_of_row(p.cu, p.num_seqs, n);
  const int64_t visible = p.cached[b] + (n - p.cu[b]) + 1;
  const int64_t split_len = ((visible + p.splits - 1) / p.splits + 31) / 32 * 32;
  const int64_t k0 = split * split_len, k1 = visible < k0 + split_len ? visible : k0 + split_len;
  const int dq = p.a.dim + p.b.dim, dv = p.v.dim;
  float q[kQPerLane], acc[kVPerLane];
#pragma unroll
  for (int i = 0; i < kQPerLane; ++i) {
    const int j = lane + 32 * i;
    q[i] = j < dq ? p.q[(n * p.heads + h) * dq + j] * p.scale : 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kVPerLane; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t t0 = k0; t0 < k1; t0 += 32) {
    // Scores of up to 32 keys; lane j keeps key t0 + j's.
    float mine = -INFINITY;
    const int count = static_cast<int>(k1 - t0 < 32 ? k1 - t0 : 32);
    for (int j = 0; j < count; ++j) {
      const int64_t r = p.rows.row(b, t0 + j);
      const int64_t ra = r * p.a.row_stride + h * p.a.head_stride, rb = r * p.b.row_stride + h * p.b.head_stride;
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kQPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < p.a.dim) s += q[i] * p.a.data[ra + d];
        else if (d < dq) s += q[i] * p.b.data[rb + d - p.a.dim];
      }
      s = warp_sum(s);
      if (lane == j) mine = s;
    }
    const float m_new = fmaxf(m, warp_max(mine));
    const float correction = expf(m - m_new);  // 0 on the first tile (m = −inf)
    const float pr = lane < count ? expf(mine - m_new) : 0.0f;
    l = l * correction + warp_sum(pr);
#pragma unroll
    for (int i = 0; i < kVPerLane; ++i) acc[i] *= correction;
    for (int j = 0; j < count; ++j) {
      const float pj = __shfl_sync(0xffffffffu, pr, j);
      const int64_t rv = p.rows.row(b, t0 + j) * p.v.row_stride + h * p.v.head_stride;
#pragma unroll
      for (int i = 0; i < kVPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < dv) acc[i] += pj * p.v.data[rv + d];
      }
    }
    m = m_new;
  }
  const int64_t slot = (n * p.heads + h) * p.splits + split;
#pragma unroll
  for (int i = 0; i < kVPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < dv) p.part_o[slot * dv + d] = acc[i];
  }
  if (lane == 0) {
    p.part_ml[slot * 2] = m;
    p.part_ml[slot * 2 + 1] = l;
  }
}

constexpr int kMaxSplits = 128;  // key splits per row, any attention kernel
constexpr int kCombineDims = 128, kCombineGroups = 4;

// out[n, h, d] = Σ_s w_s·o_s[d], w_s = e^{m_s − M} / Σ_s e^{m_s − M}·l_s over the splits that saw
// keys (m_s > −∞; the others wrote no o). A block per (row·head, 128 dims): warp 0 finds the weights,
// group g of 128 threads sums splits g, g + 4, …, and the groups add up in a fixed order.
__global__ void __launch_bounds__(kCombineDims * kCombineGroups) combine_kernel(const float* part_o,
                                                                                const float* part_ml, int splits,
                                                                                int dv, Out o) {
  __shared__ float w_s[kMaxSplits];
  __shared__ float red[kCombineGroups][kCombineDims];
  pdl_enter();
  const int64_t nh = blockIdx.x;
  const float* ml = part_ml + nh * splits * 2;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float mx = -INFINITY;
    for (int s = lane; s < splits; s += 32) mx = fmaxf(mx, ml[2 * s]);
    mx = warp_max(mx);
    float z = 0.0f;
    for (int s = lane; s < splits; s += 32)
      if (ml[2 * s] > -INFINITY) z += expf(ml[2 * s] - mx) * ml[2 * s + 1];
    z = warp_sum(z);
    for (int s = lane; s < splits; s += 32) w_s[s] = ml[2 * s] > -INFINITY ? expf(ml[2 * s] - mx) / z : 0.0f;
  }
  __syncthreads();
  const int group = threadIdx.x / kCombineDims, dd = threadIdx.x % kCombineDims;
  const int d = blockIdx.y * kCombineDims + dd;
  float acc = 0.0f;
  if (d < dv) {
#pragma unroll 4
    for (int s = group; s < splits; s += kCombineGroups)
      if (w_s[s] != 0.0f) acc += w_s[s] * part_o[(nh * splits + s) * dv + d];
  }
  red[group][dd] = acc;
  __syncthreads();
  if (group == 0 && d < dv) {
    float sum = red[0][dd];
#pragma unroll
    for (int g = 1; g < kCombineGroups; ++g) sum += red[g][dd];
    o.set(nh * dv + d, sum);
  }
}

// Block r writes row r [latent ‖ k_r] to its page row, the latent (columns < c) normalised as
// rms_norm_kernel does (block_inv_rms over the same 256 threads, then x·s·w rounded once), so the
// pages hold what rms_norm then a copy stored.
constexpr int kCacheWriteThreads = 256;
__global__ void __launch_bounds__(kCacheWriteThreads)
    cache_write_kernel(In rows, In norm, int64_t c, float eps, int64_t width, const int32_t* cu, const int32_t* cached,
                       int num_seqs, Rows where, Out pages) {
  __shared__ float scratch[32];
  pdl_enter();
  const int64_t r = blockIdx.x, base = r * width;
  const float s = block_inv_rms(rows, base, c, eps, scratch);
  const int b = seq_of_row(cu, num_seqs, r);
  const int64_t dst = where.row(b, cached[b] + r - cu[b]) * width;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x)
    pages.set(dst + j, j < c ? rows[base + j] * s * norm[j] : rows[base + j]);
}

// dst [R, width] ← the page rows of positions 0 .. ctx[b] of every sequence (sequence b from row base[b]).
__global__ void gather_pages_kernel(In pages, int64_t width, const int32_t* base, int num_seqs, Rows where,
                                    int64_t total, Out dst) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total * width;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    const int b = seq_of_row(base, num_seqs, r);
    dst.set(i, pages[where.row(b, r - base[b]) * width + c]);
  }
}

struct MlaShape {
  int64_t n, heads, qk, c, r, nope, vd, page_size;
};

MlaShape mla_shape(const MlaArgs& a, const SeqLayout& layout, const char* op) {
  MlaShape s{a.q.dim(0), a.q.dim(1), a.q.dim(2), 0, 0, 0, a.out.dim(2), a.pages.dim(1)};
  const int64_t width = a.pages.dim(2);
  // kv_b [H·(n+v), c] and width = c + r with qk = n + r: c = kv_b cols, r = width − c, n = qk − r.
  s.c = a.kv_b.dim(1);
  s.r = width - s.c;
  s.nope = s.qk - s.r;
  KL_CHECK(a.q.rank() == 3 && a.out.rank() == 3 && a.out.dim(0) == s.n && a.out.dim(1) == s.heads &&
               a.pages.rank() == 3 && s.r >= 0 && s.nope >= 0 && a.kv_b.dim(0) == s.heads * (s.nope + s.vd) &&
               layout.num_rows() == s.n && layout.page_size == s.page_size && layout.dev.page_table.defined() &&
               a.q.dtype() == a.pages.dtype() && a.kv_b.dtype() == a.q.dtype(),
           std::string(op) + " q " + shapes(a.q) + " pages " + shapes(a.pages) + " kv_b " + shapes(a.kv_b) + " out " +
               shapes(a.out) + " rows " + std::to_string(layout.num_rows()));
  return s;
}

}  // namespace

void CudaBackend::mla_cache_write(const Tensor& rows, const Tensor& norm, float eps, const Tensor& pages,
                                  const SeqLayout& layout) {
  const int64_t n = rows.dim(0), width = rows.dim(1), c = norm.numel();
  KL_CHECK(pages.rank() == 3 && pages.dim(2) == width && layout.num_rows() == n && layout.page_size == pages.dim(1) &&
               layout.dev.page_table.defined() && c >= 1 && c <= width && n <= INT_MAX,
           "mla_cache_write rows " + shapes(rows) + " norm " + shapes(norm) + " pages " + shapes(pages));
  if (n == 0) return;
  const Rows where{true, layout.dev.page_table.data_as<const int32_t>(), layout.max_pages, layout.page_size, nullptr};
  launch_dependent(stream_, cache_write_kernel, dim3(static_cast<unsigned>(n)), dim3(kCacheWriteThreads), 0,
                   "mla_cache_write " + shapes(rows), in(rows, "mla_cache_write"), in(norm, "mla_cache_write norm"), c,
                   eps, width, layout.dev.cu_seqlens.data_as<const int32_t>(),
                   layout.dev.cached.data_as<const int32_t>(), static_cast<int>(layout.num_seqs()), where,
                   out(pages, "mla_cache_write"));
}

namespace {

// The top of a two-stage tile loop (cp.async, ptx.cuh): wait until every thread is done with the
// other stage, start `load_next` into it (when there is a next tile) and wait for this tile's copies,
// visible to all.
template <class LoadNext>
__device__ __forceinline__ void pipeline_step(bool has_next, LoadNext&& load_next) {
  __syncthreads();
  if (has_next) {
    load_next();
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();
  } else {
    ptx::cp_async_wait<0>();
  }
  __syncthreads();
}

// Partial softmax states of `splits` key ranges per (row, head): o [N, H, splits, dv] (unnormalised)
// and (max, sum) pairs, merged into out [N, H, dv] by `combine`.
struct Partials {
  Tensor o, ml;
  int splits;
};

Partials alloc_partials(CudaBackend& be, int64_t n, int64_t heads, int64_t splits, int64_t dv) {
  return {be.alloc(DType::kF32, {n, heads, splits, dv}), be.alloc(DType::kF32, {n, heads, splits, 2}),
          static_cast<int>(splits)};
}

void run_combine(CudaBackend& be, const Partials& pt, const Tensor& out_t, const std::string& what) {
  const int64_t n = out_t.dim(0), heads = out_t.dim(1), dv = out_t.dim(2);
  KL_CHECK(pt.splits >= 1 && pt.splits <= kMaxSplits && out_t.numel() == n * heads * dv, what + ": combine of " +
               std::to_string(pt.splits) + " splits into " + shapes(out_t));
  launch_dependent(be.stream(), combine_kernel,
                   dim3(static_cast<unsigned>(n * heads), static_cast<unsigned>((dv + kCombineDims - 1) / kCombineDims)),
                   dim3(kCombineDims * kCombineGroups), 0, what + " (combine)", pt.o.data_as<const float>(),
                   pt.ml.data_as<const float>(), pt.splits, static_cast<int>(dv), out(out_t, what.c_str()));
}

// Blocks per row along the keys: enough blocks for about `waves` per SM over all rows and head
// tiles, from the row count and static shapes only (never the lengths).
int64_t splits_for(const CudaBackend& be, int64_t rows, int64_t head_tiles, int64_t waves, int64_t max_splits) {
  return std::clamp<int64_t>(waves * be.num_sms() / std::max<int64_t>(1, rows * head_tiles), 1, max_splits);
}

// Runs attend + combine for `p` (everything but splits and the partial buffers set) into out [N, H, v.dim].
void run_attend(CudaBackend& be, Attend p, const Tensor& o, const std::string& what) {
  const int64_t n = o.dim(0), head_blocks = (p.heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  const Partials pt = alloc_partials(be, n, p.heads, splits_for(be, n, head_blocks, 2, kMaxSplits), p.v.dim);
  p.splits = pt.splits;
  p.part_o = pt.o.data_as<float>();
  p.part_ml = pt.ml.data_as<float>();
  KL_CHECK(p.a.dim + p.b.dim <= 32 * kQPerLane && p.v.dim <= 32 * kVPerLane,
           what + ": head dims over the attention kernel's limits");
  attend_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(head_blocks), static_cast<unsigned>(p.splits)),
                  kHeadsPerBlock * 32, 0, be.stream()>>>(p);
  KL_LAUNCHED(what + " (attend)");
  run_combine(be, pt, o, what);
}

// ---- The absorbed decode on tensor cores (bf16, latent 512 + rope 64).
namespace absorbed {
constexpr int kLatent = 512, kRope = 64, kWidth = kLatent + kRope;
constexpr int kHeads = 32;            // heads per block: the M of both products (two m16 tiles)
constexpr int kTokens = 64;           // keys per tile
constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kPitch = kWidth + 8;    // bf16 per shared row (1168 B: ldmatrix's 8 rows hit distinct banks)
constexpr int kSPitch = kTokens + 4;  // floats per score row
constexpr int kPPitch = kTokens + 8;  // bf16 per probability row
constexpr size_t kSmem = size_t{kHeads + 2 * kTokens} * kPitch * 2 + size_t{kHeads} * kSPitch * 4 +
                         size_t{kHeads} * kPPitch * 2 + kHeads * 4;
static_assert(kThreads == 4 * kTokens, "a tile load gives each thread a quarter of one key row");
static_assert(kWarps * 64 == kLatent, "each warp owns 64 output columns");
static_assert(kWarps == 2 * (kTokens / 16), "each warp scores one m16 head tile × 16 keys");
static_assert(kThreads == 8 * kHeads, "the softmax gives each head row 8 threads");
static_assert(kLatent == kSm90Latent && kRope == kSm90LatentRope, "both decode kernels serve latent 512 + 64");
}  // namespace absorbed

struct AbsorbedArgs {
  const __nv_bfloat16* q_lat;  // [N, H, lat_stride]: columns 0 .. 512 are q_n·W_UK
  const __nv_bfloat16* q;      // [N, H, qk]: columns nope .. nope + 64 are q_r
  const __nv_bfloat16* pages;  // [pages, page_size, 576]
  const int32_t* page_table;   // [B, max_pages]
  int64_t max_pages, page_size, lat_stride, qk, nope;
  const int32_t* cu;
  const int32_t* cached;
  int num_seqs, heads, splits;
  float scale_log2;  // the softmax scale times log2(e): scores in base-2 units
  float* part_o;     // [N, H, splits, 512]
  float* part_ml;    // [N, H, splits, 2] (max in natural units, sum)
};

__global__ void __launch_bounds__(absorbed::kThreads, 1) absorbed_kernel(AbsorbedArgs p) {
  using namespace absorbed;
  using namespace ptx;
  extern __shared__ __align__(16) unsigned char smem[];
  pdl_enter();
  auto* q_s = reinterpret_cast<__nv_bfloat16*>(smem);             // [kHeads][kPitch]
  __nv_bfloat16* kv_s = q_s + kHeads * kPitch;                      // [2][kTokens][kPitch]
  auto* s_s = reinterpret_cast<float*>(kv_s + 2 * kTokens * kPitch);  // [kHeads][kSPitch]
  auto* p_s = reinterpret_cast<__nv_bfloat16*>(s_s + kHeads * kSPitch);  // [kHeads][kPPitch]
  auto* corr_s = reinterpret_cast<float*>(p_s + kHeads * kPPitch);  // [kHeads]

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t4 = lane % 4;
  const int64_t n = blockIdx.x;
  const int h0 = blockIdx.y * kHeads, split = blockIdx.z;
  const int b = seq_of_row(p.cu, p.num_seqs, n);
  const int64_t visible = p.cached[b] + (n - p.cu[b]) + 1;
  const int64_t tiles = (visible + kTokens - 1) / kTokens, per = (tiles + p.splits - 1) / p.splits;
  const int64_t tile0 = split * per, tile1 = tiles < tile0 + per ? tiles : tile0 + per;
  // The softmax thread of (head row srow, eighth spart of the tile's keys).
  const int srow = tid / 8, spart = tid % 8;
  const bool srow_real = h0 + srow < p.heads;
  const int64_t sslot = (n * p.heads + h0 + srow) * p.splits + split;
  if (tile0 >= tile1) {  // a split past this row's keys
    if (spart == 0 && srow_real) {
      p.part_ml[sslot * 2] = -INFINITY;
      p.part_ml[sslot * 2 + 1] = 0.0f;
    }
    return;
  }

  // Q' = [q_lat ‖ q_r] of the block's heads; rows past the last head are zeros.
  for (int c = tid; c < kHeads * (kWidth / 8); c += kThreads) {
    const int r = c / (kWidth / 8), col = c % (kWidth / 8), h = h0 + r;
    const __nv_bfloat16* src = p.q_lat;
    if (h < p.heads)
      src = col < kLatent / 8 ? p.q_lat + (n * p.heads + h) * p.lat_stride + col * 8
                              : p.q + (n * p.heads + h) * p.qk + p.nope + (col - kLatent / 8) * 8;
    cp_async16_zfill(q_s + r * kPitch + col * 8, src, h < p.heads ? 16 : 0);
  }
  // Key tile `tile` into stage `stage`: thread (tok, sub) copies 16-byte pieces sub, sub+4, … of key
  // row tok; keys past the row's end are zeros (their scores are masked).
  auto load_tile = [&](int64_t tile, int stage) {
    const int tok = tid / 4, sub = tid % 4;
    const int64_t pos = tile * kTokens + tok;
    const bool valid = pos < visible;
    const __nv_bfloat16* src = p.pages;
    if (valid)
      src += (int64_t{p.page_table[b * p.max_pages + pos / p.page_size]} * p.page_size + pos % p.page_size) * kWidth;
    __nv_bfloat16* dst = kv_s + (stage * kTokens + tok) * kPitch;
#pragma unroll
    for (int j = 0; j < kWidth / 8 / 4; ++j) cp_async16_zfill(dst + (sub + 4 * j) * 8, src + (sub + 4 * j) * 8, valid ? 16 : 0);
  };

  float acc[2][8][4];  // O: head tile mt, 8-column group j of this warp's 64 columns
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.0f;
  float m_run = -INFINITY, l_run = 0.0f;  // of head row srow, base-2 units

  load_tile(tile0, 0);
  cp_async_commit();
  for (int64_t tile = tile0; tile < tile1; ++tile) {
    const int stage = static_cast<int>((tile - tile0) % 2);
    pipeline_step(tile + 1 < tile1, [&] { load_tile(tile + 1, stage ^ 1); });
    const __nv_bfloat16* kv = kv_s + stage * kTokens * kPitch;

    // S = Q'·Kᵀ: warp (mt, nb) scores head rows 16mt .. +16 against keys 16nb .. +16.
    {
      const int mt = warp % 2, nb = warp / 2;
      float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
      const __nv_bfloat16* qa = q_s + (16 * mt + lane % 16) * kPitch + (lane / 16) * 8;
      const __nv_bfloat16* kb = kv + (16 * nb + lane % 8 + (lane / 16) * 8) * kPitch + ((lane / 8) % 2) * 8;
#pragma unroll 6
      for (int kk = 0; kk < kWidth / 16; ++kk) {
        uint32_t a[4], bk[4];
        ldsm_x4(a, qa + kk * 16);
        ldsm_x4(bk, kb + kk * 16);
        mma_bf16(sc[0], a, bk[0], bk[1]);
        mma_bf16(sc[1], a, bk[2], bk[3]);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = 16 * nb + 8 * j + 2 * t4, row = 16 * mt + g;
        const int64_t pos = tile * kTokens + col;
        const float lo0 = pos < visible ? sc[j][0] * p.scale_log2 : -INFINITY;
        const float lo1 = pos + 1 < visible ? sc[j][1] * p.scale_log2 : -INFINITY;
        const float hi0 = pos < visible ? sc[j][2] * p.scale_log2 : -INFINITY;
        const float hi1 = pos + 1 < visible ? sc[j][3] * p.scale_log2 : -INFINITY;
        *reinterpret_cast<float2*>(s_s + row * kSPitch + col) = make_float2(lo0, lo1);
        *reinterpret_cast<float2*>(s_s + (row + 8) * kSPitch + col) = make_float2(hi0, hi1);
      }
    }
    __syncthreads();

    // Online softmax of head row srow over this tile (its 8 threads are adjacent lanes).
    {
      const float4 x0 = *reinterpret_cast<const float4*>(s_s + srow * kSPitch + spart * 8);
      const float4 x1 = *reinterpret_cast<const float4*>(s_s + srow * kSPitch + spart * 8 + 4);
      const float v[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      float mx = v[0];
#pragma unroll
      for (int i = 1; i < 8; ++i) mx = fmaxf(mx, v[i]);
#pragma unroll
      for (int o = 1; o < 8; o *= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m_run, mx);  // finite: every tile has a visible key
      const float corr = exp2f(m_run - m_new);
      float sum = 0.0f;
      uint32_t pk[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float e0 = exp2f(v[2 * i] - m_new), e1 = exp2f(v[2 * i + 1] - m_new);
        sum += e0 + e1;
        pk[i] = pack_bf16(e0, e1);
      }
#pragma unroll
      for (int o = 1; o < 8; o *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      l_run = l_run * corr + sum;
      m_run = m_new;
      *reinterpret_cast<uint4*>(p_s + srow * kPPitch + spart * 8) = make_uint4(pk[0], pk[1], pk[2], pk[3]);
      if (spart == 0) corr_s[srow] = corr;
    }
    __syncthreads();

    // O = O·corr + P·V over this warp's columns 64·warp .. +64 (V = the tile's latent part).
    {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const float c_lo = corr_s[16 * mt + g], c_hi = corr_s[16 * mt + g + 8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          acc[mt][j][0] *= c_lo;
          acc[mt][j][1] *= c_lo;
          acc[mt][j][2] *= c_hi;
          acc[mt][j][3] *= c_hi;
        }
      }
#pragma unroll
      for (int kk = 0; kk < kTokens / 16; ++kk) {
        uint32_t a0[4], a1[4];
        ldsm_x4(a0, p_s + (lane % 16) * kPPitch + kk * 16 + (lane / 16) * 8);
        ldsm_x4(a1, p_s + (16 + lane % 16) * kPPitch + kk * 16 + (lane / 16) * 8);
        const __nv_bfloat16* vb = kv + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kPitch + warp * 64 + (lane / 16) * 8;
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          uint32_t bv[4];
          ldsm_x4_trans(bv, vb + np * 16);
          mma_bf16(acc[0][2 * np], a0, bv[0], bv[1]);
          mma_bf16(acc[0][2 * np + 1], a0, bv[2], bv[3]);
          mma_bf16(acc[1][2 * np], a1, bv[0], bv[1]);
          mma_bf16(acc[1][2 * np + 1], a1, bv[2], bv[3]);
        }
      }
    }
  }

#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int h_lo = h0 + 16 * mt + g, h_hi = h_lo + 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int col = warp * 64 + 8 * j + 2 * t4;
      if (h_lo < p.heads)
        *reinterpret_cast<float2*>(p.part_o + ((n * p.heads + h_lo) * p.splits + split) * kLatent + col) =
            make_float2(acc[mt][j][0], acc[mt][j][1]);
      if (h_hi < p.heads)
        *reinterpret_cast<float2*>(p.part_o + ((n * p.heads + h_hi) * p.splits + split) * kLatent + col) =
            make_float2(acc[mt][j][2], acc[mt][j][3]);
    }
  }
  if (spart == 0 && srow_real) {
    p.part_ml[sslot * 2] = m_run * 0.69314718055994531f;  // back to natural units for `combine`
    p.part_ml[sslot * 2 + 1] = l_run;
  }
}

// o_lat [N, H, 512] ← the attention of q' = [q_lat ‖ q_r] over the latent pages, on tensor cores.
void run_absorbed(CudaBackend& be, const MlaArgs& a, const Tensor& qlat, const SeqLayout& layout, const Tensor& olat,
                  const std::string& what) {
  using namespace absorbed;
  const int64_t n = a.q.dim(0), heads = a.q.dim(1), head_tiles = (heads + kHeads - 1) / kHeads;
  for (const Tensor* t : {&a.q, &qlat, &a.pages})
    KL_CHECK(reinterpret_cast<uintptr_t>(t->data()) % 16 == 0 && a.q.dim(2) % 8 == 0,
             what + ": the tensor-core path copies 16-byte pieces; q " + shapes(a.q) + " must start and have rows on them");
  static const bool smem_set = [] {
    KL_CUDA(cudaFuncSetAttribute(absorbed_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem)),
            "mla_decode: shared memory of the absorbed kernel");
    return true;
  }();
  (void)smem_set;
  const Partials pt = alloc_partials(be, n, heads, splits_for(be, n, head_tiles, 2, kMaxSplits), kLatent);
  AbsorbedArgs p{};
  p.q_lat = qlat.data_as<const __nv_bfloat16>();
  p.q = a.q.data_as<const __nv_bfloat16>();
  p.pages = a.pages.data_as<const __nv_bfloat16>();
  p.page_table = layout.dev.page_table.data_as<const int32_t>();
  p.max_pages = layout.max_pages;
  p.page_size = layout.page_size;
  p.lat_stride = qlat.dim(2);
  p.qk = a.q.dim(2);
  p.nope = a.q.dim(2) - kRope;
  p.cu = layout.dev.cu_seqlens.data_as<const int32_t>();
  p.cached = layout.dev.cached.data_as<const int32_t>();
  p.num_seqs = static_cast<int>(layout.num_seqs());
  p.heads = static_cast<int>(heads);
  p.splits = pt.splits;
  p.scale_log2 = a.scale * 1.4426950408889634f;
  p.part_o = pt.o.data_as<float>();
  p.part_ml = pt.ml.data_as<float>();
  launch_dependent(be.stream(), absorbed_kernel,
                   dim3(static_cast<unsigned>(n), static_cast<unsigned>(head_tiles), static_cast<unsigned>(pt.splits)),
                   dim3(kThreads), kSmem, what + " (absorbed attention)", p);
  run_combine(be, pt, olat, what);
}

// ---- The expanded prefill on tensor cores (bf16, q/k 128 + 64, v 128): a flash-attention forward.
namespace expanded {
constexpr int kNope = 128, kRope = 64, kQk = kNope + kRope, kV = 128;
constexpr int kRows = 64;   // query rows per block, 16 per warp
constexpr int kKeys = 64;   // keys per tile
constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kQPitch = kQk + 8, kVPitch = kV + 8;  // bf16 per shared row (400 B, 272 B: conflict-free ldmatrix)
constexpr int kKChunks = kQk / 8, kVChunks = kV / 8;  // 16-byte pieces per key and value row
constexpr size_t kSmem = (size_t{kRows} * kQPitch + 2 * size_t{kKeys} * (kQPitch + kVPitch)) * 2;
static_assert(kRows == 16 * kWarps, "a warp owns 16 query rows");
}  // namespace expanded

struct ExpandedArgs {
  const __nv_bfloat16* q;    // [N, H, 192]
  const __nv_bfloat16* kv;   // [R, H·256]: per head k_n (128) ‖ v (128) of every key row
  const __nv_bfloat16* k_r;  // row r's shared rope key at k_r + r·kr_stride (64 values)
  int64_t kr_stride;
  const int32_t* base;       // [B+1] first key row of each sequence
  const int32_t* cu;
  const int32_t* cached;
  int heads;
  float scale_log2;          // the softmax scale times log2(e)
  __nv_bfloat16* out;        // [N, H, 128]
};

// Block (query tile, head, sequence); tiles are taken from the end of each sequence first so the
// longest causal rows start earliest. Each warp keeps its 16 query rows as mma A fragments in
// registers, scores a 64-key tile (S = Q·Kᵀ, K = [k_n ‖ k_r]), and feeds the probabilities back as
// A fragments of O += P·V without leaving registers; online softmax in fp32, base 2.
__global__ void __launch_bounds__(expanded::kThreads, 2) expanded_kernel(ExpandedArgs p) {
  using namespace expanded;
  using namespace ptx;
  extern __shared__ __align__(16) unsigned char smem[];
  auto* q_s = reinterpret_cast<__nv_bfloat16*>(smem);    // [kRows][kQPitch]
  __nv_bfloat16* k_s = q_s + kRows * kQPitch;              // [2][kKeys][kQPitch]
  __nv_bfloat16* v_s = k_s + 2 * kKeys * kQPitch;          // [2][kKeys][kVPitch]

  const int b = blockIdx.z, h = blockIdx.y;
  const int64_t len = p.cu[b + 1] - p.cu[b];
  const int64_t q_tiles = (len + kRows - 1) / kRows;
  if (blockIdx.x >= q_tiles) return;
  const int64_t i0 = (q_tiles - 1 - blockIdx.x) * kRows;  // first query row of the tile, within the sequence
  const int64_t past = p.cached[b];
  const int64_t key_end = past + len < past + i0 + kRows ? past + len : past + i0 + kRows;  // keys any row sees
  const int64_t key_tiles = (key_end + kKeys - 1) / kKeys, row0 = p.base[b];
  const int64_t kv_stride = int64_t{p.heads} * (kNope + kV);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t4 = lane % 4;

  for (int c = tid; c < kRows * kKChunks; c += kThreads) {
    const int r = c / kKChunks, col = c % kKChunks;
    const bool valid = i0 + r < len;
    const __nv_bfloat16* src = valid ? p.q + ((p.cu[b] + i0 + r) * p.heads + h) * kQk + col * 8 : p.q;
    cp_async16_zfill(q_s + r * kQPitch + col * 8, src, valid ? 16 : 0);
  }
  // Key tile kt into stage `stage`: k = [k_n ‖ k_r], v; keys past key_end are zeros (and masked).
  auto load_tile = [&](int64_t kt, int stage) {
#pragma unroll 1
    for (int c = tid; c < kKeys * (kKChunks + kVChunks); c += kThreads) {
      const int r = c / (kKChunks + kVChunks), col = c % (kKChunks + kVChunks);
      const int64_t pos = kt * kKeys + r;
      const bool valid = pos < key_end;
      const __nv_bfloat16* src = p.kv;
      __nv_bfloat16* dst;
      if (col < kNope / 8) {
        src += valid ? (row0 + pos) * kv_stride + h * (kNope + kV) + col * 8 : 0;
        dst = k_s + (stage * kKeys + r) * kQPitch + col * 8;
      } else if (col < kKChunks) {
        src = valid ? p.k_r + (row0 + pos) * p.kr_stride + (col - kNope / 8) * 8 : p.kv;
        dst = k_s + (stage * kKeys + r) * kQPitch + col * 8;
      } else {
        src += valid ? (row0 + pos) * kv_stride + h * (kNope + kV) + kNope + (col - kKChunks) * 8 : 0;
        dst = v_s + (stage * kKeys + r) * kVPitch + (col - kKChunks) * 8;
      }
      cp_async16_zfill(dst, src, valid ? 16 : 0);
    }
  };

  uint32_t qf[kQk / 16][4];  // this warp's 16 query rows as A fragments
  float o[kV / 8][4];
#pragma unroll
  for (int j = 0; j < kV / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;  // rows g and g + 8 (l: this thread's part)
  const int64_t i_lo = i0 + warp * 16 + g, i_hi = i_lo + 8;

  load_tile(0, 0);
  cp_async_commit();
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    const int stage = static_cast<int>(kt % 2);
    pipeline_step(kt + 1 < key_tiles, [&] { load_tile(kt + 1, stage ^ 1); });
    if (kt == 0) {
#pragma unroll
      for (int kk = 0; kk < kQk / 16; ++kk)
        ldsm_x4(qf[kk], q_s + (warp * 16 + lane % 16) * kQPitch + kk * 16 + (lane / 16) * 8);
    }
    const __nv_bfloat16* ks = k_s + stage * kKeys * kQPitch;
    const __nv_bfloat16* vs = v_s + stage * kKeys * kVPitch;

    float sc[kKeys / 8][4];
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) sc[j][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kQk / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kKeys / 16; ++np) {
        uint32_t bk[4];
        ldsm_x4(bk, ks + (np * 16 + lane % 8 + (lane / 16) * 8) * kQPitch + kk * 16 + ((lane / 8) % 2) * 8);
        mma_bf16(sc[2 * np], qf[kk], bk[0], bk[1]);
        mma_bf16(sc[2 * np + 1], qf[kk], bk[2], bk[3]);
      }
    }
    // Scale and mask (key ≤ past + row, key < key_end), then the online softmax of rows g, g + 8.
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
    // Key bounds relative to the tile: the last key of rows g and g + 8, and the end of the keys.
    const int64_t tile_key0 = kt * kKeys;
    const int last_lo = static_cast<int>(min(past + i_lo, key_end - 1) - tile_key0);
    const int last_hi = static_cast<int>(min(past + i_hi, key_end - 1) - tile_key0);
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = 8 * j + 2 * t4 + e;
        sc[j][e] = key <= last_lo ? sc[j][e] * p.scale_log2 : -INFINITY;
        sc[j][e + 2] = key <= last_hi ? sc[j][e + 2] * p.scale_log2 : -INFINITY;
        mx_lo = fmaxf(mx_lo, sc[j][e]);
        mx_hi = fmaxf(mx_hi, sc[j][e + 2]);
      }
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 *= 2) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, o2));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, o2));
    }
    // Finite: key 0 is in every row's first tile.
    const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
    const float c_lo = exp2f(m_lo - mn_lo), c_hi = exp2f(m_hi - mn_hi);
    m_lo = mn_lo;
    m_hi = mn_hi;
    float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j) {
      sc[j][0] = exp2f(sc[j][0] - mn_lo);
      sc[j][1] = exp2f(sc[j][1] - mn_lo);
      sc[j][2] = exp2f(sc[j][2] - mn_hi);
      sc[j][3] = exp2f(sc[j][3] - mn_hi);
      sum_lo += sc[j][0] + sc[j][1];
      sum_hi += sc[j][2] + sc[j][3];
    }
    l_lo = l_lo * c_lo + sum_lo;
    l_hi = l_hi * c_hi + sum_hi;
#pragma unroll
    for (int j = 0; j < kV / 8; ++j) {
      o[j][0] *= c_lo;
      o[j][1] *= c_lo;
      o[j][2] *= c_hi;
      o[j][3] *= c_hi;
    }
    // O += P·V: the score fragments of keys 16kk .. +16 are the A fragment of that k step.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t a[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                             pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                             pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int np = 0; np < kV / 16; ++np) {
        uint32_t bv[4];
        ldsm_x4_trans(bv, vs + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kVPitch + np * 16 + (lane / 16) * 8);
        mma_bf16(o[2 * np], a, bv[0], bv[1]);
        mma_bf16(o[2 * np + 1], a, bv[2], bv[3]);
      }
    }
  }
#pragma unroll
  for (int o2 = 1; o2 < 4; o2 *= 2) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, o2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, o2);
  }
  const float inv_lo = 1.0f / l_lo, inv_hi = 1.0f / l_hi;
#pragma unroll
  for (int j = 0; j < kV / 8; ++j) {
    const int col = 8 * j + 2 * t4;
    if (i_lo < len)
      *reinterpret_cast<__nv_bfloat162*>(p.out + ((p.cu[b] + i_lo) * p.heads + h) * kV + col) =
          __floats2bfloat162_rn(o[j][0] * inv_lo, o[j][1] * inv_lo);
    if (i_hi < len)
      *reinterpret_cast<__nv_bfloat162*>(p.out + ((p.cu[b] + i_hi) * p.heads + h) * kV + col) =
          __floats2bfloat162_rn(o[j][2] * inv_hi, o[j][3] * inv_hi);
  }
}

}  // namespace

const char* mla_prefill_path_name(MlaPrefillPath path) { return path_name(path, {"FlashInfer", "expanded", "attend"}); }

bool mla_prefill_path_fits(MlaPrefillPath path, DType dtype, int64_t nope, int64_t rope, int64_t v,
                           const SeqLayout& layout) {
  switch (path) {
    case MlaPrefillPath::kFlashInfer:
      return mla_prefill_sm90_fits(dtype, nope, rope, v, layout);
    case MlaPrefillPath::kExpanded:
      return dtype == DType::kBF16 && nope == expanded::kNope && rope == expanded::kRope && v == expanded::kV;
    case MlaPrefillPath::kAttend:
      return nope + rope <= 32 * kQPerLane && v <= 32 * kVPerLane;
  }
  return false;
}

MlaPrefillPath mla_prefill_path_for(AttentionKernels kernels, DType dtype, int64_t nope, int64_t rope, int64_t v,
                                    const SeqLayout& layout) {
  if (kernels == AttentionKernels::kBest &&
      mla_prefill_path_fits(MlaPrefillPath::kFlashInfer, dtype, nope, rope, v, layout))
    return MlaPrefillPath::kFlashInfer;
  return mla_prefill_path_fits(MlaPrefillPath::kExpanded, dtype, nope, rope, v, layout) ? MlaPrefillPath::kExpanded
                                                                                      : MlaPrefillPath::kAttend;
}

void mla_prefill_on(CudaBackend& be, MlaPrefillPath path, const MlaArgs& a, const SeqLayout& layout) {
  const MlaShape s = mla_shape(a, layout, "mla_prefill");
  if (s.n == 0) return;
  const DType dtype = be.activation_dtype();
  const std::string what = "mla_prefill q " + shapes(a.q) + " seqs " + std::to_string(layout.num_seqs());
  KL_CHECK(mla_prefill_path_fits(path, dtype, s.nope, s.r, s.vd, layout),
           what + " kv_b " + shapes(a.kv_b) + " pages " + shapes(a.pages) + ": the " + mla_prefill_path_name(path) +
               " path cannot run this step (dtype, head shape or length)");
  // Every sequence's positions 0 .. cached + new, gathered from the pages.
  std::vector<int32_t> base(layout.num_seqs() + 1, 0);
  for (int64_t b = 0; b < layout.num_seqs(); ++b) base[b + 1] = base[b] + layout.cached[b] + layout.new_tokens(b);
  const int64_t total = base.back(), width = s.c + s.r;
  const Tensor base_t =
      be.to_device(Tensor::wrap(DType::kI32, {static_cast<int64_t>(base.size())}, base.data(), nullptr, Device::kCpu),
                   DType::kI32);
  const Rows paged{true, layout.dev.page_table.data_as<const int32_t>(), layout.max_pages, layout.page_size, nullptr};
  const Tensor gathered = be.alloc(dtype, {total, width});
  gather_pages_kernel<<<blocks_for(total * width, 256), 256, 0, be.stream()>>>(
      in(a.pages, "mla_prefill"), width, base_t.data_as<const int32_t>(), static_cast<int>(layout.num_seqs()), paged,
      total, out(gathered, "mla_prefill"));
  KL_LAUNCHED(what + " (gather)");
  const Tensor latent = be.alloc(dtype, {total, s.c});
  be.copy_columns(gathered, 0, latent, 0, s.c);
  const Tensor kv = be.alloc(dtype, {total, s.heads * (s.nope + s.vd)});
  be.linear(latent, a.kv_b, kv);

  if (path != MlaPrefillPath::kAttend) {
    KL_CHECK(a.out.dtype() == DType::kBF16, what + ": out must have the activation dtype");
    for (const Tensor* t : {&a.q, &a.out, &kv, &gathered})
      KL_CHECK(reinterpret_cast<uintptr_t>(t->data()) % 16 == 0 && width % 8 == 0 && s.c % 8 == 0,
               what + ": the tensor-core path copies 16-byte pieces; pages " + shapes(a.pages) + " must have rows on them");
  }
  if (path == MlaPrefillPath::kFlashInfer) {
    const MlaPrefillSm90Args f{a.q.data(), kv.data(), gathered.data_as<const __nv_bfloat16>() + s.c, width,
                               a.out.data(), s.heads, total, a.scale};
    mla_prefill_sm90(be, f, layout, base);
    return;
  }
  if (path == MlaPrefillPath::kExpanded) {
    static const bool smem_set = [] {
      KL_CUDA(cudaFuncSetAttribute(expanded_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(expanded::kSmem)),
              "mla_prefill: shared memory of the expanded kernel");
      return true;
    }();
    (void)smem_set;
    int64_t max_new = 1;
    for (int64_t b = 0; b < layout.num_seqs(); ++b) max_new = std::max<int64_t>(max_new, layout.new_tokens(b));
    ExpandedArgs p{};
    p.q = a.q.data_as<const __nv_bfloat16>();
    p.kv = kv.data_as<const __nv_bfloat16>();
    p.k_r = gathered.data_as<const __nv_bfloat16>() + s.c;
    p.kr_stride = width;
    p.base = base_t.data_as<const int32_t>();
    p.cu = layout.dev.cu_seqlens.data_as<const int32_t>();
    p.cached = layout.dev.cached.data_as<const int32_t>();
    p.heads = static_cast<int>(s.heads);
    p.scale_log2 = a.scale * 1.4426950408889634f;
    p.out = a.out.data_as<__nv_bfloat16>();
    expanded_kernel<<<dim3(static_cast<unsigned>((max_new + expanded::kRows - 1) / expanded::kRows),
                           static_cast<unsigned>(s.heads), static_cast<unsigned>(layout.num_seqs())),
                      expanded::kThreads, expanded::kSmem, be.stream()>>>(p);
    KL_LAUNCHED(what + " (expanded attention)");
    return;
  }
  Attend p{};
  p.q = in(a.q, "mla_prefill");
  const In kvi = in(kv, "mla_prefill");
  p.a = Part{kvi, s.heads * (s.nope + s.vd), s.nope + s.vd, static_cast<int>(s.nope)};
  p.b = Part{In{static_cast<const char*>(gathered.data()) + s.c * dtype_size(dtype), kvi.bf16}, width, 0,
             static_cast<int>(s.r)};
  p.v = Part{In{static_cast<const char*>(kv.data()) + s.nope * dtype_size(dtype), kvi.bf16},
             s.heads * (s.nope + s.vd), s.nope + s.vd, static_cast<int>(s.vd)};
  p.rows = Rows{false, nullptr, 0, 1, base_t.data_as<const int32_t>()};
  p.cu = layout.dev.cu_seqlens.data_as<const int32_t>();
  p.cached = layout.dev.cached.data_as<const int32_t>();
  p.num_seqs = static_cast<int>(layout.num_seqs());
  p.heads = static_cast<int>(s.heads);
  p.scale = a.scale;
  run_attend(be, p, a.out, what);
}

void CudaBackend::mla_prefill(const MlaArgs& a, const SeqLayout& layout) {
  const MlaShape s = mla_shape(a, layout, "mla_prefill");
  mla_prefill_on(*this, mla_prefill_path_for(attention_, dtype_, s.nope, s.r, s.vd, layout), a, layout);
}

const char* mla_decode_path_name(MlaDecodePath path) { return path_name(path, {"FlashInfer", "absorbed", "attend"}); }

bool mla_decode_path_fits(MlaDecodePath path, DType dtype, int64_t latent, int64_t rope) {
  switch (path) {
    case MlaDecodePath::kFlashInfer:
    case MlaDecodePath::kAbsorbed:
      return dtype == DType::kBF16 && latent == kSm90Latent && rope == kSm90LatentRope;
    case MlaDecodePath::kAttend:
      return latent + rope <= 32 * kQPerLane && latent <= 32 * kVPerLane;
  }
  return false;
}

MlaDecodePath mla_decode_path_for(AttentionKernels kernels, DType dtype, int64_t latent, int64_t rope,
                                  const SeqLayout& layout) {
  if (!mla_decode_path_fits(MlaDecodePath::kAbsorbed, dtype, latent, rope)) return MlaDecodePath::kAttend;
  return kernels == AttentionKernels::kBest && layout.num_seqs() >= kFlashInferDecodeMinSeqs
             ? MlaDecodePath::kFlashInfer
             : MlaDecodePath::kAbsorbed;
}

void CudaBackend::plan_step(const SeqLayout& layout) {
  // The FlashInfer decode exists once a step of its shape ran.
  if (mla_decode_sm90_ && mla_decode_sm90_->heads() > 0 &&
      mla_decode_path_for(attention_, dtype_, kSm90Latent, kSm90LatentRope, layout) == MlaDecodePath::kFlashInfer)
    mla_decode_sm90_->plan(layout, mla_decode_sm90_->heads());
}

void CudaBackend::mla_decode(const MlaArgs& a, const SeqLayout& layout) {
  const MlaShape s = mla_shape(a, layout, "mla_decode");
  mla_decode_on(*this, mla_decode_path_for(attention_, dtype_, s.c, s.r, layout), a, layout);
}

void mla_decode_on(CudaBackend& be, MlaDecodePath path, const MlaArgs& a, const SeqLayout& layout) {
  const MlaShape s = mla_shape(a, layout, "mla_decode");
  if (s.n == 0) return;
  const DType dtype = be.activation_dtype();
  const std::string what = "mla_decode q " + shapes(a.q) + " seqs " + std::to_string(layout.num_seqs());
  KL_CHECK(mla_decode_path_fits(path, dtype, s.c, s.r),
           what + " pages " + shapes(a.pages) + ": the " + mla_decode_path_name(path) +
               " path cannot run this step (dtype or latent shape)");
  const int64_t width = s.c + s.r, es = dtype_size(dtype);
  // q' = [q_n·W_UK ‖ q_r] per head.
  const Tensor qlat = be.alloc(dtype, {s.n, s.heads, width});
  GemmArgs uk;
  uk.m = s.n;
  uk.n = s.c;
  uk.k = s.nope;
  uk.a = a.q.data();
  uk.lda = s.heads * s.qk;
  uk.stride_a = s.qk;
  uk.b = a.kv_b.data();
  uk.ldb = s.c;
  uk.stride_b = (s.nope + s.vd) * s.c;
  uk.b_transposed = false;
  uk.c = qlat.data();
  uk.ldc = s.heads * width;
  uk.stride_c = width;
  uk.batch = s.heads;
  uk.ab_dtype = uk.c_dtype = dtype;
  be.gemm(uk, "mla_decode q·W_UK");

  const Tensor olat = be.alloc(dtype, {s.n, s.heads, s.c});
  if (path == MlaDecodePath::kFlashInfer) {
    // FlashInfer's kernel on a plan for this layout: made here when the step runs eagerly, by
    // plan_step before a graph's capture and replays (the plan's upload cannot be captured).
    if (!be.capturing_) {
      if (!be.mla_decode_sm90_) be.mla_decode_sm90_ = std::make_unique<MlaDecodeSm90>(be);
      be.mla_decode_sm90_->plan(layout, s.heads);
    } else if (!be.mla_decode_sm90_ || !be.mla_decode_sm90_->planned(layout, s.heads)) {
      be.breaks_capture(what + " (no FlashInfer plan for this step: plan_step was not called before the capture)");
      return;
    }
    be.mla_decode_sm90_->run(MlaDecodeSm90Args{qlat.data(), width, a.q.data(), s.qk, s.nope, a.pages.data(),
                                               olat.data(), s.heads, a.scale},
                             layout);
  } else if (path == MlaDecodePath::kAbsorbed) {
    run_absorbed(be, a, qlat, layout, olat, what);  // reads q_r from q itself
  } else {
    be.copy_columns(a.q.view({s.n * s.heads, s.qk}), s.nope, qlat.view({s.n * s.heads, width}), s.c, s.r);
    Attend p{};
    p.q = in(qlat, "mla_decode");
    const In pages = in(a.pages, "mla_decode");
    p.a = Part{pages, width, 0, static_cast<int>(width)};
    p.b = Part{pages, width, 0, 0};
    p.v = Part{pages, width, 0, static_cast<int>(s.c)};
    p.rows = Rows{true, layout.dev.page_table.data_as<const int32_t>(), layout.max_pages, layout.page_size, nullptr};
    p.cu = layout.dev.cu_seqlens.data_as<const int32_t>();
    p.cached = layout.dev.cached.data_as<const int32_t>();
    p.num_seqs = static_cast<int>(layout.num_seqs());
    p.heads = static_cast<int>(s.heads);
    p.scale = a.scale;
    run_attend(be, p, olat, what);
  }

  // out_h = o_lat_h · W_UV_hᵀ.
  GemmArgs uv;
  uv.m = s.n;
  uv.n = s.vd;
  uv.k = s.c;
  uv.a = olat.data();
  uv.lda = s.heads * s.c;
  uv.stride_a = s.c;
  uv.b = static_cast<const char*>(a.kv_b.data()) + s.nope * s.c * es;
  uv.ldb = s.c;
  uv.stride_b = (s.nope + s.vd) * s.c;
  uv.b_transposed = true;
  uv.c = a.out.data();
  uv.ldc = s.heads * s.vd;
  uv.stride_c = s.vd;
  uv.batch = s.heads;
  uv.ab_dtype = uv.c_dtype = dtype;
  KL_CHECK(a.out.dtype() == dtype, what + ": out must have the activation dtype");
  be.gemm(uv, "mla_decode o·W_UV");
}

}  // namespace klinear::cuda
