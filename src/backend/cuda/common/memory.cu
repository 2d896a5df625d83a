// CUDA memory ops: the backend's life cycle, the step arena, persistent allocations, host<->device
// copies with dtype conversion, fills, column and row copies (copy_columns: dst[:, dst_col + j] ←
// src[:, src_col + j]; gather_rows: out[r] = src[rows[r]]), and MXFP4 experts' upload (packed and
// scales copied as they are, MODEL.md 2.3; moe.cu reads them).
// Shapes and dtypes: as backend.h declares each op; values F32 or BF16 (In / Out), MXFP4 packed U8
// [E, out, in/2] with scales U8 [E, out, in/32].
// Ownership: the backend owns the arena (rewound by begin_step; a step's tensors live until the
// next) and the persistent blocks (freed with the backend); uploads return device tensors the
// caller keeps; copies read src and write dst, nothing else.
// Cost and floor: copies and fills are bound by bytes moved (~4.2 TB/s device to device; host
// copies by PCIe, pageable).
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "backend/cuda/common/device.cuh"
#include "backend/cuda/mla/mla_decode_sm90.h"
#include "core/counter_rng.h"

namespace klinear::cuda {

void check_cuda(cudaError_t err, const char* call, const std::string& what, const char* file, int line) {
  if (err == cudaSuccess) return;
  detail::check_failed(file, line, call,
                       std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ") in " +
                           what);
}

void check_cublas(int status, const char* call, const std::string& what, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  detail::check_failed(file, line, call,
                       std::string("cuBLAS status ") + cublasLtGetStatusName(static_cast<cublasStatus_t>(status)) +
                           " in " + what);
}

In in(const Tensor& t, const char* what) {
  KL_CHECK(t.device() == Device::kCuda && (t.dtype() == DType::kF32 || t.dtype() == DType::kBF16),
           std::string(what) + ": expected an F32 or BF16 CUDA tensor, got " + dtype_name(t.dtype()) + " " + shapes(t));
  return In{t.data(), t.dtype() == DType::kBF16};
}
Out out(const Tensor& t, const char* what) {
  const In i = in(t, what);
  return Out{t.data(), i.bf16};
}

namespace {

constexpr size_t kInitialArenaBytes = size_t{64} << 20;
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

// Blocks let go of while graphs are captured, and how many captures run (hold_block_frees).
struct HeldFrees {
  std::mutex mu;
  int captures = 0;
  std::vector<void*> blocks;
};
HeldFrees& held_frees() {
  static HeldFrees h;
  return h;
}

void free_block(void* p) {
  {
    HeldFrees& h = held_frees();
    std::lock_guard<std::mutex> lock(h.mu);
    if (h.captures > 0) {
      h.blocks.push_back(p);
      return;
    }
  }
  cudaFree(p);
}

std::shared_ptr<void> device_block(size_t bytes, const std::string& what) {
  void* p = nullptr;
  KL_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 256)), what + " (" + std::to_string(bytes) + " bytes)");
  return std::shared_ptr<void>(p, free_block);
}

// device_block while a capture runs on this thread (relaxed mode lets cudaMalloc through).
std::shared_ptr<void> block_outside_capture(size_t bytes, const std::string& what) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  KL_CUDA(cudaThreadExchangeStreamCaptureMode(&mode), what);
  auto block = device_block(bytes, what);
  KL_CUDA(cudaThreadExchangeStreamCaptureMode(&mode), what);
  return block;
}

