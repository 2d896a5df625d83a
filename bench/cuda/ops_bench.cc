// CUDA op benchmarks (issue 7's baseline table): each row prints the op, its shape, the median time
// of timed repeats (CUDA events on the backend's stream, after warm-up), the FLOP and byte counts,
// the floors they give on an H200 (4.2 TB/s copy bandwidth, 770 TFLOP/s bf16 dense) and the
// achieved fraction of the larger floor. Inputs are random (never zeros); bf16 activations.
//   ops_bench [kda|kda_decode|mla|moe|grouped_gemm|gemv|norm|all] [SHAPE]
// SHAPE (optional): the decode rows of kda_decode and mla run only where their shape contains it,
// e.g. `ops_bench mla "batch=64 ctx=32768"` (one shape under ncu).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/backend.h"
#include "backend/cuda/gemm/gemm.h"
#include "backend/cuda/kda/kda_chunked.h"
#include "backend/cuda/mla/mla.h"
#include "backend/cuda/moe/moe.h"

namespace klinear {
namespace {

constexpr double kBandwidth = 4.2e12, kFlops = 770e12;

std::string g_shape_filter;  // ops_bench's second argument; empty: every shape
bool wanted(const char* shape) { return g_shape_filter.empty() || std::strstr(shape, g_shape_filter.c_str()) != nullptr; }

// A persistent device tensor of uniform draws in [lo, hi), made on the device (the benches' weights
// run to gigabytes; drawing them on the host took longer than the timings).
Tensor random_tensor(cuda::CudaBackend& be, Shape shape, std::mt19937_64& gen, DType dtype, float lo = -1.0f,
                     float hi = 1.0f) {
  Tensor t = be.alloc_persistent(dtype, std::move(shape));
  be.random_fill(t, gen(), lo, hi, FillWindow{});
  return t;
}

// Median milliseconds of `fn` over `reps` timed runs after `warm` untimed ones. `fn` starts a step
// (begin_step) and makes everything step-scoped it uses (the layout) inside it.
double time_ms(cuda::CudaBackend& be, const std::function<void()>& fn, int warm = 3, int reps = 10) {
  for (int i = 0; i < warm; ++i) fn();
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, be.stream());
    fn();
    cudaEventRecord(b, be.stream());
    const cudaError_t err = cudaEventSynchronize(b);
    if (err != cudaSuccess) {
      std::fprintf(stderr, "ops_bench: %s\n", cudaGetErrorString(err));
      std::exit(1);
    }
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void row(const std::string& op, const std::string& shape, double ms, double flop, double bytes) {
  const double floor_ms = std::max(flop / kFlops, bytes / kBandwidth) * 1e3;
  std::printf("| %-22s | %-34s | %9.4f | %10.3g | %10.3g | %9.4f | %5.1f%% |\n", op.c_str(), shape.c_str(), ms, flop, bytes,
              floor_ms, 100.0 * floor_ms / ms);
  std::fflush(stdout);
}

SeqLayout layout_for(const std::vector<int>& lens, const std::vector<int>& cached, int64_t page_size) {
  SeqLayout l;
  l.page_size = page_size;
  l.cu_seqlens = {0};
  int64_t max_pages = 1;
  for (size_t b = 0; b < lens.size(); ++b) {
    l.cu_seqlens.push_back(l.cu_seqlens.back() + lens[b]);
    l.cached.push_back(cached[b]);
    l.slots.push_back(static_cast<int32_t>(b));
    max_pages = std::max<int64_t>(max_pages, (cached[b] + lens[b] + page_size - 1) / page_size);
  }
  l.max_pages = max_pages;
  for (size_t b = 0; b < lens.size(); ++b)
    for (int64_t p = 0; p < max_pages; ++p) l.page_table.push_back(static_cast<int32_t>(b * max_pages + p));
  return l;
}

void bench_kda(cuda::CudaBackend& be, std::mt19937_64& gen, bool decode) {
  const int64_t D = 128;
  // (lengths, heads): 32 heads, and for the prefill 16 or 8 (a two- or four-way tensor-parallel shard).
  std::vector<std::pair<std::vector<int>, int64_t>> shapes;
  if (decode)
    shapes = {{std::vector<int>(1, 1), 32}, {std::vector<int>(64, 1), 32}, {std::vector<int>(256, 1), 32}};
  else
    shapes = {{{4096}, 32}, {{16384}, 32}, {{65536}, 32}, {std::vector<int>(8, 2048), 32}, {{16384}, 16}, {{16384}, 8}};
  for (const auto& [lens, H] : shapes) {
    for (KdaGate gate : {KdaGate::kSoftplus, KdaGate::kLowerBound}) {
      // The gate form does not change the decode kernel; the sharded prefill rows take one form.
      if ((decode || H != 32) && gate == KdaGate::kLowerBound) continue;
      SeqLayout layout = layout_for(lens, std::vector<int>(lens.size(), decode ? 100 : 0), 64);
      const int64_t N = layout.num_rows(), B = static_cast<int64_t>(lens.size());
      char shape[64];
      std::snprintf(shape, sizeof shape, "B=%lld T=%lld H=%lld D=128 %s", (long long)B, (long long)(N / B),
                    (long long)H, gate == KdaGate::kSoftplus ? "softplus" : "lower-bound");
      if (!wanted(shape)) continue;
      be.begin_step();
      be.upload_layout(layout);
      const Tensor q = random_tensor(be, {N, H, D}, gen, DType::kBF16);
      const Tensor k = random_tensor(be, {N, H, D}, gen, DType::kBF16);
      const Tensor v = random_tensor(be, {N, H, D}, gen, DType::kBF16);
      const Tensor f = random_tensor(be, {N, H * D}, gen, DType::kBF16, -3, 3);
      const Tensor dt = random_tensor(be, {H * D}, gen, DType::kF32);
      const Tensor alog = random_tensor(be, {H}, gen, DType::kF32, 0.0f, std::log(16.0f));
      const Tensor beta = random_tensor(be, {N, H}, gen, DType::kF32, 0.0f, 1.0f);
      const Tensor states = random_tensor(be, {B, H, D, D}, gen, DType::kF32, -0.1f, 0.1f);
      const Tensor g = be.alloc_persistent(DType::kF32, {N, H, D});
      be.kda_gate(f, dt, alog, KdaGateParams{gate, -5.0f}, g.view({N, H * D}));
      const Tensor o = be.alloc_persistent(DType::kBF16, {N, H, D});
      const KdaArgs args{q, k, v, g, beta, states, o};
      const double ms = time_ms(be, [&] {
        be.begin_step();
        be.upload_layout(layout);
        if (decode) be.kda_recurrent(args, layout); else be.kda_chunked(args, layout);
      });
      // bytes: q, k, v, out bf16 + g fp32 + β + the state read and written; FLOP: ~ the chunk form's
      // 2·(4·64·D + 3·D·D) per token and head (decode: 4·D·D per token and head).
      const double bytes = N * H * D * (2.0 * 4 + 4) + N * H * 4.0 + 2.0 * B * H * D * D * 4;
      const double flop = decode ? N * H * 4.0 * D * D : N * H * 2.0 * (4.0 * 64 * D + 3.0 * D * D);
      row(decode ? "kda_recurrent (decode)" : "kda_chunked (prefill)", shape, ms, flop, bytes);
      if (decode) continue;
      // The paths the op did not pick, where they take these operands (the same FLOP and bytes).
      for (cuda::KdaChunkedPath path : {cuda::KdaChunkedPath::kTensorCore, cuda::KdaChunkedPath::kFp32})
        if (path != cuda::kda_chunked_path_for(args) && cuda::kda_chunked_path_fits(path, args))
          row(std::string("  path ") + cuda::kda_chunked_path_name(path), shape, time_ms(be, [&] {
                be.begin_step();
                be.upload_layout(layout);
                cuda::kda_chunked_on(be, path, args, layout);
              }), flop, bytes);
      // The tensor-core prefill's launches apart (prep for each gate form: its diagonal blocks take
      // the tensor cores where the decay allows; the state pass at each width) over the same
      // inputs: prep writes the bf16 workspace (W, Qd, Kdᵀ, Aqk, Uᵀ per chunk and head) and the
      // state pass reads it back in chunk order.
      const double chunks = (layout.num_rows() + 63.0 * B) / 64;  // upper bound: each sequence's last chunk
      // The workspace, dense: W, Qd [64, D], Kdᵀ, Uᵀ [D, 64], Aqk [64, 64] in bf16, e^{G_last} [D] in fp32.
      const double ws_bytes = chunks * H * (2.0 * (4 * 64 * D + 64 * 64) + 4.0 * D);
      const double prep_bytes = N * H * D * (2.0 * 3 + 4) + N * H * 4.0 + ws_bytes;
      const double state_bytes = ws_bytes + N * H * D * 2.0 + 2.0 * B * H * D * D * 4;
      const double prep_flop = chunks * H * (2.0 * 64 * 64 * D + 2.0 * 64 * 64 * 2 * D);
      const double state_flop = chunks * H * (3 * 2.0 * 64 * D * D + 2.0 * 64 * 64 * D);
      // Each launch timed alone over one workspace: prep writes it, the state rows read what it wrote.
      const Tensor ws = cuda::kda_tc_workspace(be, args, layout);
      auto timed = [&](const std::function<void()>& launch) {
        return time_ms(be, [&] {
          be.begin_step();
          be.upload_layout(layout);
          launch();
        });
      };
      row("  tc prep only", shape, timed([&] { cuda::kda_tc_prep(be, args, layout, ws); }), prep_flop, prep_bytes);
      auto state = [&](const cuda::KdaChunkedVariant& v) {
        return timed([&] { cuda::kda_tc_state(be, args, layout, ws, v); });
      };
      if (gate != KdaGate::kSoftplus) continue;
      for (int cols : {16, 32, 64}) {
        const std::string name = "  tc state only, " + std::to_string(cols) + " cols";
        row(name, shape, state({cols, 1}), state_flop, state_bytes);
      }
      // The sequence split (the op's own choice is the row above the variants): the state pass of
      // P segments does 2P − 3 more segment walks than one (bytes and FLOP here are the unsplit's).
      if (B == 1)
        for (int segments : {3, 5, 8}) {
          const std::string name = "  tc state only, " + std::to_string(segments) + " segments";
          row(name, shape, state({0, segments}), state_flop, state_bytes);
        }
    }
  }
}

// The layout's device arrays as persistent tensors, so a timed MLA call (and a graph that captures
// it) reads them without a per-step upload.
void persistent_layout(cuda::CudaBackend& be, SeqLayout& l) {
  auto put = [&](const std::vector<int32_t>& v) {
    const Tensor t = be.alloc_persistent(DType::kI32, {static_cast<int64_t>(v.size())});
    cudaMemcpy(t.data(), v.data(), v.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
    return t;
  };
  l.dev.cu_seqlens = put(l.cu_seqlens);
  l.dev.cached = put(l.cached);
  l.dev.slots = put(l.slots);
  l.dev.page_table = put(l.page_table).view({l.num_seqs(), l.max_pages});
}

// Milliseconds per replay of what `fn` enqueues, captured once as a CUDA graph (relaxed mode) and
// replayed `reps` times back to back, the median of 5 such rounds; -1 when the capture fails.
// Launch overheads overlap the work as they do in a captured decode step.
double graph_ms(cuda::CudaBackend& be, const std::function<void()>& fn, int reps = 20) {
  fn();  // the arena holds what fn takes before capture (no allocation while capturing)
  cudaStream_t s = be.stream();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) != cudaSuccess) return -1;
  fn();
  const bool ok = cudaStreamEndCapture(s, &graph) == cudaSuccess && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  if (!ok) {
    (void)cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    return -1;
  }
  const double ms = time_ms(be, [&] {
    for (int i = 0; i < reps; ++i) cudaGraphLaunch(exec, s);
  }, 1, 5);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms / reps;
}

// MLA at the Kimi-Linear shape (32 heads, q/k 128 + 64, v 128, latent 512 + 64, pages of 64).
// Decode: batch × context, bytes = the latent cache read once + kv_b, FLOP = the absorbed products
// (q'·k over 576, p·v over 512); eager (step rewind + the op) and replayed as a CUDA graph, with
// each latent-512 attention kernel (MlaDecodePath: FlashInfer's Hopper MLA kernel, mla.cu's absorbed
// mma.sync one).
// Prefill: 8k new tokens, FLOP = the causal attention products of the expanded form (q·k over 192,
// p·v over 128, half the square); the time also holds the page gather and the kv_b expansion GEMM.
// Its rows take the default 3 warm-up calls and 10 timed ones: with 1 and 5 the 8k row measured
// 2.338 ms in a fresh process and 1.513 in the next (H200, 2026-12-02).
// The fused decode step of a KDA layer after its projections (kda_decode): conv step, gate, β, the
// state pass and the gated norm in one launch, at the real shape.
void bench_kda_decode_fused(cuda::CudaBackend& be, std::mt19937_64& gen) {
  const int64_t H = 32, D = 128, P = H * D, C = 3 * P, Kc = 4;
  for (int B : {1, 64, 256}) {
    char shape[64];
    std::snprintf(shape, sizeof shape, "B=%d H=32 D=128 softplus", B);
    if (!wanted(shape)) continue;
    be.begin_step();
    SeqLayout layout = layout_for(std::vector<int>(B, 1), std::vector<int>(B, 100), 64);
    const Tensor qkv = random_tensor(be, {B, C}, gen, DType::kBF16);
    const Tensor conv_w = random_tensor(be, {C, Kc}, gen, DType::kBF16);
    const Tensor conv_states = random_tensor(be, {B, Kc - 1, C}, gen, DType::kBF16);
    const Tensor f = random_tensor(be, {B, P}, gen, DType::kF32, -3, 3);
    const Tensor dt = random_tensor(be, {P}, gen, DType::kF32);
    const Tensor alog = random_tensor(be, {H}, gen, DType::kF32, 0.0f, std::log(16.0f));
    const Tensor beta = random_tensor(be, {B, H}, gen, DType::kF32, -3, 3);
    const Tensor og = random_tensor(be, {B, P}, gen, DType::kBF16, -3, 3);
    const Tensor o_norm = random_tensor(be, {D}, gen, DType::kBF16, 0.5f, 1.5f);
    const Tensor states = random_tensor(be, {B, H, D, D}, gen, DType::kF32, -0.1f, 0.1f);
    const Tensor y = be.alloc_persistent(DType::kBF16, {B, P});
    const KdaDecodeArgs args{qkv, conv_w, conv_states, f, dt, alog, KdaGateParams{KdaGate::kSoftplus, 0.0f}, beta, og,
                             o_norm, 1e-5f, states, -1, y};
    persistent_layout(be, layout);
    auto step = [&] { be.kda_decode(args, layout); };
    const double ms = time_ms(be, step), graphed = graph_ms(be, step);
    // bytes: the state read and written; qkv, og, y bf16; the conv window read and written (bf16);
    // f and β fp32; the weights. FLOP: decay, Sᵀk, the rank-1 update and Sᵀq, ~7·D·D per head.
    const double bytes = 2.0 * B * H * D * D * 4 + B * (C + 2.0 * P) * 2 + 2.0 * B * (Kc - 1) * C * 2 +
                         B * (P + H) * 4.0 + C * Kc * 2.0 + P * 4.0 + D * 2.0;
    const double flop = 7.0 * B * H * D * D;
    row("kda_decode (fused)", shape, ms, flop, bytes);
    row("  as a graph replay", shape, graphed, flop, bytes);
    // What the state's traffic alone takes (the measured ceiling beside the 4.2 TB/s floor): the
    // pool copied to another pool, the decode's state bytes read and written once.
    const Tensor states2 = be.alloc_persistent(DType::kF32, {B, H, D, D});
    row("  state pool copy", shape, time_ms(be, [&] { be.copy(states, states2); }), 0, 2.0 * B * H * D * D * 4);
  }
}

void bench_mla(cuda::CudaBackend& be, std::mt19937_64& gen) {
  const int64_t H = 32, n = 128, r = 64, c = 512, vd = 128, ps = 64;
  const Tensor kvb = random_tensor(be, {H * (n + vd), c}, gen, DType::kBF16, -0.05f, 0.05f);
  const float scale = 1.0f / std::sqrt(192.0f);
  // Small batches find where FlashInfer's kernel overtakes mla.cu's (kFlashInferDecodeMinSeqs in
  // mla.h); 256 × 4k / 8k are the 48B decode step's.
  const std::pair<int64_t, int> decode_shapes[] = {{1, 4096}, {1, 32768}, {2, 4096},  {4, 4096},    {8, 4096},
                                                   {16, 4096}, {64, 4096}, {64, 32768}, {256, 4096}, {256, 8192}};
  for (const auto& [batch, ctx] : decode_shapes) {
    char shape[64];
    std::snprintf(shape, sizeof shape, "batch=%lld ctx=%d H=32 page=64", (long long)batch, ctx);
    if (!wanted(shape)) continue;
    SeqLayout layout = layout_for(std::vector<int>(batch, 1), std::vector<int>(batch, ctx - 1), ps);
    persistent_layout(be, layout);
    const int64_t pages_n = batch * layout.max_pages;
    const Tensor pages = random_tensor(be, {pages_n, ps, c + r}, gen, DType::kBF16);
    const Tensor q = random_tensor(be, {batch, H, n + r}, gen, DType::kBF16);
    const Tensor o = be.alloc_persistent(DType::kBF16, {batch, H, vd});
    const MlaArgs args{q, pages, kvb, scale, o};
    const double bytes = double(batch) * ctx * (c + r) * 2 + H * (n + vd) * c * 2.0;
    const double flop = double(batch) * H * ctx * (2.0 * (c + r) + 2.0 * c);
    for (const auto path : {cuda::MlaDecodePath::kFlashInfer, cuda::MlaDecodePath::kAbsorbed}) {
      auto step = [&] {
        be.begin_step();
        cuda::mla_decode_on(be, path, args, layout);
      };
      char label[96];
      std::snprintf(label, sizeof label, "%s %s", shape, cuda::mla_decode_path_name(path));
      row("mla_decode eager", label, time_ms(be, step), flop, bytes);
      const double g = graph_ms(be, step);  // the layout does not change: the plan is made before the capture
      if (g > 0) row("mla_decode graph", label, g, flop, bytes);
    }
  }
  // The prefill (gather, kv_b GEMM and attention) of one sequence of T new tokens with each attention
  // kernel: FlashInfer's Hopper kernel and mla.cu's mma.sync one (expanded). FLOP: the causal attention's.
  for (const int t : {2048, 8192}) {
    SeqLayout layout = layout_for({t}, {0}, ps);
    persistent_layout(be, layout);
    const Tensor pages = random_tensor(be, {layout.max_pages, ps, c + r}, gen, DType::kBF16);
    const Tensor q = random_tensor(be, {t, H, n + r}, gen, DType::kBF16);
    const Tensor o = be.alloc_persistent(DType::kBF16, {t, H, vd});
    const MlaArgs args{q, pages, kvb, scale, o};
    const double flop = double(H) * t * (t + 1) / 2.0 * 2.0 * ((n + r) + vd);
    const double bytes = double(t) * (c + r) * 2 + double(t) * H * (n + r + vd) * 2 + H * (n + vd) * c * 2.0;
    for (const auto path : {cuda::MlaPrefillPath::kFlashInfer, cuda::MlaPrefillPath::kExpanded}) {
      const double ms = time_ms(
          be,
          [&] {
            be.begin_step();
            cuda::mla_prefill_on(be, path, args, layout);
          });
      char shape[64];
      std::snprintf(shape, sizeof shape, "T=%d H=32 qk=192 v=128 %s", t, cuda::mla_prefill_path_name(path));
      row("mla_prefill (causal)", shape, ms, flop, bytes);  // of floor × 770 = TFLOP/s
    }
  }
}


// The MoE layer of Kimi-Linear-48B (E=256, top-8, D=2304, F=1024; bf16 experts). Rows:
// route + experts at N in {1, 64, 256, 8192} (the path moe_experts picks), the router alone, the
// experts alone on each path at the token counts where it may be chosen (the grouped and swapped
// paths up to 256, the per-expert GEMMs from 256), each timed eagerly (one call between two events:
// host launch time included); then route + experts replayed from a CUDA graph (the decode step's
// view) on the default path at N in {1, 64, 256}, on the grouped and swapped paths at N in {1, 8,
// 16, 32, 64, 128, 256}, where the threshold between them falls, on the grouped and rows paths at N
// in {1, 2, 4, 8} (the rows path's threshold), the router and the rows path's experts alone at
// N = 1, and at N = 1 with a shared expert (its gate/up projection an input; the rows path fuses
// its GLU and down, the grouped path adds them through glu, linear and add). Last, the same
// experts in MXFP4 (random nibbles, scale 2^−7; upload_mxfp4 keeps them packed) beside the bf16
// ones: route + experts from a graph at N in {1, 8, 64, 256} on the default path, the grouped path
// at 1 and 8, and eagerly at 8,192 (the per-expert GEMMs over dequantized experts).
// Bytes count the experts the draw actually uses: their weights (3·D·F each, 2 bytes a weight in
// bf16, 17/32 in MXFP4), x and out (bf16), logits (fp32).
// FLOP: 2·3·D·F per (token, pick).
void bench_moe(cuda::CudaBackend& be, std::mt19937_64& gen) {
  const int64_t E = 256, K = 8, D = 2304, F = 1024;
  const ExpertMatrix w13 = random_tensor(be, {E, 2 * F, D}, gen, DType::kBF16, -0.02f, 0.02f);
  const ExpertMatrix w2 = random_tensor(be, {E, D, F}, gen, DType::kBF16, -0.02f, 0.02f);
  auto mxfp4 = [&](int64_t rows, int64_t in) {
    Tensor packed = Tensor::empty(DType::kU8, {E, rows, in / 2}), scale = Tensor::empty(DType::kU8, {E, rows, in / 32});
    for (int64_t i = 0; i < packed.numel(); i += 8) {
      const uint64_t r = gen();
      std::memcpy(packed.data_as<uint8_t>() + i, &r, static_cast<size_t>(std::min<int64_t>(8, packed.numel() - i)));
    }
    std::memset(scale.data(), 120, scale.nbytes());
    return be.upload_mxfp4(packed, scale);
  };
  const ExpertMatrix w13_mx = mxfp4(2 * F, D), w2_mx = mxfp4(D, F);
  enum class Weights { kBf16, kMxfp4 };
  // A small bias: near the top scores the sigmoid's spread is ~0.01, so a ±0.1 bias would pick the
  // same few experts for every token (the 2026-12-01 run used 90 experts at N=64); a trained router
  // spreads 64 tokens over ~87 % of the experts (issue 9).
  const Tensor bias = random_tensor(be, {E}, gen, DType::kF32, -1e-3f, 1e-3f);
  const RouteParams rp{static_cast<int>(K), 1, 1, true, 2.446f};
  enum class Part { kRouteAndExperts, kRoute, kExperts };
  enum class Replay { kEager, kGraph };
  enum class Shared { kNone, kOne };  // kOne: a shared expert of width F beside the routed ones
  const Tensor shared_down = random_tensor(be, {D, F}, gen, DType::kBF16, -0.02f, 0.02f);
  // `path`: the path the experts run; none: the one moe_experts picks.
  auto run = [&](int64_t n, Part part, std::optional<cuda::MoePath> path, Replay replay = Replay::kEager,
                 Shared with = Shared::kNone, Weights weights = Weights::kBf16) {
    const bool mx = weights == Weights::kMxfp4;
    const ExpertMatrix& a = mx ? w13_mx : w13;
    const ExpertMatrix& b = mx ? w2_mx : w2;
    be.begin_step();
    const Tensor x = random_tensor(be, {n, D}, gen, DType::kBF16);
    const Tensor logits = random_tensor(be, {n, E}, gen, DType::kF32, -3, 3);
    const Tensor idx = be.alloc_persistent(DType::kI32, {n, K});
    const Tensor w = be.alloc_persistent(DType::kF32, {n, K});
    const Tensor o = be.alloc_persistent(DType::kBF16, {n, D});
    const SharedExperts shared = with == Shared::kOne
                                     ? SharedExperts{random_tensor(be, {n, 2 * F}, gen, DType::kBF16), shared_down}
                                     : SharedExperts{};
    be.moe_route(logits, bias, rp, idx, w);
    const Tensor ih = be.to_host(idx);
    std::vector<bool> used(E, false);
    for (int64_t i = 0; i < n * K; ++i) used[ih.data_as<int32_t>()[i]] = true;
    const double active = static_cast<double>(std::count(used.begin(), used.end(), true));
    const cuda::MoePath taken = path.value_or(cuda::moe_path_for(x, a, b));
    const auto step = [&] {
      be.begin_step();
      if (part != Part::kExperts) be.moe_route(logits, bias, rp, idx, w);
      if (part != Part::kRoute) cuda::moe_experts_on(be, taken, x, idx, w, a, b, GluParams{}, o, shared);
    };
    const bool graph = replay == Replay::kGraph;
    const double ms = graph ? graph_ms(be, step) : time_ms(be, step);
    const double route_bytes = n * E * 4.0 + n * K * 8.0;
    const double expert_bytes = (active * (mx ? 17.0 / 32 : 2.0) + (with == Shared::kOne) * 2.0) * 3.0 * D * F +
                                n * D * 2.0 * 2;
    const double bytes = part == Part::kRoute     ? route_bytes
                         : part == Part::kExperts ? expert_bytes
                                                  : route_bytes + expert_bytes;
    const double flop = part == Part::kRoute ? 0.0 : n * (K + (with == Shared::kOne)) * 2.0 * 3.0 * D * F;
    const std::string op = std::string(part == Part::kRoute              ? "moe_route"
                                       : part == Part::kRouteAndExperts ? "moe route+experts"
                                                                        : "moe_experts") +
                           (!graph ? "" : ms < 0 ? " NO GRAPH" : " graph");
    char shape[96];
    std::snprintf(shape, sizeof shape, "N=%lld %s%s%s%d experts used%s", (long long)n, mx ? "MXFP4 " : "",
                  part == Part::kRoute ? "" : cuda::moe_path_name(taken), part == Part::kRoute ? "" : ", ",
                  static_cast<int>(active), with == Shared::kOne ? " + shared" : "");
    row(op, shape, ms, flop, bytes);
  };
  using cuda::MoePath;
  for (int64_t n : {1, 64, 256, 8192}) run(n, Part::kRouteAndExperts, std::nullopt);
  for (int64_t n : {1, 256}) run(n, Part::kRoute, std::nullopt);
  for (int64_t n : {1, 64, 256}) run(n, Part::kExperts, MoePath::kGrouped);
  for (int64_t n : {64, 256}) run(n, Part::kExperts, MoePath::kSwappedGemm);
  for (int64_t n : {256, 512, 1024}) run(n, Part::kExperts, MoePath::kPerExpertGemm);
  // Last: a failed capture leaves the rows above.
  const Replay g = Replay::kGraph;
  for (int64_t n : {1, 64, 256}) run(n, Part::kRouteAndExperts, std::nullopt, g);
  for (const MoePath p : {MoePath::kGrouped, MoePath::kSwappedGemm})
    for (int64_t n : {1, 8, 16, 32, 64, 128, 256}) run(n, Part::kRouteAndExperts, p, g);
  for (const MoePath p : {MoePath::kGrouped, MoePath::kRows})
    for (int64_t n : {2, 4}) run(n, Part::kRouteAndExperts, p, g);
  for (int64_t n : {1, 8}) run(n, Part::kRouteAndExperts, MoePath::kRows, g);
  run(1, Part::kRoute, std::nullopt, g);
  run(1, Part::kExperts, MoePath::kRows, g);
  for (const MoePath p : {MoePath::kGrouped, MoePath::kRows}) run(1, Part::kRouteAndExperts, p, g, Shared::kOne);
  // MXFP4 beside bf16 (the default path each).
  for (const Weights wt : {Weights::kBf16, Weights::kMxfp4}) {
    for (int64_t n : {1, 8, 64, 256}) run(n, Part::kRouteAndExperts, std::nullopt, g, Shared::kNone, wt);
    for (int64_t n : {1, 8}) run(n, Part::kRouteAndExperts, MoePath::kGrouped, g, Shared::kNone, wt);
    run(8192, Part::kRouteAndExperts, std::nullopt, Replay::kEager, Shared::kNone, wt);
  }
}

// The routed experts' GEMMs of Kimi-Linear-48B alone (gemm_grouped, moe.cu's per-expert path):
// 256 problems per projection, gate/up (n = 2F = 2,048, k = D = 2,304) then down (n = D, k = F =
// 1,024), for the rows of N = 2,048 and 8,192 tokens with 8 picks each drawn uniformly (m ≈ 64 and
// ≈ 256 rows per expert, ± their Poisson spread), with each kernel of gemm_grouped. Bytes: the
// expert weights, the inputs and outputs of both projections (bf16).
void bench_grouped_gemm(cuda::CudaBackend& be, std::mt19937_64& gen) {
  const int64_t E = 256, K = 8, D = 2304, F = 1024;
  const Tensor w13 = random_tensor(be, {E, 2 * F, D}, gen, DType::kBF16, -0.02f, 0.02f);
  const Tensor w2 = random_tensor(be, {E, D, F}, gen, DType::kBF16, -0.02f, 0.02f);
  for (int64_t n : {2048, 8192}) {
    std::vector<int64_t> offset(E + 1, 0);
    std::uniform_int_distribution<int64_t> pick(0, E - 1);
    for (int64_t i = 0; i < n * K; ++i) ++offset[pick(gen) + 1];
    int64_t largest = 0;
    for (int64_t e = 0; e < E; ++e) largest = std::max(largest, offset[e + 1]), offset[e + 1] += offset[e];
    const int64_t rows = n * K;
    const Tensor x = random_tensor(be, {rows, D}, gen, DType::kBF16);
    const Tensor act = random_tensor(be, {rows, F}, gen, DType::kBF16);
    const Tensor h = be.alloc_persistent(DType::kBF16, {rows, 2 * F});
    const Tensor y = be.alloc_persistent(DType::kBF16, {rows, D});
    // Each expert's rows of `in` [rows, width] times its weight [out_w, width] of `w` into `c`.
    auto problems = [&](const Tensor& in, int64_t width, const Tensor& w, int64_t out_w, const Tensor& c) {
      std::vector<cuda::GemmArgs> list;
      for (int64_t e = 0; e < E; ++e) {
        const int64_t m = offset[e + 1] - offset[e];
        if (m == 0) continue;
        cuda::GemmArgs& g = list.emplace_back();
        g.m = m, g.n = out_w, g.k = width;
        g.a = in.data_as<const uint16_t>() + offset[e] * width, g.lda = width;
        g.b = w.data_as<const uint16_t>() + e * out_w * width, g.ldb = width;
        g.c = c.data_as<uint16_t>() + offset[e] * out_w, g.ldc = out_w;
        g.ab_dtype = g.c_dtype = DType::kBF16;
      }
      return list;
    };
    const auto gate_up = problems(x, D, w13, 2 * F, h), down = problems(act, F, w2, D, y);
    const double flop = 2.0 * rows * (2 * F * D + D * F);
    const double bytes = 2.0 * (E * 3.0 * D * F + rows * (D + 2 * F + F + D));
    for (const auto path : {cuda::GemmGroupedPath::kCutlass, cuda::GemmGroupedPath::kCublas}) {
      const double ms = time_ms(be, [&] {
        be.begin_step();
        cuda::gemm_grouped_on(be, path, gate_up, "bench gate_up");
        cuda::gemm_grouped_on(be, path, down, "bench down");
      });
      char shape[96];
      std::snprintf(shape, sizeof shape, "N=%lld m~%lld max %lld %s", (long long)n, (long long)(rows / E),
                    (long long)largest, cuda::gemm_grouped_path_name(path));
      row("gemm_grouped 48B layer", shape, ms, flop, bytes);
    }
  }
}

// The dense projections of a Kimi-Linear-48B batch-1 decode step (bf16 weights [n, k]), on the
// small-row kernel and on cuBLASLt (each GemmPath), replayed as a CUDA graph. Each graph runs the
// projection over as many copies of the weight as make ≥ 256 MB (at most 1,024: the 147 KB β weight
// stays partly in L2), so the weights come from memory as in a step (the H200's 50 MB L2 would hold
// one small matrix between replays); the time is per projection. Bytes: the weight plus the rows
// in and out. Then the groups of projections a step runs through `linears`, as one launch and as a
// launch each (the time per group; bytes: the weights).
void bench_gemv(cuda::CudaBackend& be, std::mt19937_64& gen) {
  struct Proj {
    const char* name;
    int64_t n, k;
  };
  const Proj projs[] = {{"KDA q/k/v", 12288, 2304}, {"KDA f_a / g_a", 128, 2304}, {"KDA f_b / g_b", 4096, 128},
                        {"KDA b", 32, 2304},         {"KDA / MLA o", 2304, 4096},  {"MLA q", 6144, 2304},
                        {"MLA kv_a", 576, 2304},     {"shared gate/up", 2048, 2304}, {"shared down", 2304, 1024},
                        {"router", 256, 2304},       {"lm_head", 163840, 2304}};
  for (const Proj& p : projs) {
    const double wbytes = 2.0 * p.n * p.k;
    const int copies = static_cast<int>(std::min<double>(1024, std::ceil(256e6 / wbytes)));
    std::vector<Tensor> w;
    for (int i = 0; i < copies; ++i) w.push_back(random_tensor(be, {p.n, p.k}, gen, DType::kBF16, -0.05f, 0.05f));
    const Tensor x = random_tensor(be, {1, p.k}, gen, DType::kBF16);
    const Tensor y = be.alloc_persistent(DType::kBF16, {1, p.n});
    for (const auto path : {cuda::GemmPath::kSmallRow, cuda::GemmPath::kCublasLt}) {
      const double ms = graph_ms(be, [&] {
        for (const Tensor& wi : w) {
          cuda::GemmArgs g;
          g.m = 1, g.n = p.n, g.k = p.k;
          g.a = x.data(), g.lda = p.k;
          g.b = wi.data(), g.ldb = p.k;
          g.c = y.data(), g.ldc = p.n;
          g.ab_dtype = g.c_dtype = DType::kBF16;
          cuda::gemm_on(be, path, g, "bench gemv");
        }
      }, 5);
      char shape[96];
      std::snprintf(shape, sizeof shape, "%s n=%lld k=%lld %s", p.name, (long long)p.n, (long long)p.k,
                    cuda::gemm_path_name(path));
      row("gemm (1 row)", shape, ms / copies, 2.0 * p.n * p.k, wbytes + 2.0 * (p.n + p.k));
    }
  }
  // The projections that a step runs through `linears`, as one launch and as one small-row launch
  // each (outputs bf16 but the router's logits, β and KDA's f, F32), the same way.
  enum class Inputs { kShared, kOwn };  // one x for every projection, or one each
  struct Group {
    const char* name;
    int64_t k;
    Inputs inputs;
    std::vector<std::pair<int64_t, DType>> outs;  // n and output dtype of each projection
  };
  const Group groups[] = {
      {"KDA q/k/v + f_a + b + g_a", 2304, Inputs::kShared,
       {{12288, DType::kBF16}, {128, DType::kBF16}, {32, DType::kF32}, {128, DType::kBF16}}},
      {"KDA f_b + g_b", 128, Inputs::kOwn, {{4096, DType::kF32}, {4096, DType::kBF16}}},
      {"MLA q + kv_a", 2304, Inputs::kShared, {{6144, DType::kBF16}, {576, DType::kBF16}}},
      {"router + shared gate/up", 2304, Inputs::kShared, {{256, DType::kF32}, {2048, DType::kBF16}}},
  };
  for (const Group& grp : groups) {
    const int64_t k = grp.k;
    double wbytes = 0, flop = 0;
    for (const auto& [n, dtype] : grp.outs) {
      wbytes += 2.0 * n * k;
      flop += 2.0 * n * k;
    }
    const int copies = static_cast<int>(std::min<double>(1024, std::ceil(256e6 / wbytes)));
    const Tensor x = random_tensor(be, {1, k}, gen, DType::kBF16);
    std::vector<std::vector<Projection>> sets(copies);
    for (auto& set : sets)
      for (const auto& [n, dtype] : grp.outs)
        set.push_back(Projection{grp.inputs == Inputs::kShared ? x : random_tensor(be, {1, k}, gen, DType::kBF16),
                                 random_tensor(be, {n, k}, gen, DType::kBF16, -0.05f, 0.05f),
                                 be.alloc_persistent(dtype, {1, n})});
    for (const bool one_launch : {true, false}) {
      const double ms = graph_ms(be, [&] {
        for (const auto& set : sets)
          if (one_launch)
            be.linears(set);
          else
            for (const Projection& p : set) be.linear(p.x, p.w, p.y);
      }, 5);
      char shape[96];
      std::snprintf(shape, sizeof shape, "%s k=%lld %s", grp.name, (long long)k,
                    one_launch ? "one launch" : "a launch each");
      row("linears (1 row)", shape, ms / copies, flop, wbytes);
    }
  }
}

// The residual add and the next sublayer's RMSNorm of Kimi-Linear-48B (D = 2,304, bf16) at a decode
// batch of 64 rows and a 2,048-token prefill step: add then rms_norm (two launches, the row read
// three times and written twice) beside add_rms_norm (one launch, read twice, written twice); each
// eager (host launch time included) and replayed as a CUDA graph (the decode step's view). Bytes:
// the rows moved (w, 4.6 KB, left out).
void bench_norm(cuda::CudaBackend& be, std::mt19937_64& gen) {
  const int64_t D = 2304;
  const float eps = 1e-5f;
  const Tensor w = random_tensor(be, {D}, gen, DType::kBF16, 0.5f, 1.5f);
  for (const int64_t n : {64, 2048}) {
    const Tensor h = random_tensor(be, {n, D}, gen, DType::kBF16), x = random_tensor(be, {n, D}, gen, DType::kBF16);
    const Tensor y = be.alloc_persistent(DType::kBF16, {n, D});
    const double row_bytes = double(n) * D * 2;
    const auto split = [&] {
      be.add(h, x);
      be.rms_norm(h, w, eps, y);
    };
    const auto fused = [&] { be.add_rms_norm(AddNormArgs{h, x, w, eps, y}); };
    char shape[64];
    std::snprintf(shape, sizeof shape, "N=%lld D=2304", (long long)n);
    row("add + rms_norm", shape, time_ms(be, split), 0, 5 * row_bytes);
    row("  as a graph replay", shape, graph_ms(be, split), 0, 5 * row_bytes);
    row("add_rms_norm", shape, time_ms(be, fused), 0, 4 * row_bytes);
    row("  as a graph replay", shape, graph_ms(be, fused), 0, 4 * row_bytes);
  }
}

}  // namespace
}  // namespace klinear

