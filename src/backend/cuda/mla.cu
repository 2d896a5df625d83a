// CUDA MLA (SPEC 5): the paged latent-cache write, the expanded prefill and the absorbed decode.
//
// Both attentions run one kernel, `attend`: a warp per (query row, head), 8 heads per block, the key
// range of each row cut into splits across blocks (split-KV) whose partial softmax states a second
// kernel combines. A key is [A part ‖ B part], each read from rows of a buffer: the paged cache
// (row = page·page_size + position % page_size) or a dense per-step buffer (row = base[b] + pos).
//   prefill: latent rows gathered from the pages, kv = latent·kv_bᵀ (cuBLASLt); key = k_n (kv, per
//            head) ‖ k_r (gathered rows), value = v (kv, per head), query = q.
//   decode:  q_lat = q_n·W_UK (batched cuBLASLt), key = the page row [latent ‖ k_r] shared by all
//            heads, value = the latent, query = [q_lat ‖ q_r]; out = o_lat·W_UVᵀ (batched).
// Scores and softmax in fp32. The FlashInfer / FlashMLA-style tensor-core kernels are issue 9's.
#include <algorithm>
#include <vector>

#include "backend/cuda/device.cuh"

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
  int num_seqs, heads, splits;
  int64_t split_len;  // keys per split (a multiple of 32)
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
  const int64_t k0 = split * p.split_len, k1 = visible < k0 + p.split_len ? visible : k0 + p.split_len;
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

// out[n, h, :] = Σ_s e^{m_s − M}·o_s / Σ_s e^{m_s − M}·l_s; a block per (row, head).
__global__ void combine_kernel(const float* part_o, const float* part_ml, int splits, int dv, int64_t out_stride,
                               int64_t out_offset, int heads, Out o) {
  const int64_t nh = blockIdx.x;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, part_ml[(nh * splits + s) * 2]);
  float z = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float ms = part_ml[(nh * splits + s) * 2];
    if (ms > -INFINITY) z += expf(ms - mx) * part_ml[(nh * splits + s) * 2 + 1];
  }
  const int64_t n = nh / heads, h = nh % heads;
  for (int d = threadIdx.x; d < dv; d += blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const float ms = part_ml[(nh * splits + s) * 2];
      if (ms > -INFINITY) acc += expf(ms - mx) * part_o[(nh * splits + s) * dv + d];
    }
    o.set(n * out_stride + h * dv + out_offset + d, acc / z);
  }
}

__global__ void cache_write_kernel(In rows, int64_t n, int64_t width, const int32_t* cu, const int32_t* cached,
                                   int num_seqs, Rows where, Out pages) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * width; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    const int b = seq_of_row(cu, num_seqs, r);
    pages.set(where.row(b, cached[b] + r - cu[b]) * width + c, rows[i]);
  }
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

void CudaBackend::mla_cache_write(const Tensor& rows, const Tensor& pages, const SeqLayout& layout) {
  const int64_t n = rows.dim(0), width = rows.dim(1);
  KL_CHECK(pages.rank() == 3 && pages.dim(2) == width && layout.num_rows() == n && layout.page_size == pages.dim(1) &&
               layout.dev.page_table.defined(),
           "mla_cache_write rows " + shapes(rows) + " pages " + shapes(pages));
  if (n == 0) return;
  const Rows where{true, layout.dev.page_table.data_as<const int32_t>(), layout.max_pages, layout.page_size, nullptr};
  cache_write_kernel<<<blocks_for(n * width, 256), 256, 0, stream_>>>(
      in(rows, "mla_cache_write"), n, width, layout.dev.cu_seqlens.data_as<const int32_t>(),
      layout.dev.cached.data_as<const int32_t>(), static_cast<int>(layout.num_seqs()), where,
      out(pages, "mla_cache_write"));
  KL_LAUNCHED("mla_cache_write " + shapes(rows));
}

namespace {

// Runs attend + combine for `p` (everything but splits, split_len and the partial buffers set)
// into out [N, H, v.dim].
void run_attend(CudaBackend& be, Attend p, const SeqLayout& layout, const Tensor& o, const std::string& what) {
  int64_t max_visible = 1;
  for (int64_t b = 0; b < layout.num_seqs(); ++b)
    max_visible = std::max<int64_t>(max_visible, layout.cached[b] + layout.new_tokens(b));
  const int64_t n = layout.num_rows(), head_blocks = (p.heads + kHeadsPerBlock - 1) / kHeadsPerBlock;
  const int64_t want = std::max<int64_t>(1, 2 * be.num_sms() / std::max<int64_t>(1, n * head_blocks));
  const int64_t splits = std::clamp<int64_t>(std::min(want, (max_visible + 255) / 256), 1, 64);
  p.splits = static_cast<int>(splits);
  p.split_len = ((max_visible + splits - 1) / splits + 31) / 32 * 32;
  const Tensor po = be.alloc(DType::kF32, {n, p.heads, splits, p.v.dim});
  const Tensor pml = be.alloc(DType::kF32, {n, p.heads, splits, 2});
  p.part_o = po.data_as<float>();
  p.part_ml = pml.data_as<float>();
  KL_CHECK(p.a.dim + p.b.dim <= 32 * kQPerLane && p.v.dim <= 32 * kVPerLane,
           what + ": head dims over the attention kernel's limits");
  attend_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(head_blocks), static_cast<unsigned>(splits)),
                  kHeadsPerBlock * 32, 0, be.stream()>>>(p);
  KL_LAUNCHED(what + " (attend)");
  combine_kernel<<<static_cast<unsigned>(n * p.heads), 128, 0, be.stream()>>>(
      p.part_o, p.part_ml, p.splits, p.v.dim, int64_t{p.heads} * p.v.dim, 0, p.heads, out(o, what.c_str()));
  KL_LAUNCHED(what + " (combine)");
}

}  // namespace