// Host F32 / BF16 / I32 / I64 bytes of `host` in `dtype` (floats converted, integers kept).
std::vector<uint8_t> host_bytes(const Tensor& host, DType dtype) {
  KL_CHECK(host.device() == Device::kCpu, "expected a host tensor, got a device one " + shapes(host));
  const size_t n = static_cast<size_t>(host.numel());
  std::vector<uint8_t> bytes(n * dtype_size(dtype));
  const auto integer = [](DType d) { return d == DType::kI32 || d == DType::kI64; };
  if (integer(host.dtype()) || integer(dtype)) {
    KL_CHECK(host.dtype() == dtype, "integer tensors copy as themselves only, got " +
                                        std::string(dtype_name(host.dtype())) + " to " + dtype_name(dtype));
    std::memcpy(bytes.data(), host.data(), bytes.size());
    return bytes;
  }
  KL_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, std::string("unsupported device dtype ") + dtype_name(dtype));
  if (host.dtype() == dtype) {
    std::memcpy(bytes.data(), host.data(), bytes.size());
    return bytes;
  }
  std::vector<float> f(n);
  convert_to_f32(host.dtype(), host.data(), f.data(), n);
  if (dtype == DType::kF32) {
    std::memcpy(bytes.data(), f.data(), n * 4);
  } else {
    auto* b = reinterpret_cast<uint16_t*>(bytes.data());
    for (size_t i = 0; i < n; ++i) b[i] = f32_to_bf16(f[i]);
  }
  return bytes;
}

__global__ void fill_kernel(Out t, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    t.set(i, value);
}

__global__ void random_fill_kernel(Out t, int64_t n, int64_t cols, int64_t offset, int64_t stride, uint64_t seed,
                                   float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    t.set(i, counter_uniform(seed, static_cast<uint64_t>(offset + i / cols * stride + i % cols), lo, hi));
}

__global__ void fill_i32_kernel(int32_t* t, int64_t n, int32_t value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    t[i] = value;
}

// out[r] = src[rows[r]], a row as `units` copy units U (16, 8, 4 or 2 bytes: the widest that the row
// width and both pointers allow). A thread owns one unit of a row and walks rows (x over the units,
// y over the rows, striding past 65535).
// Cost (Kimi-Linear-48B prefill of 2,048 tokens, the per-expert MoE path: 16,384 rows of 2,304 BF16
// = 4,608 bytes, 288 units of 16 bytes): writes 75.5 MB, reads 75.5 MB of which 9.4 MB distinct
// (each token's row 8 times, held in the 50 MB L2): 151 MB, 36 µs at 4.2 TB/s, ~20 µs counting
// DRAM bytes only. Measured: docs/perf-log.md, "Notes moved from the CUDA sources".
template <typename U>
__global__ void gather_rows_kernel(const U* src, int64_t src_rows, const int32_t* rows, U* dst, int64_t out_rows,
                                   int64_t units) {
  const int64_t u = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (u >= units) return;
  for (int64_t r = blockIdx.y; r < out_rows; r += gridDim.y) {
    const int32_t s = rows[r];
    if (s >= 0 && s < src_rows) dst[r * units + u] = src[s * units + u];  // a row out of range is a caller bug
  }
}

template <typename U>
void launch_gather(const void* src, int64_t src_rows, const int32_t* rows, void* dst, int64_t out_rows,
                   int64_t row_bytes, cudaStream_t stream) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(U));
  const RowGrid g = row_grid(units, out_rows);
  gather_rows_kernel<<<g.grid, g.block, 0, stream>>>(static_cast<const U*>(src), src_rows, rows, static_cast<U*>(dst),
                                                     out_rows, units);
}

}  // namespace

CudaBackend::CudaBackend(DType dtype, CudaGraphs graphs, AttentionKernels attention)
    : dtype_(dtype), graphs_(graphs), attention_(attention) {}

void hold_block_frees() {
  HeldFrees& h = held_frees();
  std::lock_guard<std::mutex> lock(h.mu);
  ++h.captures;
}