int main(int argc, char** argv) {
  using namespace klinear;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // rows reach a log as they are measured, even under a timeout
  const std::string what = argc > 1 ? argv[1] : "all";
  if (what == "--help" || what == "-h") {
    std::printf("usage: ops_bench [kda|kda_decode|mla|moe|grouped_gemm|gemv|norm|all] [SHAPE]\n"
                "  prints a table of each op's median time against its floor on this GPU; SHAPE keeps the\n"
                "  kda, kda_decode and mla decode rows whose shape contains it\n");
    return 0;
  }
  if (argc > 2) g_shape_filter = argv[2];
  auto be = cuda::CudaBackend::create(DType::kBF16);
  if (!be.ok()) {
    std::fprintf(stderr, "ops_bench: %s\n", be.status().to_string().c_str());
    return 1;
  }
  std::mt19937_64 gen(std::random_device{}());
  std::printf("| op | shape | ms (median) | FLOP | bytes | floor ms | of floor |\n|---|---|---|---|---|---|---|\n");
  if (what == "all" || what == "kda") bench_kda(*be.value(), gen, false);
  if (what == "all" || what == "kda_decode") bench_kda(*be.value(), gen, true);
  if (what == "all" || what == "kda_decode") bench_kda_decode_fused(*be.value(), gen);
  if (what == "all" || what == "mla") bench_mla(*be.value(), gen);
  if (what == "all" || what == "moe") bench_moe(*be.value(), gen);
  if (what == "all" || what == "grouped_gemm") bench_grouped_gemm(*be.value(), gen);
  if (what == "all" || what == "gemv") bench_gemv(*be.value(), gen);
  if (what == "all" || what == "norm") bench_norm(*be.value(), gen);
  return 0;
}