void CudaBackend::mla_prefill(const MlaArgs& a, const SeqLayout& layout) {
  const MlaShape s = mla_shape(a, layout, "mla_prefill");
  if (s.n == 0) return;
  const std::string what = "mla_prefill q " + shapes(a.q) + " seqs " + std::to_string(layout.num_seqs());
  // Every sequence's positions 0 .. cached + new, gathered from the pages.
  std::vector<int32_t> base(layout.num_seqs() + 1, 0);
  for (int64_t b = 0; b < layout.num_seqs(); ++b) base[b + 1] = base[b] + layout.cached[b] + layout.new_tokens(b);
  const int64_t total = base.back(), width = s.c + s.r;
  const Tensor base_t =
      to_device(Tensor::wrap(DType::kI32, {static_cast<int64_t>(base.size())}, base.data(), nullptr, Device::kCpu),
                DType::kI32);
  const Rows paged{true, layout.dev.page_table.data_as<const int32_t>(), layout.max_pages, layout.page_size, nullptr};
  const Tensor gathered = alloc(dtype_, {total, width});
  gather_pages_kernel<<<blocks_for(total * width, 256), 256, 0, stream_>>>(
      in(a.pages, "mla_prefill"), width, base_t.data_as<const int32_t>(), static_cast<int>(layout.num_seqs()), paged,
      total, out(gathered, "mla_prefill"));
  KL_LAUNCHED(what + " (gather)");
  const Tensor latent = alloc(dtype_, {total, s.c});
  copy_columns(gathered, 0, latent, 0, s.c);
  const Tensor kv = alloc(dtype_, {total, s.heads * (s.nope + s.vd)});
  linear(latent, a.kv_b, kv);

  Attend p{};
  p.q = in(a.q, "mla_prefill");
  const In kvi = in(kv, "mla_prefill");
  p.a = Part{kvi, s.heads * (s.nope + s.vd), s.nope + s.vd, static_cast<int>(s.nope)};
  p.b = Part{In{static_cast<const char*>(gathered.data()) + s.c * dtype_size(dtype_), kvi.bf16}, width, 0,
             static_cast<int>(s.r)};
  p.v = Part{In{static_cast<const char*>(kv.data()) + s.nope * dtype_size(dtype_), kvi.bf16},
             s.heads * (s.nope + s.vd), s.nope + s.vd, static_cast<int>(s.vd)};
  p.rows = Rows{false, nullptr, 0, 1, base_t.data_as<const int32_t>()};
  p.cu = layout.dev.cu_seqlens.data_as<const int32_t>();
  p.cached = layout.dev.cached.data_as<const int32_t>();
  p.num_seqs = static_cast<int>(layout.num_seqs());
  p.heads = static_cast<int>(s.heads);
  p.scale = a.scale;
  run_attend(*this, p, layout, a.out, what);
}

void CudaBackend::mla_decode(const MlaArgs& a, const SeqLayout& layout) {
  const MlaShape s = mla_shape(a, layout, "mla_decode");
  if (s.n == 0) return;
  const std::string what = "mla_decode q " + shapes(a.q) + " seqs " + std::to_string(layout.num_seqs());
  const int64_t width = s.c + s.r, es = dtype_size(dtype_);
  // q' = [q_n·W_UK ‖ q_r] per head.
  const Tensor qlat = alloc(dtype_, {s.n, s.heads, width});
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
  uk.ab_dtype = uk.c_dtype = dtype_;
  gemm(uk, "mla_decode q·W_UK");
  copy_columns(a.q.view({s.n * s.heads, s.qk}), s.nope, qlat.view({s.n * s.heads, width}), s.c, s.r);

  const Tensor olat = alloc(dtype_, {s.n, s.heads, s.c});
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
  run_attend(*this, p, layout, olat, what);

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
  uv.ab_dtype = uv.c_dtype = dtype_;
  KL_CHECK(a.out.dtype() == dtype_, what + ": out must have the activation dtype");
  gemm(uv, "mla_decode o·W_UV");
}

}  // namespace klinear::cuda