void free_held_blocks() {
  std::vector<void*> blocks;
  {
    HeldFrees& h = held_frees();
    std::lock_guard<std::mutex> lock(h.mu);
    KL_CHECK(h.captures > 0, "free_held_blocks without hold_block_frees");
    if (--h.captures == 0) blocks.swap(h.blocks);
  }
  for (void* p : blocks) cudaFree(p);
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(DType dtype, CudaGraphs graphs, AttentionKernels attention,
                                                         int gpu) {
  if (dtype != DType::kF32 && dtype != DType::kBF16)
    return Status::InvalidArgument(std::string("CUDA dtype must be float32 or bfloat16, got ") + dtype_name(dtype));
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0)
    return Status::NotSupported(std::string("no CUDA device is visible (") +
                                (err == cudaSuccess ? "0 devices" : cudaGetErrorString(err)) + "); use --device cpu");
  if (gpu >= count)
    return Status::InvalidArgument("CUDA device " + std::to_string(gpu) + ": " + std::to_string(count) +
                                   " device(s) are visible (one GPU per rank on a host: as many ranks as GPUs)");
  if (gpu >= 0) KL_CUDA(cudaSetDevice(gpu), "backend start");
  std::unique_ptr<CudaBackend> b(new CudaBackend(dtype, graphs, attention));
  KL_CUDA(cudaGetDevice(&b->device_), "backend start");
  cudaDeviceProp prop{};
  KL_CUDA(cudaGetDeviceProperties(&prop, b->device_), "backend start");
  if (prop.major < 9)
    return Status::NotSupported(std::string("the CUDA backend is built for sm_90a (Hopper); device '") + prop.name +
                                "' is sm_" + std::to_string(prop.major * 10 + prop.minor));
  b->num_sms_ = prop.multiProcessorCount;
  KL_CUDA(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking), "backend start");
  KL_CUBLAS(cublasLtCreate(&b->lt_), "backend start");
  b->lt_workspace_bytes_ = kLtWorkspaceBytes;
  KL_CUDA(cudaMalloc(&b->lt_workspace_, kLtWorkspaceBytes), "cuBLASLt workspace");
  KL_CUBLAS(cublasCreate(&b->blas_), "backend start");
  KL_CUBLAS(cublasSetStream(b->blas_, b->stream_), "backend start");
  KL_CUBLAS(cublasSetWorkspace(b->blas_, b->lt_workspace_, kLtWorkspaceBytes), "backend start");
  KL_CUBLAS(cublasSetMathMode(b->blas_, CUBLAS_DEFAULT_MATH), "backend start");  // no TF32
  // A block taken while a graph is captured is recorded as what broke the capture (the same step
  // ran eagerly first, so that only happens when a body allocates differently from one run to the
  // next); it is still allocated, outside the capture, so the body can finish.
  CudaBackend* self = b.get();
  b->arena_ = std::make_unique<Arena>(Device::kCuda, [self](size_t bytes) {
    const bool capturing = self->breaks_capture("the step arena growing by " + std::to_string(bytes) + " bytes");
    if (capturing) return block_outside_capture(bytes, "step arena");
    // A step whose activations do not fit beside the weights and caches: say what to lower.
    const uint64_t free_bytes = self->available_bytes();
    KL_CHECK(bytes <= free_bytes, "the step arena needs a block of " + std::to_string(bytes >> 20) + " MiB and the GPU has " +
                                      std::to_string(free_bytes >> 20) + " MiB free beside the weights and caches: "
                                      "lower --max-num-tokens (the tokens of one step) or the cache memory");
    return device_block(bytes, "step arena");
  });
  b->arena_->alloc(DType::kU8, {static_cast<int64_t>(kInitialArenaBytes)});
  b->arena_->rewind();
  return Result<std::unique_ptr<CudaBackend>>(std::move(b));
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  mla_decode_sm90_.reset();
  arena_.reset();
  if (lt_workspace_) cudaFree(lt_workspace_);
  if (blas_) cublasDestroy(blas_);
  if (lt_) cublasLtDestroy(lt_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaBackend::sync(const char* what) {
  if (breaks_capture(std::string(what) + " (a stream synchronisation)")) return;
  KL_CUDA(cudaStreamSynchronize(stream_), what);
}

uint64_t CudaBackend::available_bytes() const {
  size_t free_bytes = 0, total = 0;
  KL_CUDA(cudaMemGetInfo(&free_bytes, &total), "available_bytes");
  return free_bytes;
}

// No sync: every kernel runs on one stream, so the next step's writes queue behind this step's
// reads, and a merge frees blocks through cudaFree, which waits for the device.
void CudaBackend::begin_step() { arena_->rewind(); }

Tensor CudaBackend::alloc(DType dtype, const Shape& shape) { return arena_->alloc(dtype, shape); }

Tensor CudaBackend::alloc_persistent(DType dtype, const Shape& shape) {
  for (int64_t d : shape) KL_CHECK(d >= 0, "negative dimension in " + shape_to_string(shape));
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  const std::string what = "alloc_persistent " + shape_to_string(shape);
  auto block = breaks_capture(what) ? block_outside_capture(bytes, what) : device_block(bytes, what);
  return Tensor::wrap(dtype, shape, block.get(), block, Device::kCuda);
}

void CudaBackend::fill(const Tensor& t, float value) {
  if (t.dtype() == DType::kI32) {
    KL_CHECK(t.device() == Device::kCuda, "fill of a host tensor " + shapes(t));
    if (t.numel() == 0) return;
    fill_i32_kernel<<<blocks_for(t.numel(), 256), 256, 0, stream_>>>(t.data_as<int32_t>(), t.numel(),
                                                                     static_cast<int32_t>(value));
    KL_LAUNCHED("fill I32 " + shapes(t));
    return;
  }
  const Out o = out(t, "fill");
  if (t.numel() == 0) return;
  fill_kernel<<<blocks_for(t.numel(), 256), 256, 0, stream_>>>(o, t.numel(), value);
  KL_LAUNCHED("fill " + shapes(t));
}

void CudaBackend::random_fill(const Tensor& t, uint64_t seed, float lo, float hi, const FillWindow& w) {
  const Out o = out(t, "random_fill");
  if (t.numel() == 0) return;
  const int64_t cols = t.dim(-1);
  random_fill_kernel<<<blocks_for(t.numel(), 256), 256, 0, stream_>>>(o, t.numel(), cols, w.offset,
                                                                        w.stride > 0 ? w.stride : cols, seed, lo, hi);
  KL_LAUNCHED("random_fill " + shapes(t));
}

Tensor CudaBackend::upload(const Tensor& host, DType dtype) {
  const std::vector<uint8_t> bytes = host_bytes(host, dtype);
  Tensor t = alloc_persistent(dtype, host.shape());
  KL_CUDA(cudaMemcpyAsync(t.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice, stream_),
          "upload " + shapes(host));
  sync("upload");
  return t;
}

// Packed and scales stay as loaded (moe.cu dequantizes in registers): 4.25 bits a weight.
ExpertMatrix CudaBackend::upload_mxfp4(const Tensor& packed, const Tensor& scale) {
  KL_CHECK(packed.dtype() == DType::kU8 && scale.dtype() == DType::kU8 && packed.rank() == 3 && scale.rank() == 3,
           "MXFP4 parts must be U8 [E, rows, in/2] and [E, rows, in/32]");
  KL_CHECK(scale.dim(0) == packed.dim(0) && scale.dim(1) == packed.dim(1) && scale.dim(2) * 16 == packed.dim(2),
           "MXFP4 scale " + shapes(scale) + " does not fit packed " + shapes(packed));
  auto bytes = [&](const Tensor& host) {
    Tensor t = alloc_persistent(DType::kU8, host.shape());
    KL_CUDA(cudaMemcpyAsync(t.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice, stream_),
            "upload_mxfp4 " + shapes(host));
    return t;
  };
  ExpertMatrix m(bytes(packed), bytes(scale));
  sync("upload_mxfp4");
  return m;
}

Tensor CudaBackend::to_device(const Tensor& host, DType dtype) {
  const std::vector<uint8_t> bytes = host_bytes(host, dtype);
  Tensor t = alloc(dtype, host.shape());
  if (!bytes.empty() && !breaks_capture("to_device " + shapes(host) + " (a host->device copy)"))
    KL_CUDA(cudaMemcpyAsync(t.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice, stream_),
            "to_device " + shapes(host));
  return t;
}

void CudaBackend::upload_layout(SeqLayout& layout) {
  auto put = [&](const std::vector<int32_t>& v, const Shape& shape) {
    Tensor t = alloc(DType::kI32, shape);
    if (!v.empty() && !breaks_capture("upload_layout (a host->device copy)"))
      KL_CUDA(cudaMemcpyAsync(t.data(), v.data(), v.size() * 4, cudaMemcpyHostToDevice, stream_),
              "upload_layout " + shape_to_string(shape));
    return t;
  };
  const int64_t b = layout.num_seqs();
  KL_CHECK(static_cast<int64_t>(layout.cu_seqlens.size()) == b + 1 && static_cast<int64_t>(layout.slots.size()) == b &&
               static_cast<int64_t>(layout.page_table.size()) == b * layout.max_pages,
           "upload_layout: inconsistent layout for " + std::to_string(b) + " sequences");
  layout.dev.cu_seqlens = put(layout.cu_seqlens, {b + 1});
  layout.dev.cached = put(layout.cached, {b});
  layout.dev.slots = put(layout.slots, {b});
  layout.dev.page_table = put(layout.page_table, {b, layout.max_pages});
  const int64_t snaps = static_cast<int64_t>(layout.snap_seq.size());
  KL_CHECK(static_cast<int64_t>(layout.snap_pos.size()) == snaps && static_cast<int64_t>(layout.snap_slot.size()) == snaps,
           "upload_layout: snapshot arrays of different lengths");
  layout.dev.snap_seq = put(layout.snap_seq, {snaps});
  layout.dev.snap_pos = put(layout.snap_pos, {snaps});
  layout.dev.snap_slot = put(layout.snap_slot, {snaps});
}

void CudaBackend::for_snapshot_pieces(const SeqLayout& layout, const Tensor& states,
                                      const std::function<void(int64_t, int64_t, const SeqLayout&)>& op) {
  if (layout.snap_seq.empty()) {
    op(0, layout.num_rows(), layout);
    return;
  }
  const int64_t B = layout.num_seqs();
  auto snaps_of = [&](int64_t b) {
    std::vector<std::pair<int32_t, int32_t>> s;  // (position, slot), in position order
    for (size_t k = 0; k < layout.snap_seq.size(); ++k)
      if (layout.snap_seq[k] == b) s.emplace_back(layout.snap_pos[k], layout.snap_slot[k]);
    std::sort(s.begin(), s.end());
    return s;
  };
  // Rows [p0, p1) of sequence b as a layout of their own (b's positions before p0 count as cached).
  auto piece = [&](int64_t b, int64_t p0, int64_t p1) {
    SeqLayout p = layout.part(b, b + 1);
    p.cu_seqlens = {0, static_cast<int32_t>(p1 - p0)};
    p.cached[0] += static_cast<int32_t>(p0);
    p.snap_seq.clear(), p.snap_pos.clear(), p.snap_slot.clear();
    upload_layout(p);
    op(layout.cu_seqlens[b] + p0, layout.cu_seqlens[b] + p1, p);
  };
  for (int64_t b = 0; b < B;) {
    int64_t e = b;
    while (e < B && snaps_of(e).empty()) ++e;
    if (e > b) {  // sequences without snapshots, together
      SeqLayout p = layout.part(b, e);
      upload_layout(p);
      op(layout.cu_seqlens[b], layout.cu_seqlens[e], p);
      b = e;
      continue;
    }
    int64_t done = 0;
    for (const auto& [pos, slot] : snaps_of(b)) {
      KL_CHECK(pos >= done && pos <= layout.new_tokens(b), "snapshot after " + std::to_string(pos) + " of " +
                                                              std::to_string(layout.new_tokens(b)) + " rows");
      if (pos > done) piece(b, done, pos);
      done = pos;
      copy(states.rows(layout.slots[b], layout.slots[b] + 1), states.rows(slot, slot + 1));
    }
    if (done < layout.new_tokens(b)) piece(b, done, layout.new_tokens(b));
    ++b;
  }
}

Tensor CudaBackend::to_host(const Tensor& t) {
  KL_CHECK(t.device() == Device::kCuda, "to_host of a host tensor " + shapes(t));
  std::vector<uint8_t> bytes(t.nbytes());
  if (!bytes.empty() && !breaks_capture("to_host " + shapes(t) + " (a device->host copy)"))
    KL_CUDA(cudaMemcpyAsync(bytes.data(), t.data(), bytes.size(), cudaMemcpyDeviceToHost, stream_),
            "to_host " + shapes(t));
  sync("to_host");
  if (t.dtype() == DType::kI32) {
    Tensor h = Tensor::empty(DType::kI32, t.shape());
    std::memcpy(h.data(), bytes.data(), bytes.size());
    return h;
  }
  Tensor h = Tensor::empty(DType::kF32, t.shape());
  convert_to_f32(t.dtype(), bytes.data(), h.f32(), static_cast<size_t>(t.numel()));
  return h;
}

void CudaBackend::write(const Tensor& host, const Tensor& dst) {
  KL_CHECK(host.device() == Device::kCpu && dst.device() == Device::kCuda && host.numel() == dst.numel() &&
               host.dtype() == dst.dtype() && (dst.dtype() == DType::kF32 || dst.dtype() == DType::kI32),
           "write " + shapes(host) + " " + dtype_name(host.dtype()) + " into " + shapes(dst) + " " +
               dtype_name(dst.dtype()));
  if (host.nbytes() == 0 || breaks_capture("write " + shapes(dst) + " (a host->device copy)")) return;
  KL_CUDA(cudaMemcpyAsync(dst.data(), host.data(), host.nbytes(), cudaMemcpyHostToDevice, stream_), "write " + shapes(dst));
}

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  KL_CHECK(src.numel() == dst.numel() && src.dtype() == dst.dtype(),
           "copy " + shapes(src) + " " + dtype_name(src.dtype()) + " to " + shapes(dst) + " " + dtype_name(dst.dtype()));
  if (src.nbytes() == 0) return;
  KL_CUDA(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, stream_),
          "copy " + shapes(src));
}

