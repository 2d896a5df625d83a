// CUDA elementwise ops (backend.h, "elementwise and small ops"): the embedding lookup
// out[n] = table[ids[n]], the residual add acc ← acc + x, the sigmoid gate x ← x ⊙ σ(gate), y = σ(x),
// and the GLU activations out = act(gate)·up over gate_up = [gate | up] (MODEL.md 3.2).
// Shapes and dtypes: as backend.h declares each op; values F32 or BF16 in any mix (In / Out: one
// instantiation per op), ids I32 (checked by the caller). Math in fp32; each output rounded once.
// Ownership: reads the inputs, writes the outputs (in place where the op says so); no workspace.
// Cost and floor: no reuse, each element read and written once (the GLU reads 2F values a row and
// writes F), so the floor is those bytes at the copy rate (~4.2 TB/s); grid-stride launches.
#include "backend/cuda/common/device.cuh"

namespace klinear::cuda {

namespace {

// Each kernel here starts with pdl_enter and is launched as a programmatic dependent (device.cuh).
#define KL_GRID_STRIDE(i, n) \
  pdl_enter();               \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

__global__ void embedding_kernel(const int32_t* ids, In table, int64_t first, int64_t table_rows, int64_t vocab,
                                 int64_t rows, int64_t c, Out o) {
  KL_GRID_STRIDE(i, rows * c) {
    const int32_t id = ids[i / c];
    const int64_t row = id - first;
    o.set(i, id < 0 || id >= vocab ? __int_as_float(0x7fc00000)  // NaN marks a bad id
             : row >= 0 && row < table_rows ? table[row * c + i % c] : 0.0f);  // another rank's window
  }
}

__global__ void add_kernel(Out acc, In x, int64_t n) {
  KL_GRID_STRIDE(i, n) acc.set(i, acc[i] + x[i]);
}

__global__ void sigmoid_mul_kernel(Out x, In gate, int64_t n) {
  KL_GRID_STRIDE(i, n) x.set(i, x[i] * sigmoid_f(gate[i]));
}

__global__ void sigmoid_kernel(In x, Out y, int64_t n) {
  KL_GRID_STRIDE(i, n) y.set(i, sigmoid_f(x[i]));
}

// out[r, j] = glu(gate_up[r, j], gate_up[r, F + j]) (MODEL.md 3.2). A thread owns a chunk of kRowChunk
// outputs of a row (device.cuh: 16-byte accesses when F % 8 == 0 and the data is aligned) and walks
// rows (x over the chunks, y over the rows, striding past 65535): no per-element division.
// Cost (Kimi-Linear-48B prefill of 2,048 tokens, the per-expert MoE path: 16,384 rows, F = 1,024,
// BF16): reads 67.1 MB, writes 33.6 MB: 101 MB, 24 µs at 4.2 TB/s. Measured:
// docs/perf-log.md, "Notes moved from the CUDA sources".
__global__ void glu_kernel(In gate_up, int64_t rows, int64_t f, bool vec, Activation kind, float beta, bool has_lb,
                           float lb, Out o) {
  pdl_enter();
  const int64_t j = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) * kRowChunk;
  if (j >= f) return;
  const int n = chunk_size(j, f);
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float g[kRowChunk] = {}, u[kRowChunk] = {}, v[kRowChunk];
    load_chunk(gate_up, r * 2 * f + j, n, vec, g);
    load_chunk(gate_up, r * 2 * f + f + j, n, vec, u);
#pragma unroll
    for (int e = 0; e < kRowChunk; ++e) v[e] = glu_value(g[e], u[e], kind, beta, has_lb, lb);
    store_chunk(o, r * f + j, n, vec, v);
  }
}

}  // namespace

void CudaBackend::embedding(const EmbeddingArgs& a) {
  const Tensor &ids = a.ids, &table = a.table, &o = a.out;
  const int64_t c = table.dim(1), rows = ids.numel();
  KL_CHECK(ids.dtype() == DType::kI32 && o.numel() == rows * c && o.dtype() == table.dtype(),
           "embedding ids " + shapes(ids) + " table " + shapes(table) + " out " + shapes(o));
  if (o.numel() == 0) return;
  launch_dependent(stream_, embedding_kernel, dim3(blocks_for(o.numel(), 256)), dim3(256), 0, "embedding " + shapes(o),
                   ids.data_as<const int32_t>(), in(table, "embedding"), a.first_id, table.dim(0), a.vocab, rows, c,
                   out(o, "embedding"));
}

void CudaBackend::add(const Tensor& acc, const Tensor& x) {
  KL_CHECK(acc.numel() == x.numel(), "add " + shapes(acc) + " + " + shapes(x));
  if (acc.numel() == 0) return;
  launch_dependent(stream_, add_kernel, dim3(blocks_for(acc.numel(), 256)), dim3(256), 0, "add " + shapes(acc),
                   out(acc, "add"), in(x, "add"), acc.numel());
}

void CudaBackend::sigmoid_mul(const Tensor& x, const Tensor& gate) {
  KL_CHECK(x.numel() == gate.numel(), "sigmoid_mul " + shapes(x) + " gate " + shapes(gate));
  if (x.numel() == 0) return;
  launch_dependent(stream_, sigmoid_mul_kernel, dim3(blocks_for(x.numel(), 256)), dim3(256), 0,
                   "sigmoid_mul " + shapes(x), out(x, "sigmoid_mul"), in(gate, "sigmoid_mul"), x.numel());
}

void CudaBackend::sigmoid(const Tensor& x, const Tensor& y) {
  KL_CHECK(x.numel() == y.numel(), "sigmoid " + shapes(x) + " -> " + shapes(y));
  if (x.numel() == 0) return;
  launch_dependent(stream_, sigmoid_kernel, dim3(blocks_for(x.numel(), 256)), dim3(256), 0, "sigmoid " + shapes(x),
                   in(x, "sigmoid"), out(y, "sigmoid"), x.numel());
}

void CudaBackend::glu(const Tensor& gate_up, const GluParams& p, const Tensor& o) {
  const int64_t f = o.dim(-1), rows = f == 0 ? 0 : o.numel() / f;
  KL_CHECK(gate_up.numel() == rows * 2 * f, "glu " + shapes(gate_up) + " -> " + shapes(o));
  if (o.numel() == 0) return;
  const bool vec = f % kRowChunk == 0 && aligned16(gate_up.data()) && aligned16(o.data());
  const RowGrid g = row_grid((f + kRowChunk - 1) / kRowChunk, rows);
  launch_dependent(stream_, glu_kernel, g.grid, g.block, 0, "glu " + shapes(o), in(gate_up, "glu"), rows, f, vec, p.kind,
                   p.beta, p.linear_beta.has_value(), p.linear_beta.value_or(1.0f), out(o, "glu"));
}

}  // namespace klinear::cuda