void CudaBackend::copy_columns(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col, int64_t width) {
  const int64_t sc = src.dim(-1), dc = dst.dim(-1), rows = sc == 0 ? 0 : src.numel() / sc;
  KL_CHECK(src.dtype() == dst.dtype() && (dc == 0 ? rows == 0 : dst.numel() / dc == rows) && src_col >= 0 &&
               dst_col >= 0 && width >= 0 && src_col + width <= sc && dst_col + width <= dc,
           "copy_columns src " + shapes(src) + " dst " + shapes(dst));
  if (rows == 0 || width == 0) return;
  const size_t es = dtype_size(src.dtype());
  KL_CUDA(cudaMemcpy2DAsync(static_cast<char*>(dst.data()) + dst_col * es, dc * es,
                            static_cast<const char*>(src.data()) + src_col * es, sc * es, width * es, rows,
                            cudaMemcpyDeviceToDevice, stream_),
          "copy_columns src " + shapes(src) + " dst " + shapes(dst));
}

void CudaBackend::gather_rows(const Tensor& src, const Tensor& rows, const Tensor& out_t) {
  const int64_t cols = src.dim(-1), r = rows.numel();
  KL_CHECK(rows.dtype() == DType::kI32 && src.dtype() == out_t.dtype() && out_t.numel() == r * cols &&
               dtype_size(src.dtype()) % 2 == 0,
           "gather_rows src " + shapes(src) + " rows " + shapes(rows) + " out " + shapes(out_t));
  if (out_t.numel() == 0) return;
  const int64_t src_rows = src.numel() / cols, row_bytes = cols * static_cast<int64_t>(dtype_size(src.dtype()));
  const auto fits = [&](int64_t unit) {
    return row_bytes % unit == 0 && reinterpret_cast<uintptr_t>(src.data()) % unit == 0 &&
           reinterpret_cast<uintptr_t>(out_t.data()) % unit == 0;
  };
  const int32_t* ids = rows.data_as<const int32_t>();
  if (fits(16))
    launch_gather<uint4>(src.data(), src_rows, ids, out_t.data(), r, row_bytes, stream_);
  else if (fits(8))
    launch_gather<uint2>(src.data(), src_rows, ids, out_t.data(), r, row_bytes, stream_);
  else if (fits(4))
    launch_gather<uint32_t>(src.data(), src_rows, ids, out_t.data(), r, row_bytes, stream_);
  else
    launch_gather<uint16_t>(src.data(), src_rows, ids, out_t.data(), r, row_bytes, stream_);
  KL_LAUNCHED("gather_rows " + shapes(src));
}

}  // namespace klinear::cuda
